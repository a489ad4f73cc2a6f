package leasecore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

func waitCtx(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(realWait):
		t.Fatalf("context not cancelled within %v (real time)", realWait)
	}
}

// The session's context ends at the local deadline by the session's clock
// while a renewal hangs, with the deadline as its cause, and at that moment
// the server still refuses everybody else: the holder is told to stop
// before anyone else can be granted the lease.
func TestSessionContextEndsAtDeadlineWhileRenewalHangs(t *testing.T) {
	f := newFixture(false) // one clock: server and holder run at the same rate
	unblock := make(chan struct{})
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		<-unblock // ignores its context
		return nil
	}
	s := f.open(t, "holder-a")
	t.Cleanup(func() { close(unblock) }) // before the session's Close
	ctx := s.Context()
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval)
	f.local.Advance(testWindow - testInterval - time.Nanosecond)
	if ctx.Err() != nil {
		t.Fatalf("context ended 1 ns before the local deadline: %v", context.Cause(ctx))
	}
	f.local.Advance(time.Nanosecond)
	waitCtx(t, ctx)
	if cause := context.Cause(ctx); !errors.Is(cause, leasecore.ErrLocalDeadline) || cause != s.Err() {
		t.Errorf("Cause = %v, want Err() (%v) wrapping ErrLocalDeadline", cause, s.Err())
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("ctx.Err() = %v, want context.Canceled", ctx.Err())
	}
	if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL); !errors.Is(err, leasecore.ErrHeld) {
		t.Errorf("holder-b Acquire when holder-a's context ended = %v, want ErrHeld (the server still counts holder-a)", err)
	}
}

func TestSessionContextCauses(t *testing.T) {
	t.Run("lost", func(t *testing.T) {
		f := newFixture(true)
		s := f.open(t, "holder-a")
		f.local.WaitTimers(t, 2)
		f.server.Advance(testTTL)
		f.tick(t, testInterval)
		waitCtx(t, s.Context())
		var he *leasecore.HoldError
		if cause := context.Cause(s.Context()); !errors.Is(cause, leasecore.ErrLost) || !errors.As(cause, &he) {
			t.Errorf("Cause = %v, want a HoldError wrapping ErrLost", cause)
		}
	})
	t.Run("closed", func(t *testing.T) {
		f := newFixture(false)
		s := f.open(t, "holder-a")
		if s.Context().Err() != nil {
			t.Fatal("context of a running session is done")
		}
		s.Close(context.Background())
		waitCtx(t, s.Context())
		if cause := context.Cause(s.Context()); !errors.Is(cause, leasecore.ErrClosed) {
			t.Errorf("Cause = %v, want ErrClosed", cause)
		}
	})
}

func TestSessionSetContext(t *testing.T) {
	f := newFixture(true)
	unblock := make(chan struct{})
	var hang bool
	f.spy.renewAllHook = func(context.Context, []leasecore.Grant) error {
		if hang {
			<-unblock
		}
		return nil
	}
	set := f.newFakeSet(t)
	t.Cleanup(func() { close(unblock) })
	ctx := context.Background()
	for _, n := range []string{"shard-0", "shard-1"} {
		if _, err := set.Acquire(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := set.Context("shard-9"); ok {
		t.Error("Context of a name the set does not hold: ok = true")
	}
	c0, _ := set.Context("shard-0")
	c1, _ := set.Context("shard-1")
	if err := set.Release(ctx, "shard-1"); err != nil {
		t.Fatal(err)
	}
	waitCtx(t, c1)
	if cause := context.Cause(c1); !errors.Is(cause, leasecore.ErrClosed) {
		t.Errorf("released name's Cause = %v, want ErrClosed", cause)
	}
	hang = true // set before the first tick: read by the renewal goroutine after it
	f.local.Advance(testWindow)
	waitCtx(t, c0)
	if cause := context.Cause(c0); !errors.Is(cause, leasecore.ErrLocalDeadline) {
		t.Errorf("Cause = %v, want ErrLocalDeadline", cause)
	}
}
