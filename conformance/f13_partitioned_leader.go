package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// caseF13 is a leader that loses the lease while its function runs, not
// frozen: campaigner A leads in this process and its lease client's
// network is cut (netLease), so its renewals never reach the server. A's
// session ends at its local deadline by A's own clock and cancels A's lead
// context — before the lease expires by the server's clock, so before
// campaigner B, waiting on a client of its own, can be granted it. B takes
// over with a larger token. A's network comes back; A's campaign, which the
// case never restarts, waits and leads again with a larger token once B
// steps down.
func caseF13(ctx context.Context, c *caseRun, h Harness) {
	ttl := c.ttl(pausedTTL)
	renew, margin := c.scale(pausedRenew, pausedTTL), c.scale(pausedMargin, pausedTTL)
	poll := ttl / 8
	opts := []leasecore.CampaignOption{
		leasecore.WithSessionOptions(leasecore.WithTTL(ttl), leasecore.WithRenewInterval(renew), leasecore.WithMargin(margin)),
		leasecore.WithPollInterval(poll),
	}
	_, insp := c.openLease(h)
	g := newCampaignGroup(c)
	defer g.shutdown(ttl + 5*time.Second)

	leaseA, _ := c.openLease(h)
	a := g.start(ctx, leaseA, "campaigner-a", false, opts...)
	aTerm := g.await(2*ttl+5*time.Second, "A's election")
	c.Equal("I1", "A, campaigning alone, leads", a.holder, aTerm.holder)
	c.FirstToken("A leads with the lease's first token", aTerm.token)
	leaseB, _ := c.openLease(h)
	b := g.start(ctx, leaseB, "campaigner-b", false, opts...)
	// B's bound after the server's expiry: a Waiter's wait may end as late
	// as Campaign's cap on one wait (one ttl); a poll ends within one poll
	// interval.
	wait, waitWhy := poll, "B polls every poll interval at most"
	if _, ok := leaseB.(backendkit.Waiter); ok {
		wait, waitWhy = ttl, "B waits with the lease client's backendkit.Waiter, which Campaign caps at one ttl a wait"
	}
	gran := c.traits.TTLGranularity // see F12: the backend expires no finer
	c.Notef("both campaigners in this process, each with its own lease client; ttl=%v renew=%v margin=%v; A waits by %s, B by %s",
		ttl, renew, margin, a.waiting, b.waiting)
	if !g.quiet("I1", fmt.Sprintf("while A leads and renews, B is not elected (waited %v, ttl %v)", ttl, ttl), ttl) {
		panic(abortCase{}) // with two leaders already, the hand-off proves nothing
	}

	cut := time.Now()
	a.net.setCut(true)
	c.record(a.holder, "network cut: its requests no longer reach the server")
	aEnd := a.end(c, ttl+5*time.Second, "A's lead context after the cut")
	c.record(a.holder, fmt.Sprintf("lead context ended: %s", causeKind(aEnd.cause)))
	c.Check("campaign", "A's lead context is cancelled with a cause wrapping ErrLocalDeadline (or ErrLost)",
		errors.Is(aEnd.cause, leasecore.ErrLocalDeadline) || errors.Is(aEnd.cause, leasecore.ErrLost),
		"ErrLocalDeadline or ErrLost", causeKind(aEnd.cause))
	c.Check(c.id, fmt.Sprintf("A's lead context ends within ttl - margin + slack after the cut (%v: its local deadline counts from its last renewal sent before the cut; %v for scheduling)",
		ttl-margin+handoffSlack, handoffSlack),
		aEnd.at.Sub(cut) <= ttl-margin+handoffSlack, fmt.Sprintf("<= %v", ttl-margin+handoffSlack),
		aEnd.at.Sub(cut).Round(time.Millisecond))

	bound := ttl + renew + wait + gran + handoffSlack
	bTerm := g.await(2*bound, "B's takeover") // past twice the bound, give up: see F12
	c.Equal("I1", "B takes over", b.holder, bTerm.holder)
	c.record("lease", fmt.Sprintf("token %d issued to %s", bTerm.token, bTerm.holder))
	c.Check(c.id, "A's lead context was cancelled before B's winning Acquire was sent, so before the server granted B the lease",
		aEnd.at.Before(bTerm.acquire.sent), "lead end < acquire sent",
		fmt.Sprintf("lead ended %v after the cut, acquire sent %v after it", aEnd.at.Sub(cut).Round(time.Millisecond),
			bTerm.acquire.sent.Sub(cut).Round(time.Millisecond)))
	// The server restarted A's TTL no earlier than A's last successful
	// request was sent; B's grant is no later than its Acquire returned.
	held := a.net.lastHeld(aTerm.token)
	c.Check("I1", "B was granted the lease only after the server's expiry of A's hold: its Acquire returned at least one ttl after A's last successful renewal was sent",
		bTerm.acquire.returned.Sub(held) >= ttl, fmt.Sprintf(">= %v", ttl), bTerm.acquire.returned.Sub(held).Round(time.Millisecond))
	took := bTerm.acquire.returned.Sub(cut)
	c.Check(c.id, fmt.Sprintf("B is elected within ttl + renew interval + its wait bound + TTL granularity + slack after the cut (%v: A's last renewal holds the lease at most one ttl after it reached the server, which may be up to one renew interval after the cut; %s; granularity %v; %v for scheduling)",
		bound, waitWhy, gran, handoffSlack), took <= bound, fmt.Sprintf("<= %v", bound), took.Round(time.Millisecond))
	c.NextToken("B's token is larger than A's", aTerm.token, bTerm.token)

	a.net.setCut(false)
	c.record(a.holder, "network restored")
	c.Check("I1", "B is the only leader while A's network is back", g.active.Load() == 1 && g.maxActive.Load() == 1,
		"1 leader", fmt.Sprintf("%d now, at most %d", g.active.Load(), g.maxActive.Load()))
	// Let A's campaign find the lease held by B and wait, as a leader
	// back from a partition does; B's step-down then wakes it. (Without
	// the pause A would simply take the free lease on its next attempt.)
	sleep(ctx, renew)
	close(b.down)
	bEnd := b.end(c, ttl+5*time.Second, "B steps down")
	c.record(b.holder, "stepped down")
	aTerm2 := g.await(2*ttl+5*time.Second, "A's campaign after B stepped down")
	c.Equal("I1", "A's campaign, never restarted, takes the lease again", a.holder, aTerm2.holder)
	c.record("lease", fmt.Sprintf("token %d issued to %s", aTerm2.token, aTerm2.holder))
	c.LargerToken("A's new token is larger than B's", bTerm.token, aTerm2.token)
	c.Notef("A lost its hold %v after the cut; B took over %v after the cut; A led again %v after B stepped down",
		aEnd.at.Sub(cut).Round(time.Millisecond), took.Round(time.Millisecond), aTerm2.acquire.returned.Sub(bEnd.at).Round(time.Microsecond))

	// Shut down: A's campaign returns its context's error after releasing;
	// B's returned nil when it stepped down.
	aResult := a.stop(c, ttl+5*time.Second)
	aEnd2 := a.end(c, time.Second, "A's second term at shutdown")
	c.Equal("campaign", "A's function was called twice; Campaign returned its context's error, B's nil",
		fmt.Sprintf("calls=2 A=%s B=%s", errKind(context.Canceled), errKind(nil)),
		fmt.Sprintf("calls=%d A=%s B=%s", a.calls.Load(), errKind(aResult), errKind(b.wait(c, ttl+5*time.Second))))
	spans, overlap := c.overlap([]leadSpan{
		{fmt.Sprintf("A token %d", aTerm.token), aTerm.acquire.returned, aEnd.at},
		{fmt.Sprintf("B token %d", bTerm.token), bTerm.acquire.returned, bEnd.at},
		{fmt.Sprintf("A token %d", aTerm2.token), aTerm2.acquire.returned, aEnd2.at},
	})
	c.Check("I1", "at no moment two leaders: the terms, each until its function saw its context end or stepped down, do not overlap",
		!overlap && g.maxActive.Load() == 1, "no overlap; at most 1 leader", fmt.Sprintf("%s; at most %d at once", spans, g.maxActive.Load()))
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the lease at the end")
	c.Equal("campaign", "the lease ends free after the campaigns ended", "held=false", fmt.Sprintf("held=%t", st.Held))
}
