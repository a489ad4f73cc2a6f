//go:build unix

package pgtemp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// patroniHint is what a user without Patroni needs to read.
const patroniHint = "Debian/Ubuntu: apt-get install -y patroni etcd-server (as root; the tests start their own processes, " +
	"the packaged services need not run); or set LEASEFENCE_PATRONI and LEASEFENCE_ETCD to the programs"

// The three members of a PatroniCluster, each on a loopback address of its own, as three hosts of
// one subnet would be: PostgreSQL and Patroni's REST API of member i listen on 127.0.0.(i+1).
var patroniHosts = [...]string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}

// patroniTiming is the Patroni configuration that decides how fast a failover happens: the
// leader key lives ttl seconds without a renewal, a member runs its loop every loop_wait seconds,
// and gives up on etcd or PostgreSQL after retry_timeout. Patroni's defaults are 30, 10 and 10;
// these keep a failover (the ttl, then one loop) near 10 s, so that a test sees several. A leader
// that retries a call for the whole retry_timeout, twice, still renews its key within the ttl.
const (
	patroniTTL          = 10
	patroniLoopWait     = 1
	patroniRetryTimeout = 4
)

// patroniStartTimeout bounds StartPatroni: a member's initdb, two base backups and the sync
// standby's election take about 10 s on a quiet machine and up to a minute on a busy one.
const patroniStartTimeout = 3 * time.Minute

// PatroniCluster is three PostgreSQL members managed by Patroni (the HA manager that decides
// whom to promote, rewinds a failed primary and brings it back), with an etcd server of its own
// as Patroni's store of leader keys. Member i listens on 127.0.0.(i+1); etcd on 127.0.0.1; every
// port is picked free. As root, PostgreSQL and Patroni run as the OS user postgres. Patroni and
// PostgreSQL start with a clean environment (PATH, HOME and LC_ALL only): an inherited PGPASSWORD
// or PGHOST would steer Patroni's own connections (pg_basebackup's, pg_rewind's).
//
// Durability stays on (fsync, synchronous_commit=on). Synchronous: Patroni's synchronous_mode is
// on (not strict), so Patroni names one replica in synchronous_standby_names and promotes no
// member that is not that synchronous standby. Asynchronous: synchronous_mode is off and Patroni
// promotes a replica whose last published lag is within maximum_lag_on_failover (Patroni's
// default, 1 MiB).
//
// Clients reach the primary as users do, by asking Patroni who leads ([PatroniCluster.Leader],
// the REST API's /cluster) or with a multi-host DSN ([PatroniCluster.DSN],
// target_session_attrs=read-write).
//
// A failover in a test:
//
//	pc, err := pgtemp.StartPatroni(ctx, true)
//	defer pc.Stop()
//	old, err := pc.Leader(ctx)
//	// ... commits on old.DSN("postgres") ...
//	err = pc.KillMember(old)               // SIGKILL to its Patroni and its PostgreSQL: the host is gone
//	next, err := pc.WaitLeader(ctx, old)   // Patroni promotes a replica once the leader key expires
//	// ... next.DSN("postgres") serves writes ...
//
// Its methods are safe for concurrent use.
type PatroniCluster struct {
	dir         string
	synchronous bool
	scope       string
	bins        binaries
	patroni     string
	version     string
	user        *osUser

	etcd     *exec.Cmd
	etcdURL  string
	etcdDone chan struct{}

	logMu sync.Mutex
	log   io.Writer

	mu      sync.Mutex
	members [len(patroniHosts)]*patroniMember
	held    []int  // the WAL senders HoldBackReplicas stopped, until their member is killed or Stop
	heldOn  string // the member they belong to
	stopped bool
	stopErr error
}

type patroniMember struct {
	PatroniMember
	api     string // Patroni's REST API, host:port
	dir     string
	dataDir string
	config  string

	cmd  *exec.Cmd // nil once killed or stopped
	done chan struct{}
}

