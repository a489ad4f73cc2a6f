package leasecore_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// One stuck renew request (a half-open connection: it returns only when
// its context ends) must not hold up every retry until the local deadline.
// Its attempt times out by the renew interval, and the next attempt, which
// would work, keeps the session.
func TestSessionRenewAttemptTimesOut(t *testing.T) {
	f := newFixture(false)
	entered := make(chan struct{}, 1)
	var calls atomic.Int64
	f.spy.renewHook = func(ctx context.Context, g leasecore.Grant) error {
		if calls.Add(1) > 1 {
			return nil // a new attempt (a new connection) works
		}
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	s := f.open(t, "holder-a")
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval) // 400 ms: the first attempt gets stuck
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("renewal did not start")
	}
	f.local.Advance(testInterval) // 800 ms: the attempt's time is up

	ev := f.nextEvent(t)
	if !errors.Is(ev.Err, leasecore.ErrUnavailable) {
		t.Errorf("stuck attempt's event Err = %v, want it to wrap ErrUnavailable (timed out)", ev.Err)
	}
	ev = f.nextEvent(t)
	if ev.Err != nil {
		t.Fatalf("second attempt Err = %v, want success", ev.Err)
	}
	if want := epoch.Add(2*testInterval + testWindow); !ev.Deadline.Equal(want) {
		t.Errorf("second attempt's Deadline = %v, want %v (from its own start at 800 ms)", ev.Deadline, want)
	}
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval) // 1200 ms: the first deadline
	f.nextEvent(t)
	if !s.Valid() || s.Err() != nil {
		t.Errorf("at %v: Valid=%v Err=%v, want the session still running", f.local.Since(), s.Valid(), s.Err())
	}
}

// WithRenewTimeout sets the attempt's timeout; it never runs past the local
// deadline.
func TestSessionRenewTimeoutOption(t *testing.T) {
	f := newFixture(false)
	started := make(chan struct{}, 1)
	f.spy.renewHook = func(ctx context.Context, g leasecore.Grant) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	f.open(t, "holder-a", leasecore.WithRenewTimeout(100*time.Millisecond))
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval)
	<-started
	f.local.Advance(100*time.Millisecond - time.Nanosecond)
	f.noEvent(t)
	f.local.Advance(time.Nanosecond)
	if ev := f.nextEvent(t); !errors.Is(ev.Err, leasecore.ErrUnavailable) {
		t.Errorf("Err = %v, want a timeout wrapping ErrUnavailable", ev.Err)
	}

	for _, d := range []time.Duration{0, -time.Second} {
		_, err := leasecore.NewSession(context.Background(), f.spy, "other", "holder-a", f.options(leasecore.WithRenewTimeout(d))...)
		testcheck.WantArgError(t, err, "new session", "renew timeout")
	}
}

// hookClock is a fakeClock that runs hook inside the first Now call after
// it was armed, after taking its reading.
type hookClock struct {
	*fakeClock
	armed atomic.Bool
	hook  func()
}

func (c *hookClock) Now() time.Time {
	now := c.fakeClock.Now()
	if c.armed.CompareAndSwap(true, false) {
		c.hook()
	}
	return now
}

// A renewal answers 1 ns before the local deadline; the deadline passes
// while the session checks the answer. Valid must never report false and
// then true again: the check and the publish of the new deadline are one
// step under the lock Valid takes.
func TestSessionValidNeverTurnsTrueAgain(t *testing.T) {
	f := newFixture(true) // the server's clock stays put: the renewal succeeds
	hc := &hookClock{fakeClock: f.local}
	const interval = testWindow - 100*time.Millisecond // renew at 1100 ms
	var s *leasecore.Session
	observed := make(chan bool, 1)
	hc.hook = func() {
		// The session is checking the renewal's answer. The deadline
		// passes now and the owner asks. If the check holds the lock,
		// this Valid waits for the publish; give it 100 ms (real time) to
		// show it does not wait, then collect its answer later.
		hc.fakeClock.Advance(time.Nanosecond)
		res := make(chan bool, 1)
		go func() { res <- s.Valid() }()
		select {
		case v := <-res:
			observed <- v
		case <-time.After(100 * time.Millisecond):
			go func() { observed <- <-res }()
		}
	}
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		f.local.Advance(testWindow - interval - time.Nanosecond) // the answer arrives 1 ns early
		hc.armed.Store(true)
		return nil
	}
	s = f.open(t, "holder-a", leasecore.WithClock(hc), leasecore.WithRenewInterval(interval))
	f.local.WaitTimers(t, 2)
	f.local.Advance(interval)
	select {
	case <-f.events:
	case <-s.Done():
	case <-time.After(realWait):
		t.Fatal("the renewal neither succeeded nor ended the session")
	}
	first := <-observed
	then := s.Valid()
	if !first && then {
		t.Errorf("Valid() = false at the deadline and then true after the late renewal was published")
	}
}

