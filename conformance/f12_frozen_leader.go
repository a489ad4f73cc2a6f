package conformance

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// handoffSlack is the scheduling allowance in the hand-off bounds of F12
// and F13: the suite shares the machine with other tests, under -race.
const handoffSlack = 250 * time.Millisecond

// caseF12 is leader election across a frozen leader. Holder A, a separate
// OS process, campaigns with leasecore.Campaign and leads; three
// in-process campaigners wait (two with the lease client's
// backendkit.Waiter when it has one, one polling). A is frozen with SIGSTOP
// while it leads: its lead context cannot end while it is frozen, so
// nothing in A stops it. The lease expires by the backend's clock, a
// waiter takes over with a larger token and writes; A is thawed with its
// stale write as its very next action, and the resource rejects it. Only
// then does A's lead context end (at its local deadline, long past). A's
// campaign goes on: when the new leader steps down, A leads again with a
// larger token.
func caseF12(ctx context.Context, c *caseRun, h Harness) {
	hp := need[HolderProcesses](c, h, AbilityHolderProcesses)
	reader := c.openResource(h)
	_, insp := c.openLease(h)

	ttl := c.ttl(pausedTTL)
	renew, margin, running := c.scale(pausedRenew, pausedTTL), c.scale(pausedMargin, pausedTTL), c.renewingWait(ttl)
	poll := ttl / 8 // Campaign's default, set explicitly: the bound below uses it
	// A backend whose TTLs come in whole units expires no finer than that
	// (etcd's lessor revokes expired leases in rounds, then deletes the
	// key through raft).
	gran := c.traits.TTLGranularity
	bound := ttl + renew + poll + gran + handoffSlack

	aRenewTimeout := frozenHolderRenewTimeout(ttl, margin)
	a := c.startHolder(hp, KindFenced, "A")
	aTerm1 := c.leadingLine("A's campaign is elected",
		a.call(fmt.Sprintf("CAMPAIGN %s %s %v %v %v %v", leaseName, holderA, ttl, renew, margin, aRenewTimeout)))
	c.FirstToken("A, campaigning alone, leads with the lease's first token", aTerm1.token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-a", aTerm1.token))

	// The waiters start once A leads, so A is the first leader for sure.
	g := newCampaignGroup(c)
	defer g.shutdown(ttl + 5*time.Second)
	opts := []leasecore.CampaignOption{
		leasecore.WithSessionOptions(leasecore.WithTTL(ttl), leasecore.WithRenewInterval(renew), leasecore.WithMargin(margin)),
		leasecore.WithPollInterval(poll),
	}
	var waiting []string
	for i, polls := range []bool{false, false, true} {
		lease, _ := c.openLease(h)
		cp := g.start(ctx, lease, fmt.Sprintf("campaigner-%d", i+1), polls, opts...)
		waiting = append(waiting, cp.holder+": "+cp.waiting)
	}
	c.Notef("A is a separate OS process running leasecore.Campaign; in-process campaigners wait (%s); ttl=%v renew=%v margin=%v poll=%v; A's renew attempt timeout %v",
		strings.Join(waiting, "; "), ttl, renew, margin, poll, aRenewTimeout)

	if !g.quiet("I1", fmt.Sprintf("while A leads and renews, no waiter is elected (waited %v, ttl %v)", running, ttl), running) {
		panic(abortCase{}) // with two leaders already, the hand-off proves nothing
	}
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the lease")
	c.Equal("I1", "A's renewals kept the lease while it led", fmt.Sprintf("held=true by holder-a token=%d", aTerm1.token),
		fmt.Sprintf("held=%t by %s token=%d", st.Held, st.Holder, st.Token))

	var (
		preToken leasecore.Token
		preNanos int64
	)
	if line := a.call("DEADLINE"); !scanned(line, "DEADLINE token=%d deadline=%d", &preToken, &preNanos) {
		c.Fatalf("A's local deadline: reply %q", line)
	}
	frozen := time.Now() // before the signal: the bound below counts from no later than the freeze
	c.Must(freeze(a.pid), "SIGSTOP A")
	c.record("A", "SIGSTOP: frozen while leading")
	c.Equal(c.id, "after SIGSTOP /proc shows A stopped (its renewals and its lead context's timer too)", "T", waitProcState(ctx, a.pid, "T"))

	// Past twice the bound the case gives up: the check below would fail
	// anyway, and a lease that never expires must not hold the suite up.
	next := g.await(2*bound, "the hand-off after A froze")
	leader := g.byHolder(next.holder)
	c.record("lease", fmt.Sprintf("token %d issued to %s", next.token, next.holder))
	took := next.acquire.returned.Sub(frozen)
	c.Check(c.id, fmt.Sprintf("a waiter is elected within ttl + renew interval + poll interval + TTL granularity + slack after A froze "+
		"(%v: A's last renewal, sent before the freeze, holds the lease at most one ttl after it reached the server, "+
		"which may be up to one renew interval later; %s polls every poll interval at most, the Waiter's campaigners may be faster; "+
		"granularity %v; %v for scheduling)", bound, g.all[len(g.all)-1].holder, gran, handoffSlack),
		took <= bound, fmt.Sprintf("<= %v", bound), fmt.Sprintf("%s elected %v after the freeze", next.holder, took.Round(time.Millisecond)))
	c.NextToken("the new leader's token is larger than A's", aTerm1.token, next.token)

	floorBefore := c.floor(reader, scope)
	res := c.write(reader, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=201(" + next.holder + ")",
		Writer: next.holder, Token: next.token})
	c.Equal("I3", "the new leader's fenced write is accepted and moves the floor to its token",
		fmt.Sprintf("accepted=true floor %d->%d", floorBefore, next.token), fmt.Sprintf("accepted=%t floor %d->%d", res.Accepted, floorBefore, res.Floor))
	c.record("resource", fmt.Sprintf("%s's token-%d write accepted", next.holder, next.token))

	// Queue A's write, then thaw it: the write is the very next thing A
	// does, with the token of the term it still believes it leads.
	a.send("WRITE " + scope + " " + partSummary + " rows=200(A)")
	thawed := time.Now()
	c.Must(thaw(a.pid), "SIGCONT A")
	c.record("A", "SIGCONT: resumes with its write")
	aWrite := a.reply("A's write after the thaw")
	c.Equal("I3", fmt.Sprintf("A's late write with its lead token %d is rejected", aTerm1.token),
		fmt.Sprintf("WRITE accepted=false token=%d", aTerm1.token), trimFloor(aWrite))
	end := c.leadEndLine("A's lead context after the thaw", a.call("AWAIT_LEAD_END"))
	c.Check("campaign", "after the thaw A's lead context is cancelled with a cause wrapping ErrLocalDeadline or ErrLost",
		end.cause == "ErrLocalDeadline" || end.cause == "ErrLost", "ErrLocalDeadline or ErrLost", fmt.Sprintf("token=%d cause=%s", end.token, end.cause))
	c.Check(c.id, "A's local deadline (by A's clock, set before it froze) passed before the new leader's winning Acquire was sent, so before the server granted it",
		end.deadline.Before(next.acquire.sent), "deadline < acquire sent",
		fmt.Sprintf("deadline %v after the freeze, acquire sent %v after it", end.deadline.Sub(frozen).Round(time.Millisecond),
			next.acquire.sent.Sub(frozen).Round(time.Millisecond)))
	if pre := time.Unix(0, preNanos); preToken != end.token || !pre.Equal(end.deadline) {
		c.Notef("A's deadline reported before the freeze (token %d, %v after the freeze) moved with a renewal that ended just before it",
			preToken, pre.Sub(frozen).Round(time.Millisecond))
	}
	c.Notef("A's lead context ended %v after the thaw, not at its deadline: a frozen process runs no timer; the token check, not the context, stopped its write",
		end.at.Sub(thawed).Round(time.Microsecond))

	// The other waiters give up; the new leader steps down; A's campaign,
	// still running in the thawed process, takes the lease again.
	results := map[string]string{}
	for _, cp := range g.all {
		if cp != leader {
			results[cp.holder] = errKind(cp.stop(c, ttl+5*time.Second))
		}
	}
	close(leader.down)
	leaderEnd := leader.end(c, ttl+5*time.Second, "the new leader steps down")
	results[leader.holder] = errKind(leader.wait(c, ttl+5*time.Second))
	c.record(leader.holder, "stepped down")
	aTerm2 := c.leadingLine("A's campaign after the new leader stepped down", a.call("AWAIT_LEADING"))
	c.record("lease", fmt.Sprintf("token %d issued to holder-a", aTerm2.token))
	c.LargerToken("A's campaign, never restarted, leads again with a token larger than the new leader's", next.token, aTerm2.token)
	c.Notef("A took the lease %v after %s stepped down", aTerm2.granted.Sub(leaderEnd.at).Round(time.Microsecond), leader.holder)
	aWrite2 := a.call("WRITE " + scope + " " + partSummary + " rows=202(A)")
	c.Equal("I3", "A's write under its new term is accepted", fmt.Sprintf("WRITE accepted=true token=%d", aTerm2.token), trimFloor(aWrite2))
	c.Equal("campaign", "A steps down: its campaign releases and returns nil", "CAMPAIGN_ENDED err=nil", a.call("STEP_DOWN"))
	aDown := time.Now()
	c.Must(a.exit(), "A exits")

	want := map[string]string{}
	for _, cp := range g.all {
		want[cp.holder] = errKind(context.Canceled)
	}
	want[leader.holder] = errKind(nil)
	c.Equal("campaign", "the leader that stepped down got nil from Campaign; the other waiters their context's error",
		fmt.Sprint(want), fmt.Sprint(results))
	// A's first term ends, in the design, at its local deadline: what A
	// did after it (nothing, frozen; then the rejected write) is the pause
	// the token covers. The in-process leader's term runs until its
	// function returned.
	spans, overlap := c.overlap([]leadSpan{
		{fmt.Sprintf("A token %d (to its deadline)", aTerm1.token), aTerm1.granted, end.deadline},
		{fmt.Sprintf("%s token %d", next.holder, next.token), next.acquire.returned, leaderEnd.at},
		{fmt.Sprintf("A token %d", aTerm2.token), aTerm2.granted, aDown},
	})
	c.Check("I1", "at no moment two leaders: A's terms and the in-process leader's do not overlap, and never two in-process leaders at once",
		!overlap && g.maxActive.Load() == 1, "no overlap; at most 1 in-process leader",
		fmt.Sprintf("%s; at most %d in-process leaders", spans, g.maxActive.Load()))
	st, err = insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the lease at the end")
	c.Equal("campaign", "the lease ends free", "held=false", fmt.Sprintf("held=%t", st.Held))
}

