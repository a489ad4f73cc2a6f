package fencepg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestDurableOnAsyncCommitCluster: on a cluster whose default is
// synchronous_commit = off, the lease store and the fence still make their
// own commits durable. Under load (acquire/release loops and floor
// advances), the server is stopped immediately; after recovery, every
// token the store acknowledged is still issued (the next acquire of each
// name gets a larger one: no token is issued twice) and every floor
// advance it acknowledged is still in force.
//
// wal_writer_delay is at its maximum (10 s), so an asynchronous commit is
// written out only by a later synchronous one, a WAL writer woken by a
// completed WAL page, or a full WAL buffer. The control shows that the
// cluster does lose acknowledged commits: plain autocommit updates,
// acknowledged after the last synchronous commit, are gone after the
// crash. Without the control passing, the test would prove nothing.
func TestDurableOnAsyncCommitCluster(t *testing.T) {
	cluster := pgtemp.StartTB(t, asyncCommitSettings...)
	ctx := t.Context()
	for _, db := range []string{"lease_async", "res_async"} {
		if err := cluster.CreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	for _, driver := range pgopen.Drivers {
		t.Run(driver, func(t *testing.T) {
			leasePool := pgtest.Open(t, driver, cluster.DSN("lease_async"), 8)
			resPool := pgtest.Open(t, driver, cluster.DSN("res_async"), 8)
			leases, err := leasePool.LeaseStore()
			if err != nil {
				t.Fatal(err)
			}
			if err := leases.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			fence, err := resPool.Fence()
			if err != nil {
				t.Fatal(err)
			}
			if err := fence.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			control := controlCounter(t, cluster.DSN("res_async"), driver)

			const workers = 4
			acked := make([]leasecore.Token, workers)    // the largest token each name was acknowledged
			advanced := make([]leasecore.Token, workers) // the largest floor each scope was acknowledged
			// The load runs for 800 ms, and each worker for at least one
			// whole cycle however long the machine stalls (a worker whose
			// first acquire outlasted a fixed window acknowledged nothing,
			// and the test had nothing to check): the window decides when
			// to stop, never a request's context.
			loadCtx, stopLoad := context.WithTimeout(ctx, 800*time.Millisecond)
			var wg sync.WaitGroup
			for w := range workers {
				name, scope := fmt.Sprintf("%s-job-%d", driver, w), fmt.Sprintf("%s-scope-%d", driver, w)
				wg.Go(func() {
					for first := true; first || loadCtx.Err() == nil; first = false {
						g, err := leases.Acquire(ctx, name, "holder", time.Minute)
						if err != nil {
							t.Errorf("%s: acquire under load: %v", name, err)
							return
						}
						acked[w] = g.Token
						res, err := fence.Advance(ctx, leasecore.Claim{Scope: scope, Writer: "holder", Token: g.Token})
						if err != nil || !res.Accepted {
							t.Errorf("%s: advance to %d under load: %+v, %v", scope, g.Token, res, err)
							return
						}
						advanced[w] = g.Token
						if err := leases.Release(ctx, g); err != nil {
							t.Errorf("%s: release under load: %v", name, err)
							return
						}
					}
				})
			}
			wg.Wait()
			stopLoad()
			// Plain asynchronous commits, acknowledged after the store's
			// last durable one and still in the server's WAL buffers.
			controlAcked := control.bumpUnwritten(t)

			if _, err := cluster.RestartImmediate(ctx); err != nil {
				t.Fatal(err)
			}

			if got := control.read(t); got >= controlAcked {
				t.Fatalf("control: the counter is %d after the crash, %d increments were acknowledged: this cluster lost no asynchronous commit, so the test proves nothing", got, controlAcked)
			} else {
				t.Logf("control: %d plain increments acknowledged, %d survived the crash (synchronous_commit=off really loses commits here)", controlAcked, got)
			}
			for w := range workers {
				name, scope := fmt.Sprintf("%s-job-%d", driver, w), fmt.Sprintf("%s-scope-%d", driver, w)
				if acked[w] == 0 {
					t.Fatalf("%s: the load acquired nothing", name)
				}
				// The pools' connections died with the server: the first
				// statements may fail with ErrUnavailable before the pools
				// reconnect.
				// The row's token is the last one issued: the next acquire
				// issues one more. Below an acknowledged token, that
				// token would be issued twice.
				var st leasecore.LeaseState
				err := afterCrash(ctx, func() (err error) {
					st, err = leases.Inspect(ctx, name)
					return err
				})
				if err != nil {
					t.Fatalf("%s: inspect after the crash: %v", name, err)
				}
				if st.Token < acked[w] {
					t.Errorf("%s: the last token issued is %d after the crash, but token %d was acknowledged before it: tokens %d..%d would be issued twice", name, st.Token, acked[w], st.Token+1, acked[w])
				}
				var floor leasecore.Token
				err = afterCrash(ctx, func() (err error) {
					floor, err = fence.Floor(ctx, scope)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if floor < advanced[w] {
					t.Errorf("%s: floor %d after the crash, but an advance to %d was acknowledged before it", scope, floor, advanced[w])
				}
				t.Logf("%s: last acknowledged token %d, last issued after the crash %d; %s floor %d (acknowledged %d)", name, acked[w], st.Token, scope, floor, advanced[w])
			}
		})
	}
}

// asyncCommitSettings start a cluster whose plain commits a crash can
// lose: synchronous_commit = off acknowledges a commit before its WAL
// leaves the server's buffers, and wal_writer_delay at its maximum keeps
// the WAL writer from writing it out on its own timer for far longer than
// a test lasts. autovacuum = off keeps autovacuum workers, whose writes of
// dirty pages must first write the WAL up to them, from doing that for the
// control at a random moment.
var asyncCommitSettings = []pgtemp.Option{
	pgtemp.WithSetting("synchronous_commit", "off"),
	pgtemp.WithSetting("wal_writer_delay", "10s"),
	pgtemp.WithSetting("autovacuum", "off"),
}

// counter is the control: a row incremented by plain autocommit updates,
// which run with the cluster's synchronous_commit = off.
type counter struct {
	pool  *pgxpool.Pool
	table string
}

func controlCounter(t *testing.T, dsn, suffix string) counter {
	t.Helper()
	c := counter{pgtest.Open(t, pgopen.Pgx, dsn, 2).Pgx, "control_" + suffix}
	if _, err := c.pool.Exec(t.Context(), `CREATE TABLE `+c.table+` (n bigint NOT NULL); INSERT INTO `+c.table+` VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	return c
}

// bumpUnwritten increments the counter, each increment its own
// acknowledged commit, until the last one is still in the server's WAL
// buffers, not written to the kernel: what an immediate stop then loses.
// It returns the value acknowledged last.
//
// Asynchronous commits are written out by anything that writes the WAL:
// a synchronous commit of another session (a statement of the load that
// its cancelled context left running on the server), or the WAL writer,
// which a backend wakes when a WAL page fills up and which then may write
// everything inserted so far. So first wait until no other session is in a
// statement or a transaction, then check after the increments that the
// server's WAL write position (pg_current_wal_lsn) is still below the
// insert position the last increment saw after its own row change; if the
// WAL writer got there first, increment again. Nothing but the test
// writes to this cluster, so the window between that check and the
// immediate stop is only the WAL writer's 10-second timer.
func (c counter) bumpUnwritten(t *testing.T) int64 {
	t.Helper()
	ctx := t.Context()
	for quiet := false; !quiet; {
		var busy int
		err := c.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND state <> 'idle'`).Scan(&busy)
		if err != nil {
			t.Fatal(err)
		}
		if quiet = busy == 0; !quiet {
			time.Sleep(10 * time.Millisecond)
		}
	}
	for round := range 20 {
		var v int64
		var insertLSN string
		for range 20 {
			err := c.pool.QueryRow(ctx, `UPDATE `+c.table+` SET n = n + 1 RETURNING n, pg_current_wal_insert_lsn()::text`).Scan(&v, &insertLSN)
			if err != nil {
				t.Fatal(err)
			}
		}
		var unwritten bool
		if err := c.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() < $1::pg_lsn`, insertLSN).Scan(&unwritten); err != nil {
			t.Fatal(err)
		}
		if unwritten {
			return v
		}
		t.Logf("control: round %d of 20 increments was written out of the WAL buffers before the crash; incrementing again", round+1)
	}
	t.Fatal("control: after 400 asynchronous increments the server had written every one to the kernel: a crash could not lose them, so the test would prove nothing")
	return 0
}

func (c counter) read(t *testing.T) int64 {
	t.Helper()
	var v int64
	err := afterCrash(t.Context(), func() error {
		return c.pool.QueryRow(t.Context(), `SELECT n FROM `+c.table).Scan(&v)
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// afterCrash runs f until it succeeds, at most a few times: the first
// statements on a pool whose server restarted fail on dead connections.
func afterCrash(ctx context.Context, f func() error) error {
	var err error
	for range 5 {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}
