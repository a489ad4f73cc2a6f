package fencepg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Fence is the scope fence over the floor table of one database, for the
// caller's own data, on a pgx pool (NewFence; FenceDB is the same fence on
// a database/sql pool): it compares a leasecore.Claim with the scope's
// floor in the same transaction that writes the caller's rows. The
// promise: a fenced transaction commits only if, when it commits, no token
// larger than its claim's has been accepted or advanced for its scope
// (I3), and a stale holder's transaction is rejected whole. The comparison
// is the last statement before COMMIT, sent in COMMIT's round trip, so a
// newer holder's Advance or write never waits on the fence for an older
// holder's open transaction, however long that holder is frozen or slow
// inside it (it may still wait on row locks of the caller's own tables,
// which the idle-in-transaction timeout bounds while the holder is frozen
// and the context given to RunTx while it is slow). FenceDB keeps the
// first half only: database/sql sends the comparison and COMMIT as two
// round trips, and a holder frozen between them makes a newer holder's
// Advance wait, up to the idle-in-transaction timeout. The caller's tables
// and the fence's tables (fence_floor, write_attempt) must be in the same
// database.
//
// Four ways to use it, from the least control to the most:
//
//   - RunTx: begin, run the caller's function, compare and commit;
//   - Commit: compare and commit a transaction the caller began and
//     filled itself;
//   - SendBatch (Fence only): the check and the caller's statements in
//     one pipeline, one round trip, one implicit transaction;
//   - Advance: raise the floor without writing, so a new holder cuts the
//     old one off right after it acquires.
//
// A rejection is a leasecore.Result with Accepted false and the floor that
// beat the token, not an error — except when the claim names its token
// space (leasecore.Claim.Space) and the floor was raised by a token of
// another space: then the rejected Result comes with a
// *leasecore.TokenSpaceError (errors.Is leasecore.ErrTokenSpace), since the
// claim is not stale but from another lease service (a scope is fenced by
// exactly one). The floor row stores the space of the token that last
// raised it (column token_space); the space is read only after a
// rejection, so accepted checks cost what they did. A floor raised before
// the column existed, or by a claim without a space, gives the ordinary
// rejection. A scope moved to another database (Seal, Install;
// leasecore.ScopeSeal) is rejected here whatever the token, with
// Result.Floor leasecore.SealedFloor and a *leasecore.ScopeMovedError
// naming where it went (errors.Is leasecore.ErrScopeMoved), read on the
// rejection path only as well. Errors wrap leasecore's sentinels as
// described in the package documentation.
//
// The comparison is written for Read Committed, PostgreSQL's default
// isolation level: it relies on a blocked lock re-reading the newest
// version of the floor row (PostgreSQL docs §13.2.1). RunTx begins its
// transactions at that level explicitly, whatever the server's default.
// The fence's own single statements (Advance, and SendBatch's pipeline
// when it is not sent on a transaction) cannot choose their level: on a
// server, database or role that defaults to Repeatable Read or
// Serializable they are sent again after a serialization failure (SQLSTATE
// 40001), which at those levels takes the place of the re-read. In a
// caller's own Repeatable Read or Serializable transaction (Commit) the
// comparison stays correct, but where Read Committed would re-read it
// fails the transaction with an error wrapping leasecore.ErrUnavailable:
// roll back and run the whole transaction again.
//
// Everything the fence commits, and every fenced transaction of the
// caller's, commits durably: where synchronous_commit defaults to off or
// local, the comparison sets it to on for its transaction, so an
// acknowledged floor (and the rows written under it) survives a crash.
//
// A Fence is safe for concurrent use.
type Fence struct {
	fenceCore
	pool *pgxpool.Pool // RunTx's transactions
}

// FenceDB is Fence on a database/sql pool (lib/pq, or pgx's stdlib
// driver), from NewFenceDB: the same fence, with the same methods for the
// same acts (RunTx, Commit, Advance, ...), taking *sql.Tx where Fence
// takes pgx.Tx, and without SendBatch, which needs pgx's pipeline. Where
// database/sql cannot pipeline, RunTx and Commit take one more round trip
// (see each). A FenceDB is safe for concurrent use.
type FenceDB struct {
	fenceCore
	sqlDB *sql.DB // RunTx's transactions
}

// fenceCore is what Fence and FenceDB share: everything but the caller's
// transactions, which are of the pool's driver.
type fenceCore struct {
	db   dbx.DB // Advance, the rejection log, the reads
	cfg  config
	stmt fenceSQL
	read pgstore.Reader
	seen seenFloors // RunTx's early reads that can be skipped
}

