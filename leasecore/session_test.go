package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// The teaching parameters of the lease-fencing article (SOURCES.md), as in
// conformance case F4: TTL 1500 ms, margin 300 ms, renew every 400 ms. The
// local deadline is 1200 ms after the clock reading taken before a request.
const (
	testTTL      = 1500 * time.Millisecond
	testMargin   = 300 * time.Millisecond
	testInterval = 400 * time.Millisecond
	testWindow   = testTTL - testMargin

	// realWait bounds every wait on the renewal goroutine in real time. It
	// is generous: it only matters when a test is about to fail.
	realWait = 10 * time.Second
)

// spyLease wraps the in-memory lease service, counts calls, and lets a test
// make requests slow or failing.
type spyLease struct {
	*memfence.Leases
	acquires, renews, releases atomic.Int64

	// Set before the session starts; read by the renewal goroutine.
	beforeAcquire func(ctx context.Context) // e.g. the request's transit time
	afterAcquire  func(ctx context.Context) // e.g. the response's transit time
	// renewHook runs before the real renewal; a non-nil error is returned
	// instead of renewing.
	renewHook func(ctx context.Context, g leasecore.Grant) error
	// releaseHook runs before the real release; a non-nil error is
	// returned instead of releasing.
	releaseHook func(ctx context.Context, g leasecore.Grant) error
	// renewAllHook runs before the real RenewAll, afterRenewAll after it
	// (before its answer is returned); a non-nil error from renewAllHook is
	// returned instead of renewing.
	renewAllHook  func(ctx context.Context, gs []leasecore.Grant) error
	afterRenewAll func(ctx context.Context)
	renewAlls     atomic.Int64
}

func (s *spyLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	s.acquires.Add(1)
	if s.beforeAcquire != nil {
		s.beforeAcquire(ctx)
	}
	g, err := s.Leases.Acquire(ctx, name, holder, ttl)
	if s.afterAcquire != nil {
		s.afterAcquire(ctx)
	}
	return g, err
}

func (s *spyLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	s.renews.Add(1)
	if s.renewHook != nil {
		if err := s.renewHook(ctx, g); err != nil {
			return leasecore.Grant{}, err
		}
	}
	return s.Leases.Renew(ctx, g)
}

func (s *spyLease) Release(ctx context.Context, g leasecore.Grant) error {
	s.releases.Add(1)
	if s.releaseHook != nil {
		if err := s.releaseHook(ctx, g); err != nil {
			return err
		}
	}
	return s.Leases.Release(ctx, g)
}

func (s *spyLease) RenewAll(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	s.renewAlls.Add(1)
	if s.renewAllHook != nil {
		if err := s.renewAllHook(ctx, gs); err != nil {
			return nil, nil, err
		}
	}
	renewed, lost, err := s.Leases.RenewAll(ctx, gs)
	if s.afterRenewAll != nil {
		s.afterRenewAll(ctx)
	}
	return renewed, lost, err
}

// fixture is one holder's local clock, the lease service with its own
// ("server") clock, and the session's renewal events.
type fixture struct {
	local  *fakeClock
	server *fakeClock // the same as local unless the test skews them
	leases *memfence.Leases
	spy    *spyLease
	events chan leasecore.RenewEvent
}

func newFixture(separateServerClock bool) *fixture {
	f := &fixture{local: newFakeClock(), events: make(chan leasecore.RenewEvent, 128)}
	f.server = f.local
	if separateServerClock {
		f.server = newFakeClock()
	}
	f.leases = memfence.NewLeases(f.server.Now)
	f.spy = &spyLease{Leases: f.leases}
	return f
}

func (f *fixture) options(extra ...leasecore.SessionOption) []leasecore.SessionOption {
	return append([]leasecore.SessionOption{
		leasecore.WithClock(f.local),
		leasecore.WithTTL(testTTL),
		leasecore.WithMargin(testMargin),
		leasecore.WithRenewInterval(testInterval),
		leasecore.WithRenewObserver(func(ev leasecore.RenewEvent) { f.events <- ev }),
	}, extra...)
}

