package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/conformance/backendtest"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestBlockedWriteErrors ends a write that waits for the scope's floor
// lock in three ways — its context's deadline, its context's cancellation,
// the server terminating its session — and checks the error each driver's
// failure maps to.
func TestBlockedWriteErrors(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		for _, tc := range []struct {
			name string
			want error
			// end ends the blocked write; cancel cancels its context.
			end func(t *testing.T, cancel context.CancelFunc)
		}{
			{"deadline", context.DeadlineExceeded, func(t *testing.T, cancel context.CancelFunc) {}},
			{"cancel", context.Canceled, func(t *testing.T, cancel context.CancelFunc) { cancel() }},
			{"terminated", leasecore.ErrUnavailable, func(t *testing.T, cancel context.CancelFunc) {
				f.terminateLockWaiters(t)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				scope := "blocked " + tc.name
				entered, resume := make(chan struct{}), make(chan struct{})
				plain, err := f.resPool.Resource()
				if err != nil {
					t.Fatal(err)
				}
				gapped := commitgap.Wrap(plain, func(context.Context, leasecore.Write) error {
					close(entered)
					<-resume
					return nil
				})
				holderDone := make(chan error, 1)
				go func() {
					_, err := gapped.Write(context.Background(), leasecore.Write{Scope: scope, Part: "p", Writer: "a", Token: 2})
					holderDone <- err
				}()
				<-entered
				var once sync.Once
				letHolderCommit := func() {
					once.Do(func() {
						close(resume)
						if err := <-holderDone; err != nil {
							t.Error(err)
						}
					})
				}
				defer letHolderCommit()

				// A pool of its own: a terminated session must not take
				// down the fixture's.
				blocked, err := pgtest.Open(t, driver, f.resDSN, 1).Resource()
				if err != nil {
					t.Fatal(err)
				}
				timeout := time.Minute
				if tc.want == context.DeadlineExceeded {
					timeout = 300 * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				done := make(chan error, 1)
				go func() {
					_, err := blocked.Write(ctx, leasecore.Write{Scope: scope, Part: "p", Writer: "b", Token: 3})
					done <- err
				}()
				f.waitLockWaiter(t)
				tc.end(t, cancel)

				if tc.name == "terminated" && driver == pgopen.Libpq {
					// lib/pq reports a FATAL server error as
					// driver.ErrBadConn, and database/sql then sends the
					// statement again on a new connection: the error never
					// reaches fencepg. The retry queues on the lock again
					// and, once the holder commits, succeeds.
					f.waitLockWaiter(t)
					letHolderCommit()
					if err := <-done; err != nil {
						t.Fatalf("lib/pq: the retried write failed: %v", err)
					}
					backendtest.WantFloor(t, f.res, scope, 3)
					return
				}
				select {
				case err = <-done:
				case <-time.After(30 * time.Second):
					t.Fatal("the blocked write did not end")
				}
				if !errors.Is(err, tc.want) || !strings.HasPrefix(err.Error(), "fencepg: write: ") {
					t.Fatalf("got %v, want an error wrapping %v starting with \"fencepg: write: \"", err, tc.want)
				}
				t.Logf("%s: %v", driver, err)
			})
		}
	})
}

// terminateLockWaiters ends the sessions of the resource database that
// wait for a lock.
func (f *fixture) terminateLockWaiters(t *testing.T) {
	t.Helper()
	_, err := f.resourceDB.Exec(context.Background(), `SELECT pg_terminate_backend(pid)
	  FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
	if err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableServer: every operation against a port nobody listens on,
// and against a server that accepts connections and never answers (a host
// frozen or cut off mid-failover), fails with an error wrapping
// ErrUnavailable while the caller's context is live: the driver's own
// connect timeout (connect_timeout in the DSN) is not the caller's context
// ending, and leasecore.Campaign and Session retry only ErrUnavailable.
func TestUnreachableServer(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dsn := "postgres://postgres@" + ln.Addr().String() + "/nothing?sslmode=disable&connect_timeout=5"
		ln.Close()
		testUnreachable(t, dsn)
	})
	t.Run("hanging", func(t *testing.T) {
		ln := hangingServer(t)
		testUnreachable(t, "postgres://postgres@"+ln+"/nothing?sslmode=disable&connect_timeout=1")
	})
}

// hangingServer listens on 127.0.0.1, accepts every connection and never
// answers, until the test ends; it returns its address.
func hangingServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// testUnreachable runs every operation against dsn on pgx, lib/pq and pgx's
// database/sql driver.
func testUnreachable(t *testing.T, dsn string) {
	for _, driver := range []string{pgopen.Pgx, pgopen.Libpq, pgxStdlib} {
		t.Run(driver, func(t *testing.T) { testUnreachableOn(t, driver, dsn) })
	}
}

func testUnreachableOn(t *testing.T, driver, dsn string) {
	// Opened without connecting: pgopen.Open would fail on its Ping.
	var p pgopen.Pool
	switch driver {
	case pgopen.Pgx:
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		p.Pgx = pool
	case pgopen.Libpq, pgxStdlib:
		name := "postgres"
		if driver == pgxStdlib {
			name = "pgx"
		}
		db, err := sql.Open(name, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		p.SQL = db
	}
	leases, err := p.LeaseStore()
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Resource()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g := leasecore.Grant{Name: "n", Holder: "h", Token: 1, TTL: time.Second}
	for op, call := range map[string]func() error{
		"acquire": func() error { _, err := leases.Acquire(ctx, "n", "h", time.Second); return err },
		"renew":   func() error { _, err := leases.Renew(ctx, g); return err },
		"release": func() error { return leases.Release(ctx, g) },
		"inspect": func() error { _, err := leases.Inspect(ctx, "n"); return err },
		"migrate": func() error { return leases.Migrate(ctx) },
		"write": func() error {
			_, err := res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1})
			return err
		},
		"floor":     func() error { _, err := res.Floor(ctx, "s"); return err },
		"read part": func() error { _, _, err := res.ReadPart(ctx, "s", "p"); return err },
		"attempts":  func() error { _, err := res.Attempts(ctx, "s"); return err },
	} {
		err := call()
		if !errors.Is(err, leasecore.ErrUnavailable) || !strings.HasPrefix(err.Error(), "fencepg: "+op+": ") {
			t.Errorf("%s: got %v, want an error wrapping ErrUnavailable starting with \"fencepg: %s: \"", op, err, op)
		}
	}
}