// StartPatroni starts an etcd server and three Patroni members, and returns once one leads and
// both others stream from it (synchronous: one of them as Patroni's synchronous standby, in the
// leader's pg_stat_replication with sync_state 'sync'). ctx bounds the start only (at most three
// minutes). On error nothing is left running and no files are left behind. WithBinDir and
// WithLog apply; WithPort, WithSetting, WithDocker and the security options do not.
func StartPatroni(ctx context.Context, synchronous bool, opts ...Option) (_ *PatroniCluster, err error) {
	cfg := config{log: io.Discard}
	for _, opt := range opts {
		opt(&cfg)
	}
	switch {
	case cfg.port != 0:
		return nil, fmt.Errorf("pgtemp: StartPatroni: WithPort(%d): a Patroni cluster's ports are picked free: %w", cfg.port, ErrInvalidOption)
	case len(cfg.settings) > 0:
		return nil, fmt.Errorf("pgtemp: StartPatroni: WithSetting(%q): Patroni owns the servers' settings: %w", cfg.settings[0].name, ErrInvalidOption)
	case cfg.docker:
		return nil, &sentinelError{sentinel: ErrNotSupported, msg: "pgtemp: StartPatroni: WithDocker: a Patroni cluster runs local binaries only"}
	}
	if err := cfg.refuseSecurity("StartPatroni"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pgtemp: StartPatroni: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, patroniStartTimeout)
	defer cancel()
	t0 := time.Now()

	pc := &PatroniCluster{synchronous: synchronous, log: cfg.log, scope: "pgtemp"}
	if pc.bins, err = findBinaries(ctx, cfg.binDir); err != nil {
		return nil, err
	}
	patroniBin, err1 := findProgram("LEASEFENCE_PATRONI", "patroni")
	etcdBin, err2 := findProgram("LEASEFENCE_ETCD", "etcd")
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	pc.patroni = patroniBin
	out, err := exec.CommandContext(ctx, patroniBin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %s --version: %w", patroniBin, err)
	}
	pc.version = strings.TrimSpace(string(out)) // "patroni 3.0.2"
	if pc.user, err = serverUser(); err != nil {
		return nil, err
	}
	if pc.dir, err = makeTempDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = pc.Stop()
		}
	}()
	if err := pc.startEtcd(ctx, etcdBin); err != nil {
		return nil, err
	}
	for i, host := range patroniHosts {
		m, err := pc.newMember(i, host)
		if err != nil {
			return nil, err
		}
		pc.members[i] = m
	}
	if pc.user != nil {
		// The members' directories are the server user's; etcd's stays ours.
		if err := os.Chown(pc.dir, int(pc.user.uid), int(pc.user.gid)); err != nil {
			return nil, fmt.Errorf("pgtemp: %w", err)
		}
		if err := checkTraversable(pc.dir, pc.user); err != nil {
			return nil, err
		}
		for _, m := range pc.members {
			if err := chownTree(m.dir, pc.user); err != nil {
				return nil, err
			}
		}
	}
	for _, m := range pc.members {
		if err := pc.spawn(m); err != nil {
			return nil, err
		}
	}
	if err := pc.waitHealthy(ctx); err != nil {
		return nil, err
	}
	l, _ := pc.Leader(ctx)
	pc.logf("Patroni cluster started in %.1fs: leader %s, %s replication, etcd %s", time.Since(t0).Seconds(), l, pc.mode(), pc.etcdURL)
	return pc, nil
}

func (pc *PatroniCluster) mode() string {
	if pc.synchronous {
		return "synchronous"
	}
	return "asynchronous"
}

// findProgram looks for a program: the environment variable env names it, else PATH, else
// /usr/bin and /usr/sbin.
func findProgram(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("pgtemp: %s=%s is not an executable file (%s): %w", env, p, patroniHint, ErrNoPatroni)
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgtemp: the %s program was not found on PATH or in /usr/bin (%s): %w", name, patroniHint, ErrNoPatroni)
}

func chownTree(dir string, u *osUser) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(u.uid), int(u.gid))
	})
}

