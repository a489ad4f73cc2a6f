package conformance

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// campaigners is how many instances campaign for the lease in F11.
const campaigners = 4

// campaignResult is what one campaigner's Campaign returned.
type campaignResult struct {
	holder string
	err    error
}

// caseF11 is leader election with leasecore.Campaign: four instances, each
// with its own lease client, campaign for one lease; one leads, the others
// wait; the leader steps down (its function returns, Campaign releases);
// exactly one waiter takes over with a larger token. The hand-off time is
// measured and reported; how the waiters waited (in the line of the lease
// client's backendkit.QueuedAcquirer, with its backendkit.Waiter, or
// polling) is said in a note.
func caseF11(ctx context.Context, c *caseRun, h Harness) {
	ttl := c.ttl(5 * time.Second)
	type election struct {
		holder string
		token  leasecore.Token
		at     time.Time
	}
	var (
		active, maxActive atomic.Int32
		elected           = make(chan election, campaigners*2)
		stepDown          = map[string]chan struct{}{}
		wg                sync.WaitGroup
		results           = make(chan campaignResult, campaigners)
	)
	campaignCtx, stopCampaigns := context.WithCancel(ctx)
	defer stopCampaigns()
	waiting := "polling (the lease client is no backendkit.Waiter)"
	for i := 1; i <= campaigners; i++ {
		holder := fmt.Sprintf("campaigner-%d", i)
		down := make(chan struct{}) // lead reads its own channel, never the map
		stepDown[holder] = down
		lease, _ := c.openLease(h)
		switch lease.(type) {
		case backendkit.QueuedAcquirer:
			waiting = "standing in line (the lease client's backendkit.QueuedAcquirer: the release hands the lease to the first waiter)"
		case backendkit.Waiter:
			waiting = "the lease client's backendkit.Waiter, or polling where it cannot wait"
		}
		lead := func(ctx context.Context, g leasecore.Grant) error {
			token := g.Token
			n := active.Add(1)
			defer active.Add(-1)
			for {
				m := maxActive.Load()
				if n <= m || maxActive.CompareAndSwap(m, n) {
					break
				}
			}
			elected <- election{holder, token, time.Now()}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-down:
				return nil // done leading: Campaign releases and returns nil
			}
		}
		wg.Go(func() {
			err := leasecore.Campaign(campaignCtx, lease, leaseName, holder, lead,
				leasecore.WithSessionOptions(leasecore.WithTTL(ttl), leasecore.WithRenewInterval(ttl/4), leasecore.WithMargin(ttl/5)),
				leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) {
					if ev.Kind == leasecore.CampaignElected || ev.Kind == leasecore.CampaignResigned || ev.Kind == leasecore.CampaignLost {
						c.record(holder, fmt.Sprintf("%s token=%d", ev.Kind, ev.Token))
					}
				}))
			results <- campaignResult{holder, err}
		})
	}
	c.Notef("%d campaigners, each with its own lease client; ttl=%v; waiting by %s", campaigners, ttl, waiting)

	await := func(what string) election {
		select {
		case e := <-elected:
			return e
		case <-time.After(2*ttl + 5*time.Second):
			c.Fatalf("%s: no campaigner became leader within %v", what, 2*ttl+5*time.Second)
		case <-ctx.Done():
			c.Fatalf("%s: %v", what, ctx.Err())
		}
		return election{}
	}
	first := await("the first election")
	c.FirstToken(fmt.Sprintf("the first leader (%s) holds the lease's first token", first.holder), first.token)
	// The others keep waiting while the leader leads: no second election
	// within a quarter of the TTL (they are refused with ErrHeld).
	select {
	case e := <-elected:
		c.Check("I1", "while the first leader leads, nobody else is elected", false, "no election", fmt.Sprintf("%s elected with token %d", e.holder, e.token))
	case <-time.After(ttl / 4):
		c.Check("I1", "while the first leader leads, nobody else is elected", true, "no election", fmt.Sprintf("none in %v", ttl/4))
	}

	stepped := time.Now()
	close(stepDown[first.holder])
	second := await("the hand-off")
	handoff := second.at.Sub(stepped)
	c.Check("I1", "after the leader stepped down, another campaigner leads", second.holder != first.holder,
		"a holder other than "+first.holder, second.holder)
	c.NextToken("the new leader holds a larger token", first.token, second.token)
	c.Notef("hand-off: %s was elected %v after %s stepped down (waiting by %s)",
		second.holder, handoff.Round(time.Microsecond), first.holder, waiting)
	select {
	case e := <-elected:
		c.Check("I1", "exactly one waiter took over", false, "one election", fmt.Sprintf("another: %s with token %d", e.holder, e.token))
	case <-time.After(ttl / 4):
		c.Check("I1", "exactly one waiter took over", true, "one election", fmt.Sprintf("one election, none more in %v", ttl/4))
	}

	// Shut every campaign down: each returns its context's error, and the
	// lease ends free (the leader's Campaign released it).
	stopCampaigns()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ttl + 5*time.Second):
		c.Fatalf("the campaigns did not return within %v of their context's end", ttl+5*time.Second)
	}
	close(results)
	got := map[string]string{}
	for r := range results {
		got[r.holder] = errKind(r.err)
	}
	want := map[string]string{}
	for holder := range stepDown {
		want[holder] = errKind(context.Canceled)
	}
	want[first.holder] = errKind(nil)
	c.Equal("campaign", "the leader that stepped down got nil from Campaign; every other campaign returned its context's error",
		fmt.Sprint(want), fmt.Sprint(got))
	c.Equal("I1", "at no moment did two campaigners lead at once", int32(1), maxActive.Load())
	_, insp := c.openLease(h)
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the lease after the campaigns ended")
	c.Equal("campaign", "the last leader's campaign released the lease when it ended", "held=false", fmt.Sprintf("held=%t", st.Held))
}
