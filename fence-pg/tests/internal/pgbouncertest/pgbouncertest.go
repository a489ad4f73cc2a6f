// Package pgbouncertest starts a throwaway PgBouncer in front of a pgtemp
// cluster, for fence-pg's tests behind a transaction pooler.
//
// The pooler runs in pool_mode=transaction — a server connection belongs
// to a client for one transaction only, so session state (LISTEN, prepared
// statements, session-level SET) does not follow the client — listens on
// 127.0.0.1 only, on a free port, and logs every client in through an
// auth_file with auth_type=trust. Every database of the cluster is reachable
// under its own name (a "*" fallback entry), so DSN works for any database
// the cluster has. As root the pooler runs as the OS user "postgres" (like
// pgtemp's server): PgBouncer refuses to run as root.
//
// The process is pgbouncertest's child in its own process group: Stop ends
// it (SIGTERM, then SIGKILL to the group) and removes its files, and on
// Linux the kernel ends it if the test binary dies.
package pgbouncertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// ErrNoBinary means the pgbouncer program was not found; the wrapping
// error says where pgbouncertest looked and what to install.
var ErrNoBinary = errors.New("pgbouncertest: pgbouncer not found")

const (
	// EnvBinary names the pgbouncer program explicitly.
	EnvBinary = "LEASEFENCE_PGBOUNCER"

	loopback = "127.0.0.1"
	// adminDB is PgBouncer's console database.
	adminDB = "pgbouncer"

	installHint = "Debian/Ubuntu: apt-get install -y pgbouncer (as root; scripts/ensure-deps.sh does it); " +
		"Fedora/RHEL: dnf install pgbouncer; macOS: brew install pgbouncer; " +
		"or set " + EnvBinary + " to the pgbouncer program"

	// DefaultPoolSize is the number of server connections per database and
	// user: the conformance suite's 16 concurrent lease clients, a few
	// resource transactions held open (F6b) and a long transaction (F2)
	// fit, with room.
	DefaultPoolSize = 40
	// maxClientConn bounds client connections: the suite opens a pool per
	// lease client and per resource, and holder processes open their own.
	maxClientConn = 1000

	startTimeout = 30 * time.Second
	// portAttempts bounds retries when a kernel-picked port is taken between
	// closing our probe listener and pgbouncer binding it.
	portAttempts = 3
)

// Option configures Start.
type Option func(*config)

type config struct {
	poolSize int
	log      io.Writer
	settings [][2]string
}

// WithPoolSize sets default_pool_size, the server connections per database
// and user (DefaultPoolSize by default).
func WithPoolSize(n int) Option { return func(c *config) { c.poolSize = n } }

// WithSetting adds name = value to the [pgbouncer] section after
// pgbouncertest's own settings (PgBouncer takes the last value of a name).
func WithSetting(name, value string) Option {
	return func(c *config) { c.settings = append(c.settings, [2]string{name, value}) }
}

// WithLog sends progress lines to w; the default discards them.
func WithLog(w io.Writer) Option {
	return func(c *config) {
		if w == nil {
			w = io.Discard
		}
		c.log = w
	}
}

// Bouncer is a running PgBouncer in pool_mode=transaction in front of one
// cluster.
type Bouncer struct {
	bin      string
	version  string
	user     *osUser
	tmpDir   string
	iniPath  string
	logPath  string
	port     int
	dbUser   string
	backend  string // host:port of the cluster
	logMu    sync.Mutex
	logw     io.Writer
	stopOnce sync.Once
	stopErr  error
	proc     *process
}

