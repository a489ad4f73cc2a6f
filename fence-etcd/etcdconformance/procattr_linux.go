package etcdconformance

import (
	"os/exec"
	"syscall"
)

// setHolderProcAttr makes a holder die with its parent, so a killed test
// run leaves no holder behind.
func setHolderProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
