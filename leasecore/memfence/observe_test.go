package memfence_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// observer runs leasecore.Observe on l in the background and hands every
// reported state over a channel; stop ends it and returns its error.
func observer(t *testing.T, insp leasecore.LeaseInspector, poll time.Duration) (states <-chan string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		done <- leasecore.Observe(ctx, insp, "job", func(st leasecore.LeaseState) {
			ch <- fmt.Sprintf("exists=%t held=%t released=%t holder=%s token=%d", st.Exists, st.Held, st.Released, st.Holder, st.Token)
		}, leasecore.WithObservePoll(poll))
	}()
	return ch, func() error { cancel(); return <-done }
}

func next(t *testing.T, states <-chan string, within time.Duration) string {
	t.Helper()
	select {
	case s := <-states:
		return s
	case <-time.After(within):
		t.Fatalf("no state reported within %v", within)
		return ""
	}
}

// TestObserve: the first state, a new holder, a release and the next
// holder are each reported once; renewals are not reported.
func TestObserve(t *testing.T) {
	ctx := context.Background()
	l := memfence.NewLeases(nil)
	states, stop := observer(t, l, 10*time.Millisecond)
	if got, want := next(t, states, 5*time.Second), "exists=false held=false released=false holder= token=0"; got != want {
		t.Fatalf("first state %q, want %q (no leader, reported as such)", got, want)
	}
	g, err := l.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, states, 5*time.Second), "exists=true held=true released=false holder=holder-a token=1"; got != want {
		t.Fatalf("after acquire: %q, want %q", got, want)
	}
	for range 3 {
		if g, err = l.Renew(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, states, 5*time.Second), "exists=true held=false released=true holder=holder-a token=1"; got != want {
		t.Fatalf("after renewals and release: %q, want %q (renewals are no change)", got, want)
	}
	if _, err := l.Acquire(ctx, "job", "holder-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, want := next(t, states, 5*time.Second), "exists=true held=true released=false holder=holder-b token=2"; got != want {
		t.Fatalf("after B's acquire: %q, want %q", got, want)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe after its ctx ended: %v, want context.Canceled", err)
	}
	select {
	case s := <-states:
		t.Fatalf("an extra state was reported: %q", s)
	default:
	}
}

// TestObserveWakesOnRelease: with a Waiter (memfence has one) a release is
// reported at once, not after the poll interval — here an hour.
func TestObserveWakesOnRelease(t *testing.T) {
	ctx := context.Background()
	l := memfence.NewLeases(nil)
	g, err := l.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	states, stop := observer(t, l, time.Hour)
	defer stop()
	next(t, states, 5*time.Second) // held by holder-a
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if got := next(t, states, 5*time.Second); got != "exists=true held=false released=true holder=holder-a token=1" {
		t.Fatalf("after the release: %q", got)
	}
}

// noWaiter hides memfence's WaitFree: Observe must poll.
type noWaiter struct{ leasecore.LeaseInspector }

// TestObservePollsWithoutWaiter: without a Waiter the release is seen by
// polling.
func TestObservePollsWithoutWaiter(t *testing.T) {
	ctx := context.Background()
	l := memfence.NewLeases(nil)
	g, err := l.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	states, stop := observer(t, noWaiter{l}, 10*time.Millisecond)
	defer stop()
	next(t, states, 5*time.Second)
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if got := next(t, states, 5*time.Second); got != "exists=true held=false released=true holder=holder-a token=1" {
		t.Fatalf("after the release: %q", got)
	}
}

// TestObserveBadInput: bad input is an error naming the field, at once.
func TestObserveBadInput(t *testing.T) {
	ctx := context.Background()
	l := memfence.NewLeases(nil)
	f := func(leasecore.LeaseState) {}
	for _, tc := range []struct {
		field string
		err   error
	}{
		{"name", leasecore.Observe(ctx, l, "", f)},
		{"lease", leasecore.Observe(ctx, nil, "job", f)},
		{"f", leasecore.Observe(ctx, l, "job", nil)},
		{"poll", leasecore.Observe(ctx, l, "job", f, leasecore.WithObservePoll(0))},
	} {
		var ae *leasecore.ArgError
		if !errors.As(tc.err, &ae) || ae.Field != tc.field {
			t.Errorf("%s: %v, want an ArgError naming it", tc.field, tc.err)
		}
	}
}
