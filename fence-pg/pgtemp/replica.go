//go:build unix

package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyName is the standby's application_name on its replication connection: what
// pg_stat_replication shows for it and what the primary's synchronous_standby_names names in
// synchronous mode. The replication slot the standby streams from has the same name.
const StandbyName = "pgtemp_standby"

// StandbyPair is a primary and a streaming standby of it, both local clusters pgtemp started on
// 127.0.0.1, each with its own free port and data directory (as root, both run as the OS user
// postgres). Durability stays on for both (fsync, synchronous_commit, full_page_writes), as for
// every pgtemp cluster.
//
// The standby streams the primary's WAL through a relay of pgtemp's on 127.0.0.1 (its
// primary_conninfo names the relay, which forwards to the primary): the relay is the network
// between the two, which FreezeStandby cuts.
//
// A failover in a test:
//
//	pair, err := pgtemp.StartStandbyPair(ctx, false) // asynchronous
//	defer pair.Stop()
//	// ... commits on pair.Primary().DSN(db) ...
//	lsn, err := pair.FreezeStandby(ctx) // the standby has replayed them all, then receives nothing more
//	// ... more commits on the primary, which the standby never receives ...
//	err = pair.CrashPrimary(ctx)          // SIGQUIT to the primary's postmaster, no restart
//	err = pair.ThawStandby()
//	took, err := pair.Promote(ctx)        // pg_promote(); returns once the standby accepts writes
//	// ... pair.Standby().DSN(db) serves writes; the commits after lsn are gone ...
//
// Its methods are safe for concurrent use; they run one at a time.
type StandbyPair struct {
	primary, standby *Cluster
	synchronous      bool
	relay            *walRelay

	logMu sync.Mutex
	log   io.Writer

	mu sync.Mutex
	// frozen are the standby's processes FreezeStandby stopped with SIGSTOP (its postmaster
	// first), nil when it is not frozen.
	frozen   []int
	crashed  bool
	promoted bool
	stopped  bool
	stopErr  error
}

// standbyStartTimeout bounds StartStandbyPair: initdb, two server starts, a base backup and the
// wait for streaming each take seconds at most with fsync on.
const standbyStartTimeout = 2 * startTimeout

