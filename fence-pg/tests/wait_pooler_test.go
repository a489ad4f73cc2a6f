package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgbouncertest"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestWithoutNotifications: a store made WithoutNotifications never
// LISTENs: WaitFree on a held lease returns an error wrapping
// errors.ErrUnsupported at once, naming the option (an invalid name is
// still an argument error), and Campaign polls and still hands off.
func TestWithoutNotifications(t *testing.T) {
	for _, driver := range []string{pgopen.Pgx, pgxStdlib, pgopen.Libpq} {
		t.Run(driver, func(t *testing.T) {
			w := newWaitFixture(t, driver)
			var (
				quiet *fencepg.LeaseStore
				err   error
			)
			if driver == pgxStdlib {
				db, oerr := sql.Open("pgx", w.leaseDSN)
				if oerr != nil {
					t.Fatal(oerr)
				}
				t.Cleanup(func() { _ = db.Close() })
				quiet, err = fencepg.NewLeaseStoreDB(db, fencepg.WithoutNotifications())
			} else {
				quiet, err = w.leasePool.LeaseStore(fencepg.WithoutNotifications())
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			g, err := w.leases.Acquire(ctx, "leader", "holder-a", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			err = quiet.WaitFree(ctx, "leader")
			if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "WithoutNotifications") {
				t.Fatalf("WaitFree on a store WithoutNotifications: %v, want errors.ErrUnsupported naming the option", err)
			}
			if d := time.Since(t0); d > time.Second {
				t.Errorf("WaitFree took %v to say it does not wait", d)
			}
			var argErr *leasecore.ArgError
			if err := quiet.WaitFree(ctx, ""); !errors.As(err, &argErr) {
				t.Errorf("WaitFree with an empty name: %v, want a *leasecore.ArgError", err)
			}
			if err := w.leases.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			backendtest.CampaignHandoff(t, w.leases, quiet, "leader", 4*time.Second, 200*time.Millisecond, false)
			if n := w.listening(t); n != 0 {
				t.Fatalf("%d channels listened on", n)
			}
		})
	}
}

// TestWaitFreeBehindPgBouncer: behind PgBouncer in pool_mode=transaction a
// LISTEN runs on the server connection lent for that statement and does
// not stay with the client, so a release does not wake WaitFree: it
// returns only when the holding period's remaining time has passed. That is
// why WithoutNotifications exists; with it WaitFree says at once that it
// cannot wait, and Campaign hands off by polling.
func TestWaitFreeBehindPgBouncer(t *testing.T) {
	f := newFixture(t, pgopen.Pgx)
	bouncer := pgbouncertest.StartTB(t, pgtest.Cluster(t))
	u, err := url.Parse(f.leaseDSN)
	if err != nil {
		t.Fatal(err)
	}
	pooled := pgtest.Open(t, pgopen.Pgx, bouncer.DSN(strings.TrimPrefix(u.Path, "/"), "default_query_exec_mode=exec"), 2)
	listening, err := pooled.LeaseStore()
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := pooled.LeaseStore(fencepg.WithoutNotifications())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	const ttl = 2 * time.Second
	g, err := f.leases.Acquire(ctx, "leader", "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	done := waitAsync(ctx, listening, "leader")
	time.Sleep(300 * time.Millisecond) // WaitFree has LISTENed and read the lease
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		after := time.Since(released)
		t.Logf("behind the pooler WaitFree returned %v after the release, %v after it began (ttl %v)",
			after.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), ttl)
		if after < 500*time.Millisecond {
			t.Errorf("WaitFree behind a transaction pooler was woken by the release (%v after it): "+
				"notifications reach it after all, and WithoutNotifications would not be needed", after)
		}
	case <-time.After(ttl + 3*time.Second):
		t.Fatal("WaitFree behind the pooler did not return after the holding period's remaining time")
	}

	if _, err := f.leases.Acquire(ctx, "leader", "holder-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := quiet.WaitFree(ctx, "leader"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("WaitFree WithoutNotifications behind the pooler: %v, want errors.ErrUnsupported", err)
	}
	backendtest.CampaignHandoff(t, quiet, quiet, "leader-2", 4*time.Second, 200*time.Millisecond, false)
}
