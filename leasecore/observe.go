package leasecore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ObserveOption configures Observe.
type ObserveOption func(*observeConfig)

type observeConfig struct {
	poll  time.Duration
	clock Clock
}

// WithObservePoll sets how often Observe reads the lease while it is free,
// or while it is held and the lease service has no WaitFree (default 1 s).
// Each pause is random, between half of d and d.
func WithObservePoll(d time.Duration) ObserveOption {
	return func(c *observeConfig) { c.poll = d }
}

// Observe reports the state of lease name to f each time it changes — who
// holds it with which token, or that nobody does — until ctx ends, for
// dashboards and followers. The first call of f is the state at the start.
// A change is a different holder, token, held or released flag; a renewal
// (only the remaining time moves) is not one. A free lease is reported as
// such (LeaseState.Held false: no leader), not skipped.
//
// Every state is read with insp.Inspect, by the backend's clock. While the
// lease is held and insp is also a backendkit.Waiter (fencepg and
// fenceetcd lease stores are), Observe waits with WaitFree, so a release or
// an expiry is seen at once; otherwise it reads again after the poll
// interval (WithObservePoll). A new holder taking a free lease is seen at
// the next poll. What f is told is stale when it arrives: nothing should
// decide to write from it (the fencing token does that).
//
// f runs on the caller's goroutine, one call at a time; nothing Observe
// starts outlives it. It returns ctx's cause when ctx ends, and the error of
// a read that cannot heal (bad input, a missing schema) at once; reads
// that fail with ErrUnavailable are retried after the poll interval.
func Observe(ctx context.Context, insp LeaseInspector, name string, f func(LeaseState), opts ...ObserveOption) error {
	const op = "observe"
	if err := checkInspect(ctx, name); err != nil {
		return err
	}
	if insp == nil {
		return &ArgError{Op: op, Field: "lease", Reason: "must not be nil"}
	}
	if f == nil {
		return &ArgError{Op: op, Field: "f", Reason: "must not be nil"}
	}
	c := observeConfig{poll: time.Second, clock: systemClock{}}
	for _, o := range opts {
		o(&c)
	}
	if c.poll <= 0 {
		return &ArgError{Op: op, Field: "poll", Value: c.poll.String(), Reason: "must be positive"}
	}
	waiter, _ := insp.(freeWaiter)
	var last LeaseState
	first := true
	for {
		st, err := insp.Inspect(ctx, name)
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case errors.Is(err, ErrUnavailable):
			if !sleep(ctx, c.clock, jitter(c.poll)) {
				return context.Cause(ctx)
			}
			continue
		case err != nil:
			return fmt.Errorf("leasecore: %s %q: %w", op, name, err)
		}
		if first || changed(last, st) {
			f(st)
			last, first = st, false
		}
		if st.Held && waiter != nil {
			// Wakes on release or expiry; bounded by the remaining time,
			// plus one poll in case a notification was missed.
			wctx, cancel := withClockTimeout(ctx, c.clock, st.Remaining+c.poll, errObserveWait)
			werr := waiter.WaitFree(wctx, name)
			cancel()
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if werr == nil || errors.Is(werr, errObserveWait) || errors.Is(werr, context.DeadlineExceeded) {
				continue
			}
			// The backend cannot wait (a pooler, lib/pq): poll instead.
		}
		if !sleep(ctx, c.clock, jitter(c.poll)) {
			return context.Cause(ctx)
		}
	}
}

// errObserveWait ends one of Observe's bounded waits.
var errObserveWait = errors.New("leasecore: observe: wait bound reached")

// changed reports whether b is a different state of the lease than a: a
// renewal, which only moves Remaining, is not a change.
func changed(a, b LeaseState) bool {
	return a.Exists != b.Exists || a.Holder != b.Holder || a.Token != b.Token ||
		a.Held != b.Held || a.Released != b.Released
}