// StartStandbyPair starts a primary with initdb, takes a base backup of it with pg_basebackup
// (streaming the WAL written meanwhile, -X stream, into a replication slot it creates, -C -S),
// starts a hot standby on the backup with standby.signal, and returns once the primary's
// pg_stat_replication shows the standby streaming, with sync_state 'sync' when synchronous, and
// 'async' otherwise. ctx bounds the start only (at most two minutes). On error nothing is left
// running and no files are left behind.
//
// synchronous: the primary runs with synchronous_standby_names naming StandbyName and
// synchronous_commit=on, so a commit is acknowledged only once the standby has flushed its WAL
// (PostgreSQL documentation, "Synchronous Replication", warm-standby.html#SYNCHRONOUS-REPLICATION);
// otherwise synchronous_standby_names is empty and a commit is acknowledged once it is flushed on
// the primary alone. Either way, the standby itself runs with synchronous_standby_names empty,
// set on its command line like every setting of the pair (pg_basebackup copies the primary's
// configuration files, never its command line): once promoted, it waits for no standby, which
// would otherwise hold every commit forever.
//
// Options: WithBinDir, WithLog and WithSetting apply to both servers (WithSetting's parameters
// after the pair's own, so they override them). WithPort is refused with ErrInvalidOption: the
// pair picks two free ports. The pair always runs local binaries (initdb, postgres and
// pg_basebackup from one directory), whatever LEASEFENCE_PG_URL and LEASEFENCE_PG_DOCKER say: an
// external server cannot be given a standby, and the Docker provider has none; WithDocker is
// refused with ErrNotSupported.
func StartStandbyPair(ctx context.Context, synchronous bool, opts ...Option) (_ *StandbyPair, err error) {
	cfg := config{log: io.Discard}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pgtemp: start standby pair: %w", err)
	}
	if cfg.port != 0 {
		return nil, fmt.Errorf("pgtemp: StartStandbyPair: WithPort(%d): a standby pair listens on two ports, both picked free: %w",
			cfg.port, ErrInvalidOption)
	}
	for _, st := range cfg.settings {
		if !isParamName(st.name) {
			return nil, fmt.Errorf("pgtemp: StartStandbyPair: WithSetting(%q): not a parameter name: %w", st.name, ErrInvalidOption)
		}
	}
	if cfg.docker {
		return nil, &sentinelError{
			sentinel: ErrNotSupported,
			msg:      "pgtemp: StartStandbyPair: WithDocker: a standby pair runs local binaries only",
		}
	}
	// The standby's pg_basebackup and its WAL stream would need the primary's pg_hba.conf
	// to let them in.
	if err := cfg.refuseSecurity("StartStandbyPair"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, standbyStartTimeout)
	defer cancel()
	t0 := time.Now()

	p := &StandbyPair{synchronous: synchronous, log: cfg.log}
	defer func() {
		if err != nil {
			p.discard()
		}
	}()

	// The relay listens before the primary exists: its port goes into the standby's
	// primary_conninfo, and it forwards to the primary once the primary's port is known.
	if p.relay, err = startWALRelay(); err != nil {
		return nil, err
	}

	// The primary's own settings, before the user's. wal_level and the sender and slot limits
	// are PostgreSQL's defaults since version 10, set here so that nothing in postgresql.conf
	// can take replication away.
	syncNames := ""
	if synchronous {
		syncNames = StandbyName
	}
	primaryCfg := cfg
	primaryCfg.settings = append([]setting{
		{"wal_level", "replica"},
		{"max_wal_senders", "4"},
		{"max_replication_slots", "4"},
		{"synchronous_standby_names", syncNames},
	}, cfg.settings...)
	ps, info, err := startLocal(ctx, primaryCfg, p.memberLogf("primary"))
	if err != nil {
		return nil, err
	}
	p.primary = p.member(ps, info)
	p.relay.setTarget(net.JoinHostPort(loopback, strconv.Itoa(ps.port)))

	standbySettings := append([]setting{
		{"hot_standby", "on"},
		{"primary_conninfo", fmt.Sprintf("host=%s port=%d user=%s application_name=%s", loopback, p.relay.port(), superuser, StandbyName)},
		{"primary_slot_name", StandbyName},
		// Empty on the standby in both modes: see above.
		{"synchronous_standby_names", ""},
		// After ThawStandby the standby reconnects within a tenth of a second rather than
		// PostgreSQL's default 5 seconds.
		{"wal_retrieve_retry_interval", "100ms"},
	}, cfg.settings...)
	ss, info, err := startStandby(ctx, ps, standbySettings, p.memberLogf("standby"))
	if err != nil {
		return nil, err
	}
	p.standby = p.member(ss, info)

	want := "async"
	if synchronous {
		want = "sync"
	}
	if err := p.waitStreaming(ctx, want); err != nil {
		return nil, err
	}
	p.logf("standby pair started in %.1fs: primary %s:%d, standby %s:%d streaming (%s) through the relay on %s",
		time.Since(t0).Seconds(), loopback, ps.port, loopback, ss.port, want, p.relay.addr())
	return p, nil
}

// member wraps a server of the pair as a Cluster, so that DSN, CreateDatabase, Version and the
// rest work on it as on any local cluster.
func (p *StandbyPair) member(s *server, info serverInfo) *Cluster {
	return &Cluster{
		log: pairLog{p}, host: loopback, port: s.port,
		version: info.version, versionNum: info.versionNum, local: s,
	}
}

// pairLog sends a member Cluster's own log lines through the pair's, so that writes to the one
// io.Writer stay serialized.
type pairLog struct{ p *StandbyPair }

func (l pairLog) Write(b []byte) (int, error) {
	l.p.logMu.Lock()
	defer l.p.logMu.Unlock()
	return l.p.log.Write(b)
}

func (p *StandbyPair) logf(format string, args ...any) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	fmt.Fprintf(p.log, "pgtemp: "+format+"\n", args...)
}

func (p *StandbyPair) memberLogf(role string) func(string, ...any) {
	return func(format string, args ...any) { p.logf(role+": "+format, args...) }
}

// Primary returns the member started as the primary. After CrashPrimary it is down; its DSN
// still names its port, which then refuses connections.
func (p *StandbyPair) Primary() *Cluster { return p.primary }

