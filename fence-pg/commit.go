package fencepg

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The fenced transaction decides at commit. Its comparison with the floor
// is the last statement before COMMIT and takes the floor row's lock only
// from there to the end of the transaction: on pgx both travel in one
// round trip, so no pause of the client can fall between them; on
// database/sql they are two, and the idle-in-transaction timeout bounds a
// pause there. While the caller's function runs the fence holds no lock,
// so a frozen or slow holder never makes a newer writer of the scope wait
// on the floor (it may still hold row locks of the caller's own tables),
// and a newer token accepted or advanced meanwhile rejects the whole
// transaction when it commits. Etcd's Txn and Chubby's sequencers
// (SOURCES.md) decide when the request arrives for the same reason.

// RunTx begins a Read Committed transaction on the Fence's pgx pool, runs
// fn in it, and commits it only if, when it commits, no token larger than
// c.Token has been accepted or advanced for c.Scope:
//
//   - The first round trip is BEGIN with the idle timeout. Until this
//     Fence has seen the scope's floor at c.Token (the first transaction
//     of a holding period, or after the floor moved) it also reads the
//     floor, taking no lock: a token the floor has already passed is
//     rejected at once, fn not called; a floor below c.Token (a holding
//     period that did not call Advance) is first raised to c.Token in a
//     transaction of its own that commits before fn runs, as Advance
//     does, so older holders are cut off from then on — one more round
//     trip (FenceDB's: several), once per holding period, whose wait a
//     lock timeout (WithTimeouts) bounds too.
//   - fn runs with no lock of the fence's held. If fn returns an error (or
//     panics), RunTx rolls back and returns that error wrapped (errors.Is
//     and errors.As reach it; a server or connection failure inside fn is
//     classified like any other, e.g. wrapping leasecore.ErrUnavailable).
//     fn must not commit or roll back tx itself.
//   - Then the comparison and COMMIT go in one round trip: the comparison
//     share-locks the floor row and, if the floor is no longer c.Token,
//     aborts the transaction, which then rolls back whole. Accepted:
//     Result{Accepted: true}. Rejected: Result.Floor is the larger token
//     that beat c.Token (with a *leasecore.TokenSpaceError when it is from
//     another token space, see Fence), and nothing fn wrote is kept.
//
// A holder frozen inside fn (a GC pause, SIGSTOP) therefore holds up no
// newer writer on the fence: a newer holder's Advance or write goes
// through at once, and the frozen holder's transaction is rejected when it
// wakes and commits. Until it wakes or its session ends it still holds the
// row locks its own statements took on the caller's tables; the
// idle-in-transaction timeout (DefaultIdleInTransactionTimeout,
// WithTimeouts) ends a frozen holder's session, and its transaction with
// it, after that long. The frozen holder, when it wakes after that, gets
// an error wrapping leasecore.ErrUnavailable that names the timeout.
//
// ctx bounds every statement RunTx sends. Given a session's context
// (leasecore.Session.Context), a hold that ends while the transaction runs
// cancels it: RunTx returns an error wrapping the context's error and its
// cause (leasecore.ErrLocalDeadline, leasecore.ErrLost), never
// leasecore.ErrUnavailable, whichever driver noticed ("fencepg: run tx:
// context canceled (the context ended: <cause>): nothing of the
// transaction was committed"), and nothing is committed — the fence is
// not asked, and no rejection is logged — unless the hold ends during the
// round trip that carries the COMMIT (below). With a context of its own,
// the transaction goes on and the fence decides at commit. Either is safe.
//
// A floor below c.Token at the comparison, after this Fence raised it to
// c.Token or saw it at c.Token, is not a rejection: floors only go up, so
// it was written outside the fence, or the database lost committed
// transactions (and with them, perhaps, writes of this holding period).
// RunTx then commits nothing and returns an error wrapping
// leasecore.ErrConfig, for this and every later transaction of that
// holding period through this Fence, instead of raising the floor back to
// c.Token as a holding period's first write would. FenceDB.RunTx does the
// same.
//
// # An outcome that is unknown
//
// When the connection breaks or ctx ends, the error says what became of
// the transaction. Before the COMMIT was sent it ends with "nothing of the
// transaction was committed". After — the connection was lost, or ctx
// ended, during the round trip that carries the COMMIT — it says "the
// COMMIT was sent and its answer never came: the transaction may have
// committed, or may still commit" (see the package documentation). Nothing
// the fence keeps ties that outcome to this one
// transaction: the attempt log records a rejection by its Writer (the
// holder) and token only, an accepted check only with leasecore.LogAll,
// and on PostgreSQL a check's entry has no part (Attempt.Part is empty),
// so two transactions of one holder and token look alike there; the floor
// is the token whether this transaction committed or another of the same
// holding period did. To tie the outcome to this transaction, write a key
// of your own in it — an idempotency key or request id, in a row of your
// tables under a unique constraint, one per transaction — and look for it
// afterwards: found, the transaction committed; not found, it has not
// (yet: look again once the server has ended the broken connection's
// session, which pg_stat_activity shows). A retry that writes the same
// key then cannot apply twice: its insert conflicts with the committed
// one.
func (f *Fence) RunTx(ctx context.Context, c leasecore.Claim, fn func(tx pgx.Tx) error) (leasecore.Result, error) {
	const op = "run tx"
	if err := f.checkRun(ctx, op, c, fn == nil); err != nil {
		return leasecore.Result{}, err
	}
	conn, tx, floor, err := f.beginPgx(ctx, op, c)
	if err != nil {
		return leasecore.Result{}, err
	}
	if floor < c.Token {
		if floor, err = f.raisePgx(ctx, op, c, tx); err != nil {
			rollback(ctx, tx)
			conn.Release()
			return leasecore.Result{}, err
		}
	}
	return f.runPgx(ctx, op, c, conn, tx, floor, fn)
}

