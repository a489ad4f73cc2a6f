package memfence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// serverClock plays the lease service's clock; it moves only when the test
// says so.
type serverClock struct {
	mu  sync.Mutex
	now time.Time
}

func newServerClock() *serverClock {
	return &serverClock{now: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)}
}

func (c *serverClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *serverClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const ttl = 1500 * time.Millisecond

var ctx = context.Background()

func inspect(t *testing.T, l *memfence.Leases, name string) leasecore.LeaseState {
	t.Helper()
	st, err := l.Inspect(ctx, name)
	if err != nil {
		t.Fatalf("Inspect(%q) = %v", name, err)
	}
	return st
}

func acquire(t *testing.T, l *memfence.Leases, holder string, want leasecore.Token) leasecore.Grant {
	t.Helper()
	g, err := l.Acquire(ctx, "report-job", holder, ttl)
	if err != nil {
		t.Fatalf("Acquire(%s) = %v, want token %d", holder, err, want)
	}
	if g.Token != want || g.Name != "report-job" || g.Holder != holder || g.TTL != ttl {
		t.Fatalf("Acquire(%s) = %+v, want token %d for report-job, %s, %v", holder, g, want, holder, ttl)
	}
	return g
}

func wantHoldError(t *testing.T, err, sentinel error, op, reason string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	var he *leasecore.HoldError
	if !errors.As(err, &he) {
		t.Fatalf("err = %v, want a *HoldError", err)
	}
	if he.Op != op {
		t.Errorf("HoldError.Op = %q, want %q", he.Op, op)
	}
	if !strings.Contains(he.Reason, reason) {
		t.Errorf("HoldError.Reason = %q, want it to contain %q", he.Reason, reason)
	}
}

func TestLeaseLifecycle(t *testing.T) {
	clk := newServerClock()
	l := memfence.NewLeases(clk.Now)

	if st := inspect(t, l, "report-job"); st.Exists || st.Held || st.Token != 0 {
		t.Fatalf("fresh lease state %+v, want free and never acquired", st)
	}

	// F1: acquire, renew, release; the next holder gets token+1 at once.
	a := acquire(t, l, "holder-a", 1)
	if st := inspect(t, l, "report-job"); !st.Exists || !st.Held || st.Holder != "holder-a" ||
		st.Token != 1 || st.Released || st.Remaining != ttl {
		t.Fatalf("state after acquire %+v, want held by holder-a, token 1, %v remaining", st, ttl)
	}

	// I1: while held, every acquire is refused, the holder's own included,
	// and a refused acquire changes nothing.
	for _, h := range []string{"holder-b", "holder-a"} {
		_, err := l.Acquire(ctx, "report-job", h, ttl)
		wantHoldError(t, err, leasecore.ErrHeld, "acquire", "")
	}
	if st := inspect(t, l, "report-job"); st.Token != 1 || st.Holder != "holder-a" {
		t.Fatalf("state after refused acquires %+v, want unchanged", st)
	}

	// Renew extends by the TTL from the server's now; the token stays.
	clk.Advance(ttl / 2)
	r, err := l.Renew(ctx, a)
	if err != nil {
		t.Fatalf("Renew = %v", err)
	}
	if r.Token != a.Token || r.Name != a.Name || r.Holder != a.Holder || r.TTL != a.TTL {
		t.Errorf("Renew = %+v, want the same holding period as %+v", r, a)
	}
	if st := inspect(t, l, "report-job"); st.Remaining != ttl {
		t.Errorf("Remaining after renew = %v, want %v", st.Remaining, ttl)
	}
	// The original period would have ended here; the renewed one runs on.
	clk.Advance(ttl - time.Nanosecond)
	if _, err := l.Acquire(ctx, "report-job", "holder-b", ttl); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("Acquire 1ns before the renewed expiry = %v, want ErrHeld", err)
	}

	// Release frees the lease at once; the token stays.
	if err := l.Release(ctx, a); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if st := inspect(t, l, "report-job"); !st.Exists || st.Held || !st.Released || st.Token != 1 || st.Remaining != 0 {
		t.Fatalf("state after release %+v, want released, token 1", st)
	}
	err = l.Release(ctx, a)
	wantHoldError(t, err, leasecore.ErrLost, "release", "released")
	_, err = l.Renew(ctx, a)
	wantHoldError(t, err, leasecore.ErrLost, "renew", "released")

	b := acquire(t, l, "holder-b", 2)

	// Expiry is the server clock moving: no write, and a renew after it
	// fails even though nobody took over.
	clk.Advance(ttl)
	if st := inspect(t, l, "report-job"); !st.Exists || st.Held || st.Released || st.Holder != "holder-b" || st.Token != 2 {
		t.Fatalf("state after expiry %+v, want expired (not released), holder-b, token 2", st)
	}
	_, err = l.Renew(ctx, b)
	wantHoldError(t, err, leasecore.ErrLost, "renew", "expired")
	err = l.Release(ctx, b)
	wantHoldError(t, err, leasecore.ErrLost, "release", "expired")

	// The holder must acquire again, and gets a new token.
	b2 := acquire(t, l, "holder-b", 3)

	// The old grants name holding periods that are over.
	_, err = l.Renew(ctx, b)
	wantHoldError(t, err, leasecore.ErrLost, "renew", `"holder-b" with token 3`)
	err = l.Release(ctx, a)
	wantHoldError(t, err, leasecore.ErrLost, "release", "token 3")
	if st := inspect(t, l, "report-job"); !st.Held || st.Token != 3 {
		t.Fatalf("failed renew/release changed the state: %+v", st)
	}

	// A forged grant with the right token but another holder is refused.
	forged := b2
	forged.Holder = "holder-x"
	_, err = l.Renew(ctx, forged)
	wantHoldError(t, err, leasecore.ErrLost, "renew", "holder-b")

	// Unknown lease.
	_, err = l.Renew(ctx, leasecore.Grant{Name: "other", Holder: "holder-a", Token: 1, TTL: ttl})
	wantHoldError(t, err, leasecore.ErrLost, "renew", "no such lease")
}

