// Package etcdtemp starts throwaway etcd servers, as child processes of the running binary, for
// tests and the lab.
//
// It is shaped like net/http/httptest and fence-pg/pgtemp: [Start] takes a context and returns a
// [*Server] without needing a testing.T, so the lab program can use it too, and [StartTB] is the
// thin wrapper for tests.
//
// The server is etcd itself (go.etcd.io/etcd/server/v3/embed), built into the running binary, but
// it runs in a child process: the binary re-executes itself with [ServeEnv] set, and that child
// calls [Serve]. A child process is what makes [Server.KillRestart] possible: the crash case F8
// kills the server with SIGKILL, so nothing is shut down cleanly, and starts a new one on the same
// data directory, which recovers from its write-ahead log. An in-process server cannot be killed
// like that without killing the test with it.
//
// A binary that uses etcdtemp must therefore call Serve early when [IsServeProcess] reports true.
// In a test binary that is TestMain, which a test package using etcdtemp must have:
//
//	func TestMain(m *testing.M) {
//		if etcdtemp.IsServeProcess() {
//			os.Exit(etcdtemp.Serve())
//		}
//		os.Exit(m.Run())
//	}
//
// Put the hook first: whatever TestMain does before it (fixtures, other servers) runs in the
// server's process too. The child is started with "-test.run=^$" (unless [WithArgs] says
// otherwise), so a binary without the hook runs no tests there and exits, and Start fails saying
// the hook is missing. A binary that is
// re-executed for other purposes as well, such as the conformance suite's holder processes, tests
// each purpose's environment variable in turn (fence-etcd/tests/main_test.go). A complete test
// file with this hook and the conformance suite on an etcdtemp server, compiled and run by the
// repository's tests, is fence-etcd/tests/authorharness/harness_test.go.
//
// A program such as the lab does the same in a subcommand it names with [WithArgs].
//
// Durability stays at etcd's defaults: every acknowledged write has been fsynced to the WAL, which
// is what F8 checks survives the kill.
//
// [WithClientTLS] and [WithAuth] start a server whose clients must use TLS (and, if asked, present
// a certificate) and log in: for tests of a client's security settings (docs/security.md).
//
// etcdtemp needs a Unix system: it stops its children with signals.
package etcdtemp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ServeEnv is the environment variable that carries the server configuration (JSON) from Start
// to the re-executed binary. Its presence is what IsServeProcess checks; it is not meant to be
// set by hand.
const ServeEnv = "LEASEFENCE_ETCD_SERVE"

// ErrNotServing is returned (wrapped) by KillRestart when there is no server to kill: after Stop,
// after an earlier KillRestart failed to bring the server back, or when the server had already
// exited on its own.
var ErrNotServing = errors.New("etcdtemp: server not serving")

// opError names the method an error comes from without repeating the package prefix of the
// error it wraps: "etcdtemp: KillRestart: port already in use: ...".
func opError(op string, err error) error {
	return &prefixedError{op: op, err: err}
}

type prefixedError struct {
	op  string
	err error
}

func (e *prefixedError) Error() string {
	return "etcdtemp: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "etcdtemp: ")
}

func (e *prefixedError) Unwrap() error { return e.err }

const (
	// startTimeout bounds Start and the restart half of KillRestart. A single-member etcd with
	// the default timings is ready in well under a second, and WAL replay of a test's worth of
	// data takes milliseconds, so 30 seconds only pass when something is really wrong.
	startTimeout = 30 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL. etcd's own
	// graceful shutdown gives open client streams a few seconds (5s plus two election
	// timeouts by default), so this leaves it room to finish.
	stopGrace = 10 * time.Second

	loopback = "127.0.0.1"
	// memberName is the member's name, the name in its initial cluster and in MemberList.
	memberName = "default"
)

// Option configures Start.
type Option func(*config)

type config struct {
	heartbeat time.Duration
	election  time.Duration
	log       io.Writer
	args      []string

	// WithClientTLS's and WithAuth's (security.go).
	tls          *ClientTLS
	auth         bool
	rootPassword string
}

// WithHeartbeat sets etcd's heartbeat interval (--heartbeat-interval, the raft tick). The default
// is 10ms, a tenth of etcd's own default, so that a short election timeout is allowed. It must be
// a whole number of milliseconds.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.heartbeat = d }
}

// WithElection sets etcd's election timeout (--election-timeout). The default is 100ms, a tenth
// of etcd's own default: a single member elects itself at once anyway, and the shorter timeout
// lowers the server's minimum lease TTL, which is 1.5 election timeouts rounded up to whole
// seconds (1s here, 2s with etcd's defaults). It must be a whole number of milliseconds, at least
// five heartbeats (etcd's rule) and at most 50s.
func WithElection(d time.Duration) Option {
	return func(c *config) { c.election = d }
}

