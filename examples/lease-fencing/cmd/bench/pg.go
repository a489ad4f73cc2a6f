package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// plainUpsert is the baseline: the plain single-statement upsert of the
// same row, with the same durability, that an unfenced report job runs.
const plainUpsert = `INSERT INTO leasefence.report_part (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, part) DO UPDATE SET content = EXCLUDED.content, writer = EXCLUDED.writer,
  token = EXCLUDED.token, written_at = clock_timestamp()`

// The transaction-style fence of the lease-fencing article (SOURCES.md):
// BEGIN; conditional floor UPDATE; upsert; COMMIT — four round trips, the
// floor row locked across them.
const articleFloorUpdate = `UPDATE leasefence.fence_floor SET max_token = $1 WHERE scope = $2 AND max_token <= $1`

const content = "rows=100 total=12345.67 generated for the daily report"

// userTable is the caller's own table for the user-data variants: the
// bench's, in the public schema, with the same columns and key as the
// part store's report_part, so its upsert writes the same row shape as the
// baseline's.
const userTable = `CREATE TABLE public.bench_part (
  scope      text,
  part       text,
  content    text NOT NULL,
  writer     text NOT NULL,
  token      bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (scope, part)
)`

// userUpsert is the caller's statement in the user_tx variants: the
// baseline's upsert, on the caller's table. (pipeline_fenced, whose
// baseline is unfenced_upsert itself, sends plainUpsert: the very
// statement and table of its baseline, so the fence is the only
// difference.)
const userUpsert = `INSERT INTO public.bench_part (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, part) DO UPDATE SET content = EXCLUDED.content, writer = EXCLUDED.writer,
  token = EXCLUDED.token, written_at = clock_timestamp()`

// limitTable holds the bench's own floor rows for the limit variants: the
// columns and key of the fence's fence_floor, one row per scope a limit
// variant writes, none of the fence's triggers or logic.
const limitTable = `CREATE TABLE public.limit_floor (
  scope     text PRIMARY KEY,
  max_token bigint NOT NULL
)`

// limitRead is the one statement a limit variant adds to the unfenced
// write: the cheapest thing the fence's check could cost. Every fast-path
// comparison of fence-pg (FencedWriteShared in Resource.Write,
// FenceGuardOrRaise at RunTx's commit and in SendBatch's pipeline) is an
// index lookup of one floor row that takes that row's lock in share mode
// (FOR SHARE; a raise must wait for the writers that relied on the old
// floor), so the limit reads one row by primary key, FOR SHARE, too: the
// same kind of row and lock, without the fence's comparison with the
// token, its rejection, DurableCommit's setting check or its SKIP LOCKED
// (which changes nothing when the row is not locked for update). A read
// without the lock would be cheaper, but no fence: it would not keep a
// raise out until the write commits. The row must exist (Scan fails
// otherwise), so the lock is really taken.
const limitRead = `SELECT max_token FROM public.limit_floor WHERE scope = $1 FOR SHARE`

// limitAbortFunc raises an error: limitGuard's way of aborting its
// pipeline. A PL/pgSQL function, as fence_reject is, because PostgreSQL
// may evaluate an expression that raises by itself (1/0, a failing cast of
// a parameter) while planning, whichever CASE branch runs.
const limitAbortFunc = `CREATE FUNCTION public.limit_abort(scope text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'limit floor of scope % is not the token', scope;
END $$`

// limitGuard is limitRead with the one thing more a check at the head of
// a pipeline needs (fencepg.Fence.SendBatch): it aborts the pipeline, by
// raising, when the floor row is missing or differs from the token $2, so
// that the write queued behind it does not run; a statement that returns
// no row or the wrong floor would leave the write to commit. It is the
// fence's FenceGuardOrRaise without its durability setting check and with
// a raise of the bench's own.
const limitGuard = `SELECT CASE WHEN f.max_token = $2::bigint THEN f.max_token ELSE public.limit_abort($1::text) END
  FROM (SELECT 1) AS one LEFT JOIN LATERAL (
    SELECT max_token FROM public.limit_floor WHERE scope = $1::text FOR SHARE) AS f ON true`