// fenceSQL is the fence's statements in its schema.
type fenceSQL struct {
	check, checkOrRaise, advance, logAttempt, prune, write, writeBatch, floorSpace string
	// the full checks that end a fenced transaction: they also read the
	// floor before the check, which RunTx must not find below the token
	checkAndBefore, runTxCheckOrRaise string
	// the fast paths (floor = token), the first statements of RunTx
	shared, earlyRead, guardOrRaise, writeShared, writeBatchShared, writeManyShared string
	// setIdle sets the idle timeout in a RunTx whose Fence has seen the
	// floor at the token (pgsql.FenceSetIdle); empty without a timeout.
	setIdle string
}

func newFenceCore(db dbx.DB, cfg config) fenceCore {
	in := func(stmt string) string { return pgsql.InSchema(stmt, cfg.schema) }
	var setIdle string
	if d := cfg.idleInTxTimeout; d > 0 {
		setIdle = pgsql.FenceSetIdle + strconv.FormatInt(d.Milliseconds(), 10)
	}
	return fenceCore{db: db, cfg: cfg,
		stmt: fenceSQL{
			check: in(pgsql.FenceCheck), checkOrRaise: in(pgsql.FenceCheckOrRaise), advance: in(pgsql.FenceAdvance),
			checkAndBefore: in(pgsql.FenceCheckAndBefore), runTxCheckOrRaise: in(pgsql.FenceRunTxCheckOrRaise),
			logAttempt: in(pgsql.LogAttempt), prune: in(pgsql.PruneAttempts), floorSpace: in(pgsql.ReadFloorSpace),
			write: in(pgsql.FencedWrite), writeBatch: in(pgsql.FencedWriteBatch),
			shared: in(pgsql.FenceShared), earlyRead: in(pgsql.FenceEarlyRead), guardOrRaise: in(pgsql.FenceGuardOrRaise),
			writeShared: in(pgsql.FencedWriteShared), writeBatchShared: in(pgsql.FencedWriteBatchShared),
			writeManyShared: in(pgsql.FencedWriteManyShared), setIdle: setIdle,
		},
		read: pgstore.Reader{DB: db, Pkg: pkg, Schema: cfg.schema},
	}
}

// DefaultIdleInTransactionTimeout bounds how long a transaction of RunTx
// (Fence's or FenceDB's) may sit idle between two of its statements (see
// WithTimeouts).
// A holder frozen inside its transaction (a GC pause, SIGSTOP) holds no
// lock of the fence's, but it still holds the row locks its statements
// took on the caller's tables, and a newer writer of those rows waits for
// them; after this long the server ends the frozen holder's session, its
// transaction rolls back, and those locks are freed.
const DefaultIdleInTransactionTimeout = 5 * time.Second

// Option configures the constructors of the package. Each option's
// documentation says which it affects; a constructor ignores the others:
//
//   - NewFence and NewFenceDB: WithSchema, WithAttemptLog, WithTimeouts,
//     WithFenceObserver and WithLogger;
//   - NewResource and NewResourceDB: the same but WithTimeouts (a write is
//     one statement);
//   - NewLeaseStore and NewLeaseStoreDB: WithSchema, WithoutNotifications
//     and WithSharedLeases;
//   - NewOutbox and NewOutboxDB: WithSchema.
type Option func(*config)

type config struct {
	schema          string
	log             leasecore.AttemptLog
	lockTimeout     time.Duration
	idleInTxTimeout time.Duration
	noNotify        bool                       // WithoutNotifications
	observe         func(leasecore.FenceEvent) // WithFenceObserver, WithLogger
	sharedLeases    bool                       // WithSharedLeases (lease stores only)
}

func newConfig(op string, opts []Option) (config, error) {
	c := config{schema: DefaultSchema, log: leasecore.LogRejected, idleInTxTimeout: DefaultIdleInTransactionTimeout}
	for _, o := range opts {
		o(&c)
	}
	if err := checkSchemaName(op, c.schema); err != nil {
		return config{}, err
	}
	if err := backendkit.CheckAttemptLog(op, c.log); err != nil {
		return config{}, err
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"lock timeout", c.lockTimeout}, {"idle in transaction timeout", c.idleInTxTimeout}} {
		if d.v < 0 || (d.v > 0 && d.v < time.Millisecond) {
			return config{}, &leasecore.ArgError{Op: op, Field: d.field, Value: d.v.String(),
				Reason: "must be 0 (the server's setting) or at least 1ms"}
		}
	}
	return c, nil
}

