package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The outcomes a fenced transaction's error states (fencepg's commit.go).
const (
	notCommitted  = "nothing of the transaction was committed"
	commitUnknown = "the COMMIT was sent and its answer never came: the transaction may have committed, or may still commit"
)

// outcomeFixture is a fenceFixture whose fences are on one of three
// drivers: pgx's pool (Fence), lib/pq or pgx's stdlib driver (FenceDB).
type outcomeFixture struct {
	fenceFixture
	driver string
	sqlDB  *sql.DB // the FenceDB's pool; nil on pgx
}

// forEachFenceDriver runs f per driver of pgtest.ForEachDriver and once
// more on database/sql with pgx's stdlib driver, which reports the
// server's errors where lib/pq reports "bad connection".
func forEachFenceDriver(t *testing.T, f func(t *testing.T, o outcomeFixture)) {
	t.Helper()
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		o := outcomeFixture{fenceFixture: newFenceFixture(t, driver), driver: driver}
		if driver == pgopen.Libpq {
			o.sqlDB = o.resPool.SQL
		}
		f(t, o)
	})
	t.Run(pgxStdlib, func(t *testing.T) {
		o := outcomeFixture{fenceFixture: newFenceFixture(t, pgopen.Pgx), driver: pgxStdlib}
		db, err := sql.Open("pgx", o.resDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		o.sqlDB = db
		o.fence = o.withFence(t)
		f(t, o)
	})
}

// withFence returns a fence with opts on the fixture's driver.
func (o outcomeFixture) withFence(t *testing.T, opts ...fencepg.Option) pgopen.Fence {
	t.Helper()
	if o.sqlDB == nil {
		return openFence(t, o.resPool, opts...)
	}
	f, err := fencepg.NewFenceDB(o.sqlDB, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return pgopen.Fence{SQL: f, FenceMethods: f}
}

// runTx runs RunTx of fence with fn given a function that runs one
// statement in the transaction.
func runTx(ctx context.Context, fence pgopen.Fence, c leasecore.Claim, fn func(exec func(q string, args ...any) error) error) (leasecore.Result, error) {
	if fence.Pgx != nil {
		return fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
			return fn(func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err })
		})
	}
	return fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
		return fn(func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err })
	})
}

// errLocalDeadline is the cause a session's context ends with at its
// local deadline: an error wrapping leasecore.ErrLocalDeadline.
var errLocalDeadline = fmt.Errorf("holder-a: %w", leasecore.ErrLocalDeadline)

// wantContextEnded checks an error of a fenced transaction whose context
// ended with errLocalDeadline: it wraps context.Canceled and the cause,
// not leasecore.ErrUnavailable (a caller retrying on that must not take a
// lost lease for a database hiccup), starts with "fencepg: <op>: ", reads
// as the context's end whichever driver noticed, and ends with outcome.
func wantContextEnded(t *testing.T, err error, op, outcome string) {
	t.Helper()
	if !errors.Is(err, context.Canceled) || !errors.Is(err, leasecore.ErrLocalDeadline) {
		t.Errorf("%v: want it to wrap context.Canceled and the cause, ErrLocalDeadline", err)
	}
	if errors.Is(err, leasecore.ErrUnavailable) {
		t.Errorf("%v wraps ErrUnavailable: a lease that ended would be retried as a database hiccup", err)
	}
	const ended = "context canceled (the context ended: holder-a: leasecore: local deadline passed)"
	if msg := err.Error(); !strings.HasPrefix(msg, "fencepg: "+op+": ") || !strings.Contains(msg, ended) ||
		!strings.HasSuffix(msg, ": "+outcome) {
		t.Errorf("message %q: want \"fencepg: %s: [commit: ]%s: %s\"", msg, op, ended, outcome)
	}
	for _, w := range []string{"timeout", "bad connection", "conn closed"} {
		if strings.Contains(err.Error(), w) {
			t.Errorf("message %q has the driver's words %q for the context's end", err, w)
		}
	}
}

