package leasecore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// sessionEvents collects a session's lifecycle events.
type sessionEvents chan leasecore.SessionEvent

func (ch sessionEvents) option() leasecore.SessionOption {
	return leasecore.WithSessionObserver(func(ev leasecore.SessionEvent) { ch <- ev })
}

// next returns the next event, failing unless it is of kind want.
func (ch sessionEvents) next(t *testing.T, want leasecore.SessionEventKind) leasecore.SessionEvent {
	t.Helper()
	select {
	case ev := <-ch:
		if ev.Kind != want {
			t.Fatalf("session event %v %+v, want %v", ev.Kind, ev, want)
		}
		if ev.Grant.Name != "report-job" || ev.Grant.Holder == "" {
			t.Errorf("%v event names lease %q holder %q, want report-job and a holder", ev.Kind, ev.Grant.Name, ev.Grant.Holder)
		}
		return ev
	case <-time.After(realWait):
		t.Fatalf("no session event within %v (real time), want %v", realWait, want)
		return leasecore.SessionEvent{}
	}
}

func (ch sessionEvents) none(t *testing.T) {
	t.Helper()
	select {
	case ev := <-ch:
		t.Fatalf("unexpected session event %v %+v", ev.Kind, ev)
	default:
	}
}

// A session reports its life in order: acquired (with the acquire's
// latency by the session's clock), renewed, a failed renewal, a late
// renewal, and the end by Close after the release — to every observer.
func TestSessionObserverLifecycle(t *testing.T) {
	f := newFixture(false)
	const transit = 20 * time.Millisecond
	f.spy.beforeAcquire = func(context.Context) { f.local.Advance(transit) }
	transient := fmt.Errorf("spy: connection reset: %w", leasecore.ErrUnavailable)
	failNext := make(chan struct{}, 1)
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		select {
		case <-failNext:
			return transient
		default:
			return nil
		}
	}
	events, second := make(sessionEvents, 64), make(sessionEvents, 64)
	s := f.open(t, "holder-a", events.option(), leasecore.WithSessionObserver(nil), second.option())

	ev := events.next(t, leasecore.SessionAcquired)
	if ev.Grant.Token != 1 || ev.Latency != transit || !ev.Deadline.Equal(epoch.Add(testWindow)) || ev.Err != nil {
		t.Errorf("acquired: token %d latency %v deadline %v err %v; want 1, %v, %v, nil",
			ev.Grant.Token, ev.Latency, ev.Deadline.Sub(epoch), ev.Err, transit, testWindow)
	}

	f.tick(t, testInterval)
	ev = events.next(t, leasecore.SessionRenewed)
	if ev.Late || ev.Err != nil || !ev.Deadline.Equal(s.Deadline()) {
		t.Errorf("renewed on time: Late %v Err %v Deadline %v; want false, nil, the session's %v", ev.Late, ev.Err, ev.Deadline, s.Deadline())
	}

	failNext <- struct{}{}
	f.tick(t, testInterval)
	ev = events.next(t, leasecore.SessionRenewFailed)
	if !errors.Is(ev.Err, leasecore.ErrUnavailable) || !ev.Deadline.Equal(s.Deadline()) || ev.Grant.Token != 1 {
		t.Errorf("renew failed: Err %v Deadline %v token %d; want ErrUnavailable, the standing %v, 1", ev.Err, ev.Deadline, ev.Grant.Token, s.Deadline())
	}

	f.tick(t, testInterval)
	if ev = events.next(t, leasecore.SessionRenewed); !ev.Late {
		t.Error("the renewal after a failed one is not Late")
	}
	f.tick(t, testInterval)
	if ev = events.next(t, leasecore.SessionRenewed); ev.Late {
		t.Error("the next renewal on schedule is Late")
	}

	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ev = events.next(t, leasecore.SessionEnded)
	if !errors.Is(ev.Err, leasecore.ErrClosed) || ev.Err != leasecore.ErrClosed {
		t.Errorf("ended by Close: Err %v, want ErrClosed alone (the release succeeded)", ev.Err)
	}
	if f.spy.releases.Load() != 1 {
		t.Errorf("Release called %d times before the end was reported, want 1", f.spy.releases.Load())
	}
	_ = s.Close(context.Background())
	events.none(t)

	// The second observer saw the same events in the same order.
	for _, want := range []leasecore.SessionEventKind{leasecore.SessionAcquired, leasecore.SessionRenewed,
		leasecore.SessionRenewFailed, leasecore.SessionRenewed, leasecore.SessionRenewed, leasecore.SessionEnded} {
		second.next(t, want)
	}
	second.none(t)
}

