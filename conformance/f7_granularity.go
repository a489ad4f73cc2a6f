package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF7 checks that the fence covers the whole scope. A (token a) wrote
// summary and lost the lease; B (token b > a) rewrote only summary; A then
// writes detail, a part B never touched. A per-row comparison has no old
// token to compare with on a new row and accepts it (negative control);
// the scope floor rejects it.
func caseF7(ctx context.Context, c *caseRun, h Harness) {
	c.Section("row-level fence (negative control)", func(c *caseRun) {
		controls := need[NegativeControls](c, h, AbilityNegativeControls)
		res, err := controls.RowFencedResource(ctx)
		c.Must(err, "open the row-fenced resource")
		const name = "daily-report-f7-row"
		detail, tokA, _ := c.granularityTimeline(h, "FENCED_ROW", name, res)
		p, ok := c.readPart(res, name, partDetail)
		c.Exposes("a row-level comparison only sees the row being written; detail is a new row with no old token, so the stale holder's write is accepted",
			detail.Accepted && ok && p.Token == tokA, "detail="+describePart(p, ok))
	})

	c.Section("scope-level fence", func(c *caseRun) { scopeFence(c, h, partStore) })
}

// caseF7u is F7's scope-level fence over the suite's own user tables: A's
// detail rows, a part B never wrote, are rejected by the scope's floor.
func caseF7u(ctx context.Context, c *caseRun, h Harness) { scopeFence(c, h, userTables) }

// scopeFence runs F7's timeline against target t and checks that the
// scope floor rejects the stale holder's new part.
func scopeFence(c *caseRun, h Harness, t target) {
	res := t.open(c, h, nil)
	c.noteUserTarget(t)
	detail, tokA, tokB := c.granularityTimeline(h, "FENCED_SCOPE", scope, res)
	c.Check("I3", fmt.Sprintf("the scope floor rejects A's detail: token %d is below the floor %d set by B's summary", tokA, tokB),
		!detail.Accepted, fmt.Sprintf("accepted=false floor=%d", tokB), fmt.Sprintf("accepted=%t floor=%d", detail.Accepted, detail.Floor))
	c.Equal("I3", "detail was never written", "(none)", c.stored(res, scope, partDetail))
}

// granularityTimeline is F7's timeline on scope name: A writes summary and
// loses the lease; B acquires and rewrites summary only; A writes detail.
// It returns the detail write's result and both tokens.
func (c *caseRun) granularityTimeline(h Harness, label, name string, res Resource) (detail leasecore.Result, tokA, tokB leasecore.Token) {
	ctx := c.ctx
	lease, insp := c.openLease(h)
	short := c.ttl(300 * time.Millisecond)
	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, short)
	c.Must(err, "holder-a acquires "+name)
	ra := c.write(res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.waitFree(insp, name, short, sent, "holder-a's hold of "+name+", never renewed,", "its acquire") // A loses the lease
	gb, err := lease.Acquire(ctx, name, holderB, c.ttl(5*time.Second))
	c.Must(err, "holder-b acquires "+name)
	rb := c.write(res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=101(B)", Writer: holderB, Token: gb.Token})
	detail = c.write(res, leasecore.Write{Scope: name, Part: partDetail, Content: "detail(A)", Writer: holderA, Token: ga.Token})
	c.Notef("%s: A(token=%d) summary accepted=%t; B(token=%d) summary accepted=%t; A(token=%d) detail accepted=%t",
		label, ga.Token, ra.Accepted, gb.Token, rb.Accepted, ga.Token, detail.Accepted)
	return detail, ga.Token, gb.Token
}