// WithLog sends progress lines ("etcdtemp: started ... in 0.4s") to w. The default discards
// them. Writes to w are serialized. The server's own output goes to etcd.log next to the data
// directory.
func WithLog(w io.Writer) Option {
	return func(c *config) {
		if w == nil {
			w = io.Discard
		}
		c.log = w
	}
}

// WithArgs sets the command-line arguments of the re-executed binary. The default,
// "-test.run=^$", suits a test binary whose TestMain calls Serve: should the hook be missing, the
// child runs no tests and exits, and Start says what is missing. A program passes the
// subcommand that calls Serve, such as "etcd-server" for the lab.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = slices.Clone(args) }
}

func (c *config) validate() error {
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"WithHeartbeat", c.heartbeat}, {"WithElection", c.election}} {
		if d.d < time.Millisecond || d.d%time.Millisecond != 0 {
			return fmt.Errorf("etcdtemp: %s(%v): etcd takes a whole, positive number of milliseconds", d.name, d.d)
		}
	}
	if c.election < 5*c.heartbeat {
		return fmt.Errorf("etcdtemp: election timeout %v is shorter than 5 heartbeats of %v, which etcd refuses",
			c.election, c.heartbeat)
	}
	if c.election > 50*time.Second {
		return fmt.Errorf("etcdtemp: WithElection(%v): etcd allows at most 50s", c.election)
	}
	return nil
}

// Server is a running etcd server in a child process, with one member named "default" on
// loopback ports. Its methods are safe for concurrent use.
type Server struct {
	logMu sync.Mutex
	log   io.Writer

	exe  string
	args []string

	tmpDir  string
	dataDir string
	logPath string

	// Set by Start, fixed afterwards: a restarted child must listen where the first one did
	// (the peer URL is recorded in the WAL, and clients hold the client URL).
	clientURL string
	peerURL   string
	serve     serveConfig
	version   string
	memberID  uint64

	// clientTLS is the TLS of etcdtemp's own clients (WithClientTLS), nil for plain HTTP;
	// rootPassword is WithAuth's, and authOn is set once authentication is on (by Start,
	// before it returns).
	clientTLS    *tls.Config
	rootPassword string
	authOn       bool

	// Set for a Cluster member only, fixed after StartCluster: the cluster's size, the URL the
	// member announces (its proxy's), and its name, which starts its progress lines.
	clusterSize      int
	advertisePeerURL string
	logName          string

	pid atomic.Int64 // the current child, 0 while none runs

	// mu serializes KillRestart and Stop, so Stop never races a restart half way through.
	mu      sync.Mutex
	proc    *child // nil while down (after a failed restart, after Stop)
	stopped bool
	stopErr error
}

// Start starts an etcd server in a child process and returns when it serves linearizable reads.
// ctx bounds the start only (at most 30 seconds); the server runs until Stop. On error nothing is
// left running and no files are left behind.
//
// The child is the running binary (os.Executable) with the arguments from WithArgs and ServeEnv
// in its environment; see the package documentation for the hook it must have.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := config{
		heartbeat: 10 * time.Millisecond,
		election:  100 * time.Millisecond,
		log:       io.Discard,
		args:      []string{"-test.run=^$"},
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	clientTLS, err := cfg.validateSecurity()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, opError("Start", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: finding the running binary to re-execute: %w", err)
	}
	tmp, err := os.MkdirTemp("", "etcdtemp-")
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: %w", err)
	}
	if abs, err := filepath.Abs(tmp); err == nil {
		tmp = abs
	}
	s := &Server{
		log:          cfg.log,
		exe:          exe,
		args:         cfg.args,
		tmpDir:       tmp,
		dataDir:      filepath.Join(tmp, "data"),
		logPath:      filepath.Join(tmp, "etcd.log"),
		clientTLS:    clientTLS,
		rootPassword: cfg.rootPassword,
	}
	s.serve = serveConfig{
		Name:    memberName,
		DataDir: s.dataDir,
		// A token of its own gives each server distinct member and cluster IDs, so one
		// etcdtemp server is never mistaken for another.
		ClusterToken: filepath.Base(tmp),
		// "new" applies to the first start only: once the data directory holds a WAL,
		// etcd restarts from it and ignores the initial cluster settings.
		ClusterState: "new",
		HeartbeatMs:  uint(cfg.heartbeat / time.Millisecond),
		ElectionMs:   uint(cfg.election / time.Millisecond),
		ParentPID:    os.Getpid(),
	}
	if t := cfg.tls; t != nil {
		s.serve.TLS = &serveTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.TrustedCAFile, ClientCertAuth: t.ClientCertAuth}
	}
	if err := s.startFirst(ctx); err != nil {
		s.discard()
		return nil, err
	}
	if cfg.auth {
		if err := s.enableAuth(ctx); err != nil {
			s.discard()
			return nil, err
		}
	}
	return s, nil
}

