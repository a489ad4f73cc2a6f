package pgtemp

import "syscall"

// procAttr puts the child in its own process group, so a Ctrl-C at the terminal does not hit the
// server behind pgtemp's back and a process-group kill reaches every backend, and runs it as u
// when pgtemp runs as root.
//
// deathSig is delivered by the kernel when pgtemp dies, so a killed test binary does not leave an
// orphaned server holding its port. The kernel clears the parent-death signal on a credential
// change; Go sets it after switching to u, so it survives. It fires when the forking OS thread
// exits (go.dev/issue/27505), which the Go runtime only does for goroutines that lock their thread
// and exit without unlocking: do not start clusters from such goroutines.
func procAttr(u *osUser, deathSig syscall.Signal) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