// WithAttemptLog sets which checks are recorded in write_attempt:
// leasecore.LogRejected (the default), leasecore.LogAll or
// leasecore.LogNone. An accepted check's entry commits with the caller's
// transaction; a rejected check's entry is written on a connection of the
// fence's own pool, so it stays when the caller's transaction rolls back.
func WithAttemptLog(m leasecore.AttemptLog) Option {
	return func(c *config) { c.log = m }
}

// WithSchema puts the library's tables, and its functions and triggers
// (LeaseDDL and ResourceDDL name the functions), in the PostgreSQL schema
// name instead of DefaultSchema: a lower-case unquoted
// identifier (letters a-z, digits, underscores; not starting with a digit
// or "pg_"). Every store of one database that shares tables must use the
// same schema. Migrate creates the schema if it does not exist.
func WithSchema(name string) Option {
	return func(c *config) { c.schema = name }
}

// WithTimeouts sets the lock_timeout and idle_in_transaction_session_timeout
// that RunTx (Fence's and FenceDB's) sets for its own transactions, with
// SET LOCAL semantics (SendBatch sets the lock timeout only: a pipeline is
// never idle inside its transaction). Zero leaves the server's setting.
//
// The defaults: no lock timeout — the caller's context bounds a wait for
// a lock — and DefaultIdleInTransactionTimeout. The idle timeout costs
// nothing (it rides on the early read of the floor); a lock timeout costs
// one more statement in the first round trip. Commit ends the caller's
// transaction and sets nothing: set
// idle_in_transaction_session_timeout yourself (per transaction, per role
// or per database) if a holder could be frozen inside such a transaction.
func WithTimeouts(lock, idleInTransaction time.Duration) Option {
	return func(c *config) { c.lockTimeout, c.idleInTxTimeout = lock, idleInTransaction }
}

// WithoutNotifications makes a LeaseStore's WaitFree return an error
// wrapping errors.ErrUnsupported at once, without touching the database,
// so that leasecore.Campaign polls (leasecore.WithPollInterval) instead of
// waiting for a notification. Use it behind a connection pooler in
// transaction (or statement) mode, such as PgBouncer with
// pool_mode=transaction: there a LISTEN runs on whichever server
// connection the pooler lent for that one statement and does not stay
// with the client, so no release would ever wake the waiter, which would
// sleep until the holding period's remaining time had passed. Release
// still notifies (a NOTIFY is sent when its transaction commits, pooler
// or not), so waiters connected directly to the server are still woken.
// The other options and stores ignore it.
func WithoutNotifications() Option {
	return func(c *config) { c.noNotify = true }
}

// NewFence returns the fence of the database pool is connected to. The
// pool also serves Advance, the log of rejected checks, the reads and
// RunTx. A nil pool or an invalid option returns a *leasecore.ArgError.
// The caller keeps ownership of the pool and closes it. Run Migrate once
// before use.
func NewFence(pool *pgxpool.Pool, opts ...Option) (*Fence, error) {
	const op = "new fence"
	if pool == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "pool", Reason: "must not be nil"}
	}
	cfg, err := newConfig(op, opts)
	if err != nil {
		return nil, err
	}
	return &Fence{fenceCore: newFenceCore(dbx.FromPool(pool), cfg), pool: pool}, nil
}

// NewFenceDB is NewFence for a database/sql pool (lib/pq, or pgx's stdlib
// driver): it returns a FenceDB, whose RunTx and Commit take *sql.Tx.
func NewFenceDB(db *sql.DB, opts ...Option) (*FenceDB, error) {
	const op = "new fence"
	if db == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "db", Reason: "must not be nil"}
	}
	cfg, err := newConfig(op, opts)
	if err != nil {
		return nil, err
	}
	return &FenceDB{fenceCore: newFenceCore(dbx.FromSQL(db), cfg), sqlDB: db}, nil
}

// Migrate creates the fence's tables (and the part store's) if they do not
// exist, then runs CheckSchema; see Resource.Migrate.
func (f *fenceCore) Migrate(ctx context.Context) error {
	if err := pgstore.Migrate(ctx, f.db, pkg, ddl(resourceScript(), f.cfg.schema)); err != nil {
		return err
	}
	return f.CheckSchema(ctx)
}

