package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// A set of shards renewed together: each name keeps its own token; a name
// taken over is reported lost and leaves the set; the others stay held.
// On the fake clock, shared by the set and the server: the outcome is
// which names stay, not how the scheduler treats a 50 ms timer (on the
// real clock, with a 300 ms TTL, a loaded machine fired the set's timers
// 100-370 ms late and every name passed its deadline).
func TestSessionSetRenewsAllAndDropsTheLost(t *testing.T) {
	ctx := context.Background()
	f := newFixture(false)
	// An attempt's timeout 1 ns short of the interval, so that its timer
	// is never taken for the next tick (waitTick).
	set := f.newFakeSet(t, leasecore.WithRenewTimeout(testInterval-time.Nanosecond))
	for i := range 5 {
		if _, err := set.Acquire(ctx, fmt.Sprintf("shard-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Someone releases shard-2 behind the set's back; the next RenewAll
	// finds it lost.
	g := leasecore.Grant{Name: "shard-2", Holder: "holder-a", Token: 1, TTL: testTTL}
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	f.local.Advance(testInterval)
	l := waitLost(t, set, "shard-2")
	if !errors.Is(l.Err, leasecore.ErrLost) {
		t.Fatalf("lost %+v, want ErrLost", l)
	}
	// Two TTLs more, one renewal at a time: only renewal keeps the rest.
	for f.local.Since() < testInterval+2*testTTL {
		f.local.waitTick(t, f.local.Now().Add(testInterval))
		f.local.Advance(testInterval)
	}
	f.local.waitTick(t, f.local.Now().Add(testInterval))
	for _, n := range []string{"shard-0", "shard-1", "shard-3", "shard-4"} {
		if !set.Valid(n) {
			t.Errorf("%s no longer valid at %v", n, f.local.Since())
		}
		if st, _ := f.leases.Inspect(ctx, n); !st.Held || st.Holder != "holder-a" {
			t.Errorf("%s: %+v", n, st)
		}
	}
	if set.Valid("shard-2") {
		t.Error("shard-2 still valid")
	}
	if n := f.spy.renewAlls.Load(); n != 9 {
		t.Errorf("RenewAll called %d times in %v, want 9 (one every %v)", n, f.local.Since(), testInterval)
	}
	if err := set.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.leases.Inspect(ctx, "shard-0"); st.Held {
		t.Error("Close did not release shard-0")
	}
	if _, err := set.Acquire(ctx, "shard-9"); !errors.Is(err, leasecore.ErrClosed) {
		t.Errorf("acquire after Close: %v", err)
	}
}

// waitTick waits until a timer due exactly at at is active: a set's next
// renewal tick, armed once the previous RenewAll's answer was applied.
func (c *fakeClock) waitTick(t *testing.T, at time.Time) {
	t.Helper()
	timeout := time.NewTimer(realWait)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		armed, changed := false, c.changed
		for _, x := range c.timers {
			armed = armed || x.at.Equal(at)
		}
		c.mu.Unlock()
		if armed {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("waited %v (real time) for a timer due at %v", realWait, at.Sub(epoch))
		}
	}
}

func TestSessionSetNeedsABatchRenewer(t *testing.T) {
	type plain struct{ leasecore.Lease }
	_, err := leasecore.NewSessionSet(plain{memfence.NewLeases(nil)}, "holder-a")
	var ae *leasecore.ArgError
	if !errors.As(err, &ae) || ae.Field != "lease" {
		t.Fatalf("err = %v, want an ArgError on lease", err)
	}
}

// newFakeSet returns a set for holder-a on the fixture's spy, on its local
// clock with the teaching parameters, closed when the test ends. It waits
// until the renewal goroutine has armed its first tick.
func (f *fixture) newFakeSet(t *testing.T, extra ...leasecore.SessionOption) *leasecore.SessionSet {
	t.Helper()
	opts := append([]leasecore.SessionOption{leasecore.WithClock(f.local), leasecore.WithTTL(testTTL),
		leasecore.WithMargin(testMargin), leasecore.WithRenewInterval(testInterval)}, extra...)
	set, err := leasecore.NewSessionSet(f.spy, "holder-a", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set.Close(context.Background()) })
	f.local.WaitTimers(t, 1)
	return set
}

func waitLost(t *testing.T, set *leasecore.SessionSet, name string) leasecore.LostName {
	t.Helper()
	select {
	case l := <-set.Lost():
		if l.Name != name {
			t.Fatalf("lost %+v, want %s", l, name)
		}
		return l
	case <-time.After(realWait):
		t.Fatalf("%s was not reported lost within %v (real time); Valid = %v", name, realWait, set.Valid(name))
		return leasecore.LostName{}
	}
}

// hangRenewAll makes every RenewAll hang, ignoring its context: each
// call signals entered, then waits until unblock is closed.
func (f *fixture) hangRenewAll() (entered chan struct{}, unblock chan struct{}) {
	entered, unblock = make(chan struct{}, 1), make(chan struct{})
	f.spy.renewAllHook = func(context.Context, []leasecore.Grant) error {
		entered <- struct{}{}
		<-unblock
		return nil
	}
	return entered, unblock
}

// With a RenewAll that hangs (ignoring its context), each name still ends
// at its local deadline by the set's clock: reported on Lost, no longer
// Valid.
func TestSessionSetDeadlineWhileRenewAllHangs(t *testing.T) {
	f := newFixture(true)
	entered, unblock := f.hangRenewAll()
	set := f.newFakeSet(t)
	t.Cleanup(func() { close(unblock) }) // runs before the set's Close
	if _, err := set.Acquire(context.Background(), "shard-0"); err != nil {
		t.Fatal(err)
	}
	f.local.Advance(testInterval)
	select {
	case <-entered:
	case <-time.After(realWait):
		t.Fatal("RenewAll did not start")
	}
	f.local.Advance(testWindow - testInterval - time.Nanosecond)
	if !set.Valid("shard-0") {
		t.Error("Valid = false 1 ns before the deadline")
	}
	f.local.Advance(time.Nanosecond)
	l := waitLost(t, set, "shard-0")
	if !errors.Is(l.Err, leasecore.ErrLocalDeadline) || l.Token != 1 {
		t.Errorf("lost %+v, want token 1 with ErrLocalDeadline", l)
	}
	if set.Valid("shard-0") {
		t.Error("Valid = true after the deadline")
	}
}

// A RenewAll that succeeds but answers only at a name's local deadline does
// not bring the name back: Valid has been false, so it stays false, and the
// name is reported lost.
func TestSessionSetLateRenewalDoesNotRevive(t *testing.T) {
	f := newFixture(true) // the server's clock stays put: the renewal succeeds
	// What Valid said at the deadline, before the answer is returned. The
	// Advance fires the deadline timer, so the set may report the name lost
	// (and waitLost return) before this hook has asked Valid: the test
	// waits for the hook's reading instead of looking at a flag it may not
	// have set yet.
	validAtDeadline := make(chan bool, 1)
	var set *leasecore.SessionSet
	f.spy.afterRenewAll = func(context.Context) {
		f.local.Advance(testWindow - testInterval) // the answer arrives at the deadline
		select {
		case validAtDeadline <- set.Valid("shard-0"):
		default: // a later RenewAll: the first reading is the one checked
		}
	}
	set = f.newFakeSet(t)
	if _, err := set.Acquire(context.Background(), "shard-0"); err != nil {
		t.Fatal(err)
	}
	f.local.Advance(testInterval)
	l := waitLost(t, set, "shard-0")
	if !errors.Is(l.Err, leasecore.ErrLocalDeadline) {
		t.Errorf("lost %+v, want ErrLocalDeadline", l)
	}
	select {
	case valid := <-validAtDeadline:
		if valid {
			t.Error("Valid was true at the deadline")
		}
	case <-time.After(realWait):
		t.Fatalf("RenewAll did not return within %v (real time)", realWait)
	}
	if set.Valid("shard-0") {
		t.Error("Valid = true again after a renewal that answered at the deadline")
	}
}

// An acquire that took longer than ttl - margin gives an unusable grant:
// SessionSet.Acquire gives it back and reports ErrLocalDeadline, as
// NewSession does.
func TestSessionSetAcquireSlowerThanLocalWindow(t *testing.T) {
	f := newFixture(false)
	set := f.newFakeSet(t)
	f.spy.afterAcquire = func(context.Context) { f.local.Advance(testWindow) }
	tok, err := set.Acquire(context.Background(), "shard-0")
	if !errors.Is(err, leasecore.ErrLocalDeadline) {
		t.Fatalf("Acquire = %d, %v; want ErrLocalDeadline", tok, err)
	}
	if set.Valid("shard-0") || len(set.Names()) != 0 {
		t.Errorf("the set holds %v after a too slow acquire", set.Names())
	}
	if n := f.spy.releases.Load(); n != 1 {
		t.Errorf("Release called %d times, want 1", n)
	}
	if st, _ := f.leases.Inspect(context.Background(), "shard-0"); st.Held {
		t.Errorf("server state %+v, want released", st)
	}
}

// Close(ctx) returns when ctx ends, even while a RenewAll hangs.
func TestSessionSetCloseHonoursContextDuringRenewAll(t *testing.T) {
	f := newFixture(false)
	entered, unblock := f.hangRenewAll()
	set := f.newFakeSet(t)
	t.Cleanup(func() { close(unblock) })
	if _, err := set.Acquire(context.Background(), "shard-0"); err != nil {
		t.Fatal(err)
	}
	f.local.Advance(testInterval)
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- set.Close(ctx) }()
	select {
	case err := <-closed:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Close = %v, want it to wrap context.Canceled", err)
		}
	case <-time.After(realWait):
		t.Error("Close ignored its cancelled context while RenewAll hung")
	}
}
