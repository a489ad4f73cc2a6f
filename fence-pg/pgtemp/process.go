//go:build unix

package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// postmaster is one run of the postgres server process. It is started directly rather than
// through pg_ctl so that pgtemp owns its lifetime: it knows the pid to signal, sees the exit at
// once, and the kernel can stop it when pgtemp dies (see procAttr).
type postmaster struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and been reaped
	waitErr error         // valid after done is closed

	// logOffset is where this run's output starts in the log, which is appended to across
	// restarts; error messages quote only this run.
	logOffset int64
}

// serverArgs are the settings every run uses.
//
// Durability must stay on: fsync, synchronous_commit and full_page_writes are set explicitly so
// that no postgresql.conf or future default can turn them off. RestartImmediate is a crash, and
// the crash test (F8) checks that every acknowledged token increment survives it through WAL
// recovery; with synchronous_commit=off an acknowledged commit can still sit in WAL buffers when
// the server dies, and with fsync=off the test would prove nothing about real crashes.
func (s *server) serverArgs() []string {
	args := []string{
		"-D", s.dataDir,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=" + loopback,
		// The socket goes into the data directory: the default /var/run/postgresql may not
		// exist or belong to another server.
		"-c", "unix_socket_directories=" + s.dataDir,
		"-c", "fsync=on",
		"-c", "synchronous_commit=on",
		"-c", "full_page_writes=on",
		"-c", "max_connections=300",
		"-c", "shared_buffers=64MB",
	}
	// WithSetting's parameters come last: postgres takes the last -c of a name.
	for _, st := range s.settings {
		args = append(args, "-c", st.name+"="+st.value)
	}
	return args
}

// startAndWait starts a postmaster and waits until it accepts connections. On failure nothing
// of this run is left running.
func (s *server) startAndWait(ctx context.Context) (serverInfo, time.Time, error) {
	p, err := s.spawn()
	if err != nil {
		return serverInfo{}, time.Time{}, err
	}
	info, readyAt, err := s.waitReady(ctx, p)
	if err != nil {
		p.stop(syscall.SIGQUIT, 5*time.Second)
		return serverInfo{}, time.Time{}, err
	}
	s.proc = p
	return info, readyAt, nil
}

func (s *server) spawn() (*postmaster, error) {
	f, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: server log: %w", err)
	}
	// The child gets its own copy of the descriptor, so ours is not needed after Start, and no
	// goroutine copies output.
	defer f.Close()
	offset, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("pgtemp: server log: %w", err)
	}

	s.logf("starting postgres on %s:%d (%s, log %s)", loopback, s.port, s.bins.postgres, s.logPath)
	cmd := exec.Command(s.bins.postgres, s.serverArgs()...)
	cmd.Dir = s.tmpDir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr(s.user, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtemp: starting %s: %w", s.bins.postgres, err)
	}
	p := &postmaster{cmd: cmd, done: make(chan struct{}), logOffset: offset}
	// The only goroutine pgtemp leaves behind, and only for as long as the process runs.
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls with real connections, not a port probe: during WAL recovery postgres
// already listens but refuses sessions ("the database system is starting up").
func (s *server) waitReady(ctx context.Context, p *postmaster) (serverInfo, time.Time, error) {
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=%s", superuser, loopback, s.port, maintenanceDB, sslMode(s.ssl))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, time.Second)
		// A program that took the port may accept and never answer; once our postmaster
		// has exited there is nothing to wait for.
		go func() {
			select {
			case <-p.done:
				cancel()
			case <-attemptCtx.Done():
			}
		}()
		conn, err := pgx.Connect(attemptCtx, dsn)
		cancel()
		if err == nil {
			readyAt := time.Now()
			info, err := s.checkServer(ctx, conn)
			closeConn(conn)
			return info, readyAt, err
		}
		lastErr = err

		// An exit wins over a pending tick or a done context: its log says why.
		select {
		case <-p.done:
			return serverInfo{}, time.Time{}, s.exitedError(p)
		default:
		}
		select {
		case <-p.done:
			return serverInfo{}, time.Time{}, s.exitedError(p)
		case <-ctx.Done():
			return serverInfo{}, time.Time{}, fmt.Errorf(
				"pgtemp: postgres on %s:%d not ready (last attempt: %v): %w; last lines of %s:\n%s",
				loopback, s.port, lastErr, ctx.Err(), s.logPath, lastLines(s.logSince(p.logOffset), 20))
		case <-tick.C:
		}
	}
}

// checkServer makes sure the server that answered is ours: if another server took the port
// first, ours is about to fail its bind, and the other one (another trust-authenticated test
// cluster, say) must not be mistaken for it.
func (s *server) checkServer(ctx context.Context, conn *pgx.Conn) (serverInfo, error) {
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		return serverInfo{}, fmt.Errorf("pgtemp: checking the new server: %w", err)
	}
	if filepath.Clean(dataDir) != filepath.Clean(s.dataDir) {
		return serverInfo{}, portInUseError(s.port, fmt.Errorf("another server (data directory %s) answers there", dataDir))
	}
	info, err := queryServerInfo(ctx, conn)
	if err != nil {
		return serverInfo{}, fmt.Errorf("pgtemp: reading server version: %w", err)
	}
	return info, nil
}

// exitedError explains why the postmaster exited during startup. A failed bind is reported as
// ErrPortInUse: it is the one startup failure the caller can fix by choosing another port.
func (s *server) exitedError(p *postmaster) error {
	out := s.logSince(p.logOffset)
	detail := fmt.Errorf("postgres exited during startup (%v); last lines of %s:\n%s",
		p.waitErr, s.logPath, lastLines(out, 20))
	if strings.Contains(out, "could not bind") || strings.Contains(out, "Address already in use") {
		return portInUseError(s.port, detail)
	}
	return fmt.Errorf("pgtemp: %w", detail)
}

// stop signals the postmaster with sig and escalates if it does not exit within grace: SIGQUIT
// (immediate shutdown), then SIGKILL to the whole process group so no backend survives. It
// returns which step ended the process.
func (p *postmaster) stop(sig syscall.Signal, grace time.Duration) string {
	_ = p.cmd.Process.Signal(sig) // os.ErrProcessDone if it already exited: nothing to do
	if p.wait(grace) {
		return signalName(sig)
	}
	if sig != syscall.SIGQUIT {
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		if p.wait(5 * time.Second) {
			return signalName(syscall.SIGQUIT)
		}
	}
	_ = killGroup(p.cmd.Process.Pid)
	<-p.done
	return "SIGKILL"
}

func (p *postmaster) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT, fast shutdown"
	case syscall.SIGQUIT:
		return "SIGQUIT, immediate shutdown"
	}
	return sig.String()
}

// killGroup kills a process group started with Setpgid (its leader's pid is the group id).
func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// logSince returns the server log from offset on, at most its last 64 KiB.
func (s *server) logSince(offset int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	const limit = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > limit {
		offset = fi.Size() - limit
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<62))
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return string(b)
}

func lastLines(text string, n int) string {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		return "(log empty)"
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
