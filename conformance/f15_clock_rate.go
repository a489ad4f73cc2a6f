package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// rateClock is a leasecore.Clock that runs at rate times real time from its
// creation: over a real second it advances rate seconds, and its timers
// fire after d/rate of real time. A holder whose clock runs slow by a factor
// the margin does not cover believes in its lease after the server expired
// it (F15). Its readings carry the monotonic reading of the real clock at
// its creation, moved by the (scaled) elapsed time, so the session's
// comparisons and subtractions stay monotonic.
type rateClock struct {
	origin time.Time // real, with a monotonic reading
	rate   float64
}

func newRateClock(rate float64) rateClock { return rateClock{origin: time.Now(), rate: rate} }

// Now implements leasecore.Clock.
func (k rateClock) Now() time.Time {
	return k.origin.Add(time.Duration(k.rate * float64(time.Since(k.origin))))
}

// NewTimer implements leasecore.Clock: d on this clock is d/rate of real
// time, rounded up so the timer never fires before the clock shows d.
func (k rateClock) NewTimer(d time.Duration) leasecore.Timer {
	if d > 0 {
		d = time.Duration(math.Ceil(float64(d) / k.rate))
	}
	return rateTimer{time.NewTimer(d)}
}

// realAt returns the real instant at which this clock shows t (a reading
// derived from this clock).
func (k rateClock) realAt(t time.Time) time.Time {
	return k.origin.Add(time.Duration(float64(t.Sub(k.origin)) / k.rate))
}

type rateTimer struct{ t *time.Timer }

func (t rateTimer) C() <-chan time.Time { return t.t.C }
func (t rateTimer) Stop() bool          { return t.t.Stop() }

// unrenewedLease is a lease client whose renewals never reach the server:
// each fails at once with ErrUnavailable, as on a connection that is down
// (F15's holder that does not renew). Acquire, Release and Inspect go
// through its netLease, which stamps the acquire.
type unrenewedLease struct {
	*netLease
	attempts atomic.Int32
}

// Renew implements leasecore.Lease.
func (l *unrenewedLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	l.attempts.Add(1)
	return leasecore.Grant{}, fmt.Errorf("conformance: renew %q token %d: the case keeps this holder's renewals from the server: %w",
		g.Name, g.Token, leasecore.ErrUnavailable)
}

// caseF15 is a clock-rate fault: holder A's session (leasecore.Session)
// runs on a clock slower than real time, which the server's clock keeps.
// The session's local deadline and its renewal timer are on A's clock.
//
// Section 1, a clock far slower than the margin covers: A's renewal comes
// after the server expired the lease, so the server expires A's hold while
// A's Valid() is still true; B takes over with a larger token and writes;
// A, valid by its own clock, writes with its token and is rejected. The
// token check does not depend on any clock.
//
// Section 2, a clock slow by ρ with ρ·ttl ≤ margin, and no renewal: A's
// local deadline, counted on its slow clock, still passes before the
// earliest moment the server could expire the lease — the margin covers a
// clock that slow (Chubby §2.8; docs/choosing-numbers.md: m ≥ ρ·T).
func caseF15(ctx context.Context, c *caseRun, h Harness) {
	ttl := c.ttl(pausedTTL)
	c.Section("slow clock beyond the margin", func(c *caseRun) { slowBeyondMargin(ctx, c, h, ttl) })
	c.Section("slow clock within the margin", func(c *caseRun) { slowWithinMargin(ctx, c, h, ttl) })
}

// closeSession closes s at the end of a section, bounded, so that no
// renewal goroutine outlives the case.
func (c *caseRun) closeSession(s *leasecore.Session, who string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 10*time.Second)
	defer cancel()
	if err := s.Close(cctx); err != nil {
		c.Notef("closing %s's session: %v", who, err)
	}
}

