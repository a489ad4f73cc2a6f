//go:build unix && !linux

package pgbouncertest

import "syscall"

// procAttr puts the child in its own process group and runs it as u when
// not nil. Outside Linux there is no parent-death signal: a test binary
// killed with SIGKILL leaves pgbouncer running until it is stopped by hand.
func procAttr(u *osUser, _ syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
