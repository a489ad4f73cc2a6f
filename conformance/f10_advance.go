package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF10u checks advance on the suite's own user tables: a new holder
// raises the scope's floor right after it acquires, without writing data,
// and so cuts the old holder off from every part at once, including those
// the new holder has not written yet. (Without advance a stale holder can
// still write such a part until the new holder's first write: F7's
// timeline with B's summary write taken away.)
func caseF10u(ctx context.Context, c *caseRun, h Harness) {
	res := c.openUserResource(h, nil)
	c.noteUserTarget(userTables)
	lease, insp := c.openLease(h)

	short := c.ttl(300 * time.Millisecond)
	sent := time.Now()
	ga, err := lease.Acquire(ctx, leaseName, holderA, short)
	c.Must(err, "holder-a acquires "+leaseName)
	ra := c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's summary with token=%d is accepted", ga.Token), true, ra.Accepted)
	summaryA := c.stored(res, scope, partSummary)

	c.waitFree(insp, leaseName, short, sent, "holder-a's hold, never renewed,", "its acquire") // A loses the lease
	gb, err := lease.Acquire(ctx, leaseName, holderB, c.ttl(5*time.Second))
	c.Must(err, "holder-b acquires "+leaseName)
	c.NextToken("holder-b acquires the expired lease with a larger token", ga.Token, gb.Token)

	adv := c.advance(res, leasecore.Claim{Scope: scope, Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's advance with token=%d is accepted and the floor is its token", gb.Token),
		fmt.Sprintf("accepted=true floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", adv.Accepted, adv.Floor))
	c.Equal("I3", "the fence's floor after the advance is holder-b's token", gb.Token, c.floor(res, scope))
	c.Equal("advance", "the advance wrote no data: summary still holds holder-a's rows", summaryA, c.stored(res, scope, partSummary))

	detail := c.write(res, leasecore.Write{Scope: scope, Part: partDetail, Content: "detail(A)", Writer: holderA, Token: ga.Token})
	c.Check("I3", fmt.Sprintf("holder-a's detail with token=%d, a part nobody wrote since the advance, is rejected", ga.Token),
		!detail.Accepted, fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", detail.Accepted, detail.Floor))
	c.Equal("I3", "no row of holder-a's detail exists", "(none)", c.stored(res, scope, partDetail))

	stale := c.advance(res, leasecore.Claim{Scope: scope, Writer: holderA, Token: ga.Token})
	c.Check("I3", fmt.Sprintf("holder-a's advance with the stale token=%d is rejected", ga.Token),
		!stale.Accepted, fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", stale.Accepted, stale.Floor))
	c.Equal("I3", "the rejected advance left the floor at holder-b's token", gb.Token, c.floor(res, scope))

	again := c.advance(res, leasecore.Claim{Scope: scope, Writer: holderB, Token: gb.Token})
	c.Equal("I3", "holder-b advancing again with its own token is accepted (an equal token is the same holding period)",
		fmt.Sprintf("accepted=true floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", again.Accepted, again.Floor))
	rb := c.write(res, leasecore.Write{Scope: scope, Part: partDetail, Content: "detail(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", "holder-b's own detail after its advance is accepted and stored",
		fmt.Sprintf("accepted=true, detail(B) by holder-b token=%d", gb.Token),
		fmt.Sprintf("accepted=%t, %s", rb.Accepted, c.stored(res, scope, partDetail)))
	c.Must(lease.Release(ctx, gb), "holder-b releases")
}

// advance raises a scope's floor, ending the case on an error (a rejection
// is not an error).
func (c *caseRun) advance(res UserResource, cl leasecore.Claim) leasecore.Result {
	r, err := res.Advance(c.ctx, cl)
	c.Must(err, fmt.Sprintf("advance %s by %s with token %d", cl.Scope, cl.Writer, cl.Token))
	return r
}
