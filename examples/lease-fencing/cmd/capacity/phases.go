package main

import (
	"context"
	"errors"
	"fmt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// content is the value of every plain upsert and Put: the bench's part
// content.
const content = "rows=100 total=12345.67 generated for the daily report"

// satTTL is the TTL of the saturation holders' leases: long enough that
// nothing expires between two rounds of renewals.
const satTTL = time.Hour

// upsertTable is the plain-upsert baseline's table: the bench's report
// part shape (two-column text key, content, writer, token, time).
const upsertTable = `CREATE TABLE public.capacity_upsert (
  scope      text,
  part       text,
  content    text NOT NULL,
  writer     text NOT NULL,
  token      bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (scope, part)
)`

const upsertFill = `INSERT INTO public.capacity_upsert (scope, part, content, writer, token)
SELECT 'scope-' || g, 'summary', $2, 'capacity', 1 FROM generate_series(0, $1 - 1) g`

// plainUpsert is the bench's unfenced_upsert, on a random row of as many
// rows as the phase has leases.
const plainUpsert = `INSERT INTO public.capacity_upsert (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, part) DO UPDATE SET content = EXCLUDED.content, writer = EXCLUDED.writer,
  token = EXCLUDED.token, written_at = clock_timestamp()`

type pgPhase struct {
	cluster  *pgtemp.Cluster
	dsn      string
	sessions bool
	rows     int
}

func startPGPhase(ctx context.Context, cfg config, sessions bool, say func(string, ...any)) (_ *pgPhase, err error) {
	p := &pgPhase{sessions: sessions, rows: cfg.holders * cfg.names}
	say("starting a throwaway PostgreSQL cluster (durability on)")
	if p.cluster, err = pgtemp.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if err := p.cluster.CreateDatabase(ctx, "capacity"); err != nil {
		return nil, err
	}
	p.dsn = p.cluster.DSN("capacity")
	pool, err := openPool(ctx, p.dsn, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	stores, closeStores, err := openStores(ctx, p.backend(), 1)
	if err != nil {
		return nil, err
	}
	defer closeStores()
	if err := stores[0].(interface{ Migrate(context.Context) error }).Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, upsertTable); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, upsertFill, p.rows, content); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `ANALYZE public.capacity_upsert`); err != nil {
		return nil, err
	}
	// Checkpoints spaced as a server holding a million leases would have
	// them: the setup writes the million lease rows (with their index and
	// full-page images, over a gigabyte of WAL), and with the defaults
	// (max_wal_size 1GB) a checkpoint falls in the setup or the window.
	// Some full-scale runs with the defaults had a setup of 57-83 s instead
	// of 16-17 s, renewals timing out and holders losing names; a
	// checkpoint's final fsync stalling commits is the suspect (not
	// measured directly): the two runs after this change were valid. The
	// server's backends meanwhile mostly waited for their clients. Durability is unchanged: every
	// commit is still flushed to the WAL (fsync, synchronous_commit on);
	// checkpoints only bound how much WAL a crash recovery replays.
	for _, set := range []string{`ALTER SYSTEM SET max_wal_size = '8GB'`, `ALTER SYSTEM SET checkpoint_timeout = '30min'`,
		`SELECT pg_reload_conf()`} {
		if _, err := pool.Exec(ctx, set); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *pgPhase) describe() string {
	mode := "a lease row per name: a renewal is one RenewAll statement updating the holder's rows"
	if p.sessions {
		mode = "holder sessions (fencepg.WithSharedLeases): a renewal updates the holder's session row"
	}
	return fmt.Sprintf("PostgreSQL %s (pgtemp, pgx/v5), %s", p.cluster.Version(), mode)
}

func (p *pgPhase) backend() backendConfig {
	return backendConfig{Backend: "pg", DSN: p.dsn, Sessions: p.sessions}
}

func (p *pgPhase) saturate(ctx context.Context, cfg config, say func(string, ...any)) (satResult, error) {
	pool, err := openPool(ctx, p.dsn, cfg.satClients)
	if err != nil {
		return satResult{}, err
	}
	defer pool.Close()
	upsert := func(ctx context.Context, _ int) error {
		_, err := pool.Exec(ctx, plainUpsert, fmt.Sprintf("scope-%d", rand.IntN(p.rows)), "summary", content, "capacity", 1)
		return err
	}
	renew, renewOne, closeRenew, err := satRenewals(ctx, cfg, p.backend())
	if err != nil {
		return satResult{}, err
	}
	defer closeRenew()
	return alternate(ctx, cfg, say, p.pids(), upsert, renew, renewOne)
}

func (p *pgPhase) pids() []int {
	if pid := postmasterPID(p.cluster.DataDir()); pid > 0 {
		return []int{pid}
	}
	return nil
}