func slowBeyondMargin(ctx context.Context, c *caseRun, h Harness, ttl time.Duration) {
	// A quarter of real speed with a renew interval of 3/5 ttl: A's first
	// renewal is sent 2.4 ttl of real time after its clock was read before
	// the acquire, its local deadline (ttl - margin on its clock) falls
	// 3.2 ttl after it; the server expires the hold about 1 ttl after it.
	// The case needs the expiry seen, B's acquire and two writes in the
	// 1.4 ttl between.
	const rate = 0.25
	margin, interval := ttl/5, 3*ttl/5
	name, sc := leaseName+"-f15-beyond", scope+"-f15-beyond"
	rawA, _ := c.openLease(h)
	stamps, leaseA := wrapNet(rawA)
	leaseB, insp := c.openLease(h)
	res := c.openResource(h)
	c.Notef("A's clock runs at %.2f of real time; ttl=%v margin=%v renew interval=%v (on A's clock): A's first renewal is due %v of real time after its acquire, its local deadline %v after it",
		rate, ttl, margin, interval, time.Duration(float64(interval)/rate), time.Duration(float64(ttl-margin)/rate))

	clock := newRateClock(rate)
	sess, err := leasecore.NewSession(ctx, leaseA, name, holderA, leasecore.WithClock(clock), leasecore.WithTTL(ttl),
		leasecore.WithMargin(margin), leasecore.WithRenewInterval(interval))
	c.Must(err, "A's session acquires")
	defer c.closeSession(sess, "A")
	tokA := sess.Token()
	c.FirstToken("A's session acquires the free lease", tokA)
	c.record("lease", fmt.Sprintf("token %d issued to holder-a (A's clock runs at %.2f)", tokA, rate))
	ra0 := c.write(res, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: tokA})
	c.Equal("I3", "A's first write, its lease fresh, is accepted", true, ra0.Accepted)

	// The server starts the TTL no earlier than A's acquire request was
	// sent (or the grant's Start, when the backend dates it earlier).
	since := stamps.lastHeld(tokA)
	freeAt := c.waitFree(insp, name, ttl, since, "A's hold, which A's slow clock has not renewed,", "A's acquire request was sent")
	c.record("lease", "A's lease expired (backend clock)")
	validAtFree := sess.Valid()
	c.Check(c.id, "when the backend had expired A's lease, A's session still believed itself valid: its slow clock had not reached the renewal",
		validAtFree, "Valid()=true", fmt.Sprintf("Valid()=%t, err=%s", validAtFree, errKind(sess.Err())))

	gb, err := leaseB.Acquire(ctx, name, holderB, ttl)
	c.Must(err, "holder-b acquires")
	c.NextToken("B acquires the lease the backend expired, with a larger token", tokA, gb.Token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-b", gb.Token))
	bContent := "rows=201(B)"
	rb := c.write(res, leasecore.Write{Scope: sc, Part: partSummary, Content: bContent, Writer: holderB, Token: gb.Token})
	c.Equal("I3", "B's write is accepted", fmt.Sprintf("accepted=true floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", rb.Accepted, rb.Floor))
	c.record("resource", fmt.Sprintf("B's token-%d write accepted", gb.Token))

	// A checks its session as a careful holder does before writing.
	checkedAt := time.Now()
	valid, dl, now := sess.Valid(), sess.Deadline(), clock.Now()
	c.Check(c.id, "A, about to write, believes itself the holder: Valid() is true and Deadline() is ahead by A's clock",
		valid && now.Before(dl), "Valid()=true, deadline ahead",
		fmt.Sprintf("Valid()=%t, deadline %v ahead by A's clock (%v of real time)", valid, dl.Sub(now).Round(time.Millisecond),
			clock.realAt(dl).Sub(checkedAt).Round(time.Millisecond)))
	ra := c.write(res, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=200(A)", Writer: holderA, Token: sess.Token()})
	c.record("A", fmt.Sprintf("writes with token %d, valid by its own clock", tokA))
	c.Equal("I3", fmt.Sprintf("A's write with token %d, sent while its session was valid by its own clock, is rejected with B's token as the floor", tokA),
		fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", ra.Accepted, ra.Floor))
	c.record("resource", fmt.Sprintf("A's token-%d write rejected (floor %d)", tokA, ra.Floor))
	final := c.stored(res, sc, partSummary)
	c.Equal("I3", "the summary is still B's", fmt.Sprintf("%s by %s token=%d", bContent, holderB, gb.Token), final)

	// How long A believed itself valid past the server's expiry, measured
	// so that it can only come out short:
	//  - The server's expiry E is not seen directly. A's acquire answer +
	//    ttl is no upper bound of it: a backend may keep a lease past its
	//    TTL (etcd rounds TTLs up to whole seconds, finds expired leases in
	//    rounds and revokes them through raft; a new leader restarts the
	//    TTLs), so E can be later and taking that instant would overstate
	//    the belief. (A's acquire sent + ttl is a lower bound of E, the
	//    wrong side.) What bounds E from above is the backend's own word:
	//    its Inspect had answered "free" when freeAt was read, and it then
	//    granted B the lease, which it does only to a lease it considers
	//    expired (I1). So E <= freeAt.
	//  - A believed itself valid at least until lastTrue: the case read the
	//    real clock before a Valid() call that returned true.
	// A believed itself valid for at least lastTrue - freeAt past E.
	lastTrue := time.Time{}
	if valid {
		lastTrue = checkedAt
	}
	limit := clock.realAt(sess.Deadline()).Add(5 * time.Second)
	for {
		t := time.Now()
		if !sess.Valid() {
			break
		}
		lastTrue = t
		if t.After(limit) {
			c.Fatalf("A's session is still valid 5s past its local deadline in real time")
		}
		select {
		case <-sess.Done():
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			c.Fatalf("waiting for A's session to end: %v", ctx.Err())
		}
	}
	select {
	case <-sess.Done():
	case <-time.After(limit.Sub(time.Now())):
		c.Fatalf("A's session reports itself invalid and does not end (Done) by 5s past its local deadline")
	}
	endedAt := time.Now()
	endErr := sess.Err()
	c.record("A", fmt.Sprintf("its session ends: %s", causeKind(endErr)))
	c.Check("session", "A's session ends when its late renewal finds the hold lost (ErrLost), or at its local deadline (ErrLocalDeadline)",
		errors.Is(endErr, leasecore.ErrLost) || errors.Is(endErr, leasecore.ErrLocalDeadline), "ErrLost or ErrLocalDeadline", causeKind(endErr))
	if lastTrue.IsZero() {
		c.Check(c.id, "A believed itself valid after the backend had expired its lease", false, "a Valid()=true after the lease was seen free", "none")
		return
	}
	past := lastTrue.Sub(freeAt)
	c.Check(c.id, "A believed itself valid after the backend had expired its lease: the last Valid()=true came after the backend's answer that the lease was free",
		past > 0, "> 0 after the lease was seen free", past.Round(time.Millisecond))
	c.Notef("A believed itself valid for at least %v past the backend's expiry of its lease (from the moment the backend's own answer said free, %v after A's acquire was sent, B's grant confirming it, to A's last Valid()=true); its session ended %v after the lease was seen free, with %s; without a token check, A's write would have landed in that window",
		past.Round(time.Millisecond), freeAt.Sub(since).Round(time.Millisecond), endedAt.Sub(freeAt).Round(time.Millisecond), causeKind(endErr))
}

func slowWithinMargin(ctx context.Context, c *caseRun, h Harness, ttl time.Duration) {
	// ρ = 0.2 with a margin of ttl/3: ρ·ttl = 0.2 ttl <= margin. The local
	// deadline, ttl - margin on A's clock, is (ttl - margin)/(1-ρ) =
	// 0.83 ttl of real time after A read its clock: 0.17 ttl before the
	// earliest expiry, room for the timer's scheduling.
	const rate = 0.8
	margin, interval := ttl/3, ttl/4
	rho := 1 - rate
	name := leaseName + "-f15-within"
	rawA, insp := c.openLease(h)
	stamps, _ := wrapNet(rawA)
	leaseA := &unrenewedLease{netLease: stamps} // Campaign is not involved: no Waiter needed
	c.Notef("A's clock runs at %.2f of real time (ρ=%.2f): ρ·ttl = %v <= margin %v; ttl=%v renew interval=%v; A's renewals never reach the backend",
		rate, rho, time.Duration(rho*float64(ttl)).Round(time.Millisecond), margin.Round(time.Millisecond), ttl, interval)

	clock := newRateClock(rate)
	sess, err := leasecore.NewSession(ctx, leaseA, name, holderA, leasecore.WithClock(clock), leasecore.WithTTL(ttl),
		leasecore.WithMargin(margin), leasecore.WithRenewInterval(interval))
	c.Must(err, "A's session acquires")
	defer c.closeSession(sess, "A")
	tokA := sess.Token()
	c.FirstToken("A's session acquires the free lease", tokA)
	c.record("lease", fmt.Sprintf("token %d issued to holder-a (A's clock runs at %.2f)", tokA, rate))

	// The server starts the TTL when it executes the acquire, no earlier
	// than the request was sent (or the grant's Start, when the backend
	// dates it earlier): the earliest moment it can expire the hold,
	// unrenewed, is that + ttl.
	since := stamps.lastHeld(tokA)
	earliestExpiry := since.Add(ttl)
	realDeadline := clock.realAt(sess.Deadline())
	c.Check(c.id, "A's local deadline, on its slow clock, falls in real time before the earliest moment the backend could expire the lease (A's acquire request sent + ttl)",
		realDeadline.Before(earliestExpiry), fmt.Sprintf("< %v after the acquire was sent", ttl),
		fmt.Sprintf("%v after it", realDeadline.Sub(since).Round(time.Millisecond)))

	select {
	case <-sess.Done():
	case <-time.After(time.Until(earliestExpiry) + 5*time.Second):
		c.Fatalf("A's session, never renewed, did not end within 5s past the earliest expiry")
	case <-ctx.Done():
		c.Fatalf("waiting for A's session to end: %v", ctx.Err())
	}
	endedAt := time.Now()
	// Ask the backend at once: an answer that returns before the earliest
	// expiry was given before it, so the backend must still hold A's lease.
	st, err := insp.Inspect(ctx, name)
	c.Must(err, "inspect the lease")
	answered := time.Now()
	endErr := sess.Err()
	c.record("A", fmt.Sprintf("its session ends: %s", causeKind(endErr)))
	c.Check("session", "A's session, never renewed, ends at its local deadline", errors.Is(endErr, leasecore.ErrLocalDeadline),
		"ErrLocalDeadline", causeKind(endErr))
	c.Check(c.id, "A's session ended before the earliest moment the backend could expire the lease: the margin covers a clock this slow",
		endedAt.Before(earliestExpiry), fmt.Sprintf("< %v after the acquire was sent", ttl),
		fmt.Sprintf("ended %v after it", endedAt.Sub(since).Round(time.Millisecond)))
	if answered.Before(earliestExpiry) {
		c.Check("I1", "when A's session had ended, the backend still held the lease for A: A stopped before the lease could pass to anyone",
			st.Held && st.Holder == holderA && st.Token == tokA, fmt.Sprintf("held by %s token=%d", backendkit.Quote(holderA), tokA),
			describeLease(st))
	} else {
		c.Notef("the backend's answer came %v after the earliest expiry, too late to show it still held the lease", answered.Sub(earliestExpiry).Round(time.Millisecond))
	}
	c.Notef("A's local deadline passed %v after its acquire was sent, %v before the backend could expire the lease; A tried to renew %d time(s), none reached the backend",
		endedAt.Sub(since).Round(time.Millisecond), earliestExpiry.Sub(endedAt).Round(time.Millisecond), leaseA.attempts.Load())
}
