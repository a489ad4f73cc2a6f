package leasecore

import (
	"context"
	"time"
)

// Clock is the local clock a Session uses for its deadline and its renewal
// timer. Tests inject a fake one to skew or freeze time; everything else
// uses the process's clock (time.Now and time.NewTimer). Times returned by
// Now must carry a monotonic reading (as time.Now's do) when the clock can
// jump.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer a Session needs.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// systemClock is the process's own clock: time.Now and time.NewTimer. It is
// the default of every option that takes a Clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

// withClockTimeout returns a copy of parent that is also cancelled, with
// cause, once d has passed on clock. The returned cancel function stops the
// timer and must be called. On systemClock it is context.WithTimeoutCause;
// on any other clock one goroutine waits for the timer until cancel.
func withClockTimeout(parent context.Context, clock Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	if _, ok := clock.(systemClock); ok {
		return context.WithTimeoutCause(parent, d, cause)
	}
	ctx, cancel := context.WithCancelCause(parent)
	t := clock.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			cancel(cause)
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}