// beginPgx acquires a connection and sends BEGIN with the transaction's
// settings and, unless this Fence has seen the floor at c.Token already
// (seenFloors), the early read of the floor, in one round trip. It returns
// the floor read, or c.Token when it read none.
func (f *Fence) beginPgx(ctx context.Context, op string, c leasecore.Claim) (*pgxpool.Conn, pgx.Tx, leasecore.Token, error) {
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, 0, txError(ctx, op, err, false)
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	f.queueLockTimeout(b)
	floor := int64(c.Token)
	var setting string
	switch {
	case !f.seen.at(c.Scope, c.Token):
		b.Queue(f.stmt.earlyRead, c.Scope, f.idleSetting()).QueryRow(func(r pgx.Row) error { return r.Scan(&floor, &setting) })
	case f.stmt.setIdle != "":
		b.Queue(f.stmt.setIdle)
	}
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		rollback(ctx, tx)
		conn.Release()
		return nil, nil, 0, txError(ctx, op, err, false)
	}
	return conn, tx, leasecore.Token(floor), nil
}

// runPgx is RunTx once the transaction has begun and early, the floor it
// read, is at least c.Token: above it, it rejects at once; at it, it runs
// fn and then the comparison and COMMIT in one round trip.
func (f *Fence) runPgx(ctx context.Context, op string, c leasecore.Claim, conn *pgxpool.Conn, tx pgx.Tx,
	early leasecore.Token, fn func(pgx.Tx) error) (leasecore.Result, error) {
	released, finished := false, false
	release := func() {
		if !released {
			released = true
			conn.Release()
		}
	}
	defer release()
	defer func() {
		if !finished {
			rollback(ctx, tx)
		}
	}()
	rejected := func(floor int64) (leasecore.Result, error) {
		finished = true
		f.seen.saw(c.Scope, leasecore.Token(floor))
		rollback(ctx, tx)
		// Give the connection back before logging: the log needs one of
		// the pool's, and with every connection held by a rejected writer
		// waiting for another the pool would never free one.
		release()
		return f.outcome(ctx, op, c, floor)
	}
	if early != c.Token {
		if err := f.notBelow(op, c, int64(early)); err != nil {
			return leasecore.Result{}, err
		}
		return rejected(int64(early))
	}
	if err := fn(tx); err != nil {
		return leasecore.Result{}, txError(ctx, op, err, false)
	}
	if ctx.Err() != nil {
		// Ended while fn ran: not sent, the deferred rollback closes the
		// connection and the server rolls the transaction back.
		return leasecore.Result{}, txError(ctx, op+": commit", ctx.Err(), false)
	}
	b := &pgx.Batch{}
	f.queueCommitCheck(b, c)
	b.Queue("commit")
	err := tx.SendBatch(ctx, b).Close()
	if floor, ok := rejectedFloor(err); ok {
		if err := f.notBelow(op, c, floor); err != nil {
			return leasecore.Result{}, err
		}
		return rejected(floor)
	}
	if err != nil {
		return leasecore.Result{}, txError(ctx, op+": commit", err, !pgconn.SafeToRetry(err))
	}
	finished = true
	f.seen.saw(c.Scope, c.Token)
	return f.accepted(op, c), nil
}

