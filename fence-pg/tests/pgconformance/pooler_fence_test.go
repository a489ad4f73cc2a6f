package pgconformance_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgbouncertest"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestFenceTimeoutsBehindPgBouncer: the lock_timeout and
// idle_in_transaction_session_timeout that RunTx (Fence's and FenceDB's)
// sets with set_config(..., true) or SET LOCAL are transaction-local, so they work
// behind a transaction pooler and do not leak to the next transaction on the same
// server connection (another client's, behind a pooler): inside the
// transaction they hold the configured values, after it the server's; a
// writer behind a held floor lock gives up after the lock timeout
// (ErrUnavailable), and a transaction left idle is ended by the server
// after the idle timeout (ErrUnavailable, nothing committed), after which
// the pool goes on through the pooler. Two server connections, so that the
// lock holder and the writer each have one and every client reuses them.
func TestFenceTimeoutsBehindPgBouncer(t *testing.T) {
	cluster := pgtest.Cluster(t)
	bouncer := pgbouncertest.StartTB(t, cluster, pgbouncertest.WithPoolSize(2))
	for _, pc := range poolerConfigs {
		t.Run(pc.driver, func(t *testing.T) {
			ctx := context.Background()
			db := "timeouts_" + pc.driver
			if err := cluster.CreateDatabase(ctx, db); err != nil {
				t.Fatal(err)
			}
			pool := pgtest.Open(t, pc.driver, bouncer.DSN(db, pc.params...), 4)
			const lockTimeout, idleTimeout = 300 * time.Millisecond, 500 * time.Millisecond
			fence := newFence(t, pool, fencepg.WithTimeouts(lockTimeout, idleTimeout))
			if err := fence.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			const scope = "report"
			if _, err := fence.Advance(ctx, leasecore.Claim{Scope: scope, Writer: "holder-a", Token: 1}); err != nil {
				t.Fatal(err)
			}

			// Inside the fenced transaction: the configured values, in the
			// holder's first transaction (the idle timeout set with the
			// early read of the floor) and its next (the Fence has seen the
			// floor at the token: the idle timeout set on its own).
			var lock, idle string
			var res leasecore.Result
			var err error
			for _, which := range []string{"first", "next"} {
				res, err = runTx(ctx, fence, leasecore.Claim{Scope: scope, Writer: "holder-a", Token: 1}, func(q querier) error {
					return q.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&lock, &idle)
				})
				if err != nil || !res.Accepted {
					t.Fatalf("%s fenced transaction: %+v, %v", which, res, err)
				}
				if lock != "300ms" || idle != "500ms" {
					t.Errorf("inside the %s fenced transaction behind the pooler: lock_timeout=%s idle_in_transaction_session_timeout=%s, want 300ms and 500ms", which, lock, idle)
				}
			}
			// After it, on every server connection: the server's values.
			for i := range 4 {
				if err := pgtest.DB(pool).QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&lock, &idle); err != nil {
					t.Fatal(err)
				}
				if lock != "0" || idle != "0" {
					t.Errorf("statement %d after the fenced transaction: lock_timeout=%s idle_in_transaction_session_timeout=%s, want the server's 0 and 0: the settings leaked past the transaction", i, lock, idle)
				}
			}

			// A writer behind a held floor lock gives up after the lock timeout.
			holder := pgtest.Open(t, pc.driver, bouncer.DSN(db, pc.params...), 1)
			tx, err := pgtest.DB(holder).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT 1 FROM leasefence.fence_floor WHERE scope = $1 FOR UPDATE`, scope); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			_, err = runTx(ctx, fence, leasecore.Claim{Scope: scope, Writer: "holder-b", Token: 2}, func(querier) error { return nil })
			waited := time.Since(t0)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(err, leasecore.ErrUnavailable) || !strings.Contains(err.Error(), "lock timeout") {
				t.Fatalf("a writer behind a held floor lock: %v, want ErrUnavailable (lock timeout)", err)
			}
			if waited < lockTimeout || waited > 5*time.Second {
				t.Errorf("the writer gave up after %v, want about the lock timeout %v", waited, lockTimeout)
			}

			// A transaction idle longer than the idle timeout is ended by the
			// server; nothing of it commits. (RunTx raised the floor to 2
			// before fn ran, in a transaction of its own: that stays.)
			if _, err := pgtest.DB(pool).Exec(ctx, `CREATE TABLE IF NOT EXISTS public.idle_probe (k int PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			_, err = runTx(ctx, fence, leasecore.Claim{Scope: scope, Writer: "holder-b", Token: 2}, func(q querier) error {
				var k int
				if err := q.QueryRow(ctx, `INSERT INTO public.idle_probe VALUES (1) RETURNING k`).Scan(&k); err != nil {
					return err
				}
				time.Sleep(idleTimeout + time.Second)
				return nil
			})
			if !errors.Is(err, leasecore.ErrUnavailable) {
				t.Fatalf("a fenced transaction idle for %v with idle_in_transaction_session_timeout %v: %v, want ErrUnavailable",
					idleTimeout+time.Second, idleTimeout, err)
			}
			t.Logf("idle transaction behind the pooler: %v", err)
			var rows int
			if err := pgtest.DB(pool).QueryRow(ctx, `SELECT count(*) FROM public.idle_probe`).Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("rows of the ended transaction: %d, %v, want 0 (nothing committed)", rows, err)
			}
			if floor, err := fence.Floor(ctx, scope); err != nil || floor != 2 {
				t.Fatalf("floor after the ended transaction: %d, %v, want 2 (raised before fn ran)", floor, err)
			}
			res, err = runTx(ctx, fence, leasecore.Claim{Scope: scope, Writer: "holder-b", Token: 2}, func(querier) error { return nil })
			if err != nil || !res.Accepted {
				t.Fatalf("the next fenced transaction through the pooler: %+v, %v", res, err)
			}
		})
	}
}

// querier is what a test's transaction function needs of either driver's
// transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) interface{ Scan(...any) error }
}

type pgxQuerier struct{ tx pgx.Tx }

func (q pgxQuerier) QueryRow(ctx context.Context, s string, args ...any) interface{ Scan(...any) error } {
	return q.tx.QueryRow(ctx, s, args...)
}

type sqlQuerier struct{ tx *sql.Tx }

func (q sqlQuerier) QueryRow(ctx context.Context, s string, args ...any) interface{ Scan(...any) error } {
	return q.tx.QueryRowContext(ctx, s, args...)
}

// runTx is the RunTx of the fence of the pool's driver.
func runTx(ctx context.Context, f pgopen.Fence, c leasecore.Claim, fn func(querier) error) (leasecore.Result, error) {
	if f.Pgx != nil {
		return f.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error { return fn(pgxQuerier{tx}) })
	}
	return f.SQL.RunTx(ctx, c, func(tx *sql.Tx) error { return fn(sqlQuerier{tx}) })
}

func newFence(t *testing.T, p pgopen.Pool, opts ...fencepg.Option) pgopen.Fence {
	t.Helper()
	f, err := p.Fence(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