// open starts a session for holder on "report-job" and closes it when the
// test ends.
func (f *fixture) open(t *testing.T, holder string, extra ...leasecore.SessionOption) *leasecore.Session {
	t.Helper()
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", holder, f.options(extra...)...)
	if err != nil {
		t.Fatalf("NewSession(%s) = %v", holder, err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// tick waits until the renewal goroutine waits for its timers, advances the
// local clock by d, and returns the renewal that follows.
func (f *fixture) tick(t *testing.T, d time.Duration) leasecore.RenewEvent {
	t.Helper()
	f.local.WaitTimers(t, 2)
	f.local.Advance(d)
	return f.nextEvent(t)
}

func (f *fixture) nextEvent(t *testing.T) leasecore.RenewEvent {
	t.Helper()
	select {
	case ev := <-f.events:
		return ev
	case <-time.After(realWait):
		t.Fatalf("no renewal event within %v (real time)", realWait)
		return leasecore.RenewEvent{}
	}
}

func (f *fixture) noEvent(t *testing.T) {
	t.Helper()
	select {
	case ev := <-f.events:
		t.Fatalf("unexpected renewal event %+v", ev)
	default:
	}
}

func (f *fixture) inspect(t *testing.T) leasecore.LeaseState {
	t.Helper()
	st, err := f.leases.Inspect(context.Background(), "report-job")
	if err != nil {
		t.Fatalf("Inspect = %v", err)
	}
	return st
}

func waitDone(t *testing.T, s *leasecore.Session) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(realWait):
		t.Fatalf("session did not end within %v (real time); Err = %v", realWait, s.Err())
	}
}

func isDone(s *leasecore.Session) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// waitGoroutines waits until no more than baseline goroutines run: the
// session's renewal goroutine is gone.
func waitGoroutines(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(realWait)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines after %v, want <= %d (baseline):\n%s",
				runtime.NumGoroutine(), realWait, baseline, buf)
		}
		time.Sleep(time.Millisecond)
	}
}

// The local deadline counts from the clock reading taken before the acquire
// request was sent, not from when the response arrived: the server starts
// the TTL only after it received the request.
func TestSessionDeadlineFromReadingBeforeAcquire(t *testing.T) {
	f := newFixture(false)
	f.spy.beforeAcquire = func(context.Context) { f.local.Advance(200 * time.Millisecond) } // request in transit
	f.spy.afterAcquire = func(context.Context) { f.local.Advance(100 * time.Millisecond) }  // response in transit
	transient := fmt.Errorf("spy: connection reset: %w", leasecore.ErrUnavailable)
	f.spy.renewHook = func(context.Context, leasecore.Grant) error { return transient }

	s := f.open(t, "holder-a")
	if got := s.Grant().Start; !got.Equal(epoch) {
		t.Errorf("Grant().Start = %v, want the reading before the request %v", got, epoch)
	}
	if got, want := s.Deadline(), epoch.Add(testWindow); !got.Equal(want) {
		t.Errorf("Deadline() = %v, want start + ttl - margin = %v", got, want)
	}
	// The server counts its TTL from when it executed the acquire (200 ms
	// in), so at this moment (300 ms in) it still has 1400 ms left.
	if st := f.inspect(t); !st.Held || st.Remaining != testTTL-100*time.Millisecond {
		t.Errorf("server state = %+v, want held with %v remaining", st, testTTL-100*time.Millisecond)
	}

	// Renewals fail (transiently), so the first deadline stands: valid 1 ns
	// before it, over at it. A reading after the response would have put
	// it at 1500 ms.
	f.local.WaitTimers(t, 2)
	f.local.Advance(testWindow - f.local.Since() - time.Nanosecond)
	if ev := f.nextEvent(t); !errors.Is(ev.Err, leasecore.ErrUnavailable) {
		t.Fatalf("renew event Err = %v, want ErrUnavailable", ev.Err)
	}
	f.local.WaitTimers(t, 2)
	if !s.Valid() {
		t.Fatalf("Valid() = false 1ns before the local deadline")
	}
	f.local.Advance(time.Nanosecond)
	waitDone(t, s)
	if s.Valid() {
		t.Error("Valid() = true at the local deadline")
	}
	if err := s.Err(); !errors.Is(err, leasecore.ErrLocalDeadline) {
		t.Errorf("Err() = %v, want ErrLocalDeadline", err)
	}
}

// The same rule for renewals: the new deadline counts from the reading
// before the renew request, however slow the request is.
func TestSessionDeadlineFromReadingBeforeRenew(t *testing.T) {
	f := newFixture(false)
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		f.local.Advance(50 * time.Millisecond) // a slow round trip
		return nil
	}
	s := f.open(t, "holder-a")
	ev := f.tick(t, testInterval)
	if ev.Err != nil {
		t.Fatalf("renew: %v", ev.Err)
	}
	wantStart := epoch.Add(testInterval)
	if !ev.Start.Equal(wantStart) || !ev.Grant.Start.Equal(wantStart) {
		t.Errorf("event Start = %v, Grant.Start = %v, want %v", ev.Start, ev.Grant.Start, wantStart)
	}
	if want := wantStart.Add(testWindow); !ev.Deadline.Equal(want) || !s.Deadline().Equal(want) {
		t.Errorf("event Deadline = %v, Deadline() = %v, want %v", ev.Deadline, s.Deadline(), want)
	}
}

