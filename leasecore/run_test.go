package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// runJob is a job's work, run by Run in its own goroutine.
type runJob func(ctx context.Context, g leasecore.Grant) error

// startRun runs Run for holder-a on "report-job" with the fixture's clock
// and the teaching parameters, and returns its result channel.
func (f *fixture) startRun(ctx context.Context, lease leasecore.Lease, job runJob, extra ...leasecore.SessionOption) <-chan error {
	done := make(chan error, 1)
	go func() { done <- leasecore.Run(ctx, lease, "report-job", "holder-a", job, f.options(extra...)...) }()
	return done
}

func runResult(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(realWait):
		t.Fatalf("Run did not return within %v (real time)", realWait)
		return nil
	}
}

// endedEvents returns an option that sends each SessionEnded event to the
// returned channel.
func endedEvents() (leasecore.SessionOption, <-chan leasecore.SessionEvent) {
	ch := make(chan leasecore.SessionEvent, 8)
	return leasecore.WithSessionObserver(func(ev leasecore.SessionEvent) {
		if ev.Kind == leasecore.SessionEnded {
			ch <- ev
		}
	}), ch
}

// A job that succeeds: it runs once, with a context derived from Run's and
// the grant as acquired; the lease is released when it returns, so another
// holder acquires it at once, and nothing keeps running.
func TestRunReleasesAfterJob(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	var got leasecore.Grant
	var value any
	calls := 0
	ctx := context.WithValue(context.Background(), ctxKey{}, "from caller")
	err := leasecore.Run(ctx, f.spy, "report-job", "holder-a", func(ctx context.Context, g leasecore.Grant) error {
		calls++
		got, value = g, ctx.Value(ctxKey{})
		return nil
	}, f.options()...)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	want := leasecore.Grant{Name: "report-job", Holder: "holder-a", Token: 1, TTL: testTTL, Start: epoch}
	if calls != 1 || got != want || value != "from caller" {
		t.Errorf("job called %d times with grant %+v and value %v; want once with %+v and the caller's value", calls, got, value, want)
	}
	if c := got.Claim("invoices"); c != (leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: 1}) {
		t.Errorf("g.Claim = %+v", c)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state %+v, want released", st)
	}
	if g, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", testTTL); err != nil || g.Token != 2 {
		t.Errorf("holder-b Acquire after Run = %+v, %v; want token 2 at once", g, err)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}

// Another holder has the lease: Run returns NewSession's error, which wraps
// ErrHeld, without calling job or waiting.
func TestRunHeldByAnother(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	if _, err := f.leases.Acquire(context.Background(), "report-job", "holder-b", time.Hour); err != nil {
		t.Fatal(err)
	}
	err := leasecore.Run(context.Background(), f.spy, "report-job", "holder-a",
		func(context.Context, leasecore.Grant) error { t.Error("job called"); return nil }, f.options()...)
	if !errors.Is(err, leasecore.ErrHeld) {
		t.Errorf("Run = %v, want ErrHeld", err)
	}
	if n := f.spy.acquires.Load(); n != 1 {
		t.Errorf("Acquire called %d times, want 1", n)
	}
	if st := f.inspect(t); !st.Held || st.Holder != "holder-b" {
		t.Errorf("server state %+v, want still held by holder-b", st)
	}
	waitGoroutines(t, baseline)
}

// Any other acquire error is returned as it is, and job is not called.
func TestRunReturnsAcquireError(t *testing.T) {
	f := newFixture(false)
	denied := errors.New("spy: permission denied for table lease")
	bl := &brokenLease{Lease: f.spy, err: denied}
	bl.failures.Store(1)
	err := leasecore.Run(context.Background(), bl, "report-job", "holder-a",
		func(context.Context, leasecore.Grant) error { t.Error("job called"); return nil }, f.options()...)
	if err != denied {
		t.Errorf("Run = %v, want the acquire's error as it is", err)
	}
}

// A job that fails: Run returns its error as it is, after the release.
func TestRunReturnsJobError(t *testing.T) {
	f := newFixture(false)
	jobErr := errors.New("report: upstream returned 502")
	err := leasecore.Run(context.Background(), f.spy, "report-job", "holder-a",
		func(context.Context, leasecore.Grant) error { return jobErr }, f.options()...)
	if err != jobErr {
		t.Errorf("Run = %v, want job's error %v as it is", err, jobErr)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state %+v, want released", st)
	}
}