// Start starts PgBouncer in front of cluster and returns when its console
// answers and a session through it reaches the cluster. ctx bounds the
// start only. On error nothing is left running and no files are left
// behind.
func Start(ctx context.Context, cluster *pgtemp.Cluster, opts ...Option) (*Bouncer, error) {
	cfg := config{poolSize: DefaultPoolSize, log: io.Discard}
	for _, o := range opts {
		o(&cfg)
	}
	if cluster == nil {
		return nil, errors.New("pgbouncertest: nil cluster")
	}
	if cfg.poolSize < 1 {
		return nil, fmt.Errorf("pgbouncertest: WithPoolSize(%d): must be at least 1", cfg.poolSize)
	}
	for _, st := range cfg.settings {
		if !settingName.MatchString(st[0]) || strings.ContainsAny(st[1], "\n\r") {
			return nil, fmt.Errorf("pgbouncertest: WithSetting(%q, %q): not a setting", st[0], st[1])
		}
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	version, err := binaryVersion(ctx, bin)
	if err != nil {
		return nil, err
	}
	// The cluster's own DSN says which role (and, for an external server,
	// which password) a session logs in with.
	u, err := url.Parse(cluster.DSN("postgres"))
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: the cluster's DSN: %w", err)
	}
	dbUser := u.User.Username()
	password, _ := u.User.Password()
	osu, err := serverUser()
	if err != nil {
		return nil, err
	}

	tmp, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: %w", err)
	}
	b := &Bouncer{
		bin: bin, version: version, user: osu, tmpDir: tmp,
		iniPath: filepath.Join(tmp, "pgbouncer.ini"), logPath: filepath.Join(tmp, "pgbouncer.log"),
		dbUser: dbUser, backend: fmt.Sprintf("%s:%d", cluster.Host(), cluster.Port()), logw: cfg.log,
	}
	ok := false
	defer func() {
		if !ok {
			if b.proc != nil {
				b.proc.stop(5 * time.Second)
			}
			_ = os.RemoveAll(tmp)
		}
	}()
	// The auth file: the one role, with the cluster's password if its DSN
	// has one (PgBouncer logs in to the server with it); trust lets clients in
	// without one.
	userlist := fmt.Sprintf("%s %s\n", quote(dbUser), quote(password))
	if err := os.WriteFile(filepath.Join(tmp, "userlist.txt"), []byte(userlist), 0o600); err != nil {
		return nil, fmt.Errorf("pgbouncertest: %w", err)
	}
	if err := b.chownAll(); err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		if b.port, err = freePort(); err != nil {
			return nil, err
		}
		if err := b.writeConfig(cluster, cfg); err != nil {
			return nil, err
		}
		err = b.startAndWait(ctx)
		if err == nil {
			break
		}
		if attempt == portAttempts || !errors.Is(err, errPortTaken) {
			return nil, err
		}
		b.logf("port %d was taken before pgbouncer could bind it; trying another", b.port)
	}
	ok = true
	b.logf("started %s on %s:%d in front of %s (pool_mode=transaction, default_pool_size=%d, dir %s)",
		version, loopback, b.port, b.backend, cfg.poolSize, tmp)
	return b, nil
}

// StartTB is Start for tests: it fails the test if PgBouncer cannot start
// (a missing pgbouncer is a broken test environment, not a reason to skip)
// and registers Stop with tb.Cleanup.
func StartTB(tb testing.TB, cluster *pgtemp.Cluster, opts ...Option) *Bouncer {
	tb.Helper()
	b, err := Start(tb.Context(), cluster, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Stop(); err != nil {
			tb.Errorf("pgbouncertest: stop: %v", err)
		}
	})
	return b
}

// Port returns the port PgBouncer listens on, on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Version returns what `pgbouncer --version` printed, e.g. "PgBouncer 1.18.0".
func (b *Bouncer) Version() string { return b.version }

// LogPath returns PgBouncer's log (its stdout and stderr).
func (b *Bouncer) LogPath() string { return b.logPath }

// DSN returns a URL that reaches database through the pooler as the
// cluster's role, with params (such as "default_query_exec_mode=exec")
// added to its query: "postgres://postgres@127.0.0.1:6432/res?sslmode=disable".
func (b *Bouncer) DSN(database string, params ...string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(b.dbUser),
		Host:     fmt.Sprintf("%s:%d", loopback, b.port),
		Path:     "/" + database,
		RawQuery: strings.Join(append([]string{"sslmode=disable"}, params...), "&"),
	}
	return u.String()
}

// Stop ends PgBouncer (SIGTERM, an immediate shutdown: client connections
// are closed; SIGKILL to its process group if it lingers) and removes its
// files. It is idempotent.
func (b *Bouncer) Stop() error {
	b.stopOnce.Do(func() {
		how := b.proc.stop(10 * time.Second)
		if err := os.RemoveAll(b.tmpDir); err != nil {
			b.stopErr = fmt.Errorf("pgbouncertest: removing %s: %w", b.tmpDir, err)
			return
		}
		b.logf("stopped (%s), removed %s", how, b.tmpDir)
	})
	return b.stopErr
}

// Admin runs one command on PgBouncer's console (SHOW POOLS, SHOW CONFIG,
// ...) and returns its rows as text.
func (b *Bouncer) Admin(ctx context.Context, command string) ([][]string, error) {
	conn, err := pgconn.Connect(ctx, b.DSN(adminDB))
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: console: %w", err)
	}
	defer closeConn(conn)
	results, err := conn.Exec(ctx, command).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("pgbouncertest: console %q: %w", command, err)
	}
	var rows [][]string
	for _, r := range results {
		for _, row := range r.Rows {
			var cells []string
			for _, c := range row {
				cells = append(cells, string(c))
			}
			rows = append(rows, cells)
		}
	}
	return rows, nil
}