// While a renewal hangs past the local deadline, the session ends at the
// deadline by its own clock: Valid turns false and Done closes without
// waiting for the request, whose late answer is discarded.
func TestSessionEndsAtDeadlineDuringSlowRenew(t *testing.T) {
	f := newFixture(false)
	entered := make(chan struct{}, 1)
	proceed := make(chan struct{})
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		entered <- struct{}{}
		<-proceed // ignores its context on purpose: the slowest possible backend
		return nil
	}
	s := f.open(t, "holder-a")
	f.local.WaitTimers(t, 2)
	f.local.Advance(testInterval)
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("renewal did not start")
	}

	f.local.Advance(testWindow - testInterval - time.Nanosecond)
	if !s.Valid() {
		t.Error("Valid() = false 1ns before the deadline")
	}
	f.local.Advance(time.Nanosecond)
	if s.Valid() {
		t.Error("Valid() = true at the local deadline while a renewal is in flight")
	}
	waitDone(t, s) // before the renewal answers
	if !errors.Is(s.Err(), leasecore.ErrLocalDeadline) {
		t.Errorf("Err() = %v, want ErrLocalDeadline", s.Err())
	}

	close(proceed) // the renewal "succeeds" too late
	select {
	case ev := <-f.events:
		t.Errorf("a renewal answering after the deadline was reported: %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
	if s.Valid() {
		t.Error("the session came back to life after a late renewal")
	}
	if n := f.spy.renews.Load(); n != 1 {
		t.Errorf("Renew called %d times, want 1", n)
	}
}

func TestSessionRenewKeepsHoldAcrossManyTTLs(t *testing.T) {
	f := newFixture(false)
	s := f.open(t, "holder-a")
	tok := s.Token()
	if tok != 1 {
		t.Fatalf("first token = %d, want 1", tok)
	}
	const renewals = 20 // 8 s of fake time, more than five TTLs
	for i := 1; i <= renewals; i++ {
		ev := f.tick(t, testInterval)
		if ev.Err != nil {
			t.Fatalf("renewal %d: %v", i, ev.Err)
		}
		now := f.local.Now()
		if !ev.Start.Equal(now) {
			t.Errorf("renewal %d: Start = %v, want %v", i, ev.Start, now)
		}
		if ev.Grant.Token != tok || s.Token() != tok {
			t.Fatalf("renewal %d: event token %d, Token() %d, want %d (a renewal never changes the token)",
				i, ev.Grant.Token, s.Token(), tok)
		}
		if want := now.Add(testWindow); !ev.Deadline.Equal(want) || !s.Deadline().Equal(want) {
			t.Errorf("renewal %d: Deadline = %v / %v, want %v", i, ev.Deadline, s.Deadline(), want)
		}
		if !s.Valid() || s.Err() != nil || isDone(s) {
			t.Fatalf("renewal %d: Valid=%v Err=%v Done=%v, want a running session", i, s.Valid(), s.Err(), isDone(s))
		}
		if st := f.inspect(t); !st.Held || st.Holder != "holder-a" || st.Token != tok || st.Remaining != testTTL {
			t.Errorf("renewal %d: server state %+v, want held by holder-a, token %d, %v remaining", i, st, tok, testTTL)
		}
	}
	if f.local.Since() <= 5*testTTL {
		t.Fatalf("test covered only %v", f.local.Since())
	}
	if n := f.spy.renews.Load(); n != renewals {
		t.Errorf("Renew called %d times, want %d", n, renewals)
	}
}

func TestSessionEndsWhenRenewFindsHoldLost(t *testing.T) {
	tests := []struct {
		name   string
		lose   func(t *testing.T, f *fixture, g leasecore.Grant) // by the server's clock only
		reason string
		holder string // who holds the lease afterwards; "" for nobody
	}{
		{
			name: "expired, nobody took over",
			lose: func(t *testing.T, f *fixture, g leasecore.Grant) {
				f.server.Advance(testTTL)
			},
			reason: "expired",
		},
		{
			name: "taken over",
			lose: func(t *testing.T, f *fixture, g leasecore.Grant) {
				f.server.Advance(testTTL)
				b, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL)
				if err != nil || b.Token != 2 {
					t.Fatalf("holder-b Acquire = %+v, %v; want token 2", b, err)
				}
			},
			reason: `"holder-b"`,
			holder: "holder-b",
		},
		{
			name: "released by someone else",
			lose: func(t *testing.T, f *fixture, g leasecore.Grant) {
				if err := f.leases.Release(context.Background(), g); err != nil {
					t.Fatalf("Release = %v", err)
				}
			},
			reason: "released",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(true)
			s := f.open(t, "holder-a")
			f.local.WaitTimers(t, 2)
			tc.lose(t, f, s.Grant())

			ev := f.tick(t, testInterval)
			if !errors.Is(ev.Err, leasecore.ErrLost) {
				t.Fatalf("renew event Err = %v, want ErrLost", ev.Err)
			}
			if ev.Grant != (leasecore.Grant{}) || !ev.Deadline.IsZero() {
				t.Errorf("failed renewal event carries Grant %+v, Deadline %v; want zero", ev.Grant, ev.Deadline)
			}
			waitDone(t, s)
			err := s.Err()
			if !errors.Is(err, leasecore.ErrLost) {
				t.Fatalf("Err() = %v, want ErrLost", err)
			}
			var he *leasecore.HoldError
			if !errors.As(err, &he) || !strings.Contains(he.Reason, tc.reason) {
				t.Errorf("Err() = %v, want a HoldError whose reason contains %q", err, tc.reason)
			}
			// Lost although the local deadline has not passed.
			if s.Valid() {
				t.Error("Valid() = true after the hold was lost")
			}
			if s.Token() != 1 {
				t.Errorf("Token() = %d after the end, want 1", s.Token())
			}

			// The goroutine is gone: no timers, no more renewals.
			f.local.WaitTimers(t, 0)
			f.local.Advance(10 * testTTL)
			if n := f.spy.renews.Load(); n != 1 {
				t.Errorf("Renew called %d times, want 1 (none after the loss)", n)
			}

			// Close after a loss: nil, nothing released, Err unchanged.
			if err := s.Close(context.Background()); err != nil {
				t.Errorf("Close after loss = %v, want nil", err)
			}
			if n := f.spy.releases.Load(); n != 0 {
				t.Errorf("Close after loss called Release %d times, want 0", n)
			}
			if err := s.Err(); !errors.Is(err, leasecore.ErrLost) {
				t.Errorf("Err() after Close = %v, want it to stay ErrLost", err)
			}
			st := f.inspect(t)
			if tc.holder != "" && (!st.Held || st.Holder != tc.holder) {
				t.Errorf("server state %+v, want still held by %s", st, tc.holder)
			}
			f.noEvent(t)
		})
	}
}

