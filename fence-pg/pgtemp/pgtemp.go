// Package pgtemp starts throwaway PostgreSQL clusters for tests and the lab.
//
// It is shaped like net/http/httptest and stapelberg/postgrestest: [Start] takes a context and
// returns a [*Cluster] without needing a testing.T, so the lab program can use it too, and
// [StartTB] is the thin wrapper for tests. Unlike postgrestest, durability stays on (fsync,
// synchronous_commit, full_page_writes): the crash case F8 stops the server immediately and
// relies on WAL recovery to bring back every acknowledged commit, which a cluster tuned for speed
// would silently lose.
//
// Three providers exist, and which one runs a cluster is chosen explicitly, never by what
// happens to be installed or reachable:
//
//   - Docker: with the option [WithDocker], or when the environment variable LEASEFENCE_PG_DOCKER
//     is set ("1" for [DefaultDockerImage], otherwise the image to run, such as
//     [LocalDockerImage]), the cluster runs in a container of the Docker engine named by
//     DOCKER_HOST (default: the local socket), with the host's network, listening on 127.0.0.1,
//     its data directory bind-mounted from this machine. The API is the same as for a local
//     cluster, RestartImmediate included. If no engine answers, Start fails with [ErrNoDocker].
//     The option wins over both environment variables; both variables set is an error.
//   - External: if LEASEFENCE_PG_URL holds a postgres:// URL of a superuser on an existing
//     server, that server is used: nothing is started, and [Cluster.RestartImmediate] reports
//     [ErrNotSupported].
//   - Local, otherwise: a cluster is created with initdb from local PostgreSQL server binaries
//     and run as a child process on a loopback port. Without binaries, Start fails with
//     [ErrNoBinaries]; it does not switch to Docker by itself.
//
// [WithSSL] and [WithPasswordAuth] start a local cluster that requires SSL and passwords, for
// tests of a client's security settings (docs/security.md).
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Errors returned by this package. They are wrapped with details (which port, where binaries were
// looked for); match them with errors.Is.
var (
	// ErrNoBinaries means initdb and postgres were not found. The wrapping error lists where
	// pgtemp looked and what to install.
	ErrNoBinaries = errors.New("pgtemp: PostgreSQL server binaries not found")
	// ErrPortInUse means the TCP port on 127.0.0.1 was taken, either before pgtemp started
	// or by the time postgres tried to bind it.
	ErrPortInUse = errors.New("pgtemp: port already in use")
	// ErrNotSupported means the provider cannot do the operation, for example
	// RestartImmediate on an external server.
	ErrNotSupported = errors.New("pgtemp: not supported by this provider")
	// ErrInvalidOption means an Option was given a value it cannot use (WithPort, WithSetting).
	ErrInvalidOption = errors.New("pgtemp: invalid option")
)

const (
	// envURL selects the external provider.
	envURL = "LEASEFENCE_PG_URL"
	// envBinDir names the directory holding initdb and postgres.
	envBinDir = "LEASEFENCE_PG_BINDIR"

	// startTimeout bounds Start and the restart half of RestartImmediate. initdb with fsync on
	// takes a few seconds on a slow disk and WAL recovery after an immediate stop is usually
	// well under a second, so a minute only expires when something is really wrong.
	startTimeout = 60 * time.Second

	loopback = "127.0.0.1"
	// superuser is the role initdb -U creates and every DSN logs in as.
	superuser = "postgres"
	// maintenanceDB is where CreateDatabase connects, so it never sits in the database it drops.
	maintenanceDB = "postgres"
)

// Option configures Start.
type Option func(*config)

type config struct {
	port     int
	binDir   string
	log      io.Writer
	settings []setting

	// docker and dockerImage are WithDocker's (docker_options.go).
	docker      bool
	dockerImage string

	// ssl and passwordAuth are WithSSL's and WithPasswordAuth's (security.go).
	ssl          *sslFiles
	passwordAuth bool
}

// setting is one server parameter given with WithSetting.
type setting struct{ name, value string }

// WithPort makes the cluster listen on the given port of 127.0.0.1 instead of a free port picked
// by the kernel (for the Docker provider too: the container shares the host's network). If the
// port is taken, Start fails with an error wrapping ErrPortInUse. Port 0 means the default. The
// external provider ignores it.
func WithPort(port int) Option {
	return func(c *config) { c.port = port }
}

// WithBinDir names the directory holding initdb and postgres. It takes precedence over every
// other place pgtemp looks, and if it lacks them Start fails with ErrNoBinaries rather than
// silently using another installation. The external provider ignores it.
func WithBinDir(dir string) Option {
	return func(c *config) { c.binDir = dir }
}

// WithSetting starts the server with the parameter name set to value (postgres -c name=value),
// after pgtemp's own settings, so it overrides them: a test can run the library on a cluster
// whose default_transaction_isolation is serializable, or whose synchronous_commit or even fsync
// is off, to check that the library copes or refuses. It applies across restarts. A name that
// is not a parameter name (letters, digits, '_' and '.') makes Start fail with an error wrapping
// ErrInvalidOption; PostgreSQL itself rejects unknown parameters and bad values at start. The
// external provider cannot change a running server's settings: Start fails there with an error
// wrapping ErrNotSupported rather than silently running without them.
func WithSetting(name, value string) Option {
	return func(c *config) { c.settings = append(c.settings, setting{name, value}) }
}

// WithLog sends progress lines ("pgtemp: initdb ...", "pgtemp: started ... in 1.2s") to w.
// The default discards them. Writes to w are serialized.
func WithLog(w io.Writer) Option {
	return func(c *config) {
		if w == nil {
			w = io.Discard
		}
		c.log = w
	}
}

// Cluster is a running PostgreSQL server: a throwaway local cluster, a throwaway cluster in a
// Docker container, or an external server named by LEASEFENCE_PG_URL. Its methods are safe for concurrent use.
type Cluster struct {
	logMu sync.Mutex
	log   io.Writer

	host       string
	port       int
	version    string
	versionNum int
	ssl        bool // WithSSL: DSN asks for sslmode=require

	// Exactly one of local, external and docker is set.
	local    *server
	external *externalServer
	docker   *dockerServer

	// dbMu serializes CreateDatabase: CREATE DATABASE copies template1 and concurrent copies
	// can fail with "source database is being accessed by other users".
	dbMu sync.Mutex

	// mu serializes RestartImmediate and Stop, so Stop never races a restart half way through.
	mu      sync.Mutex
	stopped atomic.Bool
	stopErr error
}

// Start starts a cluster, or connects to the external server named by LEASEFENCE_PG_URL, and
// returns when it accepts connections. ctx bounds the start only (at most one minute by default);
// the cluster runs until Stop. On error nothing is left running and no files are left behind.
//
// As root, the local provider runs initdb and postgres as the OS user "postgres", because
// PostgreSQL refuses to run as root.
func Start(ctx context.Context, opts ...Option) (*Cluster, error) {
	cfg := config{log: io.Discard}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pgtemp: start: %w", err)
	}
	if cfg.port < 0 || cfg.port > 65535 {
		return nil, fmt.Errorf("pgtemp: WithPort(%d): not a TCP port: %w", cfg.port, ErrInvalidOption)
	}
	for _, st := range cfg.settings {
		if !isParamName(st.name) {
			return nil, fmt.Errorf("pgtemp: WithSetting(%q): not a parameter name: %w", st.name, ErrInvalidOption)
		}
	}
	if cfg.ssl != nil {
		if err := cfg.ssl.load(); err != nil {
			return nil, err
		}
	}

	useDocker, image, err := cfg.dockerChoice()
	if err != nil {
		return nil, err
	}

	c := &Cluster{log: cfg.log}
	if useDocker {
		if err := cfg.refuseSecurity("the Docker provider"); err != nil {
			return nil, err
		}
		// Not under startTimeout yet: pulling an image may take longer; startDocker applies it
		// to the start proper.
		d, info, err := startDocker(ctx, cfg, image, c.logf)
		if err != nil {
			return nil, err
		}
		c.docker = d
		c.host, c.port = loopback, d.port()
		c.version, c.versionNum = info.version, info.versionNum
		return c, nil
	}

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if raw := getenv(envURL); raw != "" {
		if len(cfg.settings) > 0 {
			return nil, fmt.Errorf("pgtemp: WithSetting(%q) needs a cluster pgtemp starts, not %s: %w",
				cfg.settings[0].name, envURL, ErrNotSupported)
		}
		if err := cfg.refuseSecurity(envURL); err != nil {
			return nil, err
		}
		ext, info, err := startExternal(ctx, raw, c.logf)
		if err != nil {
			return nil, err
		}
		c.external = ext
		c.host, c.port = ext.host, ext.port
		c.version, c.versionNum = info.version, info.versionNum
		return c, nil
	}

	s, info, err := startLocal(ctx, cfg, c.logf)
	if err != nil {
		return nil, err
	}
	c.local = s
	c.host, c.port = loopback, s.port
	c.ssl = cfg.ssl != nil
	c.version, c.versionNum = info.version, info.versionNum
	return c, nil
}