// pgEnv is a throwaway cluster with a lease database and a report
// database, and pools on both.
type pgEnv struct {
	cluster   *pgtemp.Cluster
	leasePool *pgxpool.Pool
	resPool   *pgxpool.Pool
	par       *pgxpool.Pool // exactly `clients` connections, for the concurrent variants
	par64     *pgxpool.Pool // exactly `manyClients` connections
	leases    *fencepg.LeaseStore
	res       *fencepg.Resource
	parRes    *fencepg.Resource
	par64Res  *fencepg.Resource
	fence     *fencepg.Fence // default options, for the caller's own rows in bench_part
	// fenceNoIdle sets no idle-in-transaction timeout (WithTimeouts(0, 0)):
	// user_tx_fenced against it is what that setting costs RunTx.
	fenceNoIdle *fencepg.Fence
}

// clients is the number of concurrent writers in the contention variants.
const clients = 8

// manyClients is the number of concurrent writers of the 64-client
// variants, which ask whether the fence keeps up with plain upserts when
// many clients each write their own scope (docs/performance.md, "Many
// writers through one Resource"). Each has a server connection of its own;
// with the bench's other pools that stays under max_connections (100).
const manyClients = 64

func startPG(ctx context.Context, say func(string, ...any)) (_ *pgEnv, err error) {
	e := &pgEnv{}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	say("starting a throwaway PostgreSQL cluster (durability on)")
	if e.cluster, err = pgtemp.Start(ctx); err != nil {
		return nil, err
	}
	for _, db := range []string{"bench_lease", "bench_res"} {
		if err := e.cluster.CreateDatabase(ctx, db); err != nil {
			return nil, err
		}
	}
	open := func(db string, conns int32) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(e.cluster.DSN(db))
		if err != nil {
			return nil, err
		}
		cfg.MaxConns, cfg.MinConns = conns, conns
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	if e.leasePool, err = open("bench_lease", 2); err != nil {
		return nil, err
	}
	if e.resPool, err = open("bench_res", 2); err != nil {
		return nil, err
	}
	if e.par, err = open("bench_res", clients); err != nil {
		return nil, err
	}
	if e.leases, err = fencepg.NewLeaseStore(e.leasePool); err != nil {
		return nil, err
	}
	if e.res, err = fencepg.NewResource(e.resPool); err != nil {
		return nil, err
	}
	if e.parRes, err = fencepg.NewResource(e.par); err != nil {
		return nil, err
	}
	if e.par64, err = open("bench_res", manyClients); err != nil {
		return nil, err
	}
	if e.par64Res, err = fencepg.NewResource(e.par64); err != nil {
		return nil, err
	}
	if e.fence, err = fencepg.NewFence(e.resPool); err != nil {
		return nil, err
	}
	if e.fenceNoIdle, err = fencepg.NewFence(e.resPool, fencepg.WithTimeouts(0, 0)); err != nil {
		return nil, err
	}
	if err := e.leases.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := e.res.Migrate(ctx); err != nil {
		return nil, err
	}
	for _, ddl := range []string{userTable, limitTable, limitAbortFunc} {
		if _, err := e.resPool.Exec(ctx, ddl); err != nil {
			return nil, err
		}
	}
	// The limit variants' floor rows: one per single-client variant, and
	// one per goroutine of limit_8_scopes_8_clients (parallelN starts a
	// multiple of GOMAXPROCS of them, fewer than clients + GOMAXPROCS).
	if _, err := e.resPool.Exec(ctx, `INSERT INTO public.limit_floor (scope, max_token)
		SELECT s, 1 FROM unnest(ARRAY['bench-limit-write', 'bench-limit-tx', 'bench-limit-pipeline', 'bench-limit-guard']) s
		UNION ALL SELECT 'bench-limit-scope-' || g, 1 FROM generate_series(1, $1::int) g`,
		clients+runtime.GOMAXPROCS(0)); err != nil {
		return nil, err
	}
	_, err = e.resPool.Exec(ctx, `INSERT INTO leasefence.fence_floor (scope, max_token) VALUES ('bench-article', 0)`)
	return e, err
}

func (e *pgEnv) close() error {
	for _, p := range []*pgxpool.Pool{e.leasePool, e.resPool, e.par, e.par64} {
		if p != nil {
			p.Close()
		}
	}
	if e.cluster != nil {
		return e.cluster.Stop()
	}
	return nil
}