func TestSessionTransientRenewErrors(t *testing.T) {
	transient := fmt.Errorf("spy: connection reset: %w", leasecore.ErrUnavailable)

	t.Run("deadline passes", func(t *testing.T) {
		f := newFixture(false)
		f.spy.renewHook = func(context.Context, leasecore.Grant) error { return transient }
		s := f.open(t, "holder-a")

		for i := 1; i <= 2; i++ { // at 400 and 800 ms
			ev := f.tick(t, testInterval)
			if !errors.Is(ev.Err, leasecore.ErrUnavailable) {
				t.Fatalf("renewal %d: Err = %v, want ErrUnavailable", i, ev.Err)
			}
			if ev.Grant != (leasecore.Grant{}) || !ev.Deadline.IsZero() {
				t.Errorf("renewal %d: failed event carries Grant %+v, Deadline %v", i, ev.Grant, ev.Deadline)
			}
			if !s.Valid() || s.Err() != nil || isDone(s) {
				t.Fatalf("renewal %d: Valid=%v Err=%v, want the session still running", i, s.Valid(), s.Err())
			}
			if !s.Deadline().Equal(epoch.Add(testWindow)) {
				t.Errorf("renewal %d: a failed renewal moved the deadline to %v", i, s.Deadline())
			}
		}

		// At 1200 ms both the tick and the deadline are due; either way the
		// session ends without another request.
		f.local.WaitTimers(t, 2)
		f.local.Advance(testInterval)
		waitDone(t, s)
		err := s.Err()
		if !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Fatalf("Err() = %v, want ErrLocalDeadline", err)
		}
		if !strings.Contains(err.Error(), `"report-job"`) || !strings.Contains(err.Error(), "token 1") {
			t.Errorf("Err() = %q, want it to name the lease and the token", err)
		}
		if s.Valid() {
			t.Error("Valid() = true after the local deadline")
		}
		f.local.WaitTimers(t, 0)
		if n := f.spy.renews.Load(); n != 2 {
			t.Errorf("Renew called %d times, want 2", n)
		}

		// The server still holds the lease for the margin; Close releases it
		// so the next holder need not wait.
		if st := f.inspect(t); !st.Held {
			t.Fatalf("server state %+v, want still held within the margin", st)
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if st := f.inspect(t); st.Held || !st.Released {
			t.Errorf("server state after Close %+v, want released", st)
		}
		if err := s.Err(); !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Errorf("Err() after Close = %v, want it to stay ErrLocalDeadline", err)
		}
	})

	t.Run("later success extends", func(t *testing.T) {
		f := newFixture(false)
		var failing atomic.Bool
		failing.Store(true)
		f.spy.renewHook = func(context.Context, leasecore.Grant) error {
			if failing.Load() {
				return transient
			}
			return nil
		}
		const interval = 300 * time.Millisecond
		s := f.open(t, "holder-a", leasecore.WithRenewInterval(interval))
		for i := 1; i <= 2; i++ { // at 300 and 600 ms
			if ev := f.tick(t, interval); !errors.Is(ev.Err, leasecore.ErrUnavailable) {
				t.Fatalf("renewal %d: Err = %v, want ErrUnavailable", i, ev.Err)
			}
		}
		failing.Store(false)
		ev := f.tick(t, interval) // at 900 ms, before the 1200 ms deadline
		if ev.Err != nil {
			t.Fatalf("renewal at 900ms: %v", ev.Err)
		}
		want := epoch.Add(900*time.Millisecond + testWindow)
		if !ev.Deadline.Equal(want) || !s.Deadline().Equal(want) {
			t.Errorf("Deadline = %v / %v, want %v", ev.Deadline, s.Deadline(), want)
		}
		// Past the first deadline (1200 ms), still running.
		if ev := f.tick(t, interval); ev.Err != nil {
			t.Fatalf("renewal at 1200ms: %v", ev.Err)
		}
		if !s.Valid() || s.Err() != nil || isDone(s) {
			t.Errorf("at %v: Valid=%v Err=%v, want the session running", f.local.Since(), s.Valid(), s.Err())
		}
		if s.Token() != 1 {
			t.Errorf("Token() = %d, want 1", s.Token())
		}
	})
}