// TestRunTxContextEnded: a job passes RunTx the session's context, which
// ends (at the local deadline, with a cause wrapping ErrLocalDeadline)
// while the transaction is open. On every driver the error wraps the
// context's error and its cause and not ErrUnavailable, starts with
// "fencepg: run tx: ", and states the outcome: nothing committed when the
// COMMIT was never sent, unknown when it was sent and no answer came.
func TestRunTxContextEnded(t *testing.T) {
	forEachFenceDriver(t, func(t *testing.T, o outcomeFixture) {
		for i, tc := range []struct {
			name string
			fn   func(cancel context.CancelCauseFunc, exec func(string, ...any) error) error
		}{
			{"during a statement of fn", func(cancel context.CancelCauseFunc, exec func(string, ...any) error) error {
				time.AfterFunc(100*time.Millisecond, func() { cancel(errLocalDeadline) })
				// Short: a server that does not notice the closed
				// connection sleeps on, with the transaction's row locks.
				return exec(`SELECT pg_sleep(1)`)
			}},
			{"after fn's statements, which returns nil", func(cancel context.CancelCauseFunc, exec func(string, ...any) error) error {
				cancel(errLocalDeadline)
				return nil
			}},
			{"before RunTx", nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := leasecore.Claim{Scope: fmt.Sprintf("ended-%d", i), Writer: "holder-a", Token: 1}
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				if tc.fn == nil {
					cancel(errLocalDeadline)
				}
				_, err := runTx(ctx, o.fence, c, func(exec func(string, ...any) error) error {
					if err := exec(upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err != nil {
						return err
					}
					return tc.fn(cancel, exec)
				})
				t.Logf("%v", err)
				wantContextEnded(t, err, "run tx", notCommitted)
				if got := o.job(t, c.Scope); got != "- lines=-" {
					t.Errorf("rows = %q, want none", got)
				}
			})
		}

		// The context ends while the comparison waits for the floor row,
		// which another transaction holds. pgx has sent the COMMIT in the
		// same round trip: the outcome is unknown (the server may run the
		// comparison and the COMMIT once the lock is free, before it
		// notices the closed connection). database/sql sends the COMMIT
		// only after the comparison: nothing was committed.
		t.Run("while the comparison waits for the floor row", func(t *testing.T) {
			ctx := context.Background()
			c := leasecore.Claim{Scope: "ended-lock", Writer: "holder-a", Token: 1}
			if res, err := o.fence.Advance(ctx, c); err != nil || !res.Accepted {
				t.Fatalf("advance: %+v %v", res, err)
			}
			locker, err := o.resourceDB.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = locker.Rollback(ctx) }()
			if _, err := locker.Exec(ctx, `SELECT FROM leasefence.fence_floor WHERE scope = $1 FOR UPDATE`, c.Scope); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			done := make(chan error, 1)
			go func() {
				_, err := runTx(rctx, o.fence, c, func(exec func(string, ...any) error) error {
					return exec(upsertRun, c.Scope, c.Writer, int64(c.Token), 1)
				})
				done <- err
			}()
			o.waitLockWaiter(t)
			cancel(errLocalDeadline)
			err = <-done
			t.Logf("%v", err)
			if o.fence.Pgx != nil {
				wantContextEnded(t, err, "run tx: commit", commitUnknown)
				return
			}
			wantContextEnded(t, err, "run tx", notCommitted)
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// The server's session of the cancelled comparison ends or
			// rolls back; what matters is that it never commits.
			time.Sleep(200 * time.Millisecond)
			if got := o.job(t, c.Scope); got != "- lines=-" {
				t.Errorf("rows = %q, want none", got)
			}
		})
	})
}

