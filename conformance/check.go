package conformance

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseRun is one running case: it carries the case's context and traits and
// records checks. Its methods must be called from the case's own goroutine
// (like testing.T's FailNow): Fatal, Must and Skip abort the case.
type caseRun struct {
	id     string // the case's ID, "F4": the tag of checks of the case's own rule
	ctx    context.Context
	traits Traits
	t      *testing.T // nil outside go test
	emit   func(kind, text string)

	passed, failed int
	skipReason     string

	st       *caseState // shared with the case's sections
	timeline []TimelineEvent
}

// caseState is what all sections of one case share.
type caseState struct {
	start    time.Time
	mu       sync.Mutex
	timeline []TimelineEvent
	cleanups []func()
}

// TimelineEvent is one event a case recorded while it ran, for pictures of
// the run (the lab draws F4's and F5's).
type TimelineEvent struct {
	At   time.Duration // since the case started
	Lane string        // who: "A", "B", "parent", "lease", "resource"
	Text string
}

// record adds an event to the case's timeline. Safe from any goroutine.
func (c *caseRun) record(lane, text string) {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	c.st.timeline = append(c.st.timeline, TimelineEvent{At: time.Since(c.st.start), Lane: lane, Text: text})
}

// recordAt adds an event that happened (or will happen) at t.
func (c *caseRun) recordAt(t time.Time, lane, text string) {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	c.st.timeline = append(c.st.timeline, TimelineEvent{At: t.Sub(c.st.start), Lane: lane, Text: text})
}

// cleanup registers fn to run when the case ends, last registered first.
func (c *caseRun) cleanup(fn func()) {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	c.st.cleanups = append(c.st.cleanups, fn)
}

// finish runs the cleanups and returns the timeline in time order.
func (st *caseState) finish() []TimelineEvent {
	st.mu.Lock()
	fns := st.cleanups
	st.cleanups = nil
	st.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	tl := slices.Clone(st.timeline)
	slices.SortStableFunc(tl, func(a, b TimelineEvent) int { return cmp.Compare(a.At, b.At) })
	return tl
}

// Line kinds, as printed.
const (
	kindOK   = "ok"
	kindFail = "FAIL"
	kindNote = "note"
	kindSkip = "skip"
)

// abortCase unwinds a case from Fatal, Must and Skip.
type abortCase struct {
	skip   bool
	reason string
}

func (c *caseRun) line(kind, text string) {
	switch kind {
	case kindOK:
		c.passed++
	case kindFail:
		c.failed++
	}
	c.emit(kind, text)
}

// Check records a check of rule (an invariant such as "I3", or a named
// property) that holds when cond is true.
func (c *caseRun) Check(rule, what string, cond bool, expected, actual any) bool {
	kind := kindFail
	if cond {
		kind = kindOK
	}
	c.line(kind, fmt.Sprintf("[%s] %s (expected=%v, actual=%v)", rule, what, expected, actual))
	return cond
}

// Equal records a check that expected and actual are equal.
func (c *caseRun) Equal(rule, what string, expected, actual any) bool {
	return c.Check(rule, what, reflect.DeepEqual(expected, actual), expected, actual)
}

// Exposes records a negative-control check: it passes when the naive
// design really showed its flaw on the backend (cond true), and fails when
// the flaw did not show, since then the experiment proved nothing.
func (c *caseRun) Exposes(flaw string, cond bool, evidence string) bool {
	if cond {
		c.line(kindOK, "negative control exposes: "+flaw+" ("+evidence+")")
	} else {
		c.line(kindFail, "negative control did not expose: "+flaw+" ("+evidence+")")
	}
	return cond
}

// Notef prints an observation that is not a check.
func (c *caseRun) Notef(format string, args ...any) {
	c.line(kindNote, fmt.Sprintf(format, args...))
}

// Fatalf records a failure and ends the case.
func (c *caseRun) Fatalf(format string, args ...any) {
	c.line(kindFail, fmt.Sprintf(format, args...))
	panic(abortCase{})
}

// stop ends the case after a failed check already said why.
func (c *caseRun) stop() { panic(abortCase{}) }

// Must ends the case when err is not nil; what says what was being done.
func (c *caseRun) Must(err error, what string) {
	if err != nil {
		c.Fatalf("%s: %v", what, err)
	}
}

// Skip ends the case (or the current Section) as skipped, printing why.
func (c *caseRun) Skip(reason string) {
	c.emit(kindSkip, reason)
	panic(abortCase{skip: true, reason: reason})
}