// pgVariants returns the PostgreSQL variants, each ready to run (leases
// acquired, rows present), so every round measures the steady state.
func (e *pgEnv) pgVariants(ctx context.Context) ([]variant, error) {
	// acquire: names are revisited only after their 10 ms TTL has run out,
	// so each acquire takes an expired lease (the UPDATE path, as in real
	// use) rather than inserting a new row.
	const acqNames = 256
	acquireTTL := fencepg.MinTTL
	for i := range acqNames {
		if _, err := e.leases.Acquire(ctx, fmt.Sprintf("bench-acq-%03d", i), "bench", acquireTTL); err != nil {
			return nil, err
		}
	}
	renewGrant, err := e.leases.Acquire(ctx, "bench-renew", "bench", time.Hour)
	if err != nil {
		return nil, err
	}
	var shards []leasecore.Grant
	for i := range 1000 {
		g, err := e.leases.Acquire(ctx, fmt.Sprintf("bench-shard-%04d", i), "bench-shards", time.Hour)
		if err != nil {
			return nil, err
		}
		shards = append(shards, g)
	}
	parallelN := func(b *testing.B, n int, body func(id int) error) {
		// n goroutines in all (GOMAXPROCS times the parallelism: at least
		// n), each on its own connection of a pool of exactly n.
		b.SetParallelism((n + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			id := int(next.Add(1))
			for pb.Next() {
				if err := body(id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	parallel := func(b *testing.B, body func(id int) error) { parallelN(b, clients, body) }
	mustAccept := func(r leasecore.Result, err error) error {
		if err == nil && !r.Accepted {
			err = fmt.Errorf("write rejected: floor %d", r.Floor)
		}
		return err
	}
	acqSeq := 0
	fenced := leasecore.Write{Scope: "bench-fenced", Part: "summary", Content: content, Writer: "holder-a", Token: 1}
	batch := leasecore.Batch{Scope: "bench-batch", Writer: "holder-a", Token: 1,
		Parts: []leasecore.PartContent{{Part: "summary", Content: content}, {Part: "detail", Content: content}}}
	// The caller's own transaction and pipeline: one holder writing again
	// and again under one token, as a real holder does, so after the first
	// write the floor equals the token and the check takes its fast path
	// (the floor row locked in share mode, no new version of it).
	txClaim := leasecore.Claim{Scope: "bench-user-tx", Writer: "holder-a", Token: 1}
	txNoIdleClaim := leasecore.Claim{Scope: "bench-user-tx-noidle", Writer: "holder-a", Token: 1}
	pipeClaim := leasecore.Claim{Scope: "bench-pipeline", Writer: "holder-a", Token: 1}
	return []variant{
		{name: "unfenced_upsert", perOp: 1, op: func() error {
			_, err := e.resPool.Exec(ctx, plainUpsert, "bench-plain", "summary", content, "holder-a", 1)
			return err
		}},
		// select_1 is one round trip that writes nothing and commits
		// nothing: unfenced_upsert minus select_1 is what a durable commit
		// (WAL write and fsync) and a row write cost in this run.
		{name: "select_1", perOp: 1, op: func() error {
			var one int
			return e.resPool.QueryRow(ctx, `SELECT 1`).Scan(&one)
		}},
		{name: "user_tx_unfenced", perOp: 1, op: func() error {
			return pgx.BeginFunc(ctx, e.resPool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, userUpsert, "bench-user-tx-plain", "summary", content, "holder-a", 1)
				return err
			})
		}},
		{name: "user_tx_fenced", perOp: 1, op: func() error {
			return mustAccept(e.fence.RunTx(ctx, txClaim, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, userUpsert, "bench-user-tx", "summary", content, "holder-a", 1)
				return err
			}))
		}},
		// user_tx_fenced_no_idle is user_tx_fenced without the
		// idle-in-transaction timeout, whose setting is one more statement
		// in BEGIN's round trip; its own scope, so both keep their fast path.
		{name: "user_tx_fenced_no_idle", perOp: 1, op: func() error {
			return mustAccept(e.fenceNoIdle.RunTx(ctx, txNoIdleClaim, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, userUpsert, "bench-user-tx-noidle", "summary", content, "holder-a", 1)
				return err
			}))
		}},
		// user_tx_limit is RunTx's three round trips with one statement
		// where the fence has its logic (limitRead): BEGIN, the upsert,
		// then limitRead and COMMIT pipelined.
		{name: "user_tx_limit", perOp: 1, op: func() error {
			return limitTx(ctx, e.resPool)
		}},
		{name: "pipeline_fenced", perOp: 1, op: func() error {
			b := &pgx.Batch{}
			b.Queue(plainUpsert, "bench-pipeline", "summary", content, "holder-a", 1)
			return mustAccept(e.fence.SendBatch(ctx, e.resPool, pipeClaim, b))
		}},
		// pipeline_limit is SendBatch's pipeline with limitRead where the
		// check goes: one round trip, one implicit transaction.
		{name: "pipeline_limit", perOp: 1, op: func() error {
			return limitPipeline(ctx, e.resPool, "bench-limit-pipeline", "summary", limitRead)
		}},
		// pipeline_limit_guard is pipeline_limit with limitGuard where
		// limitRead was: the least a check that can abort the pipeline
		// costs.
		{name: "pipeline_limit_guard", perOp: 1, op: func() error {
			return limitPipeline(ctx, e.resPool, "bench-limit-guard", "summary", limitGuard, int64(1))
		}},
		{name: "fenced_write", perOp: 1, op: func() error {
			return mustAccept(e.res.Write(ctx, fenced))
		}},
		// fenced_write_limit is the baseline's upsert of a part row plus
		// limitRead, in one pipeline: one round trip and one commit, as
		// Resource.Write (which folds both into one statement).
		{name: "fenced_write_limit", perOp: 1, op: func() error {
			return limitPipeline(ctx, e.resPool, "bench-limit-write", "summary", limitRead)
		}},
		{name: "article_txn_fence", perOp: 1, op: func() error {
			return articleFence(ctx, e.resPool)
		}},
		{name: "batch2_per_part", perOp: 2, op: func() error {
			return mustAccept(e.res.WriteBatch(ctx, batch))
		}},
		{name: "acquire", perOp: 1, op: func() error {
			acqSeq++
			_, err := e.leases.Acquire(ctx, fmt.Sprintf("bench-acq-%03d", acqSeq%acqNames), "bench", acquireTTL)
			return err
		}},
		{name: "renew", perOp: 1, op: func() error {
			_, err := e.leases.Renew(ctx, renewGrant)
			return err
		}},
		{name: "renew_1000_leases_per_lease", perOp: 1000, op: func() error {
			_, lost, err := e.leases.RenewAll(ctx, shards)
			return errors.Join(err, errors.Join(lost...))
		}},
		{name: "unfenced_8_clients", perOp: 1, parallel: func(b *testing.B) {
			parallel(b, func(id int) error {
				_, err := e.par.Exec(ctx, plainUpsert, "bench-par", fmt.Sprintf("part-%d", id), content, "holder-a", 1)
				return err
			})
		}},
		{name: "fenced_8_scopes_8_clients", perOp: 1, parallel: func(b *testing.B) {
			parallel(b, func(id int) error {
				return mustAccept(e.parRes.Write(ctx, leasecore.Write{Scope: fmt.Sprintf("bench-scope-%d", id),
					Part: "summary", Content: content, Writer: "holder-a", Token: 1}))
			})
		}},
		// limit_8_scopes_8_clients is fenced_8_scopes_8_clients's writers
		// with fenced_write_limit's pipeline instead of Resource.Write:
		// each client its own scope, one statement more per write.
		{name: "limit_8_scopes_8_clients", perOp: 1, parallel: func(b *testing.B) {
			parallel(b, func(id int) error {
				return limitPipeline(ctx, e.par, fmt.Sprintf("bench-limit-scope-%d", id), "summary", limitRead)
			})
		}},
		{name: "unfenced_64_clients", perOp: 1, parallel: func(b *testing.B) {
			parallelN(b, manyClients, func(id int) error {
				_, err := e.par64.Exec(ctx, plainUpsert, "bench-par64", fmt.Sprintf("part-%d", id), content, "holder-a", 1)
				return err
			})
		}},
		{name: "fenced_64_scopes_64_clients", perOp: 1, parallel: func(b *testing.B) {
			parallelN(b, manyClients, func(id int) error {
				return mustAccept(e.par64Res.Write(ctx, leasecore.Write{Scope: fmt.Sprintf("bench-scope64-%d", id),
					Part: "summary", Content: content, Writer: "holder-a", Token: 1}))
			})
		}},
		// The fence on the caller's own statement, one pipeline (fence
		// check and upsert, one round trip, one commit) per write: what each
		// write costs when nothing gathers concurrent writes into shared
		// statements, as Resource.Write does.
		{name: "pipeline_fenced_64_scopes_64_clients", perOp: 1, parallel: func(b *testing.B) {
			parallelN(b, manyClients, func(id int) error {
				scope := fmt.Sprintf("bench-pipe64-%d", id)
				batch := &pgx.Batch{}
				batch.Queue(plainUpsert, scope, "summary", content, "holder-a", 1)
				return mustAccept(e.fence.SendBatch(ctx, e.par64, leasecore.Claim{Scope: scope, Writer: "holder-a", Token: 1}, batch))
			})
		}},
		{name: "fenced_1_scope_8_clients", perOp: 1, parallel: func(b *testing.B) {
			parallel(b, func(id int) error {
				return mustAccept(e.parRes.Write(ctx, leasecore.Write{Scope: "bench-one-scope",
					Part: fmt.Sprintf("part-%d", id), Content: content, Writer: "holder-a", Token: 1}))
			})
		}},
	}, nil
}