// startEtcd starts the etcd server Patroni keeps its leader key in, on 127.0.0.1, with its WAL
// fsynced as always (etcd has no switch to turn that off that this package would use).
func (pc *PatroniCluster) startEtcd(ctx context.Context, bin string) error {
	client, err1 := freePortOn(loopback)
	peer, err2 := freePortOn(loopback)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	pc.etcdURL = fmt.Sprintf("http://%s:%d", loopback, client)
	peerURL := fmt.Sprintf("http://%s:%d", loopback, peer)
	logf, err := os.Create(filepath.Join(pc.dir, "etcd.log"))
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--name", "dcs", "--data-dir", filepath.Join(pc.dir, "etcd"),
		"--listen-client-urls", pc.etcdURL, "--advertise-client-urls", pc.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "dcs="+peerURL, "--initial-cluster-state", "new")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + pc.dir, "LC_ALL=C"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(nil, syscall.SIGKILL)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtemp: starting etcd: %w", err)
	}
	pc.etcd, pc.etcdDone = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(pc.etcdDone) }()
	for {
		var health struct{ Health string }
		if err := getJSON(ctx, pc.etcdURL+"/health", &health); err == nil && health.Health == "true" {
			return nil
		}
		select {
		case <-pc.etcdDone:
			return fmt.Errorf("pgtemp: etcd exited at start: %s", lastLines(readFile(filepath.Join(pc.dir, "etcd.log")), 20))
		case <-ctx.Done():
			return fmt.Errorf("pgtemp: etcd did not answer on %s: %w", pc.etcdURL, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return string(b)
}

// newMember writes member i's directory and Patroni configuration.
func (pc *PatroniCluster) newMember(i int, host string) (*patroniMember, error) {
	pgPort, err1 := freePortOn(host)
	apiPort, err2 := freePortOn(host)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	m := &patroniMember{PatroniMember: PatroniMember{Name: fmt.Sprintf("pg%d", i+1), Host: host, Port: pgPort}}
	m.api = net.JoinHostPort(host, strconv.Itoa(apiPort))
	m.dir = filepath.Join(pc.dir, m.Name)
	m.dataDir = filepath.Join(m.dir, "data")
	m.config = filepath.Join(m.dir, "patroni.yml")
	if err := os.MkdirAll(filepath.Join(m.dir, "log"), 0o700); err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	if err := os.WriteFile(m.config, []byte(pc.patroniConfig(m)), 0o600); err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	return m, nil
}

// patroniConfig is member m's patroni.yml. Everything is trusted on 127.0.0.0/8: the cluster is
// a throwaway one on loopback, as every pgtemp cluster. The bootstrap section is what the first
// member writes into etcd for all of them (the "dynamic configuration").
func (pc *PatroniCluster) patroniConfig(m *patroniMember) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) } // a YAML-safe quoted string
	return fmt.Sprintf(`scope: %[1]s
name: %[2]s
log:
  dir: %[3]s
  level: INFO
restapi:
  listen: %[4]s
  connect_address: %[4]s
etcd3:
  hosts: %[5]s
bootstrap:
  dcs:
    ttl: %[6]d
    loop_wait: %[7]d
    retry_timeout: %[8]d
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[9]t
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        wal_log_hints: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        fsync: 'on'
        synchronous_commit: 'on'
        full_page_writes: 'on'
  initdb:
  - encoding: UTF8
  - locale: C
  - auth-local: trust
  - auth-host: trust
  pg_hba:
  - host replication replicator 127.0.0.0/8 trust
  - host all all 127.0.0.0/8 trust
postgresql:
  # A member that comes back after a crash rejoins as a replica: rewound when it can be, else
  # copied afresh (a throwaway cluster has no data worth keeping apart).
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  listen: %[10]s
  connect_address: %[10]s
  data_dir: %[11]s
  bin_dir: %[12]s
  pgpass: %[13]s
  authentication:
    replication: {username: replicator, password: replicator}
    superuser: {username: %[14]s, password: %[14]s}
    rewind: {username: rewinder, password: rewinder}
  parameters:
    unix_socket_directories: %[15]s
    logging_collector: 'on'
    log_directory: %[16]s
    log_filename: postgresql.log
`, pc.scope, m.Name, q(filepath.Join(m.dir, "log")), m.api, strings.TrimPrefix(pc.etcdURL, "http://"),
		patroniTTL, patroniLoopWait, patroniRetryTimeout, pc.synchronous,
		net.JoinHostPort(m.Host, strconv.Itoa(m.Port)), q(m.dataDir), q(pc.bins.dir), q(filepath.Join(m.dir, "pgpass")),
		superuser, q(m.dir), q(filepath.Join(m.dir, "log")))
}