func (p *pgPhase) close() error { return p.cluster.Stop() }

// etcdPhase is one etcd member, or a cluster of three on 127.0.0.1-3.
type etcdPhase struct {
	srv       *etcdtemp.Server
	cluster   *etcdtemp.Cluster
	endpoints []string
	keys      int
}

// etcdTimings are etcd's own defaults (heartbeat 100 ms, election 1 s),
// not etcdtemp's short test timings: the machine is loaded on purpose, and
// an election is not what the run measures.
func etcdTimings(args []string) []etcdtemp.Option {
	return []etcdtemp.Option{etcdtemp.WithArgs(args...), etcdtemp.WithHeartbeat(100 * time.Millisecond),
		etcdtemp.WithElection(time.Second)}
}

func startEtcdPhase(ctx context.Context, cfg config, members int, say func(string, ...any)) (_ *etcdPhase, err error) {
	p := &etcdPhase{keys: cfg.holders * cfg.names}
	if members == 1 {
		say("starting an etcd server (a child process; WAL fsync on)")
		if p.srv, err = etcdtemp.Start(ctx, etcdTimings(cfg.etcdArgs)...); err != nil {
			return nil, err
		}
		p.endpoints = p.srv.Endpoints()
		return p, nil
	}
	say("starting a %d-member etcd cluster on 127.0.0.1-%d (child processes; WAL fsync on)", members, members)
	if p.cluster, err = etcdtemp.StartCluster(ctx, members, etcdTimings(cfg.etcdArgs)...); err != nil {
		return nil, err
	}
	p.endpoints = p.cluster.Endpoints()
	return p, nil
}

func (p *etcdPhase) describe() string {
	if p.cluster != nil {
		return fmt.Sprintf("etcd %s, %d members on loopback (%v), fenceetcd.WithSharedLeases: a renewal is one read of the holder's generation key and one keep-alive (the first reads every key)",
			p.cluster.Version(), p.cluster.Len(), p.endpoints)
	}
	return fmt.Sprintf("etcd %s, one member on loopback, fenceetcd.WithSharedLeases: a renewal is one read of the holder's generation key and one keep-alive (the first reads every key)",
		p.srv.Version())
}

func (p *etcdPhase) backend() backendConfig {
	return backendConfig{Backend: "etcd", Endpoints: p.endpoints}
}

func (p *etcdPhase) saturate(ctx context.Context, cfg config, say func(string, ...any)) (satResult, error) {
	clis, closeClis, err := dialEtcd(ctx, p.endpoints, max(1, cfg.satClients/4))
	if err != nil {
		return satResult{}, err
	}
	defer closeClis()
	if err := settleEtcd(ctx, clis[0], cfg.ttl, say); err != nil {
		return satResult{}, err
	}
	put := func(ctx context.Context, c int) error {
		_, err := clis[c%len(clis)].Put(ctx, fmt.Sprintf("/capacity-put/%07d", rand.IntN(p.keys)), content)
		return err
	}
	renew, renewOne, closeRenew, err := satRenewals(ctx, cfg, p.backend())
	if err != nil {
		return satResult{}, err
	}
	defer closeRenew()
	return alternate(ctx, cfg, say, p.pids(), put, renew, renewOne)
}

func (p *etcdPhase) pids() []int {
	if p.cluster == nil {
		return []int{p.srv.PID()}
	}
	var pids []int
	for i := range p.cluster.Len() {
		pids = append(pids, p.cluster.PID(i))
	}
	return pids
}

func (p *etcdPhase) close() error {
	if p.cluster != nil {
		return p.cluster.Stop()
	}
	return p.srv.Stop()
}