// isParamName reports whether name can be a PostgreSQL parameter name (custom ones have a dot).
func isParamName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// StartTB is Start for tests: it fails the test with tb.Fatal if the cluster cannot start (a
// missing PostgreSQL is a broken test environment, not a reason to skip), and registers Stop with
// tb.Cleanup.
func StartTB(tb testing.TB, opts ...Option) *Cluster {
	tb.Helper()
	c, err := Start(tb.Context(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("pgtemp: stop: %v", err)
		}
	})
	return c
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Host returns the host the server listens on: "127.0.0.1" for a local cluster, the URL's host
// for an external server.
func (c *Cluster) Host() string { return c.host }

// DSN returns a URL connecting as the superuser to the given database, such as
// "postgres://postgres@127.0.0.1:5433/res26?sslmode=disable" (sslmode=require with WithSSL).
// Both pgx and lib/pq accept it. For an external server it is LEASEFENCE_PG_URL with the
// database replaced.
func (c *Cluster) DSN(database string) string {
	if c.external != nil {
		return c.external.dsn(database)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     loopback + ":" + strconv.Itoa(c.port),
		Path:     "/" + database,
		RawQuery: "sslmode=" + sslMode(c.ssl),
	}
	return u.String()
}

// Version returns the server's server_version, for example "15.18 (Debian 15.18-0+deb12u1)".
func (c *Cluster) Version() string { return c.version }