// Standby returns the member started as the standby: read-only until Promote, the server that
// takes writes after it.
func (p *StandbyPair) Standby() *Cluster { return p.standby }

// Synchronous reports whether the primary waits for the standby's flush before it acknowledges a
// commit.
func (p *StandbyPair) Synchronous() bool { return p.synchronous }

// startStandby makes a standby of primary in a temp directory of its own: pg_basebackup, as the
// server's OS user, into an empty data directory; standby.signal; postgres with settings.
func startStandby(ctx context.Context, primary *server, settings []setting, logf func(string, ...any)) (*server, serverInfo, error) {
	t0 := time.Now()
	basebackup := filepath.Join(primary.bins.dir, "pg_basebackup")
	if !isExecutable(basebackup) {
		return nil, serverInfo{}, noBinariesError([]string{primary.bins.dir + " (no pg_basebackup, which a standby is made with)"})
	}
	tmp, err := makeTempDir()
	if err != nil {
		return nil, serverInfo{}, err
	}
	s := &server{
		bins:     primary.bins,
		user:     primary.user,
		tmpDir:   tmp,
		dataDir:  filepath.Join(tmp, "data"),
		logPath:  filepath.Join(tmp, "postgres.log"),
		logf:     logf,
		settings: settings,
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

	// -c fast: the backup starts with an immediate checkpoint rather than waiting for the next
	// one. pg_basebackup syncs what it wrote to disk (no --no-sync). -R is not used: every
	// setting of the standby is on its command line, where Describe-like output can show it.
	logf("pg_basebackup from %s:%d into %s", loopback, primary.port, s.dataDir)
	cmd := exec.CommandContext(ctx, basebackup,
		"-h", loopback, "-p", strconv.Itoa(primary.port), "-U", superuser, "-w",
		"-D", s.dataDir, "-X", "stream", "-c", "fast", "-C", "-S", StandbyName)
	cmd.Dir = s.tmpDir
	cmd.Env = childEnv()
	cmd.SysProcAttr = procAttr(s.user, syscall.SIGKILL)
	// With -X stream pg_basebackup forks a WAL streamer; the group kill reaches both.
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, serverInfo{}, fmt.Errorf("pgtemp: pg_basebackup interrupted: %w", ctxErr)
		}
		return nil, serverInfo{}, fmt.Errorf("pgtemp: pg_basebackup -D %s failed: %v; its output:\n%s",
			s.dataDir, err, strings.TrimSpace(string(out)))
	}
	logf("pg_basebackup done in %.1fs", time.Since(t0).Seconds())

	// standby.signal makes postgres start in standby mode (PostgreSQL 12 and later).
	signal := filepath.Join(s.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return nil, serverInfo{}, fmt.Errorf("pgtemp: %w", err)
	}
	if s.user != nil {
		if err := os.Chown(signal, int(s.user.uid), int(s.user.gid)); err != nil {
			return nil, serverInfo{}, fmt.Errorf("pgtemp: handing %s to OS user %s: %w", signal, s.user.name, err)
		}
	}
	info, err := s.startOnPort(ctx, 0)
	if err != nil {
		return nil, serverInfo{}, err
	}
	ok = true
	logf("standby started on %s:%d in %.1fs (data dir %s)", loopback, s.port, time.Since(t0).Seconds(), s.dataDir)
	return s, info, nil
}

// waitStreaming polls the primary's pg_stat_replication until the standby's WAL sender streams
// with sync_state want.
func (p *StandbyPair) waitStreaming(ctx context.Context, want string) error {
	var state, syncState string
	err := p.poll(ctx, p.primary, func(conn *pgx.Conn) (bool, error) {
		err := conn.QueryRow(ctx,
			"SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", StandbyName).Scan(&state, &syncState)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil && state == "streaming" && syncState == want, err
	})
	if err != nil {
		return fmt.Errorf("pgtemp: waiting for the standby to stream with sync_state %s (last seen: state %q, sync_state %q): %w",
			want, state, syncState, err)
	}
	return nil
}