// settleEtcd waits until the holders' etcd leases are gone. Unlike
// PostgreSQL's rows, which stay when their holders stop, etcd deletes the
// keys of a lease when it expires: a TTL after the holders stopped, the
// server revokes their 10,000 leases and deletes their 1,000,000 keys, work
// that would land in the first saturation rounds (a first full-scale run
// measured 58 renewals/s in such a round, 7,000/s in the next). So the
// measurement waits for it, up to ttl + 2 minutes, and says how long that
// took: on etcd the capacity is measured on the server the million keys
// came and went on.
func settleEtcd(ctx context.Context, cli *clientv3.Client, ttl time.Duration, say func(string, ...any)) error {
	start := time.Now()
	deadline := start.Add(ttl + 2*time.Minute)
	for {
		resp, err := cli.Leases(ctx)
		if err != nil {
			return err
		}
		if len(resp.Leases) == 0 {
			say("the holders' etcd leases expired and were revoked %.1f s after the holders stopped", time.Since(start).Seconds())
			return settleApplied(ctx, cli, deadline, say)
		}
		if time.Now().After(deadline) {
			say("%d etcd leases still there %.0f s after the holders stopped; measuring anyway", len(resp.Leases), time.Since(start).Seconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// settleApplied waits, until deadline, for every member to apply what the
// cluster had committed once the leases were gone: a member whose applied
// index lags its committed one by more than etcd's limit (5,000 entries)
// refuses requests with "too many requests", and the revocations of a
// million keys leave the followers behind for a while (seen on a 3-member
// cluster on a slow disk: the first saturation acquire refused).
func settleApplied(ctx context.Context, cli *clientv3.Client, deadline time.Time, say func(string, ...any)) error {
	start := time.Now()
	var target uint64
	for _, ep := range cli.Endpoints() {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return err
		}
		target = max(target, st.RaftIndex)
	}
	for {
		behind := 0
		for _, ep := range cli.Endpoints() {
			st, err := cli.Status(ctx, ep)
			if err != nil {
				return err
			}
			if st.RaftAppliedIndex < target {
				behind++
			}
		}
		if behind == 0 {
			if d := time.Since(start); d >= time.Second {
				say("every member applied the revocations %.1f s later", d.Seconds())
			}
			return nil
		}
		if time.Now().After(deadline) {
			say("%d members still applying the revocations; measuring anyway", behind)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// satRenewals acquires cfg.names names for each of cfg.satClients holders
// of their own, through stores opened as the holder processes open theirs,
// and returns client c's renewal, RenewAll of its holder's grants, and
// renewOne, Renew of its holder's first name only (with holder sessions or
// shared leases it extends every name of the holder; per lease, that name
// alone).
func satRenewals(ctx context.Context, cfg config, bc backendConfig) (renew, renewOne func(context.Context, int) error, close func(), err error) {
	stores, closeStores, err := openStores(ctx, bc, cfg.satClients)
	if err != nil {
		return nil, nil, nil, err
	}
	grants := make([][]leasecore.Grant, cfg.satClients)
	for c := range cfg.satClients {
		store := stores[c%len(stores)]
		for n := range cfg.names {
			g, err := store.Acquire(ctx, satLeaseName(c, n), satHolderName(c), satTTL)
			if err != nil {
				closeStores()
				return nil, nil, nil, err
			}
			grants[c] = append(grants[c], g)
		}
	}
	renew = func(ctx context.Context, c int) error {
		renewed, lost, err := stores[c%len(stores)].RenewAll(ctx, grants[c])
		if err == nil {
			err = errors.Join(lost...)
		}
		if err == nil {
			grants[c] = renewed
		}
		return err
	}
	renewOne = func(ctx context.Context, c int) error {
		g, err := stores[c%len(stores)].Renew(ctx, grants[c][0])
		if err == nil {
			grants[c][0] = g
		}
		return err
	}
	return renew, renewOne, closeStores, nil
}

// measured is one saturation measurement: operations per second, and the
// server's CPU meanwhile (cores: CPU seconds per second).
type measured struct{ rate, cores float64 }

// satResult is a phase's saturation measurements, one per round each.
type satResult struct {
	upserts, renews, ones []measured
}

// alternate measures the operations at saturation (the plain upsert or
// Put, the holders' RenewAll, Renew of one name), cfg.satRounds rounds of
// each, the order rotating from round to round, and returns each one's
// rate per round, with the CPU the server processes pids used.
func alternate(ctx context.Context, cfg config, say func(string, ...any), pids []int, upsert, renew, renewOne func(context.Context, int) error) (satResult, error) {
	var res satResult
	ops := []struct {
		name string
		op   func(context.Context, int) error
		out  *[]measured
	}{{"upserts", upsert, &res.upserts}, {"renewals", renew, &res.renews}, {"renewals of one name", renewOne, &res.ones}}
	for r := range cfg.satRounds {
		for k := range ops {
			o := ops[(k+r)%len(ops)]
			cpu0, t0 := serverCPU(pids), time.Now()
			rate, err := saturate(ctx, cfg.satClients, cfg.satTime, o.op)
			if err != nil {
				return res, fmt.Errorf("saturation, %s: %w", o.name, err)
			}
			m := measured{rate: rate, cores: cores(cpu0, serverCPU(pids), time.Since(t0))}
			say("saturation round %d/%d: %s %.1f/s, server CPU %.2f cores", r+1, cfg.satRounds, o.name, rate, m.cores)
			*o.out = append(*o.out, m)
		}
	}
	return res, nil
}

// saturate runs op back to back on clients goroutines for d and returns
// the operations per second completed.
func saturate(ctx context.Context, clients int, d time.Duration, op func(context.Context, int) error) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := op(ctx, c); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}
