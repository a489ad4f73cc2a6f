package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

const testPoll = 200 * time.Millisecond

// campaignRun is one Campaign running in its own goroutine, its events and
// its result.
type campaignRun struct {
	events chan leasecore.CampaignEvent
	done   chan error
	cancel context.CancelCauseFunc
}

// startCampaign runs Campaign for holder on "report-job" with the fixture's
// clock and the teaching parameters, polling every testPoll.
func (f *fixture) startCampaign(t *testing.T, lease leasecore.Lease, holder string,
	lead func(context.Context, leasecore.Grant) error, extra ...leasecore.CampaignOption) *campaignRun {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &campaignRun{events: make(chan leasecore.CampaignEvent, 128), done: make(chan error, 1), cancel: cancel}
	opts := append([]leasecore.CampaignOption{
		leasecore.WithSessionOptions(leasecore.WithClock(f.local), leasecore.WithTTL(testTTL),
			leasecore.WithMargin(testMargin), leasecore.WithRenewInterval(testInterval)),
		leasecore.WithPollInterval(testPoll),
		leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) { r.events <- ev }),
	}, extra...)
	go func() { r.done <- leasecore.Campaign(ctx, lease, "report-job", holder, lead, opts...) }()
	t.Cleanup(func() {
		cancel(errors.New("test over"))
		select {
		case <-r.done:
		case <-time.After(realWait):
			t.Errorf("Campaign did not return within %v after its context ended", realWait)
		}
	})
	return r
}

func (r *campaignRun) next(t *testing.T, want leasecore.CampaignEventKind) leasecore.CampaignEvent {
	t.Helper()
	select {
	case ev := <-r.events:
		if ev.Kind != want {
			t.Fatalf("campaign event %v %+v, want %v", ev.Kind, ev, want)
		}
		return ev
	case <-time.After(realWait):
		t.Fatalf("no campaign event within %v (real time), want %v", realWait, want)
		return leasecore.CampaignEvent{}
	}
}

func (r *campaignRun) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(realWait):
		t.Fatalf("Campaign did not return within %v (real time)", realWait)
		return nil
	}
}

// leaseOnly hides every optional interface of a Lease: no Waiter, so a
// campaign polls, and no LeaseInspector.
type leaseOnly struct{ leasecore.Lease }

// inspectable hides the Waiter but keeps the LeaseInspector.
type inspectable struct {
	leasecore.Lease
	leasecore.LeaseInspector
}

type ctxKey struct{}