func (b *Bouncer) writeConfig(cluster *pgtemp.Cluster, cfg config) error {
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n", cluster.Host(), cluster.Port())
	for _, kv := range append([][2]string{
		{"listen_addr", loopback}, // test traffic stays on loopback
		{"listen_port", strconv.Itoa(b.port)},
		{"unix_socket_dir", ""}, // no socket: nothing but 127.0.0.1
		{"pool_mode", "transaction"},
		{"auth_type", "trust"},
		{"auth_file", filepath.Join(b.tmpDir, "userlist.txt")},
		{"admin_users", b.dbUser},
		{"default_pool_size", strconv.Itoa(cfg.poolSize)},
		{"max_client_conn", strconv.Itoa(maxClientConn)},
		// lib/pq sends extra_float_digits in its startup packet.
		{"ignore_startup_parameters", "extra_float_digits"},
		// After a server crash (F8) reconnect soon; clients that come in
		// meanwhile get an error at once instead of waiting.
		{"server_login_retry", "1"},
		{"query_wait_timeout", "60"},
		// TLS to the server when it offers it (an external server), none to clients.
		{"server_tls_sslmode", "prefer"},
		{"pidfile", ""},
		{"logfile", ""},
		{"log_connections", "0"},
		{"log_disconnections", "0"},
	}, cfg.settings...) {
		fmt.Fprintf(&ini, "%s = %s\n", kv[0], kv[1])
	}
	if err := os.WriteFile(b.iniPath, []byte(ini.String()), 0o600); err != nil {
		return fmt.Errorf("pgbouncertest: %w", err)
	}
	return b.chownAll()
}

// startAndWait starts pgbouncer and waits until a session through it
// reaches the cluster. On failure nothing of this run is left running.
func (b *Bouncer) startAndWait(ctx context.Context) error {
	p, offset, err := b.spawn()
	if err != nil {
		return err
	}
	if err := b.waitReady(ctx, p, offset); err != nil {
		p.stop(5 * time.Second)
		return err
	}
	b.proc = p
	return nil
}

var (
	errPortTaken = errors.New("port taken")
	settingName  = regexp.MustCompile(`^[a-z_]+$`)
)

// waitReady polls the console until it answers, then checks that this
// pooler is ours (its listen_port and config file) and that a session
// through it reaches the cluster.
func (b *Bouncer) waitReady(ctx context.Context, p *process, offset int64) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgconn.Connect(attemptCtx, b.DSN(adminDB))
		cancel()
		if err == nil {
			closeConn(conn)
			return b.checkOurs(ctx)
		}
		lastErr = err
		select {
		case <-p.done:
			out := b.logSince(offset)
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("pgbouncertest: port %d: %w", b.port, errPortTaken)
			}
			return fmt.Errorf("pgbouncertest: pgbouncer exited during startup (%v); its log:\n%s", p.waitErr, lastLines(out, 20))
		case <-ctx.Done():
			return fmt.Errorf("pgbouncertest: pgbouncer on %s:%d not ready (last attempt: %v): %w; its log:\n%s",
				loopback, b.port, lastErr, ctx.Err(), lastLines(b.logSince(offset), 20))
		case <-tick.C:
		}
	}
}

// checkOurs makes sure the pooler that answered is the one just started
// (another one may have taken the port first) and that it reaches the
// cluster.
func (b *Bouncer) checkOurs(ctx context.Context) error {
	rows, err := b.Admin(ctx, "SHOW CONFIG")
	if err != nil {
		return err
	}
	ours := false
	for _, r := range rows {
		if len(r) >= 2 && r[0] == "conffile" && r[1] == b.iniPath {
			ours = true
		}
	}
	if !ours {
		return fmt.Errorf("pgbouncertest: port %d: another pgbouncer answers there: %w", b.port, errPortTaken)
	}
	conn, err := pgconn.Connect(ctx, b.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgbouncertest: a session through pgbouncer on port %d to %s: %w", b.port, b.backend, err)
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		return fmt.Errorf("pgbouncertest: a statement through pgbouncer on port %d to %s: %w", b.port, b.backend, err)
	}
	return nil
}

func (b *Bouncer) logf(format string, args ...any) {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	fmt.Fprintf(b.logw, "pgbouncertest: "+format+"\n", args...)
}

// logSince returns pgbouncer's log from offset on, at most its last 64 KiB.
func (b *Bouncer) logSince(offset int64) string {
	f, err := os.Open(b.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	const limit = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > limit {
		offset = fi.Size() - limit
	}
	data, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<62))
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return string(data)
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

// quote writes an auth_file field: double quotes, an inner quote doubled.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// findBinary looks for pgbouncer: EnvBinary (authoritative when set), PATH,
// then the usual places (Debian puts it in /usr/sbin, which a non-root PATH
// may lack).
func findBinary() (string, error) {
	if p := strings.TrimSpace(os.Getenv(EnvBinary)); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%w: %s=%s is not an executable file", ErrNoBinary, EnvBinary, p)
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	places := []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer", "/opt/homebrew/bin/pgbouncer"}
	for _, p := range places {
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: looked on PATH and in %s. To install: %s", ErrNoBinary, strings.Join(places, ", "), installHint)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

func binaryVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgbouncertest: %s --version: %v: %s", bin, err, strings.TrimSpace(string(out)))
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first, nil
}

func closeConn(conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