// poll runs check on one connection to c every 10ms until it reports done or fails, or ctx ends.
func (p *StandbyPair) poll(ctx context.Context, c *Cluster, check func(*pgx.Conn) (bool, error)) error {
	conn, err := pgx.Connect(ctx, c.DSN(maintenanceDB))
	if err != nil {
		return err
	}
	defer closeConn(conn)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := check(conn)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// FreezeStandby makes the standby a lagging one, as of now: it waits until the standby has
// replayed the primary's current WAL position (pg_current_wal_lsn() on the primary, compared with
// pg_last_wal_replay_lsn() on the standby), so every commit acknowledged so far is on the
// standby, then cuts the replication connection at the relay (and refuses the standby's
// reconnections), and stops every process of the standby with SIGSTOP, its postmaster first,
// then its children (found through /proc, or ps, by parent pid: each child of a postmaster is
// the leader of a session of its own, so no process group holds them all). It returns the LSN the
// standby has replayed.
//
// Both are needed. SIGSTOP alone does not stop WAL from reaching the standby: the primary's WAL
// sender keeps writing to its socket, the kernel keeps accepting the bytes into the stopped WAL
// receiver's socket buffer, and after SIGCONT the receiver reads, writes and replays them, even
// when the primary has crashed in between (TestStandbyPairSIGSTOPAloneLeaks shows it). The cut
// alone would let the standby's WAL receiver notice it and retry; stopped, it cannot, and its
// state stays exactly that of the moment of the freeze.
//
// With a synchronous pair, every commit on the primary then waits until the standby is thawed
// and caught up again (or forever, if the primary is crashed first): that is what synchronous
// replication promises.
func (p *StandbyPair) FreezeStandby(ctx context.Context) (lsn string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return "", errors.New("pgtemp: FreezeStandby: pair stopped")
	case p.frozen != nil:
		return "", errors.New("pgtemp: FreezeStandby: the standby is frozen already")
	case p.crashed:
		return "", errors.New("pgtemp: FreezeStandby: the primary has crashed; nothing to catch up with")
	case p.promoted:
		return "", errors.New("pgtemp: FreezeStandby: the standby was promoted; it is no longer a standby")
	}

	var target string
	if err := p.poll(ctx, p.primary, func(conn *pgx.Conn) (bool, error) {
		return true, conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target)
	}); err != nil {
		return "", fmt.Errorf("pgtemp: FreezeStandby: reading the primary's WAL position: %w", err)
	}
	if err := p.poll(ctx, p.standby, func(conn *pgx.Conn) (bool, error) {
		var caughtUp bool
		err := conn.QueryRow(ctx,
			"SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, '')",
			target).Scan(&caughtUp, &lsn)
		return caughtUp, err
	}); err != nil {
		return "", fmt.Errorf("pgtemp: FreezeStandby: waiting for the standby to replay up to %s (replayed: %s): %w", target, lsn, err)
	}

	p.relay.cut(true)
	pids, err := stopTree(p.standbyPostmaster())
	if err != nil {
		// Leave nothing half frozen.
		signalAll(pids, syscall.SIGCONT)
		p.relay.cut(false)
		return "", fmt.Errorf("pgtemp: FreezeStandby: %w", err)
	}
	p.frozen = pids
	p.logf("standby frozen at replay LSN %s (primary at %s): replication cut at the relay, SIGSTOP to %d processes", lsn, target, len(pids))
	return lsn, nil
}

// ThawStandby undoes FreezeStandby: SIGCONT to every process it stopped (children first, the
// postmaster last), and the relay forwards the standby's reconnection to the primary again, if
// it still runs (the slot kept the WAL the standby missed). It does nothing when the standby is
// not frozen.
func (p *StandbyPair) ThawStandby() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thawLocked()
}

func (p *StandbyPair) thawLocked() error {
	if p.frozen == nil {
		return nil
	}
	pids := p.frozen
	p.frozen = nil
	err := signalAll(pids, syscall.SIGCONT)
	p.relay.cut(false)
	p.logf("standby thawed: SIGCONT to %d processes", len(pids))
	if err != nil {
		return fmt.Errorf("pgtemp: ThawStandby: %w", err)
	}
	return nil
}

// standbyPostmaster returns the standby's postmaster pid, 0 when it is down.
func (p *StandbyPair) standbyPostmaster() int {
	p.standby.mu.Lock()
	defer p.standby.mu.Unlock()
	if p.standby.local.proc == nil {
		return 0
	}
	return p.standby.local.proc.cmd.Process.Pid
}

