//go:build unix && !linux

package pgtemp

import "syscall"

// procAttr puts the child in its own process group, so a Ctrl-C at the terminal does not hit the
// server behind pgtemp's back and a process-group kill reaches every backend, and runs it as u
// when pgtemp runs as root.
//
// Outside Linux there is no parent-death signal: if pgtemp is killed with SIGKILL the server
// keeps running until it is stopped by hand (kill the pid in DATA/postmaster.pid).
func procAttr(u *osUser, _ syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