// limitPipeline sends check (limitRead, or limitGuard with the token as
// its one extra argument) for scope and then the baseline's upsert of part
// of scope as one pipeline on pool: one round trip, one implicit
// transaction, one durable commit. Scope must have a limit_floor row for
// limitRead to return one.
func limitPipeline(ctx context.Context, pool *pgxpool.Pool, scope, part, check string, extra ...any) error {
	b := &pgx.Batch{}
	var floor int64
	args := append(make([]any, 0, 1+len(extra)), scope) // one allocation, as Queue's own
	b.Queue(check, append(args, extra...)...).QueryRow(func(r pgx.Row) error { return r.Scan(&floor) })
	b.Queue(plainUpsert, scope, part, content, "holder-a", 1)
	return pool.SendBatch(ctx, b).Close()
}

// limitTx runs the caller's upsert in a transaction with RunTx's round
// trips and nothing of its logic: BEGIN (Read Committed, sent as a batch
// as RunTx does, without the idle timeout RunTx sets there), the upsert,
// then limitRead and COMMIT in one pipeline.
func limitTx(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection given back inside a transaction (after a failure) is
	// closed by the pool, so no rollback is needed for correctness; the
	// rollbacks below only spare the pool a new connection. None runs
	// after the COMMIT: pgx does not see a COMMIT sent as a statement,
	// and a ROLLBACK there would cost a round trip.
	defer conn.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, userUpsert, "bench-limit-tx", "summary", content, "holder-a", 1); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	b = &pgx.Batch{}
	var floor int64
	b.Queue(limitRead, "bench-limit-tx").QueryRow(func(r pgx.Row) error { return r.Scan(&floor) })
	b.Queue("commit")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return nil
}