// The session ends while job runs: job's context is cancelled with the
// session's Err as cause; the error Run returns wraps that Err when job
// returns an error, is job's own when it already wraps it, and is nil when
// job returns nil.
func TestRunSessionEndsWhileJobRuns(t *testing.T) {
	for _, end := range []struct {
		name     string
		sentinel error
		released bool // Close releases after a local deadline, not after a loss
	}{
		{"lost", leasecore.ErrLost, false},
		{"local deadline", leasecore.ErrLocalDeadline, true},
	} {
		for _, ret := range []string{"ctx.Err", "cause", "nil"} {
			t.Run(end.name+"/"+ret, func(t *testing.T) {
				baseline := runtime.NumGoroutine()
				f := newFixture(true)
				if end.sentinel == leasecore.ErrLocalDeadline {
					f.spy.renewHook = func(context.Context, leasecore.Grant) error {
						return fmt.Errorf("spy: connection reset: %w", leasecore.ErrUnavailable)
					}
				}
				running, causes := make(chan struct{}), make(chan error, 1)
				done := f.startRun(context.Background(), leaseOnly{f.spy}, func(ctx context.Context, g leasecore.Grant) error {
					close(running)
					<-ctx.Done()
					causes <- context.Cause(ctx)
					switch ret {
					case "ctx.Err":
						return ctx.Err()
					case "cause":
						return context.Cause(ctx)
					}
					return nil
				})
				<-running
				if end.sentinel == leasecore.ErrLost {
					f.local.WaitTimers(t, 2)
					f.server.Advance(testTTL) // expired by the server's clock
					f.local.Advance(testInterval)
				} else {
					for range 3 { // renewals at 400 and 800 ms fail; the deadline at 1200 ms ends it
						f.local.WaitTimers(t, 2)
						f.local.Advance(testInterval)
					}
				}
				err := runResult(t, done)
				cause := <-causes
				if !errors.Is(cause, end.sentinel) {
					t.Errorf("job's context cause %v, want %v", cause, end.sentinel)
				}
				switch ret {
				case "ctx.Err":
					if !errors.Is(err, context.Canceled) || !errors.Is(err, end.sentinel) || !errors.Is(err, cause) {
						t.Errorf("Run = %v, want job's context.Canceled wrapped with the session's Err %v", err, cause)
					}
				case "cause":
					if err != cause {
						t.Errorf("Run = %v, want job's error %v as it is", err, cause)
					}
				default:
					if err != nil {
						t.Errorf("Run = %v, want nil: job returned nil", err)
					}
				}
				if n := f.spy.releases.Load(); (n == 1) != end.released {
					t.Errorf("Release called %d times; want a release: %v", n, end.released)
				}
				waitGoroutines(t, baseline)
				f.local.WaitTimers(t, 0)
			})
		}
	}
}

// A job that returns an error as soon as its process wakes from a pause
// longer than the local deadline, before the session's timer goroutine has
// run: Run still reports that the session had ended.
func TestRunReportsDeadlinePassedBeforeTheTimerRan(t *testing.T) {
	for i := range 20 { // the timer goroutine would win some runs by itself
		f := newFixture(false)
		errDown := errors.New("job: the server ended the transaction")
		done := f.startRun(context.Background(), leaseOnly{f.spy}, func(ctx context.Context, g leasecore.Grant) error {
			f.local.Advance(testWindow) // the pause: the deadline passes by the session's clock
			return errDown
		})
		err := runResult(t, done)
		if !errors.Is(err, errDown) || !errors.Is(err, leasecore.ErrLocalDeadline) {
			t.Fatalf("run %d: Run = %v, want the job's error wrapped with ErrLocalDeadline", i, err)
		}
	}
}