// StartTB is Start for tests: it fails the test with tb.Fatal if the server cannot start, and
// registers Stop with tb.Cleanup. The test binary needs the TestMain hook of the package
// documentation.
func StartTB(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := Start(tb.Context(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("etcdtemp: stop: %v", err)
		}
	})
	return s
}

// Endpoints returns the client URL, such as []string{"http://127.0.0.1:41234"} ("https://..."
// with WithClientTLS), for clientv3.Config.Endpoints. It stays the same across KillRestart. The
// slice is the caller's.
func (s *Server) Endpoints() []string { return []string{s.clientURL} }

// DataDir returns the server's data directory. The server's output, etcd.log, is next to it.
// Stop removes both.
func (s *Server) DataDir() string { return s.dataDir }

// Version returns the etcd server version reported by the running server, such as "3.7.3".
func (s *Server) Version() string { return s.version }

// PID returns the process id of the child running the server, or 0 when none runs (after Stop,
// or after a failed KillRestart). It changes with every KillRestart.
func (s *Server) PID() int { return int(s.pid.Load()) }

// KillRestart crashes the server and starts it again: it sends SIGKILL to the child, so etcd
// gets no chance to flush or close anything, waits for it to exit, and starts a new child on the
// same data directory and ports, which recovers from the WAL. It returns when the new server
// serves linearizable reads again; downtime is the time from SIGKILL to that moment.
//
// If ctx is already done nothing is killed. On a failed restart the server is left down (PID
// returns 0, a further KillRestart returns ErrNotServing); Stop still cleans up.
func (s *Server) KillRestart(ctx context.Context) (downtime time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return 0, opError("KillRestart", fmt.Errorf("%w: Stop was called", ErrNotServing))
	}
	p := s.proc
	if p == nil {
		return 0, opError("KillRestart", fmt.Errorf("%w: an earlier restart failed; only Stop is left to do", ErrNotServing))
	}
	if p.exited() {
		s.proc = nil
		s.pid.Store(0)
		return 0, opError("KillRestart", fmt.Errorf("%w: etcd child pid %d had already exited (%s); last lines of %s:\n%s",
			ErrNotServing, p.pid, exitText(p.waitErr), s.logPath, lastLines(s.logSince(p.logOffset), 20)))
	}
	if err := ctx.Err(); err != nil {
		return 0, opError("KillRestart", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	s.logf("crash: SIGKILL to etcd pid %d", p.pid)
	t0 := time.Now()
	s.proc = nil
	s.pid.Store(0)
	p.kill()
	s.logf("etcd pid %d gone %v after SIGKILL; restarting on %s", p.pid, time.Since(t0).Round(time.Millisecond), s.dataDir)
	readyAt, err := s.startAndWait(ctx)
	if err != nil {
		return time.Since(t0), opError("KillRestart", err)
	}
	downtime = readyAt.Sub(t0)
	s.logf("restarted as pid %d on %s after SIGKILL, recovered from the WAL; down for %v",
		s.PID(), s.clientURL, downtime.Round(time.Millisecond))
	return downtime, nil
}

// Stop shuts the server down gracefully (SIGTERM; SIGKILL if it has not exited after 10
// seconds) and removes its temporary directory, data directory included. It is idempotent and
// safe to call concurrently: later calls wait for the first and return its result.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.stopErr
	}
	s.stopped = true
	t0 := time.Now()
	how := "already down"
	if p := s.proc; p != nil {
		s.proc = nil
		how = p.stop(stopGrace)
	}
	s.pid.Store(0)
	if err := os.RemoveAll(s.tmpDir); err != nil {
		s.stopErr = fmt.Errorf("etcdtemp: stop: removing %s: %w", s.tmpDir, err)
		return s.stopErr
	}
	s.logf("stopped (%s) and removed %s in %.1fs", how, s.tmpDir, time.Since(t0).Seconds())
	return nil
}

func (s *Server) logf(format string, args ...any) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	prefix := "etcdtemp: "
	if s.logName != "" {
		prefix += s.logName + ": "
	}
	fmt.Fprintf(s.log, prefix+format+"\n", args...)
}