// rollback rolls tx back after a failure, under ctx like every round trip
// of the call: a rollback detached from ctx would wait for as long as a
// server that stopped answering takes, past the caller's deadline. When ctx
// has ended (often why the transaction failed) pgx does not send the
// ROLLBACK: it closes the connection, which the pool then discards, and the
// server rolls the transaction back when it sees the connection close (a
// server that is not answering, when it runs again).
func rollback(ctx context.Context, tx pgx.Tx) { _ = tx.Rollback(ctx) }

// queueCommitCheck queues RunTx's comparison that goes before COMMIT: the
// guard (the floor must equal the token; RunTx raised it before fn ran)
// or, with leasecore.LogAll, the full check, which also logs the accepted
// attempt in the transaction. Either raises fencepg's rejection (see
// rejectedFloor) when the floor is not the token — the full check also
// when the floor before it was below the token, which it would have
// raised — so the COMMIT behind it does not run.
func (f *fenceCore) queueCommitCheck(b *pgx.Batch, c leasecore.Claim) {
	if f.logAll() {
		b.Queue(f.stmt.runTxCheckOrRaise, f.args(c, false)...)
		return
	}
	b.Queue(f.stmt.guardOrRaise, c.Scope, int64(c.Token))
}

// raiseArgs are the advance's parameters when either RunTx raises a
// floor below the token before the caller's function runs: nothing is
// logged there (the read that follows decides, and a rejection is logged
// once, by outcome; with leasecore.LogAll the accepted attempt is logged
// by the comparison at commit).
func (f *fenceCore) raiseArgs(c leasecore.Claim) []any {
	args := f.args(c, false)
	args[3] = false
	return args
}

