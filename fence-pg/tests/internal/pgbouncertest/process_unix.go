//go:build unix

package pgbouncertest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one run of pgbouncer, started directly so that this package
// owns its lifetime: it knows the pid, sees the exit at once (a goroutine
// reaps it), and the kernel ends it when the test binary dies (procAttr).
type process struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and been reaped
	waitErr error         // valid after done is closed
}

// osUser is the unprivileged account pgbouncer runs as when the tests run
// as root: PgBouncer refuses to run as root.
type osUser struct {
	name     string
	uid, gid uint32
}

func (b *Bouncer) spawn() (*process, int64, error) {
	f, err := os.OpenFile(b.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("pgbouncertest: log: %w", err)
	}
	defer f.Close() // the child has its own copy
	offset, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, 0, fmt.Errorf("pgbouncertest: log: %w", err)
	}
	if err := b.chownAll(); err != nil {
		return nil, 0, err
	}
	cmd := exec.Command(b.bin, b.iniPath)
	cmd.Dir = b.tmpDir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr(b.user, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("pgbouncertest: starting %s: %w", b.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	// The only goroutine left behind, and only while the process runs.
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, offset, nil
}

// stop sends SIGTERM (PgBouncer's immediate shutdown) and, if the process
// has not exited within grace, SIGKILL to its process group. It returns
// which step ended it.
func (p *process) stop(grace time.Duration) string {
	if p == nil {
		return "not running"
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return "SIGTERM"
	case <-t.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return "SIGKILL"
}

// serverUser returns nil normally and the OS user "postgres" as root.
func serverUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	const name = "postgres"
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: PgBouncer refuses to run as root; running as root needs an unprivileged OS user %q "+
			"(scripts/ensure-deps.sh creates it): %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgbouncertest: OS user %s: %w", name, err)
	}
	return &osUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// chownAll hands the temp directory and its files to the OS user pgbouncer
// runs as (as root only).
func (b *Bouncer) chownAll() error {
	if b.user == nil {
		return nil
	}
	entries, err := os.ReadDir(b.tmpDir)
	if err != nil {
		return fmt.Errorf("pgbouncertest: %w", err)
	}
	paths := []string{b.tmpDir}
	for _, e := range entries {
		paths = append(paths, b.tmpDir+"/"+e.Name())
	}
	for _, p := range paths {
		if err := os.Chown(p, int(b.user.uid), int(b.user.gid)); err != nil {
			return fmt.Errorf("pgbouncertest: handing %s to OS user %s: %w", p, b.user.name, err)
		}
	}
	return nil
}

// childEnv is our environment without libpq and locale variables.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
	if err != nil {
		return 0, fmt.Errorf("pgbouncertest: picking a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