// articleFence is the fence of the lease-fencing article (SOURCES.md) as a
// transaction of four round trips (no attempt log).
func articleFence(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	tag, err := tx.Exec(ctx, articleFloorUpdate, int64(1), "bench-article")
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return errors.New("article fence rejected the write")
	}
	if _, err := tx.Exec(ctx, plainUpsert, "bench-article", "summary", content, "holder-a", 1); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type scaleRow struct {
	n              int
	acquire, write float64 // median ns/op; acquire is an acquire+release pair
	// acquireRatio and writeRatio are the medians over rounds of this
	// size's time over the smallest size's, measured together.
	acquireRatio, writeRatio float64
}

type scaleResult struct {
	rounds int
	rows   []scaleRow
}

// scaleSet is one size of the scaling table: n existing leases and n
// scopes, in databases of their own.
type scaleSet struct {
	n      int
	leases *fencepg.LeaseStore
	res    *fencepg.Resource
	seq    int
}

// pgScaling measures acquire and fenced-write latency with n existing
// leases and scopes, for each n: both should stay flat (one index lookup
// each). Every size has its own databases, filled first; then the sizes
// are measured together (alternate), like the ratios, so a slow moment of
// the machine does not land on one size only.
func (e *pgEnv) pgScaling(ctx context.Context, sizes []int, say func(string, ...any)) (scaleResult, error) {
	const rounds = 5
	res := scaleResult{rounds: rounds}
	sets := make([]*scaleSet, len(sizes))
	for i, n := range sizes {
		say("scaling: %d existing leases and scopes", n)
		set, closePools, err := e.newScaleSet(ctx, n)
		if err != nil {
			return res, err
		}
		defer closePools()
		sets[i] = set
	}
	// Acquire a released lease and release it again: the pair keeps
	// every lease free, for any n, with no timing tricks.
	acquire := func(s *scaleSet) error {
		s.seq++
		g, err := s.leases.Acquire(ctx, fmt.Sprintf("lease-%d", 1+s.seq%s.n), "bench", time.Hour)
		if err != nil {
			return err
		}
		return s.leases.Release(ctx, g)
	}
	write := func(s *scaleSet) error {
		_, err := s.res.Write(ctx, leasecore.Write{Scope: fmt.Sprintf("scope-%d", 1+s.n/2), Part: "summary",
			Content: content, Writer: "bench", Token: 1})
		return err
	}
	acqNs := make([][]float64, len(sets))
	wrNs := make([][]float64, len(sets))
	acqRatio := make([][]float64, len(sets))
	wrRatio := make([][]float64, len(sets))
	for range rounds {
		for _, m := range []struct {
			op        func(*scaleSet) error
			ns, ratio [][]float64
		}{{acquire, acqNs, acqRatio}, {write, wrNs, wrRatio}} {
			ops := make([]func() error, len(sets))
			for i, set := range sets {
				ops[i] = func() error { return m.op(set) }
			}
			per, err := alternate(ctx, ops...)
			if err != nil {
				return res, fmt.Errorf("scaling: %w", err)
			}
			for i := range sets {
				m.ns[i] = append(m.ns[i], per[i])
				m.ratio[i] = append(m.ratio[i], per[i]/per[0])
			}
		}
	}
	for i, s := range sets {
		res.rows = append(res.rows, scaleRow{n: s.n, acquire: median(acqNs[i]), write: median(wrNs[i]),
			acquireRatio: median(acqRatio[i]), writeRatio: median(wrRatio[i])})
	}
	return res, nil
}

