package pgconformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
)

var _ conformance.Replicas = (*harness)(nil)

// The databases of a replica set: the pair is the replica set's own, so
// fixed names collide with nothing.
const (
	replicaLeaseDB    = "lease_f16"
	replicaResourceDB = "res_f16"
)

// failoverTimeout bounds Failover's wait for the first write through the
// moved proxy, after the promotion: the suite retries a client's calls for
// 30 seconds, so a failover that takes longer fails there anyway.
const failoverTimeout = 30 * time.Second

// declareReplicas adds AbilityReplicas to absent, with the reason, when
// this harness cannot start a replica set: it needs the binaries of a local
// cluster pgtemp started (Config.Cluster) to start a primary and a standby
// of the same installation.
func (h *harness) declareReplicas(absent map[conformance.Ability]string) {
	if why := h.replicasAbsent(); why != "" {
		absent[conformance.AbilityReplicas] = why
	}
}

func (h *harness) replicasAbsent() string {
	switch c := h.cfg.Cluster; {
	case c == nil:
		return "pgconformance.Config.Cluster is not set: no local PostgreSQL installation to start a primary and a standby from"
	case c.External():
		return "external server (LEASEFENCE_PG_URL): the suite starts a primary and a standby from local binaries only, and there are none to use"
	case c.BinDir() == "":
		return "Config.Cluster runs in a Docker container: the suite starts a primary and a standby (pgtemp.StartStandbyPair) from local binaries only"
	}
	return ""
}

// StartReplicas implements conformance.Replicas: a pgtemp.StandbyPair of
// the binaries of Config.Cluster, synchronous or asynchronous as mode says,
// with the lease and resource databases created on the primary and
// migrated (and emptied) by a harness of their own, the way New's harness
// does it, and a TCP proxy on 127.0.0.1 in front of the primary that every
// client of the replica set connects through: the virtual address a
// failover manager moves to the new primary. The pair is reached directly,
// never through Config.Pooler. The harness's Close closes the clients,
// the proxy and the pair, in that order.
func (h *harness) StartReplicas(ctx context.Context, mode conformance.ReplicationMode) (conformance.ReplicaSet, error) {
	if mode != conformance.ReplicationSynchronous && mode != conformance.ReplicationAsynchronous {
		return nil, fmt.Errorf("%s: StartReplicas: mode %q: want %q or %q: %w", pkg, mode,
			conformance.ReplicationSynchronous, conformance.ReplicationAsynchronous, leasecore.ErrInvalidArgument)
	}
	if why := h.replicasAbsent(); why != "" {
		return nil, fmt.Errorf("%s: StartReplicas: %s: %w", pkg, why, errors.ErrUnsupported)
	}
	if h.cfg.Patroni {
		return h.startPatroni(ctx, mode) // patroni.go
	}
	t0 := time.Now()
	pair, err := pgtemp.StartStandbyPair(ctx, mode == conformance.ReplicationSynchronous,
		pgtemp.WithBinDir(h.cfg.Cluster.BinDir()))
	if err != nil {
		return nil, fmt.Errorf("%s: StartReplicas: %w", pkg, err)
	}
	if !h.onClose(pair.Stop) {
		_ = pair.Stop()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	rs := &replicaSet{replicaBase: replicaBase{mode: mode}, pair: pair}
	primary := pair.Primary()
	if err := h.openReplicaBase(ctx, &rs.replicaBase, t0, primary.CreateDatabase,
		net.JoinHostPort(primary.Host(), strconv.Itoa(primary.Port())), primary.DSN); err != nil {
		return nil, err
	}
	if err := rs.readSettings(ctx); err != nil {
		return nil, err
	}
	return rs, nil
}

// openReplicaBase creates the lease and resource databases on a replica
// set's primary (create), starts the TCP proxy in front of it
// (primaryAddr) that every client of the set connects through, and a
// harness of the set's own on the proxy's DSNs (dsn names a database on
// the primary): the same driver, pool sizes and options, migrations and
// truncation as h's, and no pooler, the set being reached directly. The
// proxy and the harness close with h. It fills in b's clients; t0 is when
// the set began to start.
func (h *harness) openReplicaBase(ctx context.Context, b *replicaBase, t0 time.Time,
	create func(context.Context, string) error, primaryAddr string, dsn func(string) string) error {
	for _, db := range []string{replicaLeaseDB, replicaResourceDB} {
		if err := create(ctx, db); err != nil {
			return fmt.Errorf("%s: StartReplicas: %w", pkg, err)
		}
	}
	proxy, err := startFailoverProxy(primaryAddr)
	if err != nil {
		return err
	}
	if !h.onClose(proxy.close) {
		_ = proxy.close()
		return fmt.Errorf("%s: harness is closed", pkg)
	}
	leaseDSN, err1 := withHostPort(dsn(replicaLeaseDB), proxy.addr())
	resDSN, err2 := withHostPort(dsn(replicaResourceDB), proxy.addr())
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	sub, err := newHarness(ctx, Config{Driver: h.cfg.Driver, LeaseDSN: leaseDSN, ResourceDSN: resDSN,
		SharedLeases: h.cfg.SharedLeases})
	if err != nil {
		return fmt.Errorf("%s: StartReplicas: %w", pkg, err)
	}
	if !h.onClose(sub.Close) {
		_ = sub.Close()
		return fmt.Errorf("%s: harness is closed", pkg)
	}
	b.h, b.proxy, b.pooler, b.started = sub, proxy, h.cfg.Pooler, time.Since(t0)
	return nil
}

// replicaBase is what the two kinds of replica set share: their clients,
// the proxy in front of the member that serves writes, and the state of
// HoldBackStandby and Failover, which each may do once, in that order.
type replicaBase struct {
	h       *harness // the replica set's own harness, on the proxy's DSNs
	proxy   *failoverProxy
	mode    conformance.ReplicationMode
	pooler  string
	started time.Duration

	// settings are what the servers said at the start (SHOW), for Describe.
	settings string

	mu         sync.Mutex
	heldAt     string // the WAL position the replicas were held back at; "" when not held
	failedOver bool
}

// OpenLease implements conformance.ReplicaSet: the harness's lease store,
// on the proxy.
func (b *replicaBase) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	return b.h.OpenLease(ctx)
}