// CheckSchema reports, as an error wrapping leasecore.ErrSchema that names
// the table or column, whether the fence's tables in its schema
// (fence_floor, write_attempt; not the part store's report_part) are
// missing, out of date, foreign (another table of the same name), or not
// visible to this pool's role. Preflight runs it after checking the
// connection, the server's durability and the role's grants: call
// Preflight at start-up.
func (f *fenceCore) CheckSchema(ctx context.Context) error {
	return pgstore.CheckSchema(ctx, f.db, pkg, f.cfg.schema, pgsql.FenceColumns, pgsql.ResourceFunctions)
}

// Querier is what Fence.Seal and Fence.Install need from a pgx transaction:
// pgx.Tx, *pgx.Conn, *pgxpool.Conn and *pgxpool.Tx all have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// check validates c, runs stmt with the check's parameters, and logs a
// rejection on the fence's own pool.
func (f *fenceCore) check(ctx context.Context, op string, c leasecore.Claim, stmt func(args []any) (int64, error)) (leasecore.Result, error) {
	if err := backendkit.CheckClaim(ctx, op, c); err != nil {
		return leasecore.Result{}, err
	}
	// A rejected entry written inside the caller's transaction would be
	// rolled back with it: rejections are logged by logRejected instead.
	floor, err := stmt(f.args(c, false))
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	return f.outcome(ctx, op, c, floor)
}

// args are the parameters $1..$6 every fence statement takes. logRejected
// is false for a statement in a transaction the caller may roll back.
func (f *fenceCore) args(c leasecore.Claim, logRejected bool) []any {
	return []any{c.Scope, int64(c.Token), c.Writer, f.cfg.log == leasecore.LogAll,
		logRejected && f.cfg.log != leasecore.LogNone, c.Space}
}

// outcome turns the floor a check left into a Result, logging a rejection
// and diagnosing a floor from another token space.
func (f *fenceCore) outcome(ctx context.Context, op string, c leasecore.Claim, floor int64) (leasecore.Result, error) {
	res := leasecore.Result{Accepted: leasecore.Token(floor) == c.Token, Floor: leasecore.Token(floor)}
	if !res.Accepted {
		logErr := f.logRejected(ctx, op, c, "", res.Floor)
		err := errors.Join(f.diagnose(ctx, op, c, res.Floor), logErr)
		f.report(op, c, res, err)
		return res, err
	}
	if f.cfg.observe != nil {
		f.report(op, c, res, nil)
	}
	return res, nil
}

// spaceError is the rejection path's diagnosis: when c names its token
// space, it reads the scope's floor and the space stored with it (one
// statement on the fence's pool, after the check) and returns a
// *leasecore.TokenSpaceError when the floor's space is known and another.
// It returns nil for an ordinary rejection and for a claim without a space
// (then nothing is read). Like logRejected it runs under ctx: when ctx has
// ended, the rejection comes back with an error wrapping ctx's instead of
// the diagnosis.
func (f *fenceCore) spaceError(ctx context.Context, op string, c leasecore.Claim) error {
	if c.Space == "" {
		return nil
	}
	var (
		floor int64
		space string
	)
	err := f.db.QueryRow(ctx, f.stmt.floorSpace, c.Scope).Scan(&floor, &space)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil // no floor: nothing rejected by one
	case err != nil:
		return pgstore.MapError(ctx, pkg, op+": read the floor's token space", err)
	}
	return backendkit.TokenSpaceMismatch(op, c, leasecore.Token(floor), space)
}

// logRejected records a rejected check in autocommit on the fence's pool,
// under ctx like every statement of the call: a caller whose ctx ends right
// after the rejection gets the rejection with an error wrapping ctx's, and
// the attempt is not logged (a record written after the caller's deadline
// would be the call outlasting it).
func (f *fenceCore) logRejected(ctx context.Context, op string, c leasecore.Claim, part string, floor leasecore.Token) error {
	if f.cfg.log == leasecore.LogNone {
		return nil
	}
	_, err := f.db.Exec(ctx, f.stmt.logAttempt, c.Scope, part, c.Writer, int64(c.Token), false, int64(floor))
	if err != nil {
		return pgstore.MapError(ctx, pkg, op+": log the rejection", err)
	}
	return nil
}