// DataDir returns the cluster's data directory, or "" for an external server. The server log,
// postgres.log, is next to it. For a cluster in a Docker container it is a directory of this
// machine, mounted at the same path in the container.
func (c *Cluster) DataDir() string {
	if c.docker != nil {
		return c.docker.dataDirPath()
	}
	if c.local == nil {
		return ""
	}
	return c.local.dataDir
}

// External reports whether the cluster is an external server from LEASEFENCE_PG_URL.
func (c *Cluster) External() bool { return c.external != nil }

// CreateDatabase creates an empty database called name, dropping any existing one of that name
// first (and disconnecting its sessions), so each run starts from a clean database. name is
// quoted, so any string is a valid name.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("pgtemp: CreateDatabase: empty database name")
	}
	if c.stopped.Load() {
		return errors.New("pgtemp: CreateDatabase: cluster stopped")
	}
	c.dbMu.Lock()
	defer c.dbMu.Unlock()

	conn, err := pgx.Connect(ctx, c.maintenanceDSN())
	if err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %q: %w", name, err)
	}
	defer closeConn(conn)
	if c.external != nil {
		// Record before dropping: if CREATE fails half way, Stop still tries to clean up.
		c.external.remember(name)
	}
	if err := dropDatabase(ctx, conn, c.versionNum, name); err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %q: %w", name, err)
	}
	return nil
}