// raisePgx raises the floor to c.Token before RunTx's function runs, on
// the transaction's own connection and in one round trip: the empty
// transaction begun with the early read is rolled back, the advance runs
// in a transaction of its own (with the lock timeout) and commits, so no
// lock of it is held while fn runs, and the transaction proper begins
// again with its settings and reads the floor once more, which it
// returns.
func (f *Fence) raisePgx(ctx context.Context, op string, c leasecore.Claim, tx pgx.Tx) (leasecore.Token, error) {
	const begin = "begin isolation level read committed"
	b := &pgx.Batch{}
	b.Queue("rollback")
	b.Queue(begin)
	f.queueLockTimeout(b)
	b.Queue(f.stmt.advance, f.raiseArgs(c)...)
	b.Queue("commit")
	b.Queue(begin)
	f.queueLockTimeout(b)
	var floor int64
	var setting string
	b.Queue(f.stmt.earlyRead, c.Scope, f.idleSetting()).QueryRow(func(r pgx.Row) error { return r.Scan(&floor, &setting) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, txError(ctx, op, err, false)
	}
	return leasecore.Token(floor), nil
}

// raiseSQL is raisePgx for FenceDB.RunTx, whose caller has rolled its
// transaction back: the advance in a transaction of its own on the pool,
// with the lock timeout.
func (f *FenceDB) raiseSQL(ctx context.Context, op string, c leasecore.Claim) error {
	tx, err := f.beginSQLTx(ctx, op)
	if err != nil {
		return err
	}
	var floor int64
	if err := tx.QueryRowContext(ctx, f.stmt.advance, f.raiseArgs(c)...).Scan(&floor); err != nil {
		_ = tx.Rollback()
		return txError(ctx, op, err, false)
	}
	// The raise's own COMMIT: the caller's transaction has not begun.
	if err := tx.Commit(); err != nil {
		return txError(ctx, op, err, false)
	}
	return nil
}

// notBelow returns the error for a floor found below c.Token where it can
// only be at or above it: in RunTx, which had the floor at c.Token before
// the caller's function ran (it raised it there, or its Fence saw it
// there: seenFloors). Floors only go up, so it was written outside the
// fence, or the database lost the transaction that raised it: the error
// wraps leasecore.ErrConfig. The Fence keeps the floor it saw, so the
// holding period of c.Token meets the error again on each RunTx through
// it: its writes since that raise may have been lost with the raise.
func (f *fenceCore) notBelow(op string, c leasecore.Claim, floor int64) error {
	if leasecore.Token(floor) >= c.Token {
		return nil
	}
	return fmt.Errorf("%s: %s: the floor of scope %q is %d, below %d, which this Fence raised it to or saw it at: it was written outside the fence, or the database lost committed transactions (a failover to a replica that lacked them, a restore): %w",
		pkg, op, c.Scope, floor, c.Token, leasecore.ErrConfig)
}

// accepted reports and returns an accepted commit.
func (f *fenceCore) accepted(op string, c leasecore.Claim) leasecore.Result {
	res := leasecore.Result{Accepted: true, Floor: c.Token}
	if f.cfg.observe != nil {
		f.report(op, c, res, nil)
	}
	return res
}

// RunTx is Fence.RunTx on the FenceDB's database/sql pool, with fn
// given a *sql.Tx. BEGIN, the lock timeout's setting (when one is set) and
// the early read are a round trip each — once the Fence has seen the floor
// at the token, the idle timeout's setting, a statement without parameters,
// takes the early read's place (lib/pq sends a statement with parameters
// in two round trips unless the DSN sets binary_parameters=yes); at the end
// the comparison and COMMIT are two, since database/sql cannot pipeline them: the comparison's share
// lock of the floor row is held for the one round trip between them. A
// holder frozen there makes a newer holder's Advance (and fenced writes)
// wait until it wakes or the idle-in-transaction timeout ends its session;
// in a loop of small transactions a random pause lands there often.
func (f *FenceDB) RunTx(ctx context.Context, c leasecore.Claim, fn func(tx *sql.Tx) error) (leasecore.Result, error) {
	const op = "run tx"
	if err := f.checkRun(ctx, op, c, fn == nil); err != nil {
		return leasecore.Result{}, err
	}
	tx, floor, err := f.beginSQL(ctx, op, c)
	if err != nil {
		return leasecore.Result{}, err
	}
	if floor < c.Token {
		_ = tx.Rollback()
		if err := f.raiseSQL(ctx, op, c); err != nil {
			return leasecore.Result{}, err
		}
		if tx, floor, err = f.beginSQL(ctx, op, c); err != nil {
			return leasecore.Result{}, err
		}
	}
	if floor != c.Token {
		_ = tx.Rollback()
		if err := f.notBelow(op, c, int64(floor)); err != nil {
			return leasecore.Result{}, err
		}
		f.seen.saw(c.Scope, floor)
		return f.outcome(ctx, op, c, int64(floor))
	}
	// RunTx's own first statements have returned: how long the
	// transaction can have sat idle is at most the time since.
	since := time.Now()
	if err, lost := runFn(tx, fn); err != nil {
		return leasecore.Result{}, f.lostSQLTx(ctx, op, err, since, lost)
	}
	return f.commitSQL(ctx, op, tx, c, since, true)
}

// runFn calls fn and rolls tx back unless fn returned nil; a panic rolls
// back too and goes on. lost reports that the rollback found the
// connection broken, which fn's error (formatted, not wrapped) may hide.
func runFn(tx *sql.Tx, fn func(*sql.Tx) error) (err error, lost bool) {
	ok := false
	defer func() {
		if !ok {
			lost = errors.Is(tx.Rollback(), driver.ErrBadConn)
		}
	}()
	err = fn(tx)
	ok = err == nil
	return err, false
}

// What the error of a fenced transaction says about its outcome when the
// connection broke or ctx ended, the errors after which the package
// documentation calls an outcome unknown: a transaction whose COMMIT was
// never sent has committed nothing; one whose COMMIT was sent and not
// answered may have committed.
const (
	notCommitted  = "nothing of the transaction was committed"
	commitUnknown = "the COMMIT was sent and its answer never came: the transaction may have committed, or may still commit"
)

// txError maps err, from step op of a fenced transaction, with MapError
// and, when that leaves the outcome open (a broken connection, ctx's end:
// pgstore.OutcomeUnknown) and the server did not answer with an error of
// its own, states the outcome: commitSent reports that the COMMIT may
// have reached the server.
func txError(ctx context.Context, op string, err error, commitSent bool) error {
	mapped := pgstore.MapError(ctx, pkg, op, err)
	var coded interface{ SQLState() string }
	if !pgstore.OutcomeUnknown(mapped) || (ctx.Err() == nil && errors.As(err, &coded)) {
		return mapped
	}
	if commitSent {
		return fmt.Errorf("%w: %s", mapped, commitUnknown)
	}
	return fmt.Errorf("%w: %s", mapped, notCommitted)
}

// lostSQLTx maps the error of a database/sql fenced transaction before
// its COMMIT was sent (in fn, or at the comparison) and says that nothing
// of the transaction was committed when the connection broke or ctx
// ended. lib/pq turns the server's FATAL error for a session it ended
// into driver.ErrBadConn and the reason is lost (pgx's stdlib driver keeps
// it, SQLSTATE 25P03, which MapError names); the most common reason
// inside a transaction is idle_in_transaction_session_timeout. RunTx
// knows the timeout it set (since is when its own first statements
// returned; fn's are not timed): when the transaction had been open
// longer than that, the error says that the server most likely ended it.
// For Commit, since is zero: the caller's transaction is not the fence's
// to time. lost reports that a rollback found the connection broken,
// which fn's error (formatted, not wrapped) may hide.
func (f *FenceDB) lostSQLTx(ctx context.Context, op string, err error, since time.Time, lost bool) error {
	var coded interface{ SQLState() string }
	if ctx.Err() != nil || errors.As(err, &coded) || !(lost || pgstore.IsConnectionError(err)) {
		return txError(ctx, op, err, false)
	}
	mapped := pgstore.MapError(ctx, pkg, op, err)
	if !errors.Is(mapped, leasecore.ErrUnavailable) {
		mapped = fmt.Errorf("%s: %s: %w: %w", pkg, op, leasecore.ErrUnavailable, err)
	}
	if d := f.cfg.idleInTxTimeout; !since.IsZero() && d > 0 {
		if open := time.Since(since); open > d {
			return fmt.Errorf("%w (the connection broke before the COMMIT was sent, %v after the transaction began, longer than its "+
				"idle_in_transaction_session_timeout %v: the server most likely ended the session of a transaction that sat idle "+
				"that long, SQLSTATE 25P03, which this driver does not report; %s)", mapped, open.Round(time.Millisecond), d, notCommitted)
		}
	}
	return fmt.Errorf("%w (the connection broke before the COMMIT was sent: %s)", mapped, notCommitted)
}

// commitFailed maps the error of database/sql's COMMIT of a fenced
// transaction; idleFrom is when the comparison before it returned, since
// as for lostSQLTx. database/sql returns the context's error itself, or
// sql.ErrTxDone when it has already rolled the transaction back for the
// context, without sending the COMMIT, and pgx's stdlib driver marks an
// error from before sending safe to retry: then nothing was committed.
// Otherwise the COMMIT was sent, and a broken connection leaves the
// outcome unknown. lib/pq reports driver.ErrBadConn both when the server
// had ended the session before the COMMIT arrived (it reads the server's
// FATAL error, or EOF, where the answer should be) and when the
// connection broke after the COMMIT arrived, which may have committed it:
// the error stays "outcome unknown", and adds the likely cause when RunTx
// knows that the transaction sat idle between the comparison and the
// COMMIT for longer than the idle timeout it set.
func (f *FenceDB) commitFailed(ctx context.Context, op string, err error, idleFrom, since time.Time) error {
	//nolint:errorlint // database/sql returns the context's error value itself
	sent := !(err == context.Canceled || err == context.DeadlineExceeded ||
		errors.Is(err, sql.ErrTxDone) || pgconn.SafeToRetry(err))
	mapped := txError(ctx, op, err, sent)
	d := f.cfg.idleInTxTimeout
	if !sent || ctx.Err() != nil || !errors.Is(err, driver.ErrBadConn) || since.IsZero() || d <= 0 {
		return mapped
	}
	if idle := time.Since(idleFrom); idle > d {
		return fmt.Errorf("%w (the transaction sat idle %v between the comparison and the COMMIT, longer than its "+
			"idle_in_transaction_session_timeout %v: the server most likely ended the session before the COMMIT arrived, "+
			"SQLSTATE 25P03, which this driver does not report, and then nothing was committed)",
			mapped, idle.Round(time.Millisecond), d)
	}
	return mapped
}

// beginSQLTx begins a Read Committed transaction on the database/sql
// pool with the lock timeout, when one is set.
func (f *FenceDB) beginSQLTx(ctx context.Context, op string) (*sql.Tx, error) {
	tx, err := f.sqlDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, txError(ctx, op, err, false)
	}
	if d := f.cfg.lockTimeout; d > 0 {
		// No arguments: lib/pq sends the simple protocol.
		if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(d.Milliseconds(), 10)); err != nil {
			_ = tx.Rollback()
			return nil, txError(ctx, op, err, false)
		}
	}
	return tx, nil
}

