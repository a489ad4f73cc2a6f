package conformance

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// In-process campaigners of F12 and F13: leasecore.Campaign on lease
// clients wrapped by netLease, with lead functions that report each term
// and its end to the case over channels.

// leaderTerm is one election of an in-process campaigner.
type leaderTerm struct {
	holder string
	token  leasecore.Token
	// acquire brackets the server's grant: sent before, returned after.
	acquire acquireStamp
	led     time.Time // when the lead function was called
}

// leaderEnd is the end of one term's lead function.
type leaderEnd struct {
	token leasecore.Token
	cause error // context.Cause of the lead context; nil when it stepped down
	at    time.Time
}

// campaigner is one in-process campaign. Its goroutines write only its own
// channels and counters, and read only its own down channel: nothing the
// case goroutine is still filling.
type campaigner struct {
	holder  string
	net     *netLease
	waiting string // how it waits while another holder leads
	down    chan struct{}
	ends    chan leaderEnd
	result  chan error // Campaign's result
	cancel  context.CancelFunc
	calls   atomic.Int32 // lead calls
}

// campaignGroup runs the campaigners of one case.
type campaignGroup struct {
	c                 *caseRun
	elected           chan leaderTerm // every election of every campaigner
	active, maxActive atomic.Int32    // lead functions running now, and at most
	all               []*campaigner
	wg                sync.WaitGroup
}

func newCampaignGroup(c *caseRun) *campaignGroup {
	return &campaignGroup{c: c, elected: make(chan leaderTerm, 32)}
}

// start starts a campaign for holder on lease. With poll, the client's
// backendkit.Waiter (if any) is hidden, so the campaign polls every poll
// interval at most: the bound F12 derives the hand-off time from.
func (g *campaignGroup) start(ctx context.Context, lease leasecore.Lease, holder string, poll bool, opts ...leasecore.CampaignOption) *campaigner {
	n, wrapped := wrapNet(lease)
	cp := &campaigner{holder: holder, net: n, down: make(chan struct{}),
		ends: make(chan leaderEnd, 16), result: make(chan error, 1)}
	switch _, isWaiter := wrapped.(backendkit.Waiter); {
	case poll:
		wrapped = n // the netLease alone has no WaitFree
		cp.waiting = "polling"
	case isWaiter:
		cp.waiting = "the lease client's backendkit.Waiter (polling while it cannot wait)"
	default:
		cp.waiting = "polling (the lease client is no backendkit.Waiter)"
	}
	cctx, cancel := context.WithCancel(ctx)
	cp.cancel = cancel
	c := g.c
	lead := func(lctx context.Context, grant leasecore.Grant) error {
		token := grant.Token
		now := g.active.Add(1)
		defer g.active.Add(-1)
		for {
			m := g.maxActive.Load()
			if now <= m || g.maxActive.CompareAndSwap(m, now) {
				break
			}
		}
		cp.calls.Add(1)
		g.elected <- leaderTerm{holder: holder, token: token, acquire: cp.net.acquired(token), led: time.Now()}
		select {
		case <-lctx.Done():
			cause := context.Cause(lctx)
			cp.ends <- leaderEnd{token, cause, time.Now()}
			return cause
		case <-cp.down:
			cp.ends <- leaderEnd{token, nil, time.Now()}
			return nil // done leading: Campaign releases and returns nil
		}
	}
	opts = append(opts, leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) {
		switch ev.Kind {
		case leasecore.CampaignElected, leasecore.CampaignResigned:
			c.record(holder, fmt.Sprintf("%s token=%d", ev.Kind, ev.Token))
		case leasecore.CampaignLost:
			c.record(holder, fmt.Sprintf("%s token=%d: %s", ev.Kind, ev.Token, causeKind(ev.Err)))
		}
	}))
	g.all = append(g.all, cp)
	g.wg.Go(func() {
		cp.result <- leasecore.Campaign(cctx, wrapped, leaseName, holder, lead, opts...)
	})
	return cp
}

// await returns the next election, ending the case when none comes within
// limit.
func (g *campaignGroup) await(within time.Duration, what string) leaderTerm {
	select {
	case t := <-g.elected:
		return t
	case <-time.After(within):
		g.c.Fatalf("%s: no campaigner was elected within %v", what, within)
	case <-g.c.ctx.Done():
		g.c.Fatalf("%s: %v", what, g.c.ctx.Err())
	}
	return leaderTerm{}
}

// quiet checks that nobody is elected for d (rule, what: the check's).
func (g *campaignGroup) quiet(rule, what string, d time.Duration) bool {
	select {
	case t := <-g.elected:
		return g.c.Check(rule, what, false, "no election", fmt.Sprintf("%s elected with token %d", t.holder, t.token))
	case <-time.After(d):
		return g.c.Check(rule, what, true, "no election", fmt.Sprintf("none in %v", d))
	case <-g.c.ctx.Done():
		g.c.Fatalf("%s: %v", what, g.c.ctx.Err())
	}
	return false
}

// byHolder returns the campaigner of holder.
func (g *campaignGroup) byHolder(holder string) *campaigner {
	for _, cp := range g.all {
		if cp.holder == holder {
			return cp
		}
	}
	g.c.Fatalf("no campaigner %q", holder)
	return nil
}

// end waits for the end of cp's current term.
func (cp *campaigner) end(c *caseRun, within time.Duration, what string) leaderEnd {
	select {
	case e := <-cp.ends:
		return e
	case <-time.After(within):
		c.Fatalf("%s: %s's lead function did not return within %v", what, cp.holder, within)
	case <-c.ctx.Done():
		c.Fatalf("%s: %v", what, c.ctx.Err())
	}
	return leaderEnd{}
}

// stop cancels cp's campaign and returns Campaign's result.
func (cp *campaigner) stop(c *caseRun, within time.Duration) error {
	cp.cancel()
	return cp.wait(c, within)
}

// wait returns Campaign's result once it returned.
func (cp *campaigner) wait(c *caseRun, within time.Duration) error {
	select {
	case err := <-cp.result:
		cp.result <- err // for a later wait
		return err
	case <-time.After(within):
		c.Fatalf("%s's campaign did not return within %v", cp.holder, within)
	}
	return nil
}

// shutdown cancels every campaign and waits for them, bounded: it runs
// deferred, also when the case ends early, and must neither block for
// ever nor end the case.
func (g *campaignGroup) shutdown(within time.Duration) {
	for _, cp := range g.all {
		cp.cancel()
	}
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
	}
}

// leadSpan is one term as the case can observe it: from a moment the
// leader certainly held the lease to the moment it certainly stopped
// leading by its own account.
type leadSpan struct {
	who      string
	from, to time.Time
}

// overlap describes the spans in time order, relative to the case's
// start, and reports whether two of them overlap.
func (c *caseRun) overlap(spans []leadSpan) (string, bool) {
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	var (
		parts   []string
		overlap bool
		lastTo  time.Time // the latest end of the spans before
	)
	for _, s := range spans {
		parts = append(parts, fmt.Sprintf("%s [%v, %v]", s.who,
			s.from.Sub(c.st.start).Round(time.Millisecond), s.to.Sub(c.st.start).Round(time.Millisecond)))
		if s.from.Before(lastTo) {
			overlap = true
		}
		if s.to.After(lastTo) {
			lastTo = s.to
		}
	}
	return strings.Join(parts, ", "), overlap
}