// queueLockTimeout queues the lock timeout, when one is set, for the rest
// of the transaction (set_config with is_local: a pipeline's statements go
// through the extended protocol, one statement each).
func (f *fenceCore) queueLockTimeout(b *pgx.Batch) {
	if d := f.cfg.lockTimeout; d > 0 {
		b.Queue("SELECT set_config('lock_timeout', $1::text, true)", strconv.FormatInt(d.Milliseconds(), 10))
	}
}

// BatchSender sends a pgx.Batch: *pgxpool.Pool, *pgx.Conn, *pgxpool.Conn
// and pgx.Tx all do.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// SendBatch sends the check for c and then the statements of b as one
// pipeline on s, a pool or a connection: one round trip, one implicit
// transaction. When the check does not let c through it raises an error
// that aborts the whole pipeline: none of b's statements takes effect. The
// check share-locks the floor row only while the pipeline runs on the
// server: the client sent all of it at once, so no pause of the client
// can fall in between.
//
// The check in the pipeline only passes when the scope's floor equals
// c.Token (this holding period wrote before, or called Advance). When the
// floor is below c.Token, or the scope has none, SendBatch advances it
// (Advance, its own statement) and sends the pipeline once more: three
// round trips, once per holding period that did not call Advance. When
// the floor is above c.Token, SendBatch returns the rejection as a Result
// (logged like RunTx's), not as an error. With leasecore.LogAll the
// pipeline starts with the full check instead, which logs the accepted
// attempt in the pipeline's transaction.
//
// s must not be a pgx.Tx (an error wrapping leasecore.ErrInvalidArgument):
// a check inside the caller's transaction would hold the floor row's lock
// until that transaction ends. Queue the statements on the transaction
// and end it with Commit, which compares at commit. b must not begin or
// end a transaction itself (no Batch.BeginTx, no BEGIN or COMMIT
// statements: they would end the implicit transaction early). Its queries
// may be sent twice; their callbacks (QueuedQuery.Exec, Query, QueryRow)
// run only for the pipeline that was applied. b itself is not changed. An
// error from one of b's statements is returned (wrapped), and nothing of
// b took effect.
//
// The advance of a floor below c.Token is a request, and a transaction,
// of its own, committed before the pipeline is sent. So SendBatch can
// commit that raise and still return a rejection (a newer token passed the
// floor between the advance and the pipeline) or an error (from one of b's
// statements, a lost connection, ctx ending): then the scope's floor was
// raised to c.Token and nothing of b was written. The raise is safe to
// keep: it cuts off only holders older than c.Token, as c's own Advance
// would.
func (f *Fence) SendBatch(ctx context.Context, s BatchSender, c leasecore.Claim, b *pgx.Batch) (leasecore.Result, error) {
	const op = "send batch"
	if err := backendkit.CheckClaim(ctx, op, c); err != nil {
		return leasecore.Result{}, err
	}
	switch s.(type) {
	case nil:
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "sender", Reason: "must not be nil"}
	case pgx.Tx:
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "sender",
			Reason: "is a transaction: queue the statements on it and end it with Commit, which compares at commit"}
	}
	if b == nil {
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "batch", Reason: "must not be nil"}
	}
	// The pipeline is one implicit transaction of our own: a serialization
	// failure (a server defaulting to a stricter level than Read Committed)
	// aborted all of it, and it is sent again like a single statement (see
	// RetrySerialization).
	send := func(check string, args ...any) (floor int64, err error) {
		err = pgstore.RetrySerialization(ctx, func() (err error) {
			floor, err = f.sendPipeline(ctx, s, b, check, args...)
			return err
		})
		return floor, err
	}
	if f.logAll() {
		floor, err := send(f.stmt.checkOrRaise, f.args(c, false)...)
		if floor, ok := rejectedFloor(err); ok {
			return f.outcome(ctx, op, c, floor)
		}
		if err != nil {
			return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
		}
		if f.cfg.observe != nil {
			f.report(op, c, leasecore.Result{Accepted: true, Floor: leasecore.Token(floor)}, nil)
		}
		return leasecore.Result{Accepted: true, Floor: leasecore.Token(floor)}, nil
	}
	for advanced := false; ; advanced = true {
		_, err := send(f.stmt.guardOrRaise, c.Scope, int64(c.Token))
		floor, ok := rejectedFloor(err)
		switch {
		case err == nil:
			if f.cfg.observe != nil {
				f.report(op, c, leasecore.Result{Accepted: true, Floor: c.Token}, nil)
			}
			return leasecore.Result{Accepted: true, Floor: c.Token}, nil
		case !ok:
			return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
		case leasecore.Token(floor) > c.Token:
			return f.outcome(ctx, op, c, floor)
		case advanced:
			// Only ever raised, the floor was c.Token or more after the
			// advance: it was written outside the fence.
			return leasecore.Result{}, fmt.Errorf("%s: %s: the floor of scope %q is %d right after it was advanced to %d: it was written outside the fence, or the database lost committed transactions (a failover to a replica that lacked them, a restore): %w",
				pkg, op, c.Scope, floor, c.Token, leasecore.ErrConfig)
		}
		res, err := f.advance(ctx, c) // reported as this send batch, not as an Advance
		if err != nil || !res.Accepted {
			if res.Floor != 0 { // rejected
				f.report(op, c, res, err)
			}
			return res, err
		}
	}
}

