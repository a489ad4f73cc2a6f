package leasecore_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// fakeClock is a leasecore.Clock that moves only when the test calls
// Advance. It is safe for concurrent use: the session's renewal goroutine
// reads it and creates timers while the test advances it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer  // active timers: not fired, not stopped
	changed chan struct{} // closed and replaced whenever timers changes
}

type fakeTimer struct {
	clock *fakeClock
	at    time.Time
	ch    chan time.Time
}

var _ leasecore.Clock = (*fakeClock)(nil)

// epoch is an arbitrary start; it carries no monotonic reading, which is
// fine because a fake clock never jumps except through Advance.
var epoch = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock {
	return &fakeClock{now: epoch, changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires once the clock has been advanced by d.
// A timer with d <= 0 has fired already, like time.NewTimer's.
func (c *fakeClock) NewTimer(d time.Duration) leasecore.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	c.notifyLocked()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			c.notifyLocked()
			return true
		}
	}
	return false
}

// Advance moves the clock forward by d and fires, in time order, every
// timer that is due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now // buffered, and a timer fires at most once
	}
	for i := len(kept); i < len(c.timers); i++ {
		c.timers[i] = nil
	}
	c.timers = kept
	c.notifyLocked()
}

// Since returns how far the clock has moved since epoch.
func (c *fakeClock) Since() time.Duration { return c.Now().Sub(epoch) }

func (c *fakeClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// ActiveTimers returns how many timers are waiting to fire.
func (c *fakeClock) ActiveTimers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitTimers waits until exactly n timers are active. A Session's renewal
// goroutine has two (the renew tick and the deadline) while it waits for
// the next renewal and none after it returned, so this is how a test knows
// the goroutine is ready before it advances the clock.
func (c *fakeClock) WaitTimers(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		got, changed := len(c.timers), c.changed
		c.mu.Unlock()
		if got == n {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("waited 10s (real time) for %d active timers, have %d", n, got)
		}
	}
}

// WaitPause waits until exactly one timer is active and it is due within
// d: a campaign pausing between attempts, not one bounding a request.
func (c *fakeClock) WaitPause(t *testing.T, d time.Duration) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		ok, changed := len(c.timers) == 1 && !c.timers[0].at.After(c.now.Add(d)), c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("waited 10s (real time) for one timer due within %v", d)
		}
	}
}

func TestFakeClock(t *testing.T) {
	c := newFakeClock()
	a := c.NewTimer(time.Second)
	b := c.NewTimer(2 * time.Second)
	z := c.NewTimer(0)
	select {
	case <-z.C():
	default:
		t.Fatal("a timer of 0 did not fire at once")
	}
	c.Advance(999 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("timer fired early")
	default:
	}
	c.Advance(time.Millisecond)
	if got := <-a.C(); !got.Equal(epoch.Add(time.Second)) {
		t.Errorf("fired with %v, want %v", got, epoch.Add(time.Second))
	}
	if a.Stop() {
		t.Error("Stop of a fired timer returned true")
	}
	if !b.Stop() {
		t.Error("Stop of an active timer returned false")
	}
	c.Advance(time.Hour)
	select {
	case <-b.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	if n := c.ActiveTimers(); n != 0 {
		t.Errorf("ActiveTimers = %d, want 0", n)
	}
}