// The ways a session ends, each reported once with its reason; Close after
// a loss reports nothing more.
func TestSessionObserverEnds(t *testing.T) {
	t.Run("lost", func(t *testing.T) {
		f := newFixture(true)
		events := make(sessionEvents, 64)
		s := f.open(t, "holder-a", events.option())
		events.next(t, leasecore.SessionAcquired)
		f.local.WaitTimers(t, 2)
		f.server.Advance(testTTL)
		if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL); err != nil {
			t.Fatal(err)
		}
		f.tick(t, testInterval)
		if ev := events.next(t, leasecore.SessionRenewFailed); !errors.Is(ev.Err, leasecore.ErrLost) {
			t.Errorf("renew failed: Err %v, want ErrLost", ev.Err)
		}
		ev := events.next(t, leasecore.SessionEnded)
		if !errors.Is(ev.Err, leasecore.ErrLost) || ev.Grant.Token != 1 || !strings.Contains(ev.Err.Error(), "holder-b") {
			t.Errorf("ended: Err %v token %d, want ErrLost naming holder-b, token 1", ev.Err, ev.Grant.Token)
		}
		waitDone(t, s)
		_ = s.Close(context.Background())
		events.none(t)
	})

	t.Run("local deadline", func(t *testing.T) {
		f := newFixture(false)
		f.spy.renewHook = func(context.Context, leasecore.Grant) error {
			return fmt.Errorf("spy: down: %w", leasecore.ErrUnavailable)
		}
		events := make(sessionEvents, 64)
		s := f.open(t, "holder-a", events.option())
		events.next(t, leasecore.SessionAcquired)
		f.tick(t, testInterval)
		f.tick(t, testInterval)
		events.next(t, leasecore.SessionRenewFailed)
		events.next(t, leasecore.SessionRenewFailed)
		f.local.WaitTimers(t, 2)
		f.local.Advance(testInterval) // 1200 ms: the deadline
		waitDone(t, s)
		if ev := events.next(t, leasecore.SessionEnded); !errors.Is(ev.Err, leasecore.ErrLocalDeadline) {
			t.Errorf("ended: Err %v, want ErrLocalDeadline", ev.Err)
		}
		_ = s.Close(context.Background()) // releases, reports nothing more
		events.none(t)
	})

	// Done does not wait for the observer; Close does.
	t.Run("observer still reporting the end", func(t *testing.T) {
		f := newFixture(false)
		f.spy.renewHook = func(context.Context, leasecore.Grant) error {
			return fmt.Errorf("spy: down: %w", leasecore.ErrUnavailable)
		}
		entered, gate := make(chan struct{}), make(chan struct{})
		var reported atomic.Bool
		s := f.open(t, "holder-a", leasecore.WithSessionObserver(func(ev leasecore.SessionEvent) {
			if ev.Kind == leasecore.SessionEnded {
				close(entered)
				<-gate
				reported.Store(true)
			}
		}))
		f.local.WaitTimers(t, 2)
		f.local.Advance(testWindow) // the local deadline, renewals failing
		waitDone(t, s)
		<-entered
		closed := make(chan error, 1)
		go func() { closed <- s.Close(context.Background()) }()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while the observer was still reporting the end", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(gate)
		select {
		case <-closed:
		case <-time.After(realWait):
			t.Fatalf("Close did not return within %v of the observer finishing", realWait)
		}
		if !reported.Load() {
			t.Error("Close returned before the SessionEnded report finished")
		}
	})

	t.Run("closed, release failed", func(t *testing.T) {
		f := newFixture(false)
		down := fmt.Errorf("spy: down: %w", leasecore.ErrUnavailable)
		f.spy.releaseHook = func(context.Context, leasecore.Grant) error { return down }
		events := make(sessionEvents, 64)
		s := f.open(t, "holder-a", events.option())
		events.next(t, leasecore.SessionAcquired)
		if err := s.Close(context.Background()); !errors.Is(err, down) {
			t.Fatalf("Close = %v, want the release's error", err)
		}
		ev := events.next(t, leasecore.SessionEnded)
		if !errors.Is(ev.Err, leasecore.ErrClosed) || !errors.Is(ev.Err, down) {
			t.Errorf("ended: Err %v, want ErrClosed and the release's error", ev.Err)
		}
	})
}

// A refused or failed acquire is reported with the lease and holder named;
// options refused before the acquire are not.
func TestSessionObserverAcquireFailed(t *testing.T) {
	f := newFixture(false)
	f.open(t, "holder-a")
	events := make(sessionEvents, 8)
	_, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-b", f.options(events.option())...)
	if !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("holder-b NewSession = %v, want ErrHeld", err)
	}
	ev := events.next(t, leasecore.SessionAcquireFailed)
	if ev.Err != err || ev.Grant.Holder != "holder-b" || ev.Grant.Token != 0 {
		t.Errorf("acquire failed: %+v, want holder-b, no token, the returned error", ev)
	}

	// An acquire slower than ttl - margin: its grant was given back.
	f.spy.afterAcquire = func(context.Context) { f.local.Advance(testWindow) }
	_, err = leasecore.NewSession(context.Background(), f.spy, "other-job", "holder-b", f.options(events.option())...)
	if !errors.Is(err, leasecore.ErrLocalDeadline) {
		t.Fatalf("slow NewSession = %v, want ErrLocalDeadline", err)
	}
	select {
	case ev = <-events:
		if ev.Kind != leasecore.SessionAcquireFailed || ev.Grant.Name != "other-job" || ev.Grant.Token == 0 ||
			ev.Latency != testWindow || !errors.Is(ev.Err, leasecore.ErrLocalDeadline) {
			t.Errorf("slow acquire: %v %+v, want acquire failed with the unusable grant, latency %v, ErrLocalDeadline", ev.Kind, ev, testWindow)
		}
	case <-time.After(realWait):
		t.Fatal("no event for the slow acquire")
	}

	f.spy.afterAcquire = nil
	_, err = leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-b",
		f.options(events.option(), leasecore.WithMargin(-time.Second))...)
	if !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Fatalf("NewSession with a negative margin = %v, want ErrInvalidArgument", err)
	}
	events.none(t)
}

