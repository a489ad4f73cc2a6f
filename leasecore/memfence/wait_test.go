package memfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

func TestWaitFree(t *testing.T) {
	clock := newServerClock()
	l := memfence.NewLeases(clock.Now)
	if err := l.WaitFree(ctx, "job"); err != nil {
		t.Fatalf("WaitFree of a lease never held = %v, want nil at once", err)
	}
	g, err := l.Acquire(ctx, "job", "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}

	// Held: it waits, until the release.
	woke := make(chan error, 1)
	go func() { woke <- l.WaitFree(ctx, "job") }()
	select {
	case err := <-woke:
		t.Fatalf("WaitFree returned %v while the lease is held", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if err != nil {
			t.Errorf("WaitFree after the release = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitFree did not wake on the release")
	}

	// Expired by the server's clock: free at once.
	if _, err := l.Acquire(ctx, "job", "holder-b", ttl); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl)
	if err := l.WaitFree(ctx, "job"); err != nil {
		t.Errorf("WaitFree of an expired lease = %v, want nil", err)
	}

	// The context ends the wait.
	if _, err := l.Acquire(ctx, "job", "holder-c", ttl); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := l.WaitFree(cctx, "job"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitFree with an ending context = %v, want DeadlineExceeded", err)
	}
	if err := l.WaitFree(ctx, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("WaitFree(\"\") = %v, want ErrInvalidArgument", err)
	}
}

// On the real clock the wait ends when the holding period runs out.
func TestWaitFreeWakesAtExpiry(t *testing.T) {
	l := memfence.NewLeases(nil)
	start := time.Now() // before the holding period began
	if _, err := l.Acquire(ctx, "job", "holder-a", 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := l.WaitFree(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("woke after %v, before the holding period ran out", d)
	}
	if _, err := l.Acquire(ctx, "job", "holder-b", time.Second); err != nil {
		t.Errorf("Acquire after the wake-up = %v", err)
	}
}
