package etcdtemp

import "syscall"

// procAttr puts the child in its own process group, so a Ctrl-C at the terminal (SIGINT to the
// foreground group) does not stop the server behind the parent's back: the parent decides when,
// with Stop.
//
// Pdeathsig has the kernel SIGKILL the child when the parent dies, so a killed test binary or
// lab does not leave an orphaned etcd holding its ports and temp directory. SIGKILL rather than
// SIGTERM because an orphan has nobody left to wait for its shutdown. The signal fires when the
// forking OS thread exits (go.dev/issue/27505), which the Go runtime only does for goroutines that
// lock their thread and exit without unlocking: do not start servers from such goroutines.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
