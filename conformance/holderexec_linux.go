package conformance

import (
	"os/exec"
	"syscall"
)

// setHolderProcAttr makes a holder die with its parent: a test run killed
// by a timeout must not leave a frozen holder behind.
func setHolderProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