// holderLeading is a LEADING reply of a holder process.
type holderLeading struct {
	token             leasecore.Token
	deadline, granted time.Time
}

func (c *caseRun) leadingLine(what, line string) holderLeading {
	var (
		tok    leasecore.Token
		dl, gr int64
	)
	if !scanned(line, "LEADING token=%d deadline=%d granted=%d", &tok, &dl, &gr) {
		c.Fatalf("%s: reply %q", what, line)
	}
	return holderLeading{tok, time.Unix(0, dl), time.Unix(0, gr)}
}

// holderLeadEndLine is a LEAD_ENDED reply of a holder process.
type holderLeadEndLine struct {
	token        leasecore.Token
	deadline, at time.Time
	cause        string
}

func (c *caseRun) leadEndLine(what, line string) holderLeadEndLine {
	head, cause, ok := strings.Cut(line, " cause=")
	var (
		tok    leasecore.Token
		dl, at int64
	)
	if !ok || !scanned(head, "LEAD_ENDED token=%d deadline=%d at=%d", &tok, &dl, &at) {
		c.Fatalf("%s: reply %q", what, line)
	}
	return holderLeadEndLine{tok, time.Unix(0, dl), time.Unix(0, at), cause}
}

// scanned reports whether line matches format, filling args.
func scanned(line, format string, args ...any) bool {
	_, err := fmt.Sscanf(line, format, args...)
	return err == nil
}