// A local clock that runs fast makes the holder stop early; it has no say
// over the lease, whose expiry only the server's clock decides.
func TestSessionFastLocalClock(t *testing.T) {
	f := newFixture(true)
	s := f.open(t, "holder-a")
	f.local.WaitTimers(t, 2)

	// 1000 ms pass on the server while the local clock counts 1300 ms. Both
	// local timers fire at once; either way the session ends without a
	// renewal.
	f.server.Advance(1000 * time.Millisecond)
	f.local.Advance(1300 * time.Millisecond)
	waitDone(t, s)
	if s.Valid() || !errors.Is(s.Err(), leasecore.ErrLocalDeadline) {
		t.Fatalf("Valid=%v Err=%v, want the session over by its local deadline", s.Valid(), s.Err())
	}
	if n := f.spy.renews.Load(); n != 0 {
		t.Errorf("Renew called %d times, want 0", n)
	}

	st := f.inspect(t)
	if !st.Held || st.Holder != "holder-a" || st.Remaining != 500*time.Millisecond {
		t.Fatalf("server state %+v, want held by holder-a with 500ms remaining", st)
	}
	// However far the local clock runs, the server still counts holder-a's
	// holding period.
	f.local.Advance(time.Hour)
	if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("holder-b Acquire before server expiry = %v, want ErrHeld", err)
	}
	f.server.Advance(500 * time.Millisecond)
	g, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL)
	if err != nil || g.Token != 2 {
		t.Fatalf("holder-b Acquire at server expiry = %+v, %v; want token 2", g, err)
	}
	// Closing the old session must not disturb the new holder.
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v, want nil (the hold is already over)", err)
	}
	if st := f.inspect(t); !st.Held || st.Holder != "holder-b" || st.Token != 2 {
		t.Errorf("server state %+v, want held by holder-b with token 2", st)
	}
}

// A local clock that runs slow keeps Valid() true after the server let the
// lease expire: the margin must cover the rate difference, and when it does
// not, only the resource's token check keeps the stale write out.
func TestSessionSlowLocalClockOnlyTokenProtects(t *testing.T) {
	f := newFixture(true)
	res := memfence.NewResource()
	ctx := context.Background()
	const interval = 1100 * time.Millisecond
	s := f.open(t, "holder-a", leasecore.WithRenewInterval(interval))
	f.local.WaitTimers(t, 2)

	f.server.Advance(testTTL + 100*time.Millisecond)
	f.local.Advance(1000 * time.Millisecond)
	b, err := f.leases.Acquire(ctx, "report-job", "holder-b", testTTL)
	if err != nil {
		t.Fatalf("holder-b Acquire = %v", err)
	}
	if r, err := res.Write(ctx, leasecore.Write{Scope: "daily-report", Part: "summary",
		Content: "by b", Writer: "holder-b", Token: b.Token}); err != nil || !r.Accepted {
		t.Fatalf("holder-b write = %+v, %v; want accepted", r, err)
	}

	if !s.Valid() {
		t.Fatal("Valid() = false; the slow local clock should still count the deadline as ahead")
	}
	r, err := res.Write(ctx, leasecore.Write{Scope: "daily-report", Part: "summary",
		Content: "by a", Writer: "holder-a", Token: s.Token()})
	if err != nil || r.Accepted || r.Floor != 2 {
		t.Fatalf("stale holder-a write = %+v, %v; want rejected with floor 2", r, err)
	}

	// The next renewal discovers the loss.
	if ev := f.tick(t, interval-1000*time.Millisecond); !errors.Is(ev.Err, leasecore.ErrLost) {
		t.Fatalf("renew Err = %v, want ErrLost", ev.Err)
	}
	waitDone(t, s)
}