// beginSQL begins RunTx's transaction with its settings and, unless
// this Fence has seen the floor at c.Token already (seenFloors), reads the
// floor, taking no lock. It returns the floor read, or c.Token when it
// read none.
func (f *FenceDB) beginSQL(ctx context.Context, op string, c leasecore.Claim) (*sql.Tx, leasecore.Token, error) {
	tx, err := f.beginSQLTx(ctx, op)
	if err != nil {
		return nil, 0, err
	}
	floor := int64(c.Token)
	switch {
	case !f.seen.at(c.Scope, c.Token):
		var setting string
		err = tx.QueryRowContext(ctx, f.stmt.earlyRead, c.Scope, f.idleSetting()).Scan(&floor, &setting)
	case f.stmt.setIdle != "":
		// No arguments: lib/pq sends it with the simple protocol, one
		// round trip, where a statement with a parameter is prepared
		// first, two.
		_, err = tx.ExecContext(ctx, f.stmt.setIdle)
	}
	if err != nil {
		_ = tx.Rollback()
		return nil, 0, txError(ctx, op, err, false)
	}
	return tx, leasecore.Token(floor), nil
}

// commitSQL compares c with the floor as the last statement of tx and
// commits tx when the floor is c.Token, else rolls it back: RunTx's end
// (since is when RunTx's last statement before fn returned) and Commit
// (since is zero: the caller's transaction is not ours to time). runTx
// says that the floor was at c.Token before the caller's function ran
// (RunTx raised it there, or its Fence saw it there): then a floor found
// below c.Token is an error (notBelow), not raised.
func (f *FenceDB) commitSQL(ctx context.Context, op string, tx *sql.Tx, c leasecore.Claim, since time.Time, runTx bool) (leasecore.Result, error) {
	var floor int64
	err := sql.ErrNoRows
	if !f.logAll() {
		// The common case: the floor equals the token; share-locked, no
		// new row version.
		err = tx.QueryRowContext(ctx, f.stmt.shared, c.Scope, int64(c.Token)).Scan(&floor)
	}
	if errors.Is(err, sql.ErrNoRows) {
		// Not equal (or LogAll): the full check raises a floor below the
		// token and returns the floor it left, and the floor before it.
		var before int64
		err = tx.QueryRowContext(ctx, f.stmt.checkAndBefore, f.args(c, false)...).Scan(&floor, &before)
		if err == nil && runTx && leasecore.Token(before) < c.Token {
			_ = tx.Rollback()
			return leasecore.Result{}, f.notBelow(op, c, before)
		}
	}
	if err != nil {
		lost := errors.Is(tx.Rollback(), driver.ErrBadConn)
		return leasecore.Result{}, f.lostSQLTx(ctx, op, err, since, lost)
	}
	checked := time.Now()
	f.seen.saw(c.Scope, leasecore.Token(floor))
	if leasecore.Token(floor) != c.Token {
		_ = tx.Rollback()
		return f.outcome(ctx, op, c, floor)
	}
	if pause := commitgap.PauseFrom(ctx); pause != nil {
		pause()
	}
	if ctx.Err() != nil {
		// Commit's tx may be bound to another context than ctx, which
		// still ends the call: the COMMIT is not sent.
		_ = tx.Rollback()
		return leasecore.Result{}, txError(ctx, op+": commit", ctx.Err(), false)
	}
	if err := tx.Commit(); err != nil {
		return leasecore.Result{}, f.commitFailed(ctx, op+": commit", err, checked, since)
	}
	return f.accepted(op, c), nil
}