// A job that is done: lead runs once with the token and a context derived
// from Campaign's, the lease is released after it, and Campaign returns
// lead's result.
func TestCampaignLeadsOnceAndResigns(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	jobErr := errors.New("job result")
	var got atomic.Value
	lead := func(ctx context.Context, g leasecore.Grant) error {
		got.Store(fmt.Sprintf("%s %s token %d ttl %v start %v value %v",
			g.Name, g.Holder, g.Token, g.TTL, g.Start.Equal(epoch), ctx.Value(ctxKey{})))
		return jobErr
	}
	ctx := context.WithValue(context.Background(), ctxKey{}, "from caller")
	err := leasecore.Campaign(ctx, f.spy, "report-job", "holder-a", lead,
		leasecore.WithSessionOptions(leasecore.WithClock(f.local), leasecore.WithTTL(testTTL)))
	if err != jobErr {
		t.Errorf("Campaign = %v, want lead's result %v", err, jobErr)
	}
	if s, _ := got.Load().(string); s != "report-job holder-a token 1 ttl 1.5s start true value from caller" {
		t.Errorf("lead saw %q, want the grant as acquired (token 1) and the caller's value", s)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state %+v, want released", st)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}

// Without a Waiter the campaign polls while another holder has the lease,
// reports that holder once, and takes over within one poll of the release.
func TestCampaignPollsWhileHeld(t *testing.T) {
	f := newFixture(false)
	b, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leading := make(chan leasecore.Token, 1)
	r := f.startCampaign(t, inspectable{f.spy, f.leases}, "holder-a", func(ctx context.Context, g leasecore.Grant) error {
		leading <- g.Token
		<-ctx.Done()
		return nil
	})
	ev := r.next(t, leasecore.CampaignObserved)
	if ev.Holder != "holder-b" || ev.Token != 1 || ev.Name != "report-job" {
		t.Errorf("observed %+v, want holder-b with token 1", ev)
	}
	for range 3 { // refused again at each poll; the same holder is not reported again
		f.local.WaitPause(t, testPoll)
		f.local.Advance(testPoll)
	}
	f.local.WaitPause(t, testPoll)
	if n := f.spy.acquires.Load(); n != 4 {
		t.Errorf("Acquire called %d times after 3 polls, want 4", n)
	}
	if err := f.leases.Release(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	f.local.Advance(testPoll) // the longest a poll pause may be
	if ev := r.next(t, leasecore.CampaignElected); ev.Token != 2 || ev.Holder != "holder-a" {
		t.Errorf("elected %+v, want holder-a with token 2", ev)
	}
	if tok := <-leading; tok != 2 {
		t.Errorf("lead got token %d, want 2", tok)
	}
	r.cancel(errors.New("shutting down"))
	r.next(t, leasecore.CampaignResigned)
	if err := r.result(t); err == nil || err.Error() != "shutting down" {
		t.Errorf("Campaign = %v, want its context's cause", err)
	}
	if st := f.inspect(t); st.Held {
		t.Errorf("server state %+v, want released after the campaign ended", st)
	}
}

// With a Waiter the campaign takes over as soon as the holder releases,
// without any time passing on its clock.
func TestCampaignWaitsWithWaiter(t *testing.T) {
	f := newFixture(false)
	b, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r := f.startCampaign(t, f.spy, "holder-a", func(ctx context.Context, _ leasecore.Grant) error {
		<-ctx.Done()
		return nil
	})
	r.next(t, leasecore.CampaignObserved)
	f.local.WaitTimers(t, 1) // the campaign's one-ttl bound on the wait
	if err := f.leases.Release(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if ev := r.next(t, leasecore.CampaignElected); ev.Token != 2 {
		t.Errorf("elected %+v, want token 2", ev)
	}
	if f.local.Since() != 0 {
		t.Errorf("the clock moved %v", f.local.Since())
	}
	if n := f.spy.acquires.Load(); n != 2 {
		t.Errorf("Acquire called %d times, want 2 (refused, then taken on the release)", n)
	}
}

// A Waiter that cannot wait makes the campaign poll for that wait.
type failingWaiter struct {
	*spyLease
	waits atomic.Int64
}

func (w *failingWaiter) WaitFree(ctx context.Context, name string) error {
	w.waits.Add(1)
	return fmt.Errorf("LISTEN not supported behind the pooler: %w", leasecore.ErrUnavailable)
}

func TestCampaignFallsBackToPollingWhenWaiterFails(t *testing.T) {
	f := newFixture(false)
	b, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w := &failingWaiter{spyLease: f.spy}
	r := f.startCampaign(t, w, "holder-a", func(ctx context.Context, _ leasecore.Grant) error {
		<-ctx.Done()
		return nil
	})
	r.next(t, leasecore.CampaignObserved)
	ev := r.next(t, leasecore.CampaignRetry)
	if !errors.Is(ev.Err, leasecore.ErrUnavailable) || ev.Delay < testPoll/2 || ev.Delay > testPoll {
		t.Errorf("retry %+v, want the waiter's error and a pause in [%v, %v]", ev, testPoll/2, testPoll)
	}
	f.leases.Release(context.Background(), b)
	f.local.WaitPause(t, ev.Delay)
	f.local.Advance(ev.Delay)
	r.next(t, leasecore.CampaignElected)
	if n := w.waits.Load(); n != 1 {
		t.Errorf("WaitFree called %d times, want 1", n)
	}
}

// A leader whose session ends while lead runs sees its context cancelled
// with the reason as cause, and the campaign takes the lease again with a
// larger token.
func TestCampaignRecampaignsAfterLoss(t *testing.T) {
	var causes chan error
	var leading chan leasecore.Token
	lead := func(ctx context.Context, g leasecore.Grant) error {
		leading <- g.Token
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
	t.Run("lost", func(t *testing.T) {
		causes, leading = make(chan error, 2), make(chan leasecore.Token, 2)
		f := newFixture(true)
		r := f.startCampaign(t, leaseOnly{f.spy}, "holder-a", lead)
		r.next(t, leasecore.CampaignElected)
		<-leading
		f.local.WaitTimers(t, 2)
		f.server.Advance(testTTL) // expired by the server's clock
		f.local.Advance(testInterval)
		ev := r.next(t, leasecore.CampaignLost)
		if cause := <-causes; !errors.Is(cause, leasecore.ErrLost) || cause != ev.Err {
			t.Errorf("lead's cause %v, event Err %v; want the same error wrapping ErrLost", cause, ev.Err)
		}
		if ev := r.next(t, leasecore.CampaignElected); ev.Token != 2 {
			t.Errorf("elected again with token %d, want 2", ev.Token)
		}
		if tok := <-leading; tok != 2 {
			t.Errorf("lead again with token %d, want 2", tok)
		}
	})
	t.Run("local deadline", func(t *testing.T) {
		causes, leading = make(chan error, 2), make(chan leasecore.Token, 2)
		f := newFixture(false)
		var failing atomic.Bool
		failing.Store(true)
		f.spy.renewHook = func(context.Context, leasecore.Grant) error {
			if failing.Load() {
				return fmt.Errorf("spy: connection reset: %w", leasecore.ErrUnavailable)
			}
			return nil
		}
		r := f.startCampaign(t, leaseOnly{f.spy}, "holder-a", lead)
		r.next(t, leasecore.CampaignElected)
		<-leading
		for range 3 { // renewals at 400 and 800 ms fail; the deadline at 1200 ms ends it
			f.local.WaitTimers(t, 2)
			f.local.Advance(testInterval)
		}
		ev := r.next(t, leasecore.CampaignLost)
		if cause := <-causes; !errors.Is(cause, leasecore.ErrLocalDeadline) || cause != ev.Err {
			t.Errorf("lead's cause %v, event Err %v; want the same error wrapping ErrLocalDeadline", cause, ev.Err)
		}
		failing.Store(false)
		// The lost session was released, so the next acquire works at once.
		if ev := r.next(t, leasecore.CampaignElected); ev.Token != 2 {
			t.Errorf("elected again with token %d, want 2", ev.Token)
		}
	})
}

// brokenLease refuses every acquire with err.
type brokenLease struct {
	leasecore.Lease
	err      error
	failures atomic.Int64 // how many acquires fail; then they work
	calls    atomic.Int64
}

func (b *brokenLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if b.calls.Add(1) <= b.failures.Load() {
		return leasecore.Grant{}, b.err
	}
	return b.Lease.Acquire(ctx, name, holder, ttl)
}

// Errors that may pass are retried with a growing, bounded, jittered pause.
func TestCampaignBacksOffOnTransientErrors(t *testing.T) {
	f := newFixture(false)
	bl := &brokenLease{Lease: f.spy, err: fmt.Errorf("spy: connection refused: %w", leasecore.ErrUnavailable)}
	bl.failures.Store(4)
	r := f.startCampaign(t, bl, "holder-a", func(ctx context.Context, _ leasecore.Grant) error {
		<-ctx.Done()
		return nil
	}, leasecore.WithBackoff(100*time.Millisecond, 300*time.Millisecond))
	for i, want := range []time.Duration{100, 200, 300, 300} {
		want *= time.Millisecond
		ev := r.next(t, leasecore.CampaignRetry)
		if !errors.Is(ev.Err, leasecore.ErrUnavailable) || ev.Delay < want/2 || ev.Delay > want {
			t.Errorf("retry %d: %+v, want ErrUnavailable and a pause in [%v, %v]", i, ev, want/2, want)
		}
		f.local.WaitPause(t, ev.Delay)
		f.local.Advance(ev.Delay)
	}
	if ev := r.next(t, leasecore.CampaignElected); ev.Token != 1 {
		t.Errorf("elected %+v, want token 1", ev)
	}
}

// Errors that cannot heal end the campaign at once and are returned.
func TestCampaignStopsOnPermanentErrors(t *testing.T) {
	schema := fmt.Errorf("spy: relation \"lease\" does not exist: %w", leasecore.ErrSchema)
	denied := errors.New("spy: permission denied for table lease")
	for _, perm := range []error{schema, denied} {
		t.Run(perm.Error(), func(t *testing.T) {
			baseline := runtime.NumGoroutine()
			f := newFixture(false)
			bl := &brokenLease{Lease: f.spy, err: perm}
			bl.failures.Store(100)
			err := leasecore.Campaign(context.Background(), bl, "report-job", "holder-a",
				func(context.Context, leasecore.Grant) error { t.Error("lead called"); return nil },
				leasecore.WithSessionOptions(leasecore.WithClock(f.local)))
			if !errors.Is(err, perm) {
				t.Errorf("Campaign = %v, want %v", err, perm)
			}
			if n := bl.calls.Load(); n != 1 {
				t.Errorf("Acquire called %d times, want 1", n)
			}
			waitGoroutines(t, baseline)
		})
	}
	t.Run("bad input", func(t *testing.T) {
		f := newFixture(false)
		lead := func(context.Context, leasecore.Grant) error { return nil }
		err := leasecore.Campaign(context.Background(), f.spy, "", "holder-a", lead)
		testcheck.WantArgError(t, err, "acquire", "name")
		f.spy.acquires.Store(0)
		for _, c := range []struct {
			opt   leasecore.CampaignOption
			field string
		}{
			{leasecore.WithPollInterval(0), "poll interval"},
			{leasecore.WithBackoff(0, time.Second), "backoff minimum"},
			{leasecore.WithBackoff(time.Second, time.Millisecond), "backoff maximum"},
			{leasecore.WithSessionOptions(leasecore.WithMargin(-1)), "margin"},
		} {
			testcheck.WantArgError(t, leasecore.Campaign(context.Background(), f.spy, "report-job", "holder-a", lead, c.opt), "campaign", c.field)
		}
		testcheck.WantArgError(t, leasecore.Campaign(context.Background(), f.spy, "report-job", "holder-a", nil), "campaign", "lead")
		if n := f.spy.acquires.Load(); n != 0 {
			t.Errorf("Acquire called %d times for bad options", n)
		}
	})
}

// A campaign whose context ends while it waits returns the cause and
// leaves nothing running.
func TestCampaignEndsWhileWaiting(t *testing.T) {
	for _, wait := range []string{"poll", "waiter"} {
		t.Run(wait, func(t *testing.T) {
			baseline := runtime.NumGoroutine()
			f := newFixture(false)
			if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour); err != nil {
				t.Fatal(err)
			}
			var lease leasecore.Lease = f.spy
			if wait == "poll" {
				lease = leaseOnly{f.spy}
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- leasecore.Campaign(ctx, lease, "report-job", "holder-a",
					func(context.Context, leasecore.Grant) error { return nil },
					leasecore.WithSessionOptions(leasecore.WithClock(f.local), leasecore.WithTTL(testTTL)))
			}()
			f.local.WaitTimers(t, 1) // waiting
			stop := errors.New("deploy")
			cancel(stop)
			select {
			case err := <-done:
				if err != stop {
					t.Errorf("Campaign = %v, want the cause %v", err, stop)
				}
			case <-time.After(realWait):
				t.Fatal("Campaign did not return")
			}
			waitGoroutines(t, baseline)
			f.local.WaitTimers(t, 0)
		})
	}
}

// A lead function that panics: the panic goes on to the caller, and the
// lease is released before it does, so a caller that recovers is not left
// holding (and renewing) a lease nobody leads under.
func TestCampaignReleasesWhenLeadPanics(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = leasecore.Campaign(context.Background(), f.spy, "report-job", "holder-a",
			func(context.Context, leasecore.Grant) error { panic("lead failed") },
			leasecore.WithSessionOptions(leasecore.WithClock(f.local), leasecore.WithTTL(testTTL)))
		return nil
	}()
	if recovered != "lead failed" {
		t.Fatalf("recovered %v, want lead's panic", recovered)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state after lead panicked: %+v, want released", st)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}

// queuedLease waits in line (backendkit.QueuedAcquirer): AcquireQueued
// calls wait, then acquires, and dates the grant dated before it returns,
// as a backend whose hold started with an earlier request does.
type queuedLease struct {
	*spyLease
	wait   func(ctx context.Context) error
	dated  time.Duration
	queued atomic.Int64
}

func (q *queuedLease) AcquireQueued(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	q.queued.Add(1)
	if err := q.wait(ctx); err != nil {
		return leasecore.Grant{}, err
	}
	g, err := q.spyLease.Acquire(ctx, name, holder, ttl)
	if err == nil {
		g.Start = time.Now().Add(-q.dated)
	}
	return g, err
}

// With a QueuedAcquirer the campaign, refused, waits in line instead of
// polling or waiting with WaitFree: it leads when AcquireQueued returns,
// without any time passing on its clock, and its session counts from the
// grant's Start, which the backend dated before the call returned.
func TestCampaignWaitsInLine(t *testing.T) {
	f := newFixture(false)
	b, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	handed := make(chan struct{})
	const dated = 300 * time.Millisecond
	q := &queuedLease{spyLease: f.spy, dated: dated, wait: func(ctx context.Context) error {
		select {
		case <-handed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	grants := make(chan leasecore.Grant, 1)
	r := f.startCampaign(t, q, "holder-a", func(ctx context.Context, g leasecore.Grant) error {
		grants <- g
		<-ctx.Done()
		return nil
	})
	r.next(t, leasecore.CampaignObserved)
	if err := f.leases.Release(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	close(handed)
	if ev := r.next(t, leasecore.CampaignElected); ev.Token != 2 {
		t.Errorf("elected %+v, want token 2", ev)
	}
	g := <-grants
	if early := epoch.Sub(g.Start); early < dated || early > dated+realWait {
		t.Errorf("lead's grant starts %v before the clock's reading at the election, want the backend's %v (and little more)", early, dated)
	}
	if f.local.Since() != 0 {
		t.Errorf("the clock moved %v", f.local.Since())
	}
	if n, m := q.queued.Load(), f.spy.acquires.Load(); n != 1 || m != 2 {
		t.Errorf("AcquireQueued called %d times, Acquire %d; want 1 and 2 (refused, then in line)", n, m)
	}
}

// An error of AcquireQueued that may pass is retried after a backoff (in
// line again); one that cannot heal ends the campaign.
func TestCampaignInLineErrors(t *testing.T) {
	f := newFixture(false)
	if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	config := fmt.Errorf("no such role: %w", leasecore.ErrConfig)
	q := &queuedLease{spyLease: f.spy, wait: func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			return fmt.Errorf("watch lost: %w", leasecore.ErrUnavailable)
		}
		return config
	}}
	r := f.startCampaign(t, q, "holder-a", func(ctx context.Context, _ leasecore.Grant) error {
		t.Error("lead called")
		return nil
	})
	r.next(t, leasecore.CampaignObserved)
	ev := r.next(t, leasecore.CampaignRetry)
	if !errors.Is(ev.Err, leasecore.ErrUnavailable) {
		t.Errorf("retry %+v, want AcquireQueued's error", ev)
	}
	f.local.WaitPause(t, ev.Delay)
	f.local.Advance(ev.Delay)
	if err := r.result(t); !errors.Is(err, leasecore.ErrConfig) {
		t.Errorf("Campaign = %v, want the ErrConfig of AcquireQueued", err)
	}
	if n := q.queued.Load(); n != 2 {
		t.Errorf("AcquireQueued called %d times, want 2", n)
	}
}
