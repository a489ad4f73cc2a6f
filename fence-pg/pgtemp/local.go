//go:build unix

package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// server is a local cluster: a temp directory holding the data directory and the server log,
// and the postmaster currently running on it.
type server struct {
	bins    binaries
	user    *osUser // nil: the binaries run as the current user
	tmpDir  string
	dataDir string
	logPath string
	port    int
	logf    func(format string, args ...any)
	// settings are WithSetting's parameters, passed after ours on every start.
	settings []setting
	// ssl is WithSSL's: the server refuses TCP connections without SSL, so pgtemp's own use it.
	ssl bool

	proc *postmaster // nil while down (after a failed restart, after shutdown)
}

// osUser is the unprivileged account the server runs as when pgtemp runs as root.
type osUser struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
}

// autoPortAttempts bounds retries when a kernel-picked port is taken between closing our probe
// listener and postgres binding it. A port the caller chose is never silently replaced.
const autoPortAttempts = 3

func startLocal(ctx context.Context, cfg config, logf func(string, ...any)) (*server, serverInfo, error) {
	t0 := time.Now()
	bins, err := findBinaries(ctx, cfg.binDir)
	if err != nil {
		return nil, serverInfo{}, err
	}
	// Checked before anything is created, so this common mistake costs nothing to report.
	if cfg.port != 0 {
		if err := checkPortFree(cfg.port); err != nil {
			return nil, serverInfo{}, err
		}
	}
	u, err := serverUser()
	if err != nil {
		return nil, serverInfo{}, err
	}
	if u != nil {
		if err := checkTraversable(os.TempDir(), u); err != nil {
			return nil, serverInfo{}, err
		}
	}

	tmp, err := makeTempDir()
	if err != nil {
		return nil, serverInfo{}, err
	}
	s := &server{
		bins:     bins,
		user:     u,
		tmpDir:   tmp,
		dataDir:  filepath.Join(tmp, "data"),
		logPath:  filepath.Join(tmp, "postgres.log"),
		logf:     logf,
		settings: cfg.settings,
	}
	ok := false
	defer func() {
		if !ok {
			s.discard()
		}
	}()
	if err := s.prepareDirs(); err != nil {
		return nil, serverInfo{}, err
	}
	if err := s.initdb(ctx); err != nil {
		return nil, serverInfo{}, err
	}
	if err := s.configureSecurity(cfg); err != nil {
		return nil, serverInfo{}, err
	}
	info, err := s.startOnPort(ctx, cfg.port)
	if err != nil {
		return nil, serverInfo{}, err
	}
	ok = true
	logf("started PostgreSQL %s on %s:%d in %.1fs (data dir %s)",
		info.version, loopback, s.port, time.Since(t0).Seconds(), s.dataDir)
	return s, info, nil
}

// startOnPort starts the postmaster on fixed, or on a kernel-picked port if fixed is 0.
func (s *server) startOnPort(ctx context.Context, fixed int) (serverInfo, error) {
	for attempt := 1; ; attempt++ {
		s.port = fixed
		if fixed == 0 {
			port, err := freePort()
			if err != nil {
				return serverInfo{}, err
			}
			s.port = port
		}
		info, _, err := s.startAndWait(ctx)
		if err == nil || fixed != 0 || attempt == autoPortAttempts || !errors.Is(err, ErrPortInUse) {
			return info, err
		}
		s.logf("port %d was taken before postgres could bind it; trying another", s.port)
	}
}

// discard undoes a failed start: whatever is running dies, the files go.
func (s *server) discard() {
	if p := s.proc; p != nil {
		s.proc = nil
		p.stop(syscall.SIGQUIT, 5*time.Second)
	}
	_ = os.RemoveAll(s.tmpDir)
}

func (s *server) shutdown() error {
	t0 := time.Now()
	how := "already down"
	if p := s.proc; p != nil {
		s.proc = nil
		// SIGINT is a fast shutdown: sessions are ended and a checkpoint is written.
		how = p.stop(syscall.SIGINT, 10*time.Second)
	}
	if err := os.RemoveAll(s.tmpDir); err != nil {
		return fmt.Errorf("pgtemp: stop: removing %s: %w", s.tmpDir, err)
	}
	s.logf("stopped (%s) and removed %s in %.1fs", how, s.tmpDir, time.Since(t0).Seconds())
	return nil
}

func (s *server) restartImmediate(ctx context.Context) (time.Duration, error) {
	p := s.proc
	if p == nil {
		return 0, errors.New("pgtemp: RestartImmediate: postgres is not running (an earlier restart failed)")
	}
	select {
	case <-p.done:
		return 0, fmt.Errorf("pgtemp: RestartImmediate: postgres had already exited (%v); see %s", p.waitErr, s.logPath)
	default:
	}
	s.logf("immediate shutdown: SIGQUIT to postmaster pid %d", p.cmd.Process.Pid)
	t0 := time.Now()
	s.proc = nil
	how := p.stop(syscall.SIGQUIT, 10*time.Second)
	s.logf("postmaster gone (%s) %v after SIGQUIT", how, time.Since(t0).Round(time.Millisecond))
	_, readyAt, err := s.startAndWait(ctx)
	if err != nil {
		return time.Since(t0), err
	}
	downtime := readyAt.Sub(t0)
	s.logf("restarted on port %d after immediate shutdown, recovered from WAL; down for %v",
		s.port, downtime.Round(time.Millisecond))
	return downtime, nil
}