// WithLogger logs the lifecycle: acquired with its token, renewed late,
// lost with its reason; an acquire refused as held only at debug level.
func TestSessionLogger(t *testing.T) {
	f := newFixture(true)
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	failNext := make(chan struct{}, 1)
	f.spy.renewHook = func(context.Context, leasecore.Grant) error {
		select {
		case <-failNext:
			return fmt.Errorf("spy: reset: %w", leasecore.ErrUnavailable)
		default:
			return nil
		}
	}
	events := make(sessionEvents, 64)
	s := f.open(t, "holder-a", leasecore.WithLogger(logger), events.option(), leasecore.WithLogger(nil))
	events.next(t, leasecore.SessionAcquired)
	if _, err := leasecore.NewSession(context.Background(), f.spy, "report-job", "holder-b",
		f.options(leasecore.WithLogger(logger))...); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("holder-b = %v, want ErrHeld", err)
	}
	f.tick(t, testInterval) // renewed on time: debug, not logged at info
	events.next(t, leasecore.SessionRenewed)
	failNext <- struct{}{}
	f.tick(t, testInterval)
	events.next(t, leasecore.SessionRenewFailed)
	f.tick(t, testInterval)
	events.next(t, leasecore.SessionRenewed)
	// The server's clock runs on past the TTL: the next renewal finds the
	// hold over.
	f.local.WaitTimers(t, 2)
	f.server.Advance(10 * testTTL)
	f.tick(t, testInterval)
	events.next(t, leasecore.SessionRenewFailed)
	events.next(t, leasecore.SessionEnded)
	waitDone(t, s)

	recs := testcheck.LogRecords(t, &buf)
	var msgs []string
	for _, r := range recs {
		msgs = append(msgs, fmt.Sprint(r["level"], " ", r["msg"]))
	}
	want := []string{"INFO lease acquired", "WARN lease renewal failed", "WARN lease renewed late",
		"WARN lease renewal failed", "WARN lease lost"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Errorf("records %q, want %q (nothing at debug level: renewals on time, the refused acquire)", msgs, want)
	}
	acq := testcheck.FindRecord(t, recs, "lease acquired")
	if acq["lease"] != "report-job" || acq["holder"] != "holder-a" || acq["token"] != float64(1) {
		t.Errorf("acquired record %v, want lease report-job, holder holder-a, token 1", acq)
	}
	lost := testcheck.FindRecord(t, recs, "lease lost")
	if lost["reason"] != "lost" || lost["token"] != float64(1) || !strings.Contains(fmt.Sprint(lost["err"]), "expired") {
		t.Errorf("lost record %v, want reason lost, token 1, the error saying expired", lost)
	}

	// At debug level, the refused acquire and a renewal on time appear too.
	buf.Reset()
	debug := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g := newFixture(false)
	d := g.open(t, "holder-c", leasecore.WithLogger(debug))
	g.tick(t, testInterval)
	if _, err := leasecore.NewSession(context.Background(), g.spy, "report-job", "holder-d",
		g.options(leasecore.WithLogger(debug))...); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("holder-d = %v, want ErrHeld", err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs = testcheck.LogRecords(t, &buf)
	testcheck.FindRecord(t, recs, "lease renewed")
	if r := testcheck.FindRecord(t, recs, "lease held by another holder"); r["holder"] != "holder-d" {
		t.Errorf("held record %v, want holder-d", r)
	}
	if r := testcheck.FindRecord(t, recs, "lease released"); r["level"] != "INFO" || r["err"] != nil {
		t.Errorf("released record %v, want INFO without err", r)
	}
}

// Campaign observers add up: a user's own and, say, a metrics collector's
// both see every event.
func TestCampaignObserversAddUp(t *testing.T) {
	f := newFixture(false)
	second := make(chan leasecore.CampaignEvent, 64)
	r := f.startCampaign(t, f.spy, "holder-a", func(context.Context, leasecore.Grant) error { return nil },
		leasecore.WithCampaignObserver(nil),
		leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) { second <- ev }))
	r.next(t, leasecore.CampaignElected)
	r.next(t, leasecore.CampaignResigned)
	if err := r.result(t); err != nil {
		t.Fatal(err)
	}
	for _, want := range []leasecore.CampaignEventKind{leasecore.CampaignElected, leasecore.CampaignResigned} {
		if ev := <-second; ev.Kind != want {
			t.Errorf("second observer: %v, want %v", ev.Kind, want)
		}
	}
}