// CrashPrimary stops the primary immediately, as a crash would, and does not start it again: it
// sends SIGQUIT to the primary's postmaster — what "pg_ctl stop -m immediate" sends: no
// checkpoint, no further WAL sent, every backend ended — and waits until it has exited (SIGKILL
// to its process group after 10 seconds). The primary's data directory stays until Stop.
func (p *StandbyPair) CrashPrimary(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errors.New("pgtemp: CrashPrimary: pair stopped")
	}
	if p.crashed {
		return errors.New("pgtemp: CrashPrimary: the primary has crashed already")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgtemp: CrashPrimary: %w", err)
	}
	c := p.primary
	c.mu.Lock()
	defer c.mu.Unlock()
	proc := c.local.proc
	if c.stopped.Load() || proc == nil {
		return errors.New("pgtemp: CrashPrimary: the primary is not running")
	}
	c.local.proc = nil
	p.crashed = true
	// The relay forwards nothing more: nothing may ever answer on the dead primary's port in its
	// place.
	p.relay.setTarget("")
	t0 := time.Now()
	how := proc.stop(syscall.SIGQUIT, 10*time.Second)
	p.logf("primary crashed: postmaster pid %d gone (%s) %v after SIGQUIT", proc.cmd.Process.Pid, how, time.Since(t0).Round(time.Millisecond))
	return nil
}

// Promote promotes the standby with pg_promote() (which waits for the promotion itself, up to
// 60 seconds) and returns once it accepts writes: pg_is_in_recovery() is false and a
// transaction can take an id (txid_current()). took is the time from the pg_promote() call to
// the first write accepted. The standby must not be frozen (ThawStandby first). The promoted
// standby runs with synchronous_standby_names empty: its commits wait for no standby.
func (p *StandbyPair) Promote(ctx context.Context) (took time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return 0, errors.New("pgtemp: Promote: pair stopped")
	case p.frozen != nil:
		return 0, errors.New("pgtemp: Promote: the standby is frozen: ThawStandby first")
	case p.promoted:
		return 0, errors.New("pgtemp: Promote: the standby was promoted already")
	}
	t0 := time.Now()
	var promoted bool
	err = p.poll(ctx, p.standby, func(conn *pgx.Conn) (bool, error) {
		if !promoted {
			if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&promoted); err != nil {
				return false, err
			}
			if !promoted {
				return false, errors.New("pg_promote() returned false: not promoted within 60 seconds")
			}
		}
		var inRecovery bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
			return false, err
		}
		_, err := conn.Exec(ctx, "SELECT txid_current()")
		return err == nil, err
	})
	if err != nil {
		return time.Since(t0), fmt.Errorf("pgtemp: Promote: %w; last lines of %s:\n%s",
			err, p.standby.local.logPath, lastLines(p.standby.local.logSince(0), 10))
	}
	p.promoted = true
	took = time.Since(t0)
	p.logf("standby promoted: accepts writes %v after pg_promote()", took.Round(time.Millisecond))
	return took, nil
}

// Stop thaws the standby if it is frozen, then stops both servers and removes their files, and
// closes the relay: no process and no goroutine of the pair is left. It is idempotent; later
// calls return the first call's result.
func (p *StandbyPair) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return p.stopErr
	}
	p.stopped = true
	p.stopErr = p.stopLocked()
	return p.stopErr
}

func (p *StandbyPair) stopLocked() error {
	errs := []error{p.thawLocked()}
	// The primary first: in a fast shutdown it waits until its WAL senders have sent
	// everything, which needs the standby up.
	for _, c := range []*Cluster{p.primary, p.standby} {
		if c != nil {
			errs = append(errs, c.Stop())
		}
	}
	if p.relay != nil {
		errs = append(errs, p.relay.close())
	}
	return errors.Join(errs...)
}

// discard undoes a failed StartStandbyPair.
func (p *StandbyPair) discard() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	_ = p.stopLocked()
}

// BinDir returns the directory the binaries of a local cluster came from (WithBinDir's, or
// where pgtemp found them), "" for an external server or a cluster in a Docker container. Passing
// it to WithBinDir starts a cluster, or a StandbyPair, of the same installation.
func (c *Cluster) BinDir() string {
	if c.local == nil {
		return ""
	}
	return c.local.bins.dir
}