// prepareDirs hands the temp directory to the server's user. The data directory is created
// here with mode 0700 because initdb and postgres refuse a data directory others can read.
func (s *server) prepareDirs() error {
	if err := os.Mkdir(s.dataDir, 0o700); err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	f, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	f.Close()
	if s.user == nil {
		return nil
	}
	for _, p := range []string{s.tmpDir, s.dataDir, s.logPath} {
		if err := os.Chown(p, int(s.user.uid), int(s.user.gid)); err != nil {
			return fmt.Errorf("pgtemp: handing %s to OS user %s: %w", p, s.user.name, err)
		}
	}
	return nil
}

func (s *server) initdb(ctx context.Context) error {
	t0 := time.Now()
	as := ""
	if s.user != nil {
		as = " as OS user " + s.user.name
	}
	s.logf("initdb %s (%s%s)", s.dataDir, s.bins.initdb, as)
	// No --no-sync: the cluster's files must be on disk before the first crash test, too.
	cmd := exec.CommandContext(ctx, s.bins.initdb,
		"-D", s.dataDir, "-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C")
	cmd.Dir = s.tmpDir
	cmd.Env = childEnv()
	cmd.SysProcAttr = procAttr(s.user, syscall.SIGKILL)
	// initdb runs postgres in bootstrap and single-user mode as its own children; killing only
	// initdb would leave them running on a directory we are about to delete.
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("pgtemp: initdb interrupted: %w", ctxErr)
		}
		return fmt.Errorf("pgtemp: initdb -D %s failed: %v; its output:\n%s",
			s.dataDir, err, strings.TrimSpace(string(out)))
	}
	s.logf("initdb done in %.1fs", time.Since(t0).Seconds())
	return nil
}

// childEnv is our environment without libpq and locale variables: PGDATA, PGPORT and the like
// are meant for the user's own server and must not steer ours, and the C locale keeps server
// messages in English, which is what the port-in-use detection matches.
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

// serverUser returns the account to run the binaries as: nil normally, "postgres" as root,
// because postgres and initdb refuse to run as root.
func serverUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	const name = "postgres"
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: PostgreSQL refuses to run as root; running as root needs an unprivileged OS user 'postgres' "+
			"(created by the postgresql package, or: useradd --system --home /var/lib/postgresql postgres): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtemp: OS user %s: %w", name, err)
	}
	ou := &osUser{name: name, uid: uint32(uid), gid: uint32(gid), groups: []uint32{uint32(gid)}}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				ou.groups = append(ou.groups, uint32(g))
			}
		}
	}
	return ou, nil
}

// checkTraversable makes sure u can reach dir. As root, os.TempDir() may be under a directory
// only root can enter (a TMPDIR in /root, a 0700 test directory); initdb would then fail with a
// bare "permission denied", so say what to change instead.
func checkTraversable(dir string, u *osUser) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("pgtemp: temp directory: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgtemp: temp directory %s: %w (set TMPDIR to an existing directory)", dir, err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !canSearch(fi.Mode().Perm(), uint32(st.Uid), uint32(st.Gid), u) {
			return fmt.Errorf("pgtemp: the OS user %s (uid %d) that runs postgres cannot enter %s (mode %v, owner uid %d), "+
				"so it could not reach a data directory under the temp directory %s; set TMPDIR to a directory it can reach, for example TMPDIR=/tmp",
				u.name, u.uid, d, fi.Mode().Perm(), st.Uid, dir)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// canSearch applies the Unix permission rule for entering a directory (ACLs aside).
func canSearch(perm os.FileMode, owner, group uint32, u *osUser) bool {
	switch {
	case owner == u.uid:
		return perm&0o100 != 0
	case slices.Contains(u.groups, group):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

func freePort() (int, error) { return freePortOn(loopback) }

// freePortOn picks a free TCP port on host.
func freePortOn(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("pgtemp: picking a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// checkPortFree fails early and clearly for a fixed port that is taken. It cannot rule out a
// race with another process; startup also recognizes postgres's own bind failure.
func checkPortFree(port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(loopback, strconv.Itoa(port)))
	if err != nil {
		return portInUseError(port, err)
	}
	return ln.Close()
}

func portInUseError(port int, cause error) error {
	return &sentinelError{
		sentinel: ErrPortInUse,
		msg: fmt.Sprintf("pgtemp: port %d on %s is already in use (another PostgreSQL, or a previous run still running?)",
			port, loopback),
		cause: cause,
	}
}

// makeTempDir makes the directory a server's data, socket and log live in,
// as an absolute path: postgres reports its data directory as an absolute
// path, and ours must compare equal to it.
func makeTempDir() (string, error) {
	tmp, err := os.MkdirTemp("", "pgtemp-")
	if err != nil {
		return "", fmt.Errorf("pgtemp: %w", err)
	}
	if abs, err := filepath.Abs(tmp); err == nil {
		tmp = abs
	}
	return tmp, nil
}
