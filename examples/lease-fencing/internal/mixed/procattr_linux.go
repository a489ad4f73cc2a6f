package mixed

import (
	"os/exec"
	"syscall"
)

// setHolderProcAttr makes a holder die with its parent.
func setHolderProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