// Leases with different names have their own tokens and holders.
func TestLeasesAreIndependent(t *testing.T) {
	l := memfence.NewLeases(newServerClock().Now)
	for _, name := range []string{"job-x", "job-y"} {
		g, err := l.Acquire(ctx, name, "holder-a", ttl)
		if err != nil || g.Token != 1 {
			t.Errorf("Acquire(%s) = %+v, %v; want token 1", name, g, err)
		}
	}
}

func TestLeaseRejectsBadInputAndChangesNothing(t *testing.T) {
	clk := newServerClock()
	l := memfence.NewLeases(clk.Now)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	check := func(err error, field string) {
		t.Helper()
		var ae *leasecore.ArgError
		if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != field {
			t.Errorf("err = %v, want an ArgError for %q", err, field)
		}
	}
	_, err := l.Acquire(ctx, "", "holder-a", ttl)
	check(err, "name")
	_, err = l.Acquire(ctx, "report-job", "", ttl)
	check(err, "holder")
	_, err = l.Acquire(ctx, "report-job", "holder-a", memfence.MinTTL-1)
	check(err, "ttl")
	_, err = l.Acquire(ctx, "report-job", "holder-a", backendkit.MaxTTL+1)
	check(err, "ttl")
	if _, err := l.Acquire(cancelled, "report-job", "holder-a", ttl); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire(cancelled) = %v, want context.Canceled", err)
	}
	if st := inspect(t, l, "report-job"); st.Exists {
		t.Fatalf("state after rejected acquires %+v, want no lease", st)
	}

	g := acquire(t, l, "holder-a", 1)
	bad := g
	bad.Token = 0
	_, err = l.Renew(ctx, bad)
	check(err, "token")
	check(l.Release(ctx, bad), "token")
	bad = g
	bad.TTL = 0
	_, err = l.Renew(ctx, bad)
	check(err, "ttl")
	if _, err := l.Renew(cancelled, g); !errors.Is(err, context.Canceled) {
		t.Errorf("Renew(cancelled) = %v, want context.Canceled", err)
	}
	if err := l.Release(cancelled, g); !errors.Is(err, context.Canceled) {
		t.Errorf("Release(cancelled) = %v, want context.Canceled", err)
	}
	if st := inspect(t, l, "report-job"); !st.Held || st.Token != 1 || st.Remaining != ttl {
		t.Errorf("state after rejected calls %+v, want unchanged", st)
	}
	if _, err := l.Inspect(ctx, ""); !errors.Is(err, leasecore.ErrInvalidArgument) {
		t.Errorf("Inspect(\"\") = %v, want ErrInvalidArgument", err)
	}
	if _, err := l.Inspect(cancelled, "report-job"); !errors.Is(err, context.Canceled) {
		t.Errorf("Inspect(cancelled) = %v, want context.Canceled", err)
	}
}

// F3 in miniature: goroutines released together, exactly one winner on a
// fresh lease, none while it is held, exactly one after expiry.
func TestConcurrentAcquire(t *testing.T) {
	clk := newServerClock()
	l := memfence.NewLeases(clk.Now)
	const n = 16
	round := func() (winners int, tokens []leasecore.Token) {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			start = make(chan struct{})
		)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				g, err := l.Acquire(ctx, "report-job", "holder-"+string(rune('a'+i)), ttl)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					winners++
					tokens = append(tokens, g.Token)
				case !errors.Is(err, leasecore.ErrHeld):
					t.Errorf("Acquire = %v, want success or ErrHeld", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		return winners, tokens
	}
	if w, tok := round(); w != 1 || tok[0] != 1 {
		t.Errorf("fresh lease: %d winners with tokens %v, want 1 winner with token 1", w, tok)
	}
	if w, _ := round(); w != 0 {
		t.Errorf("held lease: %d winners, want 0", w)
	}
	clk.Advance(ttl)
	if w, tok := round(); w != 1 || tok[0] != 2 {
		t.Errorf("expired lease: %d winners with tokens %v, want 1 winner with token 2", w, tok)
	}
}

func TestNewLeasesNilClockUsesTimeNow(t *testing.T) {
	l := memfence.NewLeases(nil)
	g, err := l.Acquire(ctx, "report-job", "holder-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if st := inspect(t, l, "report-job"); !st.Held || st.Remaining <= 0 || st.Remaining > time.Hour {
		t.Errorf("state %+v, want held with up to an hour remaining", st)
	}
	if err := l.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}