// Commit ends the caller's own pgx transaction tx under the fence for c:
// it compares c.Token with the scope's floor as the last statement of tx
// and commits tx in the same round trip when the floor allows it, so tx
// commits only if, when it commits, no larger token has been accepted or
// advanced for c.Scope. A floor below c.Token is raised to it in that
// statement. Use it for transactions the caller begins and fills itself
// (its own BEGIN, statements, a pgx.Batch on tx); RunTx does the same for
// a function.
//
// Accepted: tx is committed, Result{Accepted: true}. Rejected: tx is
// rolled back, nothing written in it is kept, and Result.Floor is the
// larger token that beat c.Token (logged, and diagnosed, as RunTx's
// rejections are). Either way tx is closed: a deferred tx.Rollback then
// returns pgx.ErrTxClosed, as after tx.Commit. An error means tx was
// rolled back (a ctx that had already ended sends nothing and rolls tx
// back: "nothing of the transaction was committed"), or — an error that
// says the COMMIT was sent and its answer never came: the connection lost,
// or ctx ended, during the round trip — that the outcome is unknown:
// resolve it with a key of your own written in tx, as RunTx's
// documentation describes (the attempt log and the floor cannot tell
// which transaction of a holder committed).
//
// Until Commit the fence holds no lock for tx, so a newer holder never
// waits on the fence for it; tx's own statements hold their row locks
// until it ends, as always. Run tx at Read Committed (see Fence about
// stricter levels) and bound how long a frozen holder can keep them: set
// idle_in_transaction_session_timeout for the transaction right after
// BEGIN (tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout =
// '5s'")), or for the role or database. tx must be a transaction begun on a pool or connection (pgx.Tx from
// Begin or BeginTx), not a pseudo-nested one from Tx.Begin: Commit commits
// the real transaction. Its round trip carries one more statement after
// the COMMIT, a BEGIN, whose empty transaction tx.Commit then ends: that
// is how tx is closed (and a *pgxpool.Tx's connection returned) without a
// COMMIT the server would answer with a warning.
func (f *Fence) Commit(ctx context.Context, tx pgx.Tx, c leasecore.Claim) (leasecore.Result, error) {
	const op = "commit"
	if err := backendkit.CheckClaim(context.WithoutCancel(ctx), op, c); err != nil {
		return leasecore.Result{}, err
	}
	if tx == nil {
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	if ctx.Err() != nil {
		rollback(ctx, tx)
		return leasecore.Result{}, txError(ctx, op, ctx.Err(), false)
	}
	b := &pgx.Batch{}
	b.Queue(f.stmt.checkOrRaise, f.args(c, false)...)
	b.Queue("commit")
	b.Queue("begin")
	err := tx.SendBatch(ctx, b).Close()
	if err != nil {
		rollback(ctx, tx)
		if floor, ok := rejectedFloor(err); ok {
			return f.outcome(ctx, op, c, floor)
		}
		return leasecore.Result{}, txError(ctx, op, err, !pgconn.SafeToRetry(err))
	}
	// Committed. This ends the empty transaction the BEGIN opened; if it
	// fails the connection is gone, which changes nothing that committed.
	// Under ctx, as every round trip of Commit: with ctx ended pgx closes
	// the connection instead, and the server ends the empty transaction.
	_ = tx.Commit(ctx)
	f.seen.saw(c.Scope, c.Token)
	return f.accepted(op, c), nil
}

// Commit is Fence.Commit for a database/sql transaction: the comparison and
// COMMIT are two round trips (database/sql cannot pipeline them), so the
// comparison's share lock of the floor row is held for the one round trip
// between them. Accepted: tx is committed. Rejected or an error: tx is
// rolled back — except when the error says that the COMMIT was sent and
// its answer never came (the connection broke, or ctx ended, during the
// COMMIT): then the outcome is unknown; resolve it with a key of your own
// written in tx, as Fence.RunTx's documentation describes. A connection
// that broke, or a ctx that ended, before the COMMIT was sent says that
// nothing was committed. lib/pq does not report why a server ended a
// session, most often idle_in_transaction_session_timeout inside a
// transaction, and reports a session the server ended before the COMMIT
// arrived as it reports a connection lost after: "bad connection", the
// outcome unknown. RunTx, which sets the idle timeout itself, then names
// the timeout as the likely cause when its transaction sat idle between
// the comparison and the COMMIT for longer than that.
func (f *FenceDB) Commit(ctx context.Context, tx *sql.Tx, c leasecore.Claim) (leasecore.Result, error) {
	const op = "commit"
	if err := backendkit.CheckClaim(context.WithoutCancel(ctx), op, c); err != nil {
		return leasecore.Result{}, err
	}
	if tx == nil {
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	if ctx.Err() != nil {
		_ = tx.Rollback()
		return leasecore.Result{}, txError(ctx, op, ctx.Err(), false)
	}
	return f.commitSQL(ctx, op, tx, c, time.Time{}, false)
}

// logAll reports whether every attempt is logged (leasecore.LogAll): the
// accepted one only the full check logs.
func (f *fenceCore) logAll() bool { return f.cfg.log == leasecore.LogAll }

// idleSetting is the idle timeout as set_config takes it, nil to leave the
// server's setting.
func (f *fenceCore) idleSetting() any {
	if d := f.cfg.idleInTxTimeout; d > 0 {
		return strconv.FormatInt(d.Milliseconds(), 10)
	}
	return nil
}

// checkRun validates RunTx's input. A context that has already ended is
// reported as one that ends during the transaction (txError): with its
// cause, and nothing committed.
func (f *fenceCore) checkRun(ctx context.Context, op string, c leasecore.Claim, nilFn bool) error {
	if err := backendkit.CheckClaim(context.WithoutCancel(ctx), op, c); err != nil {
		return err
	}
	if nilFn {
		return &leasecore.ArgError{Op: op, Field: "fn", Reason: "must not be nil"}
	}
	if ctx.Err() != nil {
		return txError(ctx, op, ctx.Err(), false)
	}
	return nil
}