// Section runs one part of a case. A Skip inside it skips only this part;
// Fatal inside it ends only this part. Under go test it is a subtest.
func (c *caseRun) Section(name string, fn func(c *caseRun)) {
	if c.t == nil {
		c.emit("", "-- "+name)
		sub := &caseRun{id: c.id, ctx: c.ctx, traits: c.traits, emit: c.emit, st: c.st}
		sub.protect(func() { fn(sub) })
		c.passed += sub.passed
		c.failed += sub.failed
		return
	}
	c.t.Run(sectionName(name), func(t *testing.T) {
		sub := newTestC(c.ctx, c.traits, t)
		sub.id, sub.st = c.id, c.st
		sub.protect(func() { fn(sub) })
		if sub.skipReason != "" && sub.passed == 0 && sub.failed == 0 {
			t.Skip(sub.skipReason)
		}
	})
}

// protect runs fn, turning an abort into a return and a panic into a
// failure.
func (c *caseRun) protect(fn func()) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if a, ok := r.(abortCase); ok {
			if a.skip {
				c.skipReason = a.reason
			}
			return
		}
		c.line(kindFail, fmt.Sprintf("panic: %v\n%s", r, debug.Stack()))
	}()
	fn()
}

func newTestC(ctx context.Context, traits Traits, t *testing.T) *caseRun {
	// t.Output keeps the line format of the lease-fencing article
	// (SOURCES.md): no file:line prefixes.
	return &caseRun{ctx: ctx, traits: traits, t: t, emit: func(kind, text string) {
		if kind == kindFail {
			t.Fail()
		}
		fmt.Fprintln(t.Output(), formatLine(kind, text))
	}}
}

// formatLine renders one output line in the format of the lease-fencing
// article (SOURCES.md).
func formatLine(kind, text string) string {
	if kind == "" {
		return "  " + text
	}
	return fmt.Sprintf("  %-4s %s", kind, text)
}

func sectionName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' {
			return '_'
		}
		return r
	}, s)
}

// Token checks.

// FirstToken checks the first token a fresh lease issues.
func (c *caseRun) FirstToken(what string, got leasecore.Token) {
	if c.traits.TokenStep == 1 {
		c.Equal("I2", what, "token=1", fmt.Sprintf("token=%d", got))
		return
	}
	c.Check("I2", what, got > 0, "token>0", fmt.Sprintf("token=%d", got))
}

// NextToken checks that got follows prev: exactly prev+step when the
// backend declares a step, strictly greater otherwise.
func (c *caseRun) NextToken(what string, prev, got leasecore.Token) {
	if step := c.traits.TokenStep; step != 0 {
		c.Equal("I2", what, fmt.Sprintf("token=%d", prev+step), fmt.Sprintf("token=%d", got))
		return
	}
	c.Check("I2", what, got > prev, fmt.Sprintf("token>%d", prev), fmt.Sprintf("token=%d", got))
}

// LargerToken checks I2's "strictly greater" even on a backend whose
// TokenStep is 1: for a holder whose connections a freeze or a cut broke,
// where an acquire may have been issued a token whose answer it never got
// (lib/pq under database/sql re-sends a statement on a new connection
// after a read fails, and the re-sent acquire then meets its own first
// grant), so the next token it leads with can be more than one above.
func (c *caseRun) LargerToken(what string, prev, got leasecore.Token) {
	c.Check("I2", what, got > prev, fmt.Sprintf("token>%d", prev), fmt.Sprintf("token=%d", got))
	if step := c.traits.TokenStep; step != 0 && got > prev+step {
		c.Notef("tokens %d to %d were issued in between: acquires whose grants this holder did not lead with", prev+step, got-step)
	}
}

// ttl returns base, or the backend's minimum TTL when that is larger,
// rounded up to the backend's TTL granularity, so timings scale with what
// the backend honours.
func (c *caseRun) ttl(base time.Duration) time.Duration {
	t := max(base, c.traits.MinTTL)
	if g := c.traits.TTLGranularity; g > 0 && t%g != 0 {
		t += g - t%g
	}
	return t
}

// scale returns d stretched by the same factor ttl(base) stretched base.
func (c *caseRun) scale(d, base time.Duration) time.Duration {
	t := c.ttl(base)
	if t == base {
		return d
	}
	return time.Duration(float64(d) * float64(t) / float64(base))
}