// newScaleSet creates the databases of size n (n released leases; n scopes
// with a floor and one part each) and the stores on them.
func (e *pgEnv) newScaleSet(ctx context.Context, n int) (_ *scaleSet, closePools func(), err error) {
	var pools []*pgxpool.Pool
	closePools = func() {
		for _, p := range pools {
			p.Close()
		}
	}
	defer func() {
		if err != nil {
			closePools()
		}
	}()
	open := func(db string) (*pgxpool.Pool, error) {
		if err := e.cluster.CreateDatabase(ctx, db); err != nil {
			return nil, err
		}
		p, err := pgxpool.New(ctx, e.cluster.DSN(db))
		if err == nil {
			pools = append(pools, p)
		}
		return p, err
	}
	leasePool, err := open(fmt.Sprintf("scale_lease_%d", n))
	if err != nil {
		return nil, nil, err
	}
	resPool, err := open(fmt.Sprintf("scale_res_%d", n))
	if err != nil {
		return nil, nil, err
	}
	set := &scaleSet{n: n}
	if set.leases, err = fencepg.NewLeaseStore(leasePool); err != nil {
		return nil, nil, err
	}
	if set.res, err = fencepg.NewResource(resPool); err != nil {
		return nil, nil, err
	}
	if err := set.leases.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	if err := set.res.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	for _, st := range []struct {
		pool *pgxpool.Pool
		sql  string
	}{
		{leasePool, `INSERT INTO leasefence.lease (name, holder, token, expires_at)
			SELECT 'lease-' || g, 'bench', 1, '-infinity' FROM generate_series(1, $1) g`},
		{resPool, `INSERT INTO leasefence.fence_floor (scope, max_token) SELECT 'scope-' || g, 1 FROM generate_series(1, $1) g`},
		{resPool, `INSERT INTO leasefence.report_part (scope, part, content, writer, token)
			SELECT 'scope-' || g, 'summary', 'x', 'bench', 1 FROM generate_series(1, $1) g`},
	} {
		if _, err := st.pool.Exec(ctx, st.sql, n); err != nil {
			return nil, nil, err
		}
	}
	for _, p := range pools {
		if _, err := p.Exec(ctx, `ANALYZE`); err != nil {
			return nil, nil, err
		}
	}
	return set, closePools, nil
}