// TestFenceCommitContextEnded: Commit of the caller's own transaction,
// with the context it began the transaction with ended meanwhile: the
// error is the context's end with its cause, not ErrUnavailable, and the
// transaction is rolled back, nothing committed.
func TestFenceCommitContextEnded(t *testing.T) {
	forEachFenceDriver(t, func(t *testing.T, o outcomeFixture) {
		c := leasecore.Claim{Scope: "commit-ended", Writer: "holder-a", Token: 1}
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		var err error
		if o.fence.Pgx != nil {
			tx, berr := o.resPool.Pgx.Begin(ctx)
			if berr != nil {
				t.Fatal(berr)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err != nil {
				t.Fatal(err)
			}
			cancel(errLocalDeadline)
			_, err = o.fence.Pgx.Commit(ctx, tx, c)
		} else {
			tx, berr := o.sqlDB.BeginTx(ctx, nil)
			if berr != nil {
				t.Fatal(berr)
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err != nil {
				t.Fatal(err)
			}
			cancel(errLocalDeadline)
			_, err = o.fence.SQL.Commit(ctx, tx, c)
		}
		t.Logf("%v", err)
		wantContextEnded(t, err, "commit", notCommitted)
		if got := o.job(t, c.Scope); got != "- lines=-" {
			t.Errorf("rows = %q, want none", got)
		}
	})
}

// TestRunTxIdleTimeoutAtCommit: the server ends a fenced transaction that
// sat idle longer than its idle-in-transaction timeout (WithTimeouts)
// right before its COMMIT step. On pgx the comparison and the COMMIT are
// one round trip, so the idle time is inside fn; on database/sql they are
// two, and the holder pauses between them (commitgap.WithPause), as one
// frozen there would. Nothing is committed on any driver. pgx and its
// stdlib driver read the server's SQLSTATE 25P03, and the error names the
// timeout and says that nothing was committed. lib/pq reports only
// driver.ErrBadConn after the COMMIT was written, as it does for a
// connection lost after the server received the COMMIT: the outcome stays
// unknown, and the error names the idle timeout as the likely cause.
func TestRunTxIdleTimeoutAtCommit(t *testing.T) {
	const idle = 300 * time.Millisecond
	forEachFenceDriver(t, func(t *testing.T, o outcomeFixture) {
		fence := o.withFence(t, fencepg.WithTimeouts(0, idle))
		c := leasecore.Claim{Scope: "idle-at-commit", Writer: "holder-a", Token: 1}
		sleep := func() { time.Sleep(2 * idle) }
		ctx := context.Background()
		if fence.Pgx == nil {
			ctx = commitgap.WithPause(ctx, sleep)
		}
		_, err := runTx(ctx, fence, c, func(exec func(string, ...any) error) error {
			if err := exec(upsertRun, c.Scope, c.Writer, int64(c.Token), 1); err != nil {
				return err
			}
			if fence.Pgx != nil {
				sleep()
			}
			return nil
		})
		t.Logf("%v", err)
		if !errors.Is(err, leasecore.ErrUnavailable) {
			t.Errorf("%v: want it to wrap ErrUnavailable", err)
		}
		msg := fmt.Sprint(err)
		want := []string{"fencepg: run tx: commit: ", "idle_in_transaction_session_timeout", notCommitted}
		if o.driver == pgopen.Libpq {
			want = []string{"fencepg: run tx: commit: ", "bad connection", commitUnknown,
				"longer than its idle_in_transaction_session_timeout 300ms: the server most likely ended the session before the COMMIT arrived",
				"and then nothing was committed"}
		}
		if !strings.HasPrefix(msg, want[0]) {
			t.Errorf("message %q does not start with %q", msg, want[0])
		}
		for _, w := range want[1:] {
			if !strings.Contains(msg, w) {
				t.Errorf("message %q lacks %q", msg, w)
			}
		}
		if got := o.job(t, c.Scope); got != "- lines=-" {
			t.Errorf("rows = %q, want none", got)
		}
	})
}