// OpenResource implements conformance.ReplicaSet: the harness's fenced
// resource, on the proxy.
func (b *replicaBase) OpenResource(ctx context.Context) (conformance.Resource, error) {
	return b.h.OpenResource(ctx)
}

// holdBack is HoldBackStandby: hold, once, before a failover, and never in
// synchronous mode, where a replica held back would hold every commit.
func (b *replicaBase) holdBack(ctx context.Context, hold func(context.Context) (string, error)) error {
	if b.mode == conformance.ReplicationSynchronous {
		return fmt.Errorf("%s: HoldBackStandby: a synchronous standby held back would hold every commit of the primary: %w",
			pkg, errors.ErrUnsupported)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failedOver {
		return fmt.Errorf("%s: HoldBackStandby: the replica set failed over already", pkg)
	}
	lsn, err := hold(ctx)
	if err != nil {
		return fmt.Errorf("%s: HoldBackStandby: %w", pkg, err)
	}
	b.heldAt = lsn
	return nil
}

// beginFailover marks the set failed over, once, and returns with its lock
// held: the caller unlocks it when the failover is done.
func (b *replicaBase) beginFailover() error {
	b.mu.Lock()
	if b.failedOver {
		b.mu.Unlock()
		return fmt.Errorf("%s: Failover: the replica set failed over already", pkg)
	}
	b.failedOver = true
	return nil
}

// replicaSet is a conformance.ReplicaSet on a pgtemp.StandbyPair.
type replicaSet struct {
	replicaBase
	pair *pgtemp.StandbyPair
}

var _ conformance.ReplicaSet = (*replicaSet)(nil)

// readSettings asks both servers for the settings that make the mode, so
// that Describe states what the servers run with, not what was asked for.
func (rs *replicaSet) readSettings(ctx context.Context) error {
	show := func(c *pgtemp.Cluster, query string, dest ...any) error {
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return conn.QueryRow(ctx, query).Scan(dest...)
	}
	var commit, names, fsync, syncState, standbyNames, version string
	err := errors.Join(
		show(rs.pair.Primary(), `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
			current_setting('fsync'), current_setting('server_version'),
			coalesce((SELECT sync_state FROM pg_stat_replication WHERE application_name = '`+pgtemp.StandbyName+`'), 'none')`,
			&commit, &names, &fsync, &version, &syncState),
		show(rs.pair.Standby(), `SELECT current_setting('synchronous_standby_names')`, &standbyNames),
	)
	if err != nil {
		return fmt.Errorf("%s: StartReplicas: reading the pair's settings: %w", pkg, err)
	}
	rs.settings = fmt.Sprintf("PostgreSQL %s; primary: synchronous_commit=%s, synchronous_standby_names='%s', fsync=%s, "+
		"pg_stat_replication.sync_state=%s for %s; standby: synchronous_standby_names='%s' (once promoted it waits for no standby)",
		version, commit, names, fsync, syncState, pgtemp.StandbyName, standbyNames)
	return nil
}

// Describe implements conformance.ReplicaSet.
func (rs *replicaSet) Describe() string {
	p, s := rs.pair.Primary(), rs.pair.Standby()
	d := fmt.Sprintf("%s replication: primary %s:%d + hot standby %s:%d (pg_basebackup, streaming through a replication slot), started in %v; %s; "+
		"clients connect through a TCP proxy on %s that a failover moves to the promoted standby",
		rs.mode, p.Host(), p.Port(), s.Host(), s.Port(), rs.started.Round(time.Millisecond), rs.settings, rs.proxy.addr())
	if rs.pooler != "" {
		d += "; the pair is reached directly, not through " + rs.pooler
	}
	return d
}

// HoldBackStandby implements conformance.ReplicaSet with
// pgtemp.StandbyPair.FreezeStandby: it waits until the standby has replayed
// the primary's current WAL position, then cuts the replication connection
// and stops the standby's processes with SIGSTOP. Synchronous mode: an
// error wrapping errors.ErrUnsupported.
func (rs *replicaSet) HoldBackStandby(ctx context.Context) error {
	return rs.holdBack(ctx, rs.pair.FreezeStandby)
}

// Failover implements conformance.ReplicaSet: an immediate stop of the
// primary (pgtemp.StandbyPair.CrashPrimary: SIGQUIT to its postmaster, no
// restart), the standby resumed if held back, promoted with pg_promote(),
// the proxy moved to it and every connection it carried dropped. downtime
// runs from the SIGQUIT to the first commit of a transaction with a
// transaction id through the moved proxy.
func (rs *replicaSet) Failover(ctx context.Context) (string, time.Duration, error) {
	if err := rs.beginFailover(); err != nil {
		return "", 0, err
	}
	defer rs.mu.Unlock()
	p, s := rs.pair.Primary(), rs.pair.Standby()
	t0 := time.Now()
	if err := rs.pair.CrashPrimary(ctx); err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	thawed := ""
	if rs.heldAt != "" {
		if err := rs.pair.ThawStandby(); err != nil {
			return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
		}
		thawed = fmt.Sprintf(", the standby resumed (SIGCONT; it had been held back at replay LSN %s: replication cut, processes stopped)", rs.heldAt)
	}
	promote, err := rs.pair.Promote(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	standbyAddr := net.JoinHostPort(s.Host(), strconv.Itoa(s.Port()))
	dropped := rs.proxy.moveTo(standbyAddr)
	if err := firstWrite(ctx, rs.pair.Standby().DSN(replicaLeaseDB), rs.proxy.addr()); err != nil {
		return "", 0, fmt.Errorf("%s: Failover: no write through the proxy moved to %s: %w", pkg, standbyAddr, err)
	}
	downtime := time.Since(t0)
	how := fmt.Sprintf("immediate stop of the primary %s:%d (SIGQUIT to its postmaster, no restart)%s, "+
		"standby %s:%d promoted with pg_promote() (writable %v after the call), proxy %s moved to it (%d connections still open through it dropped); "+
		"downtime measured from the SIGQUIT to the first commit through the moved proxy",
		p.Host(), p.Port(), thawed, s.Host(), s.Port(), promote.Round(time.Millisecond), rs.proxy.addr(), dropped)
	return how, downtime, nil
}

// firstWrite waits until a transaction that takes a transaction id (a
// write: a standby refuses it) commits through the proxy at proxyAddr, on
// a connection of its own to dsn's database.
func firstWrite(ctx context.Context, dsn, proxyAddr string) error {
	ctx, cancel := context.WithTimeout(ctx, failoverTimeout)
	defer cancel()
	dsn, err := withHostPort(dsn, proxyAddr)
	if err != nil {
		return err
	}
	for {
		err := func() error {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			_, err = conn.Exec(ctx, "SELECT txid_current()")
			return err
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// failoverProxy is a TCP proxy on 127.0.0.1 that forwards every connection
// to the current primary: the virtual address of a failover manager.
// moveTo points new connections at another server and drops those it
// carried, as a moved address does (their server is gone anyway).
type failoverProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string
	closed bool
	conns  map[net.Conn]struct{}
}

func startFailoverProxy(target string) (*failoverProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%s: failover proxy: %w", pkg, err)
	}
	p := &failoverProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *failoverProxy) addr() string { return p.ln.Addr().String() }

// moveTo sends new connections to target and closes the ones it carried;
// it returns how many client connections it dropped.
func (p *failoverProxy) moveTo(target string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	return p.dropLocked()
}

func (p *failoverProxy) dropLocked() int {
	for c := range p.conns {
		_ = c.Close()
	}
	// Each carried connection is a client socket and a server socket.
	return len(p.conns) / 2
}

// close stops the proxy and returns once every goroutine of it has.
func (p *failoverProxy) close() error {
	p.mu.Lock()
	p.closed = true
	p.dropLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *failoverProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		server, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			// The primary is down and the proxy not moved yet: the client
			// sees its connection closed, which it reports as unavailable.
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		// Moved or closed while dialling: this server is not the target.
		if p.closed || p.target != target {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			continue
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

// pipe copies src to dst until either ends, then closes both, so the other
// direction ends too.
func (p *failoverProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