// RestartImmediate crashes the server and starts it again: it sends SIGQUIT to the postmaster,
// which is exactly what "pg_ctl stop -m immediate" does (immediate shutdown: no checkpoint,
// backends killed), waits for it to exit, and starts postgres again on the same data directory and
// port, so the next start recovers from the WAL. It returns when the server accepts connections
// again; downtime is the time from SIGQUIT to ready. On error the cluster may be left down; Stop
// still cleans up.
//
// In a Docker container the postmaster is the container's PID 1: SIGQUIT ends it and the
// container, which is then started again on the same data directory (bind-mounted) and port.
//
// For an external server it returns an error wrapping ErrNotSupported.
func (c *Cluster) RestartImmediate(ctx context.Context) (downtime time.Duration, err error) {
	if c.external != nil {
		return 0, &sentinelError{
			sentinel: ErrNotSupported,
			msg:      "pgtemp: RestartImmediate: external server (LEASEFENCE_PG_URL): cannot crash it",
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.Load() {
		return 0, errors.New("pgtemp: RestartImmediate: cluster stopped")
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if c.docker != nil {
		return c.docker.restartImmediate(ctx)
	}
	return c.local.restartImmediate(ctx)
}

// Stop shuts the server down and removes its files (and its container, for the Docker
// provider); for an external server it drops the
// databases this Cluster created (best effort). It is idempotent and safe to call concurrently:
// later calls wait for the first and return its result.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.Load() {
		return c.stopErr
	}
	c.stopped.Store(true)
	if c.external != nil {
		c.external.stop(c.versionNum)
		return nil
	}
	if c.docker != nil {
		c.stopErr = c.docker.shutdown()
		return c.stopErr
	}
	c.stopErr = c.local.shutdown()
	return c.stopErr
}

func (c *Cluster) maintenanceDSN() string {
	if c.external != nil {
		return c.external.maintenanceDSN()
	}
	return c.DSN(maintenanceDB)
}

func (c *Cluster) logf(format string, args ...any) {
	c.logMu.Lock()
	defer c.logMu.Unlock()
	fmt.Fprintf(c.log, "pgtemp: "+format+"\n", args...)
}

// serverInfo is what a provider learns from the running server.
type serverInfo struct {
	version    string
	versionNum int
}

// queryServerInfo reads the version once, on the connection that proved the server ready.
func queryServerInfo(ctx context.Context, conn *pgx.Conn) (serverInfo, error) {
	var info serverInfo
	var num string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&info.version); err != nil {
		return info, err
	}
	if err := conn.QueryRow(ctx, "SHOW server_version_num").Scan(&num); err != nil {
		return info, err
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return info, fmt.Errorf("server_version_num %q: %w", num, err)
	}
	info.versionNum = n
	return info, nil
}

// dropDatabase drops name if it exists, ending its sessions first: a leftover connection from a
// previous run must not make the recreate fail.
func dropDatabase(ctx context.Context, conn *pgx.Conn, versionNum int, name string) error {
	ident := pgx.Identifier{name}.Sanitize()
	if versionNum >= 130000 {
		_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		return err
	}
	// Before PostgreSQL 13 there is no WITH (FORCE); a session connecting between these two
	// statements can still make the drop fail, which is acceptable for test databases.
	if _, err := conn.Exec(ctx,
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
		name); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident)
	return err
}

// closeConn closes conn even when the caller's context is already done, so the server sees a
// clean Terminate instead of a dropped socket where possible.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// sentinelError has its own specific message yet matches a sentinel with errors.Is, so the text
// says exactly what went wrong without repeating the sentinel's generic words.
type sentinelError struct {
	sentinel error
	msg      string
	cause    error
}

func (e *sentinelError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *sentinelError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}
