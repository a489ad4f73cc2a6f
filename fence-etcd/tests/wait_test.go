package fenceetcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// waitAsync runs WaitFree in a goroutine; the channel gets its result.
func waitAsync(ctx context.Context, s *fenceetcd.LeaseStore, name string) <-chan error {
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
// leases' releases, wakes when the lessor deletes an expired lease's key,
// and ends with ctx; no watch stays open afterwards. In both lease modes.
func TestWaitFree(t *testing.T) {
	for _, shared := range []bool{false, true} {
		mode := "own-leases"
		if shared {
			mode = "shared-leases"
		}
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			leases := f.leases
			if shared {
				leases = sharedStore(t, f, f.cli)
				defer leases.Close()
			}
			// The waiter is another instance, on a client of its own, so
			// that what it leaves behind can be told apart.
			waiter, err := fenceetcd.NewLeaseStore(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix))
			if err != nil {
				t.Fatal(err)
			}
			before := goleak.IgnoreCurrent()
			const name, ttl = "leader", 6 * time.Second

			// Free: at once.
			start := time.Now()
			if err := waiter.WaitFree(ctx, name); err != nil {
				t.Fatalf("WaitFree of a lease never held = %v, want nil", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("WaitFree of a lease never held took %v, want at once", d)
			}

			// Held: woken by the release, not by the end of the holding period.
			g, err := leases.Acquire(ctx, name, "holder-a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			other, err := leases.Acquire(ctx, "other", "holder-a", ttl)
			if err != nil {
				t.Fatal(err)
			}
			done := waitAsync(ctx, waiter, name)
			notReturned(t, done, 300*time.Millisecond, "while the lease is held")
			if err := leases.Release(ctx, other); err != nil {
				t.Fatal(err)
			}
			notReturned(t, done, 300*time.Millisecond, "after another lease's release")
			released := time.Now()
			if err := leases.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("WaitFree after the release = %v, want nil", err)
				}
				// Expected: at once, by the watch. TTL/2 leaves room for a
				// slow machine and is still far from the expiry.
				if d := time.Since(released); d > ttl/2 {
					t.Fatalf("WaitFree returned %v after the release (TTL %v): not woken by the release", d, ttl)
				}
				t.Logf("woken %v after the release", time.Since(released).Round(time.Millisecond))
			case <-time.After(2 * ttl):
				t.Fatalf("WaitFree did not return within %v of the release", 2*ttl)
			}

			// Held until it expires, with no release: woken when the lessor
			// revokes the etcd lease and its key.
			const short = 2 * time.Second
			if _, err := leases.Acquire(ctx, name, "holder-b", short); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			if err := waiter.WaitFree(ctx, name); err != nil {
				t.Fatalf("WaitFree until expiry = %v, want nil", err)
			}
			waited := time.Since(start)
			st, err := leases.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held {
				t.Fatalf("WaitFree returned after %v while the lease is still held: %+v", waited, st)
			}
			if waited > short+2*time.Second {
				t.Fatalf("WaitFree returned %v after an acquire of TTL %v, want soon after the expiry", waited, short)
			}
			t.Logf("woken %v after an acquire of TTL %v, by the expiry", waited.Round(time.Millisecond), short)

			// The context ends the wait, with its error.
			if _, err := leases.Acquire(ctx, name, "holder-c", time.Minute); err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			start = time.Now()
			err = waiter.WaitFree(cctx, name)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitFree with an ending context = %v, want an error wrapping context.DeadlineExceeded", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("WaitFree took %v to end after its context (200 ms)", d)
			}
			cctx, cancel = context.WithCancel(ctx)
			done = waitAsync(cctx, waiter, name)
			notReturned(t, done, 100*time.Millisecond, "while the lease is held")
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("WaitFree cancelled = %v, want an error wrapping context.Canceled", err)
			}

			if err := waiter.WaitFree(ctx, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
				t.Fatalf(`WaitFree("") = %v, want ErrInvalidArgument`, err)
			}
			// Every watch was cancelled: the client's watch stream and its
			// goroutines are gone.
			if err := goleak.Find(before); err != nil {
				t.Fatalf("goroutines left behind by WaitFree: %v", err)
			}
		})
	}
}

// TestCampaignHandoff: two instances campaign for one lease; when the
// leader's function returns, the other becomes leader with a larger token,
// woken by the watch (a poll would take at least half the poll interval,
// which is the TTL here).
func TestCampaignHandoff(t *testing.T) {
	f := newFixture(t)
	leasesB, err := fenceetcd.NewLeaseStore(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix))
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 8 * time.Second
	// A poll pauses ttl/2 or more: far above a watch event.
	backendtest.CampaignHandoff(t, f.leases, leasesB, "leader", ttl, ttl, true)
}