// stopTree stops the process pid and then every descendant of it with SIGSTOP, and returns the
// pids it stopped, pid first. The parent is stopped first so that it forks no new child while
// the children are listed; the listing is repeated until it finds no process not stopped yet.
func stopTree(pid int) ([]int, error) {
	if pid <= 0 {
		return nil, errors.New("the standby's postmaster is not running")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("SIGSTOP to postmaster %d: %w", pid, err)
	}
	stopped := []int{pid}
	seen := map[int]bool{pid: true}
	for {
		parents, err := parentPids()
		if err != nil {
			return stopped, err
		}
		added := false
		for child, parent := range parents {
			if seen[parent] && !seen[child] {
				seen[child] = true
				// A child that has just exited is no reason to fail.
				if err := syscall.Kill(child, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
					return stopped, fmt.Errorf("SIGSTOP to %d: %w", child, err)
				}
				stopped = append(stopped, child)
				added = true
			}
		}
		if !added {
			return stopped, nil
		}
	}
}

// signalAll sends sig to pids in reverse order (the children before the postmaster that was
// stopped first), ignoring processes that no longer exist.
func signalAll(pids []int, sig syscall.Signal) error {
	var errs []error
	for i := len(pids) - 1; i >= 0; i-- {
		if err := syscall.Kill(pids[i], sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("%v to %d: %w", sig, pids[i], err))
		}
	}
	return errors.Join(errs...)
}

// parentPids maps every process to its parent: from /proc where there is one (Linux), else from
// ps (macOS, the BSDs).
func parentPids() (map[int]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err == nil && len(stats) > 0 {
		parents := make(map[int]int, len(stats))
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // exited meanwhile
			}
			// "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse
			// after the last ')'.
			rest := string(b)
			if i := strings.LastIndexByte(rest, ')'); i >= 0 {
				rest = rest[i+1:]
			}
			fields := strings.Fields(rest)
			if len(fields) < 2 {
				continue
			}
			pid, err1 := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			ppid, err2 := strconv.Atoi(fields[1])
			if err1 == nil && err2 == nil {
				parents[pid] = ppid
			}
		}
		return parents, nil
	}
	out, err := exec.Command("ps", "-A", "-o", "pid=", "-o", "ppid=").Output()
	if err != nil {
		return nil, fmt.Errorf("listing processes (no /proc, ps failed): %w", err)
	}
	parents := map[int]int{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		ppid, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil {
			parents[pid] = ppid
		}
	}
	return parents, nil
}

// walRelay is the network between the standby and the primary: a TCP relay on 127.0.0.1 that
// forwards the standby's replication connections to the primary, and that FreezeStandby cuts.
type walRelay struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string // the primary's address; "" until it is known
	isCut  bool
	closed bool
	conns  map[net.Conn]struct{}
}

func startWALRelay() (*walRelay, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
	if err != nil {
		return nil, fmt.Errorf("pgtemp: replication relay: %w", err)
	}
	r := &walRelay{ln: ln, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *walRelay) addr() string { return r.ln.Addr().String() }

func (r *walRelay) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

func (r *walRelay) setTarget(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = addr
}

// cut closes every connection the relay carries and refuses new ones while on; off lets new
// ones through again.
func (r *walRelay) cut(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.isCut = on
	if on {
		r.dropLocked()
	}
}

func (r *walRelay) dropLocked() {
	for c := range r.conns {
		_ = c.Close()
	}
}

// close stops the relay and waits for its goroutines.
func (r *walRelay) close() error {
	r.mu.Lock()
	r.closed = true
	r.dropLocked()
	r.mu.Unlock()
	err := r.ln.Close()
	r.wg.Wait()
	return err
}

func (r *walRelay) accept() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		r.mu.Lock()
		target, refuse := r.target, r.isCut || r.closed || r.target == ""
		r.mu.Unlock()
		if refuse {
			_ = client.Close()
			continue
		}
		server, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		r.mu.Lock()
		if r.isCut || r.closed {
			r.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			continue
		}
		r.conns[client], r.conns[server] = struct{}{}, struct{}{}
		r.wg.Add(2)
		r.mu.Unlock()
		go r.pipe(client, server)
		go r.pipe(server, client)
	}
}

// pipe copies from src to dst until either side ends, then closes both, so the other direction
// ends too.
func (r *walRelay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}