func TestSessionClose(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a", f.options()...)
	if err != nil {
		t.Fatal(err)
	}
	f.local.WaitTimers(t, 2)
	if runtime.NumGoroutine() <= baseline {
		t.Fatalf("no renewal goroutine seen (baseline %d)", baseline)
	}

	// Several concurrent Close calls: one releases, all return its result.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Close(context.Background())
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Close #%d = %v, want nil", i, err)
		}
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("repeated Close = %v, want nil", err)
	}
	if n := f.spy.releases.Load(); n != 1 {
		t.Errorf("Release called %d times, want 1", n)
	}
	if !isDone(s) || s.Valid() || !errors.Is(s.Err(), leasecore.ErrClosed) {
		t.Errorf("after Close: Done=%v Valid=%v Err=%v; want done, invalid, ErrClosed", isDone(s), s.Valid(), s.Err())
	}
	if st := f.inspect(t); st.Held || !st.Released || st.Token != 1 {
		t.Errorf("server state %+v, want released with token 1", st)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)

	// The next holder acquires at once, without waiting for the TTL.
	b, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-b", f.options()...)
	if err != nil {
		t.Fatalf("holder-b NewSession right after Close = %v", err)
	}
	defer b.Close(context.Background())
	if b.Token() != 2 {
		t.Errorf("holder-b token = %d, want 2", b.Token())
	}

	// The closed session never renews again.
	f.local.WaitTimers(t, 2) // holder-b's timers
	f.tick(t, testInterval)
	if n := f.spy.renews.Load(); n != 1 {
		t.Errorf("Renew called %d times, want 1 (holder-b's only)", n)
	}
}

func TestSessionCloseWaitsForInflightRenew(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	entered := make(chan struct{}, 1)
	cancelled := make(chan error, 1)
	unblock := make(chan struct{})
	var returned atomic.Bool
	f.spy.renewHook = func(ctx context.Context, g leasecore.Grant) error {
		entered <- struct{}{}
		<-ctx.Done()
		cancelled <- ctx.Err()
		<-unblock
		returned.Store(true)
		return ctx.Err()
	}
	// A long TTL and interval so the attempt's own timeout (the interval,
	// on the fake clock) cannot be what cancels it.
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a",
		f.options(leasecore.WithTTL(time.Hour), leasecore.WithMargin(10*time.Minute),
			leasecore.WithRenewInterval(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	f.local.WaitTimers(t, 2)
	f.local.Advance(time.Minute)
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("renewal did not start")
	}

	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("in-flight Renew's context ended with %v, want context.Canceled", err)
		}
	case <-time.After(realWait):
		t.Fatal("Close did not cancel the in-flight renewal")
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the renewal was still running", err)
	default:
	}
	close(unblock)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close = %v, want nil", err)
		}
	case <-time.After(realWait):
		t.Fatal("Close did not return after the renewal finished")
	}
	if !returned.Load() {
		t.Error("Close returned before the renewal did")
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state %+v, want released", st)
	}
	f.noEvent(t) // a renewal cut short by Close is not reported
	waitGoroutines(t, baseline)
}

// A Close whose release fails for another reason than a lost hold reports
// it, and keeps reporting it.
func TestSessionCloseReportsReleaseError(t *testing.T) {
	f := newFixture(false)
	s := f.open(t, "holder-a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Close(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Close(cancelled ctx) = %v, want context.Canceled", err)
	}
	if err2 := s.Close(context.Background()); err2 != err {
		t.Errorf("second Close = %v, want the first call's result %v", err2, err)
	}
	if !errors.Is(s.Err(), leasecore.ErrClosed) {
		t.Errorf("Err() = %v, want ErrClosed", s.Err())
	}
	if st := f.inspect(t); !st.Held {
		t.Errorf("server state %+v, want still held (the release did not happen)", st)
	}
}

func TestNewSessionRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name  string
		nilL  bool
		opts  []leasecore.SessionOption
		op    string
		field string
	}{
		{name: "nil lease", nilL: true, op: "new session", field: "lease"},
		{name: "nil clock", opts: []leasecore.SessionOption{leasecore.WithClock(nil)}, op: "new session", field: "clock"},
		{name: "zero ttl", opts: []leasecore.SessionOption{leasecore.WithTTL(0)}, op: "new session", field: "ttl"},
		{name: "negative ttl", opts: []leasecore.SessionOption{leasecore.WithTTL(-time.Second)}, op: "new session", field: "ttl"},
		{name: "ttl above MaxTTL", opts: []leasecore.SessionOption{leasecore.WithTTL(backendkit.MaxTTL + 1)}, op: "new session", field: "ttl"},
		{name: "negative margin", opts: []leasecore.SessionOption{leasecore.WithMargin(-1)}, op: "new session", field: "margin"},
		{name: "margin equals ttl", opts: []leasecore.SessionOption{leasecore.WithMargin(testTTL)}, op: "new session", field: "margin"},
		{name: "margin above ttl", opts: []leasecore.SessionOption{leasecore.WithMargin(2 * testTTL)}, op: "new session", field: "margin"},
		{name: "zero interval", opts: []leasecore.SessionOption{leasecore.WithRenewInterval(0)}, op: "new session", field: "renew interval"},
		{name: "negative interval", opts: []leasecore.SessionOption{leasecore.WithRenewInterval(-time.Second)}, op: "new session", field: "renew interval"},
		{name: "interval equals ttl-margin", opts: []leasecore.SessionOption{leasecore.WithRenewInterval(testWindow)}, op: "new session", field: "renew interval"},
		{name: "interval equals ttl", opts: []leasecore.SessionOption{leasecore.WithRenewInterval(testTTL)}, op: "new session", field: "renew interval"},
		// Left to the lease service: its own minimum TTL.
		{name: "ttl below backend minimum", opts: []leasecore.SessionOption{
			leasecore.WithTTL(memfence.MinTTL / 2), leasecore.WithMargin(0), leasecore.WithRenewInterval(memfence.MinTTL / 4)}, op: "acquire", field: "ttl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			baseline := runtime.NumGoroutine()
			f := newFixture(false)
			var lease leasecore.Lease = f.spy
			if tc.nilL {
				lease = nil
			}
			s, err := leasecore.NewSession(context.Background(), lease, "report-job", "holder-a", f.options(tc.opts...)...)
			if s != nil {
				t.Errorf("NewSession returned a session with error %v", err)
				s.Close(context.Background())
			}
			testcheck.WantArgError(t, err, tc.op, tc.field)
			if tc.op == "new session" && f.spy.acquires.Load() != 0 {
				t.Errorf("Acquire called %d times for a bad option", f.spy.acquires.Load())
			}
			if st := f.inspect(t); st.Exists {
				t.Errorf("server state %+v, want no lease", st)
			}
			waitGoroutines(t, baseline)
		})
	}

	// Bad names are the lease service's to report, as for any Acquire.
	for _, c := range []struct{ name, holder, field string }{
		{"", "holder-a", "name"},
		{"report-job", " holder-a", "holder"},
		{"report\x00job", "holder-a", "name"},
	} {
		f := newFixture(false)
		s, err := leasecore.NewSession(context.Background(), f.spy, c.name, c.holder, f.options()...)
		if s != nil {
			s.Close(context.Background())
		}
		testcheck.WantArgError(t, err, "acquire", c.field)
		if st := f.inspect(t); st.Exists {
			t.Errorf("server state %+v, want no lease", st)
		}
	}

	// Only a large margin set: the default interval (ttl/4) no longer fits
	// before the local deadline, and the error says so.
	f0 := newFixture(false)
	s0, err := leasecore.NewSession(context.Background(), f0.spy, "report-job", "holder-a",
		leasecore.WithClock(f0.local), leasecore.WithTTL(testTTL), leasecore.WithMargin(testTTL*4/5))
	if s0 != nil {
		s0.Close(context.Background())
	}
	testcheck.WantArgError(t, err, "new session", "renew interval")
	if n := f0.spy.acquires.Load(); n != 0 {
		t.Errorf("Acquire called %d times for a bad option", n)
	}

	// The boundaries just inside are accepted.
	f := newFixture(false)
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a",
		f.options(leasecore.WithMargin(0), leasecore.WithRenewInterval(testTTL-1))...)
	if err != nil {
		t.Fatalf("NewSession(margin 0, interval ttl-1ns) = %v", err)
	}
	s.Close(context.Background())
}

func TestNewSessionDefaults(t *testing.T) {
	f := newFixture(false)
	s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-a",
		leasecore.WithClock(f.local))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	g := s.Grant()
	const defaultTTL = 15 * time.Second // as WithTTL says
	if g.TTL != defaultTTL {
		t.Errorf("TTL = %v, want %v", g.TTL, defaultTTL)
	}
	// Default margin: TTL/5.
	if want := epoch.Add(defaultTTL * 4 / 5); !s.Deadline().Equal(want) {
		t.Errorf("Deadline() = %v, want %v", s.Deadline(), want)
	}
	// Default interval: TTL/4. Nothing renews 1 ns before it.
	f.local.WaitTimers(t, 2)
	f.local.Advance(defaultTTL/4 - 1)
	if n := f.spy.renews.Load(); n != 0 {
		t.Errorf("renewed after %v", f.local.Since())
	}
	f.local.Advance(1)
	for wait := time.Now().Add(realWait); f.spy.renews.Load() == 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond) // until the renewal goroutine sends its request
	}
	if n := f.spy.renews.Load(); n != 1 {
		t.Errorf("Renew called %d times at %v, want 1", n, f.local.Since())
	}
}

func TestNewSessionCancelledContext(t *testing.T) {
	f := newFixture(false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := leasecore.NewSession(ctx, f.spy, "report-job", "holder-a", f.options()...)
	if s != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("NewSession(cancelled) = %v, %v; want nil, context.Canceled", s, err)
	}
	if st := f.inspect(t); st.Exists {
		t.Errorf("server state %+v, want no lease", st)
	}
}

