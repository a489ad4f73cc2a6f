package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers database/sql driver "pgx"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/leasecore"
)

// pgxStdlib is database/sql with pgx's stdlib driver: it can wait for
// notifications, where lib/pq cannot.
const pgxStdlib = "pgx-stdlib"

// waitFixture is a fixture plus a LeaseStore for WaitFree on one driver,
// and a way to count the pool's idle connections that still LISTEN.
type waitFixture struct {
	*fixture
	store     *fencepg.LeaseStore
	listening func(t *testing.T) int
	notifies  bool // the driver can wait for notifications
}

func forEachWaitDriver(t *testing.T, f func(t *testing.T, w *waitFixture)) {
	for _, d := range []string{pgopen.Pgx, pgxStdlib, pgopen.Libpq} {
		t.Run(d, func(t *testing.T) { f(t, newWaitFixture(t, d)) })
	}
}

func newWaitFixture(t *testing.T, driver string) *waitFixture {
	t.Helper()
	if driver == pgxStdlib {
		w := newWaitFixture(t, pgopen.Pgx)
		db, err := sql.Open("pgx", w.leaseDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		w.useSQL(t, db)
		return w
	}
	w := &waitFixture{fixture: newFixture(t, driver), notifies: driver != pgopen.Libpq}
	if driver == pgopen.Libpq {
		w.useSQL(t, w.leasePool.SQL)
		return w
	}
	w.store = w.leases
	pool := w.leasePool.Pgx
	w.listening = func(t *testing.T) int {
		t.Helper()
		ctx := context.Background()
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%d connections still acquired from the pool", n)
		}
		n := 0
		for _, c := range pool.AcquireAllIdle(ctx) {
			n += countListening(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_listening_channels()`))
			c.Release()
		}
		return n
	}
	return w
}

// useSQL makes w wait through a LeaseStore on db.
func (w *waitFixture) useSQL(t *testing.T, db *sql.DB) {
	t.Helper()
	var err error
	if w.store, err = fencepg.NewLeaseStoreDB(db); err != nil {
		t.Fatal(err)
	}
	w.listening = func(t *testing.T) int {
		t.Helper()
		ctx := context.Background()
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use", n)
		}
		// Hold every idle connection at once, so that each one is asked.
		var conns []*sql.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		n := 0
		for range db.Stats().Idle {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			n += countListening(t, c.QueryRowContext(ctx, `SELECT count(*) FROM pg_listening_channels()`))
		}
		return n
	}
}

func countListening(t *testing.T, row interface{ Scan(...any) error }) int {
	t.Helper()
	var n int
	if err := row.Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitAsync runs WaitFree in a goroutine; the channel gets its result.
func waitAsync(ctx context.Context, s *fencepg.LeaseStore, name string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.WaitFree(ctx, name) }()
	return done
}

// notReturned fails the test if done delivers within d: the lease is
// still held, and WaitFree must still wait.
func notReturned(t *testing.T, done <-chan error, d time.Duration, while string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("WaitFree returned %v %s, want it to keep waiting", err, while)
	case <-time.After(d):
	}
}

// TestWaitFree: WaitFree returns at once on a free lease, is woken by a
// release long before the holding period would end, sleeps through other
// leases' releases, wakes after an expiry nobody announced, and ends with
// ctx; afterwards no pool connection LISTENs or stays taken. With lib/pq it
// says at once that it cannot wait (Campaign then polls).
func TestWaitFree(t *testing.T) {
	forEachWaitDriver(t, func(t *testing.T, w *waitFixture) {
		ctx := context.Background()
		const name, ttl = "leader", 6 * time.Second

		if !w.notifies {
			g, err := w.leases.Acquire(ctx, name, "holder-a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // the second time without asking the driver again
				start := time.Now()
				err := w.store.WaitFree(ctx, name)
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("WaitFree on lib/pq = %v, want an error wrapping errors.ErrUnsupported", err)
				}
				if d := time.Since(start); d > time.Second {
					t.Fatalf("WaitFree on lib/pq took %v to refuse, want at once", d)
				}
			}
			if err := w.leases.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			if n := w.listening(t); n != 0 {
				t.Fatalf("%d channels still listened on", n)
			}
			return
		}

		// Free (never held, released, expired): at once.
		start := time.Now()
		if err := w.store.WaitFree(ctx, name); err != nil {
			t.Fatalf("WaitFree of a lease never held = %v, want nil", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("WaitFree of a lease never held took %v, want at once", d)
		}

		// Held: woken by the release, not by the end of the holding period.
		g, err := w.leases.Acquire(ctx, name, "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		other, err := w.leases.Acquire(ctx, "other", "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		done := waitAsync(ctx, w.store, name)
		notReturned(t, done, 300*time.Millisecond, "while the lease is held")
		if err := w.leases.Release(ctx, other); err != nil {
			t.Fatal(err)
		}
		notReturned(t, done, 300*time.Millisecond, "after another lease's release")
		released := time.Now()
		if err := w.leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("WaitFree after the release = %v, want nil", err)
			}
			// Expected: at once, by the notification. TTL/2 leaves room
			// for a slow machine and is still far from the expiry.
			if d := time.Since(released); d > ttl/2 {
				t.Fatalf("WaitFree returned %v after the release (TTL %v): not woken by the release", d, ttl)
			}
			t.Logf("woken %v after the release", time.Since(released).Round(time.Millisecond))
		case <-time.After(2 * ttl):
			t.Fatalf("WaitFree did not return within %v of the release", 2*ttl)
		}
		if err := w.store.WaitFree(ctx, name); err != nil {
			t.Fatalf("WaitFree of a released lease = %v, want nil", err)
		}

		// Held until it expires, with no release: woken by the remaining time.
		const short = 1500 * time.Millisecond
		if _, err := w.leases.Acquire(ctx, name, "holder-b", short); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := w.store.WaitFree(ctx, name); err != nil {
			t.Fatalf("WaitFree until expiry = %v, want nil", err)
		}
		waited := time.Since(start)
		st, err := w.leases.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held {
			t.Fatalf("WaitFree returned after %v while the lease is still held by the database clock: %+v", waited, st)
		}
		if waited > short+time.Second {
			t.Fatalf("WaitFree returned %v after an acquire of TTL %v, want soon after the expiry", waited, short)
		}

		// The context ends the wait, with its error.
		if _, err := w.leases.Acquire(ctx, name, "holder-c", time.Minute); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		start = time.Now()
		err = w.store.WaitFree(cctx, name)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitFree with an ending context = %v, want an error wrapping context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("WaitFree took %v to end after its context (200 ms)", d)
		}
		cctx, cancel = context.WithCancel(ctx)
		done = waitAsync(cctx, w.store, name)
		notReturned(t, done, 100*time.Millisecond, "while the lease is held")
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitFree cancelled = %v, want an error wrapping context.Canceled", err)
		}

		if err := w.store.WaitFree(ctx, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
			t.Fatalf(`WaitFree("") = %v, want ErrInvalidArgument`, err)
		}
		if n := w.listening(t); n != 0 {
			t.Fatalf("%d channels still listened on by the pool's connections after the waits, want 0", n)
		}
	})
}

// TestWaitFreeInSchema: a release in one schema does not wake a waiter of
// the same lease name in another (the payload carries the schema).
func TestWaitFreeInSchema(t *testing.T) {
	f := newFixture(t, pgopen.Pgx)
	ctx := context.Background()
	other, err := fencepg.NewLeaseStore(f.leasePool.Pgx, fencepg.WithSchema("leasefence_wait"))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.leaseDB.Exec(ctx, `DROP SCHEMA leasefence_wait CASCADE`) })
	const name = "leader"
	g, err := f.leases.Acquire(ctx, name, "a", 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gOther, err := other.Acquire(ctx, name, "a", 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := waitAsync(ctx, f.leases, name)
	notReturned(t, done, 300*time.Millisecond, "while the lease is held")
	if err := other.Release(ctx, gOther); err != nil {
		t.Fatal(err)
	}
	notReturned(t, done, 300*time.Millisecond, "after the release of the same name in another schema")
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCampaignHandoff: two instances campaign for one lease; when the
// leader's function returns, the other becomes leader with a larger token,
// woken by the release's notification (a poll would take at least half the
// poll interval, which is the TTL here). lib/pq polls: it still hands off.
func TestCampaignHandoff(t *testing.T) {
	forEachWaitDriver(t, func(t *testing.T, w *waitFixture) {
		const ttl = 8 * time.Second
		poll := ttl // a poll pauses between ttl/2 and ttl: far above a notification
		if !w.notifies {
			poll = 200 * time.Millisecond
		}
		backendtest.CampaignHandoff(t, w.leases, w.store, "leader", ttl, poll, w.notifies)
		if n := w.listening(t); n != 0 {
			t.Fatalf("%d channels still listened on after the campaigns", n)
		}
	})
}