// The caller's context ends while job runs: job's context ends with the
// caller's cause, Run returns job's error without any session error, and the
// release still happens (it does not inherit the caller's end).
func TestRunCallerCancels(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	ctx, cancel := context.WithCancelCause(context.Background())
	running := make(chan struct{})
	done := f.startRun(ctx, f.spy, func(ctx context.Context, g leasecore.Grant) error {
		close(running)
		<-ctx.Done()
		return context.Cause(ctx)
	})
	<-running
	stop := errors.New("deploy")
	cancel(stop)
	if err := runResult(t, done); err != stop {
		t.Errorf("Run = %v, want the caller's cause %v as job returned it", err, stop)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state %+v, want released although the caller's context ended", st)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}

// Bad input is refused before anything is acquired, naming the field.
func TestRunBadInput(t *testing.T) {
	f := newFixture(false)
	job := func(context.Context, leasecore.Grant) error { t.Error("job called"); return nil }
	for _, c := range []struct {
		lease        leasecore.Lease
		name, holder string
		job          runJob
		opts         []leasecore.SessionOption
		field        string
	}{
		{f.spy, "", "holder-a", job, nil, "name"},
		{f.spy, "report-job", " holder-a", job, nil, "holder"},
		{f.spy, "report-job", "holder-a", nil, nil, "job"},
		{nil, "report-job", "holder-a", job, nil, "lease"},
		{f.spy, "report-job", "holder-a", job, []leasecore.SessionOption{leasecore.WithMargin(-1)}, "margin"},
		{f.spy, "report-job", "holder-a", job, []leasecore.SessionOption{leasecore.WithTTL(0)}, "ttl"},
	} {
		testcheck.WantArgError(t, leasecore.Run(context.Background(), c.lease, c.name, c.holder, c.job, c.opts...), "run", c.field)
	}
	if n := f.spy.acquires.Load(); n != 0 {
		t.Errorf("Acquire called %d times for bad input", n)
	}
}

// A release that hangs holds Run up for one TTL on the session's clock, no
// longer, and Run still returns job's result; the failed release is the
// Err of the SessionEnded event.
func TestRunReleaseBoundedWhenReleaseHangs(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	releasing := make(chan struct{}, 1)
	f.spy.releaseHook = func(ctx context.Context, g leasecore.Grant) error {
		releasing <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	}
	observe, ended := endedEvents()
	done := f.startRun(context.Background(), f.spy, func(context.Context, leasecore.Grant) error { return nil }, observe)
	<-releasing
	f.local.WaitTimers(t, 1) // the release's bound; the renewal goroutine is gone
	f.local.Advance(testTTL - time.Millisecond)
	if n := f.local.ActiveTimers(); n != 1 {
		t.Fatalf("the release's bound fired before the TTL (%d timers)", n)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before the release's bound", err)
	default:
	}
	f.local.Advance(time.Millisecond)
	if err := runResult(t, done); err != nil {
		t.Errorf("Run = %v, want nil: job succeeded, the release's failure is not returned", err)
	}
	ev := <-ended
	if !errors.Is(ev.Err, leasecore.ErrClosed) || !errors.Is(ev.Err, leasecore.ErrUnavailable) {
		t.Errorf("SessionEnded Err = %v, want ErrClosed and the release's timeout (ErrUnavailable)", ev.Err)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}

// A release that fails is never returned: Run returns job's result, nil or
// an error, and the failure is the Err of the SessionEnded event.
func TestRunReleaseFailureNotReturned(t *testing.T) {
	unreachable := fmt.Errorf("spy: connection refused: %w", leasecore.ErrUnavailable)
	for _, jobErr := range []error{nil, errors.New("report: upstream returned 502")} {
		t.Run(fmt.Sprint(jobErr), func(t *testing.T) {
			f := newFixture(false)
			f.spy.releaseHook = func(context.Context, leasecore.Grant) error { return unreachable }
			observe, ended := endedEvents()
			err := leasecore.Run(context.Background(), f.spy, "report-job", "holder-a",
				func(context.Context, leasecore.Grant) error { return jobErr }, f.options(observe)...)
			if err != jobErr {
				t.Errorf("Run = %v, want job's result %v", err, jobErr)
			}
			if ev := <-ended; !errors.Is(ev.Err, unreachable) {
				t.Errorf("SessionEnded Err = %v, want the release's error", ev.Err)
			}
			if st := f.inspect(t); !st.Held {
				t.Errorf("server state %+v, want still held until the TTL runs out", st)
			}
		})
	}
}

// A job that panics: the lease is released before the panic goes on.
func TestRunReleasesWhenJobPanics(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = leasecore.Run(context.Background(), f.spy, "report-job", "holder-a",
			func(context.Context, leasecore.Grant) error { panic("job failed") }, f.options()...)
		return nil
	}()
	if recovered != "job failed" {
		t.Fatalf("recovered %v, want job's panic", recovered)
	}
	if st := f.inspect(t); st.Held || !st.Released {
		t.Errorf("server state after job panicked: %+v, want released", st)
	}
	waitGoroutines(t, baseline)
	f.local.WaitTimers(t, 0)
}