func TestNewSessionWhenHeld(t *testing.T) {
	f := newFixture(false)
	a := f.open(t, "holder-a")
	f.local.WaitTimers(t, 2)
	baseline := runtime.NumGoroutine()

	for _, holder := range []string{"holder-b", "holder-a"} { // the same holder included
		s, err := leasecore.NewSession(context.Background(), f.spy, "report-job", holder, f.options()...)
		if s != nil {
			t.Fatalf("NewSession(%s) returned a session while the lease is held", holder)
		}
		if !errors.Is(err, leasecore.ErrHeld) {
			t.Fatalf("NewSession(%s) = %v, want ErrHeld", holder, err)
		}
		var he *leasecore.HoldError
		if !errors.As(err, &he) || he.Op != "acquire" || he.Holder != holder {
			t.Errorf("NewSession(%s) = %#v, want a HoldError for acquire by %s", holder, err, holder)
		}
	}
	waitGoroutines(t, baseline)
	if n := f.spy.releases.Load(); n != 0 {
		t.Errorf("Release called %d times, want 0", n)
	}
	if st := f.inspect(t); st.Holder != "holder-a" || st.Token != 1 || !st.Held {
		t.Errorf("server state %+v, want held by holder-a with token 1 (a refused acquire changes nothing)", st)
	}
	if !a.Valid() || a.Token() != 1 {
		t.Errorf("holder-a Valid=%v Token=%d, want true, 1", a.Valid(), a.Token())
	}
}

func TestNewSessionAcquireSlowerThanLocalWindow(t *testing.T) {
	t.Run("too slow", func(t *testing.T) {
		baseline := runtime.NumGoroutine()
		f := newFixture(false)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f.spy.afterAcquire = func(context.Context) {
			f.local.Advance(testWindow) // the response arrives exactly at the deadline
			cancel()                    // and the caller gave up meanwhile
		}
		s, err := leasecore.NewSession(ctx, f.spy, "report-job", "holder-a", f.options()...)
		if s != nil || !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Fatalf("NewSession = %v, %v; want nil, ErrLocalDeadline", s, err)
		}
		// The unusable grant was given back, despite the cancelled context.
		if n := f.spy.releases.Load(); n != 1 {
			t.Errorf("Release called %d times, want 1", n)
		}
		if st := f.inspect(t); st.Held || !st.Released || st.Token != 1 {
			t.Errorf("server state %+v, want released with token 1", st)
		}
		g, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL)
		if err != nil || g.Token != 2 {
			t.Errorf("holder-b Acquire = %+v, %v; want token 2 at once", g, err)
		}
		waitGoroutines(t, baseline)
	})
	t.Run("just in time", func(t *testing.T) {
		f := newFixture(false)
		f.spy.afterAcquire = func(context.Context) { f.local.Advance(testWindow - time.Nanosecond) }
		s := f.open(t, "holder-a")
		if !s.Valid() {
			t.Error("Valid() = false 1ns before the deadline")
		}
	})
}

// One smoke test on the real clock: background renewal works with the
// process's clock. The window (2 s) is far longer than the interval (20
// ms), so a slow machine does not make it flaky.
func TestSessionSystemClock(t *testing.T) {
	baseline := runtime.NumGoroutine()
	leases := memfence.NewLeases(nil)
	events := make(chan leasecore.RenewEvent, 64)
	s, err := leasecore.NewSession(context.Background(), leases, "report-job", "holder-a",
		leasecore.WithTTL(3*time.Second), leasecore.WithMargin(time.Second),
		leasecore.WithRenewInterval(20*time.Millisecond),
		leasecore.WithRenewObserver(func(ev leasecore.RenewEvent) {
			select {
			case events <- ev:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		select {
		case ev := <-events:
			if ev.Err != nil {
				t.Fatalf("renewal %d: %v", i, ev.Err)
			}
			if ev.Grant.Token != s.Token() {
				t.Fatalf("renewal %d changed the token", i)
			}
		case <-time.After(realWait):
			t.Fatalf("no renewal %d within %v", i, realWait)
		}
	}
	if !s.Valid() {
		t.Error("Valid() = false while renewing")
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, baseline)
}

// backdated dates every grant 3 s before the call, as a backend whose
// holding period began earlier does (fenceetcd's shared leases).
type backdated struct{ leasecore.Lease }

func (b backdated) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := b.Lease.Acquire(ctx, name, holder, ttl)
	g.Start = g.Start.Add(-3 * time.Second)
	return g, err
}

// The session's deadline follows a grant dated before the call: it must
// never be later than the server's expiry.
func TestSessionHonoursBackdatedGrant(t *testing.T) {
	before := time.Now()
	s, err := leasecore.NewSession(context.Background(), backdated{memfence.NewLeases(nil)}, "report-job", "holder-a",
		leasecore.WithTTL(10*time.Second), leasecore.WithMargin(time.Second), leasecore.WithRenewInterval(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	// The first renewal is due one interval after the grant's start, 1 s
	// from now (with an interval under 3 s it would be due at once, and
	// its grant, not backdated, could move the deadline before the read).
	// Without the backdating the deadline would be before+9s.
	if d := s.Deadline().Sub(before); d > 6*time.Second+100*time.Millisecond || d < 5*time.Second {
		t.Errorf("deadline %v after the call, want about 6s (10s ttl - 1s margin - 3s backdated)", d)
	}
}