// spawn starts m's Patroni, which starts (and, the first time, creates) its PostgreSQL.
func (pc *PatroniCluster) spawn(m *patroniMember) error {
	out, err := os.OpenFile(filepath.Join(m.dir, "log", "patroni.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(pc.patroni, m.config)
	cmd.Dir = m.dir
	// A clean environment: see PatroniCluster.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + m.dir, "LC_ALL=C"}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr(pc.user, syscall.SIGKILL)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtemp: starting Patroni for %s: %w", m.Name, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	done := m.done
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// patroniView is what Patroni's REST API says about the cluster (GET /cluster).
type patroniView struct {
	Members []struct {
		Name     string `json:"name"`
		Role     string `json:"role"` // leader, replica, sync_standby
		State    string `json:"state"`
		Timeline int    `json:"timeline"`
	} `json:"members"`
}

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return json.Unmarshal(body, v)
}

// view asks the live members' REST APIs in turn for the cluster and returns the first answer.
func (pc *PatroniCluster) view(ctx context.Context) (patroniView, error) {
	var errs []error
	for _, m := range pc.liveMembers() {
		var v patroniView
		err := getJSON(ctx, "http://"+m.api+"/cluster", &v)
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return patroniView{}, errors.New("no member is running")
	}
	return patroniView{}, errors.Join(errs...)
}

func (pc *PatroniCluster) liveMembers() []*patroniMember {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var live []*patroniMember
	for _, m := range pc.members {
		if m != nil && m.cmd != nil {
			live = append(live, m)
		}
	}
	return live
}

func (pc *PatroniCluster) member(name string) *patroniMember {
	for _, m := range pc.members {
		if m != nil && m.Name == name {
			return m
		}
	}
	return nil
}

// Members returns the three members, in order.
func (pc *PatroniCluster) Members() []PatroniMember {
	var ms []PatroniMember
	for _, m := range pc.members {
		ms = append(ms, m.PatroniMember)
	}
	return ms
}

// Version is what the patroni program says of itself: "patroni 3.0.2".
func (pc *PatroniCluster) Version() string { return pc.version }

// Synchronous reports whether Patroni's synchronous_mode is on.
func (pc *PatroniCluster) Synchronous() bool { return pc.synchronous }

// DSN returns a multi-host postgres:// URL of database that connects to whichever member
// accepts writes (target_session_attrs=read-write), trying the members in order: how an
// application that knows the cluster's hosts reaches its primary without a proxy (pgx
// understands it).
func (pc *PatroniCluster) DSN(database string) string {
	var hosts []string
	for _, m := range pc.members {
		hosts = append(hosts, net.JoinHostPort(m.Host, strconv.Itoa(m.Port)))
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		superuser, strings.Join(hosts, ","), database)
}

// Leader returns the member Patroni names leader, once its PostgreSQL accepts a write. Like
// WaitLeader it waits until ctx ends.
func (pc *PatroniCluster) Leader(ctx context.Context) (PatroniMember, error) {
	return pc.WaitLeader(ctx, PatroniMember{})
}

// WaitLeader waits until Patroni names a leader other than not (the zero PatroniMember: any)
// and its PostgreSQL commits a transaction that takes a transaction id, and returns it. It waits
// until ctx ends.
func (pc *PatroniCluster) WaitLeader(ctx context.Context, not PatroniMember) (PatroniMember, error) {
	var last error
	for {
		m, err := pc.writableLeader(ctx)
		switch {
		case err != nil:
			last = err
		case m.Name == not.Name:
			last = fmt.Errorf("%s still leads", m.Name)
		default:
			return m, nil
		}
		select {
		case <-ctx.Done():
			return PatroniMember{}, fmt.Errorf("pgtemp: waiting for a Patroni leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (pc *PatroniCluster) writableLeader(ctx context.Context) (PatroniMember, error) {
	v, err := pc.view(ctx)
	if err != nil {
		return PatroniMember{}, err
	}
	m, err := pc.leaderOf(v)
	if err != nil {
		return PatroniMember{}, err
	}
	if err := commitOn(ctx, m.DSN(maintenanceDB)); err != nil {
		return PatroniMember{}, fmt.Errorf("leader %s: %w", m.Name, err)
	}
	return m, nil
}

// leaderOf returns the member v names its running leader.
func (pc *PatroniCluster) leaderOf(v patroniView) (PatroniMember, error) {
	for _, vm := range v.Members {
		if vm.Role != "leader" || vm.State != "running" {
			continue
		}
		if m := pc.member(vm.Name); m != nil {
			return m.PatroniMember, nil
		}
		return PatroniMember{}, fmt.Errorf("Patroni names an unknown leader %q", vm.Name)
	}
	return PatroniMember{}, errors.New("Patroni names no running leader")
}

// commitOn commits a transaction that takes a transaction id (a standby refuses it).
func commitOn(ctx context.Context, dsn string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "SELECT txid_current()")
	return err
}

// WaitHealthy waits until a leader accepts writes and both other members stream from it, one of
// them as the synchronous standby in synchronous mode: after a member was killed and restarted,
// until it has rejoined. It waits until ctx ends.
func (pc *PatroniCluster) WaitHealthy(ctx context.Context) error {
	return pc.waitHealthy(ctx)
}

func (pc *PatroniCluster) waitHealthy(ctx context.Context) error {
	var last error
	for {
		last = pc.healthy(ctx)
		if last == nil {
			return nil
		}
		for _, m := range pc.liveMembers() {
			select {
			case <-m.done:
				return fmt.Errorf("pgtemp: Patroni of %s exited: %s", m.Name, lastLines(readFile(filepath.Join(m.dir, "log", "patroni.out")), 20))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtemp: the Patroni cluster did not become healthy: %w (last: %v)\n%s", ctx.Err(), last, pc.logTails())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (pc *PatroniCluster) healthy(ctx context.Context) error {
	// What Patroni itself says: a running leader, every member running, and in synchronous mode
	// one named its synchronous standby in etcd (its switchover and failover go by that, not by
	// the server's pg_stat_replication).
	v, err := pc.view(ctx)
	if err != nil {
		return err
	}
	l, err := pc.leaderOf(v)
	if err != nil {
		return err
	}
	running, syncStandbys := 0, 0
	for _, m := range v.Members {
		if m.State == "running" {
			running++
		}
		if m.Role == "sync_standby" {
			syncStandbys++
		}
	}
	if running != len(pc.members) {
		return fmt.Errorf("Patroni shows %d of %d members running", running, len(pc.members))
	}
	if pc.synchronous && syncStandbys != 1 {
		return fmt.Errorf("Patroni names %d synchronous standbys", syncStandbys)
	}
	// What the leader's server says: it takes writes, and both others stream from it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, l.DSN(maintenanceDB))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var streaming, sync int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'streaming'), count(*) FILTER (WHERE sync_state = 'sync'),
		txid_current() FROM pg_stat_replication`).Scan(&streaming, &sync, nil); err != nil {
		return fmt.Errorf("leader %s: %w", l.Name, err)
	}
	if streaming != len(pc.members)-1 {
		return fmt.Errorf("%d of %d replicas stream from the leader %s", streaming, len(pc.members)-1, l.Name)
	}
	if pc.synchronous && sync != 1 {
		return fmt.Errorf("no synchronous standby yet (%d in sync_state 'sync')", sync)
	}
	return nil
}

// logTails is the end of every member's Patroni output, for a start that failed.
func (pc *PatroniCluster) logTails() string {
	var b strings.Builder
	for _, m := range pc.members {
		if m != nil {
			fmt.Fprintf(&b, "--- %s patroni:\n%s\n", m.Name, lastLines(readFile(filepath.Join(m.dir, "log", "patroni.out")), 10))
		}
	}
	return b.String()
}

// CreateDatabase creates database name on the leader and returns once every replica has replayed
// it: a replica that has not would answer a connection to it with "database does not exist",
// and pgx does not try a multi-host DSN's next host after that error.
func (pc *PatroniCluster) CreateDatabase(ctx context.Context, name string) error {
	l, err := pc.Leader(ctx)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, l.DSN(maintenanceDB))
	if err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %s: %w", name, err)
	}
	if _, _, err := pc.waitReplayed(ctx, conn); err != nil {
		return fmt.Errorf("pgtemp: CreateDatabase %s: %w", name, err)
	}
	return nil
}

// waitReplayed waits until every replica streaming from the leader conn is connected to has
// replayed the leader's current WAL position, and returns that position and the replicas' WAL
// senders.
func (pc *PatroniCluster) waitReplayed(ctx context.Context, conn *pgx.Conn) (lsn string, senders []int, err error) {
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return "", nil, err
	}
	for {
		var behind int
		if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid), '{}'), count(*) FILTER (WHERE replay_lsn IS NULL OR replay_lsn < $1::pg_lsn)
			FROM pg_stat_replication`, lsn).Scan(&senders, &behind); err != nil {
			return "", nil, err
		}
		if behind == 0 && len(senders) == len(pc.members)-1 {
			return lsn, senders, nil
		}
		select {
		case <-ctx.Done():
			return "", nil, fmt.Errorf("replicas did not replay %s (%d of %d streaming, %d behind): %w", lsn, len(senders), len(pc.members)-1, behind, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// HoldBackReplicas waits until every replica has replayed the leader's current WAL position, then
// stops the leader's WAL senders with SIGSTOP: from then on the leader acknowledges commits its
// replicas never receive, and their Patroni sees them as current as the leader's last published
// position, up to loop_wait old. It returns that position. In synchronous mode it returns an error
// wrapping ErrNotSupported: a synchronous standby held back would hold every commit. The WAL
// senders stay stopped until the leader is killed or the cluster stopped.
func (pc *PatroniCluster) HoldBackReplicas(ctx context.Context) (lsn string, err error) {
	if pc.synchronous {
		return "", &sentinelError{sentinel: ErrNotSupported,
			msg: "pgtemp: HoldBackReplicas: a synchronous standby held back would hold every commit of the leader"}
	}
	l, err := pc.Leader(ctx)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, l.DSN(maintenanceDB))
	if err != nil {
		return "", fmt.Errorf("pgtemp: HoldBackReplicas: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	lsn, senders, err := pc.waitReplayed(ctx, conn)
	if err != nil {
		return "", fmt.Errorf("pgtemp: HoldBackReplicas: %w", err)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if len(pc.held) > 0 {
		return "", fmt.Errorf("pgtemp: HoldBackReplicas: %s's WAL senders are held already", pc.heldOn)
	}
	for _, pid := range senders {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			_ = signalAll(pc.held, syscall.SIGCONT)
			pc.held, pc.heldOn = nil, ""
			return "", fmt.Errorf("pgtemp: HoldBackReplicas: SIGSTOP to WAL sender %d: %w", pid, err)
		}
		pc.held = append(pc.held, pid)
	}
	pc.heldOn = l.Name
	pc.logf("Patroni: %s's WAL senders %v stopped at %s", l.Name, senders, lsn)
	return lsn, nil
}

// KillMember crashes m's host: SIGKILL to its Patroni, then to its PostgreSQL's postmaster and
// every process the postmaster started. Nothing is flushed
// and nothing is shut down; Patroni's leader key, if m held it, expires after its TTL.
func (pc *PatroniCluster) KillMember(m PatroniMember) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pm, err := pc.runningMember("KillMember", m)
	if err != nil {
		return err
	}
	_ = pm.cmd.Process.Signal(syscall.SIGKILL)
	<-pm.done
	pm.cmd = nil
	err = pc.killPostgresLocked(pm)
	pc.logf("Patroni: %s killed (SIGKILL to Patroni and PostgreSQL)", m.Name)
	return err
}

// runningMember returns m's member, whose Patroni must be running. pc.mu is held.
func (pc *PatroniCluster) runningMember(op string, m PatroniMember) (*patroniMember, error) {
	pm := pc.member(m.Name)
	if pm == nil {
		return nil, fmt.Errorf("pgtemp: %s: no member %q: %w", op, m.Name, ErrInvalidOption)
	}
	if pm.cmd == nil {
		return nil, fmt.Errorf("pgtemp: %s: %s is not running", op, m.Name)
	}
	return pm, nil
}

// killPostgresLocked kills pm's PostgreSQL, and with it the WAL senders HoldBackReplicas stopped
// if they were pm's. pc.mu is held.
func (pc *PatroniCluster) killPostgresLocked(pm *patroniMember) error {
	err := killPostmaster(pm.dataDir)
	if pc.heldOn == pm.Name {
		pc.held, pc.heldOn = nil, ""
	}
	return err
}

// KillPostgres crashes m's PostgreSQL only (SIGKILL to its postmaster and every process it
// started) and
// leaves its Patroni running, which notices and starts it again; whether m stays leader is
// Patroni's decision.
func (pc *PatroniCluster) KillPostgres(m PatroniMember) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pm, err := pc.runningMember("KillPostgres", m)
	if err != nil {
		return err
	}
	err = pc.killPostgresLocked(pm)
	pc.logf("Patroni: %s's PostgreSQL killed (SIGKILL), its Patroni left running", m.Name)
	return err
}

// RestartMember starts the Patroni of m, killed by KillMember, again on its data directory: it
// rejoins as a replica of the current leader (rewound with pg_rewind, or copied afresh when that
// fails). It returns once Patroni runs; WaitHealthy waits for the rejoin.
func (pc *PatroniCluster) RestartMember(m PatroniMember) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pm := pc.member(m.Name)
	switch {
	case pm == nil:
		return fmt.Errorf("pgtemp: RestartMember: no member %q: %w", m.Name, ErrInvalidOption)
	case pc.stopped:
		return fmt.Errorf("pgtemp: RestartMember: the cluster is stopped")
	case pm.cmd != nil:
		return fmt.Errorf("pgtemp: RestartMember: %s is running", m.Name)
	}
	return pc.spawn(pm)
}

// Switchover asks the leader's Patroni for a planned switchover (POST /switchover without a
// candidate: Patroni picks one, the synchronous standby in synchronous mode) and waits until
// another member leads and accepts writes. It returns the old leader and the new one.
func (pc *PatroniCluster) Switchover(ctx context.Context) (from, to PatroniMember, err error) {
	from, err = pc.Leader(ctx)
	if err != nil {
		return from, to, err
	}
	body, _ := json.Marshal(map[string]string{"leader": from.Name})
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+pc.member(from.Name).api+"/switchover", bytes.NewReader(body))
	if err != nil {
		return from, to, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return from, to, fmt.Errorf("pgtemp: Switchover: %w", err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return from, to, fmt.Errorf("pgtemp: Switchover from %s: %s: %s", from.Name, resp.Status, bytes.TrimSpace(answer))
	}
	to, err = pc.WaitLeader(ctx, from)
	if err == nil {
		pc.logf("Patroni: switchover %s -> %s", from.Name, to.Name)
	}
	return from, to, err
}

// killPostmaster SIGKILLs the postmaster whose pid dataDir's postmaster.pid names and every
// process it started, and waits until they are gone. Every backend of PostgreSQL runs in a process
// group of its own, so a group kill would miss them: a backend left running notices the
// postmaster's death by itself, but one stopped with SIGSTOP (a held WAL sender) never would,
// and it keeps the old shared memory attached, which a restarted postmaster refuses to share. So
// the postmaster is stopped first (it forks nothing more), its descendants listed and stopped,
// and then all of them killed.
func killPostmaster(dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // not running
	}
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return fmt.Errorf("pgtemp: %s/postmaster.pid: no pid in %q", dataDir, first)
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return nil // a stale file
	}
	pids, err := stopTree(pid)
	if kerr := signalAll(pids, syscall.SIGKILL); err == nil {
		err = kerr
	}
	if err != nil {
		return fmt.Errorf("pgtemp: killing postmaster %d and its children: %w", pid, err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !slices.ContainsFunc(pids, running) {
			return nil
		}
	}
	return fmt.Errorf("pgtemp: processes of postmaster %d still there 10 s after SIGKILL", pid)
}

// running reports whether process pid exists and is not a zombie (a zombie holds no memory; who
// reaps it is its parent's business, or init's).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: existence only
	}
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// Stop stops every member (SIGTERM to Patroni, which shuts its PostgreSQL down; SIGKILL to what
// is left after 30 s) and etcd, and removes every file. It is safe to call more than once.
func (pc *PatroniCluster) Stop() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.stopped {
		return pc.stopErr
	}
	pc.stopped = true
	_ = signalAll(pc.held, syscall.SIGCONT)
	pc.held, pc.heldOn = nil, ""
	var errs []error
	for _, m := range pc.members {
		if m != nil && m.cmd != nil {
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, m := range pc.members {
		if m == nil {
			continue
		}
		if m.cmd != nil {
			select {
			case <-m.done:
			case <-time.After(30 * time.Second):
				_ = m.cmd.Process.Signal(syscall.SIGKILL)
				<-m.done
			}
			m.cmd = nil
		}
		if err := killPostmaster(m.dataDir); err != nil {
			errs = append(errs, err)
		}
	}
	if pc.etcd != nil {
		_ = pc.etcd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pc.etcdDone:
		case <-time.After(10 * time.Second):
			_ = pc.etcd.Process.Signal(syscall.SIGKILL)
			<-pc.etcdDone
		}
	}
	if pc.dir != "" {
		if err := os.RemoveAll(pc.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgtemp: %w", err))
		}
	}
	pc.stopErr = errors.Join(errs...)
	return pc.stopErr
}

func (pc *PatroniCluster) logf(format string, args ...any) {
	pc.logMu.Lock()
	defer pc.logMu.Unlock()
	fmt.Fprintf(pc.log, "pgtemp: "+format+"\n", args...)
}
