//go:build unix && !linux

package etcdtemp

import "syscall"

// procAttr puts the child in its own process group, so a Ctrl-C at the terminal (SIGINT to the
// foreground group) does not stop the server behind the parent's back: the parent decides when,
// with Stop.
//
// Outside Linux there is no parent-death signal. The child notices that its parent died by
// polling its parent pid instead (see watchParent) and shuts down within a second or so.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