// sendPipeline sends check (with args) and then b's statements as one
// pipeline on s and returns the floor the check read.
func (f *Fence) sendPipeline(ctx context.Context, s BatchSender, b *pgx.Batch, check string, args ...any) (floor int64, err error) {
	pipe := &pgx.Batch{}
	f.queueLockTimeout(pipe)
	pipe.Queue(check, args...).QueryRow(func(r pgx.Row) error { return r.Scan(&floor) })
	// Fresh copies: pgx keeps a sent query's prepared-statement
	// description in it, and after an aborted pipeline that statement
	// may be gone from the server.
	for _, q := range b.QueuedQueries {
		pipe.QueuedQueries = append(pipe.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn})
	}
	return floor, s.SendBatch(ctx, pipe).Close()
}

// rejectedFloor recognises fence_reject's error and returns the floor it
// carries in its DETAIL.
func rejectedFloor(err error) (int64, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgsql.RejectedState {
		return 0, false
	}
	n, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
	return n, perr == nil
}

// Advance raises the scope's floor to c.Token without writing data: one
// statement in autocommit. A new holder calls it right after it acquires,
// so a stale holder is rejected from then on, also for parts or rows the
// new holder has not written yet. Accepted when the floor was at most
// c.Token (it now equals it; a floor it moved up stores c.Space as its
// token space);
// rejected, changing nothing, when a newer token already passed — with a
// *leasecore.TokenSpaceError when that token was from another token space
// (see Fence). Logged as the fence's attempt log says (WithAttemptLog).
func (f *fenceCore) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	res, err := f.advance(ctx, c)
	if f.cfg.observe != nil && res.Floor != 0 { // a Result, accepted or rejected
		f.report("advance", c, res, err)
	}
	return res, err
}

// advance is Advance without the report, for SendBatch too.
func (f *fenceCore) advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	const op = "advance"
	if err := backendkit.CheckClaim(ctx, op, c); err != nil {
		return leasecore.Result{}, err
	}
	var floor int64
	if err := pgstore.RetrySerialization(ctx, func() error {
		return f.db.QueryRow(ctx, f.stmt.advance, f.args(c, true)...).Scan(&floor)
	}); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	res := leasecore.Result{Accepted: leasecore.Token(floor) == c.Token, Floor: leasecore.Token(floor)}
	if !res.Accepted {
		// Logged by the statement itself (autocommit); only the diagnosis
		// is left.
		return res, f.diagnose(ctx, op, c, res.Floor)
	}
	return res, nil
}

// Floor returns the scope's floor, 0 when the scope never accepted a
// check.
func (f *fenceCore) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return f.read.Floor(ctx, scope)
}

// Attempts returns entries of the attempt log of q.Scope logged at or
// after q.Since (by the database clock), oldest first, at most q.Limit.
// A check's entry has an empty Part.
func (f *fenceCore) Attempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	return f.read.AttemptsSince(ctx, q)
}

// PruneAttempts deletes the entries of scope's attempt log logged before
// before (by the database clock) and returns how many it deleted.
func (f *fenceCore) PruneAttempts(ctx context.Context, scope string, before time.Time) (int64, error) {
	const op = "prune attempts"
	if err := backendkit.CheckPrune(ctx, op, scope, before); err != nil {
		return 0, err
	}
	var n int64
	err := pgstore.RetrySerialization(ctx, func() (err error) {
		n, err = f.db.Exec(ctx, f.stmt.prune, scope, before)
		return err
	})
	if err != nil {
		return 0, pgstore.MapError(ctx, pkg, op, err)
	}
	return n, nil
}
