package pgbouncertest

import "syscall"

// procAttr puts the child in its own process group (so a group kill
// reaches it and a Ctrl-C at the terminal does not), runs it as u when
// not nil, and has the kernel send deathSig when the forking thread dies
// (see pgtemp's procAttr for the caveat about locked OS threads).
func procAttr(u *osUser, deathSig syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