// Close(ctx) returns when ctx ends, even while a renewal that ignores its
// own context hangs; the goroutine goes away once the renewal returns.
func TestSessionCloseHonoursContextDuringRenew(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	entered := make(chan struct{}, 1)
	unblock := make(chan struct{})
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		entered <- struct{}{}
		<-unblock // ignores its context: the slowest possible backend
		return nil
	}
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a", f.options()...)
	if err != nil {
		t.Fatal(err)
	}
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval)
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("renewal did not start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	closed := make(chan error, 1)
	go func() { closed <- s.Close(ctx) }()
	cancel()
	returned := false
	select {
	case err := <-closed:
		returned = true
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Close = %v, want it to wrap context.Canceled", err)
		}
	case <-time.After(realWait):
		t.Error("Close ignored its cancelled context while a renewal hung")
	}
	if !isDone(s) || !errors.Is(s.Err(), leasecore.ErrClosed) {
		t.Errorf("after Close: Done=%v Err=%v, want done with ErrClosed", isDone(s), s.Err())
	}
	close(unblock)
	if !returned {
		<-closed
	}
	waitGoroutines(t, baseline)
	f.noEvent(t) // the renewal answering after Close is not reported
}

// The best-effort release of a grant that came too late is bounded: a
// release that hangs does not keep NewSession from returning.
func TestNewSessionBestEffortReleaseIsBounded(t *testing.T) {
	f := newFixture(false)
	giveUp := make(chan struct{})
	t.Cleanup(func() { close(giveUp) })
	entered := make(chan struct{}, 1)
	f.spy.afterAcquire = func(context.Context) { f.local.Advance(testWindow) }
	f.spy.releaseHook = func(ctx context.Context, g leasecore.Grant) error {
		entered <- struct{}{}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-giveUp:
			return errors.New("test over")
		}
	}
	result := make(chan error, 1)
	go func() {
		s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a", f.options()...)
		if s != nil {
			s.Close(context.Background())
		}
		result <- err
	}()
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("the late grant was not released")
	}
	f.local.Advance(testTTL) // longer than any bound the release may have
	select {
	case err := <-result:
		if !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Errorf("NewSession = %v, want ErrLocalDeadline", err)
		}
	case <-time.After(realWait):
		t.Error("NewSession still waits for a hung best-effort release")
	}
}

// The first renewal is due one interval after the clock reading taken
// before the acquire, from which the local deadline counts, as each later
// renewal is due one interval after the reading before its renew request.
// Counted from when the acquire returned, a slow acquire would take its
// own latency off the first renewal's time before the deadline (and with
// an acquire slower than ttl - margin - interval, the deadline would pass
// before the first renewal, which WithRenewInterval's bound rules out).
func TestSessionFirstRenewalCountsFromAcquireStart(t *testing.T) {
	for _, took := range []time.Duration{300 * time.Millisecond, testInterval + 100*time.Millisecond} {
		t.Run(took.String(), func(t *testing.T) {
			f := newFixture(false)
			f.spy.afterAcquire = func(context.Context) { f.local.Advance(took) } // the response in transit
			s := f.open(t, "holder-a")
			var ev leasecore.RenewEvent
			if took < testInterval {
				ev = f.tick(t, testInterval-took)
			} else {
				ev = f.nextEvent(t) // due already: sent as soon as the acquire returned
			}
			if want := epoch.Add(max(testInterval, took)); ev.Err != nil || !ev.Start.Equal(want) {
				t.Errorf("first renewal: Start %v after the acquire's reading, Err %v; want %v, nil",
					ev.Start.Sub(epoch), ev.Err, want.Sub(epoch))
			}
			if want := ev.Start.Add(testWindow); !s.Deadline().Equal(want) {
				t.Errorf("Deadline() = %v after the acquire's reading, want %v", s.Deadline().Sub(epoch), want.Sub(epoch))
			}
		})
	}
}
