package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF1 runs the whole life of a lease in one process: holder-a acquires,
// writes, renews and releases; holder-b acquires at once with a larger
// token and writes; the floor ends at holder-b's token.
func caseF1(ctx context.Context, c *caseRun, h Harness) { normalPath(ctx, c, h, partStore) }

// caseF1u is F1 writing the suite's own user tables through the fence.
func caseF1u(ctx context.Context, c *caseRun, h Harness) { normalPath(ctx, c, h, userTables) }

func normalPath(ctx context.Context, c *caseRun, h Harness, t target) {
	res := t.open(c, h, nil)
	c.noteUserTarget(t)
	lease, insp := c.openLease(h)
	ttl := c.ttl(5 * time.Second)

	ga, err := lease.Acquire(ctx, leaseName, holderA, ttl)
	c.Must(err, "holder-a acquires the free lease")
	c.FirstToken("holder-a acquires the free lease", ga.Token)

	_, err = lease.Acquire(ctx, leaseName, holderB, ttl)
	c.Equal("I1", "holder-b's acquire while holder-a holds the lease is refused", "ErrHeld", errKind(err))

	r := c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's write with token=%d is accepted", ga.Token), true, r.Accepted)

	renewed, err := lease.Renew(ctx, ga)
	c.Must(err, "holder-a renews")
	c.Equal("I2", "renewal keeps the token (one token = one holding period)", ga.Token, renewed.Token)

	c.Must(lease.Release(ctx, renewed), "holder-a releases")
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect after release")
	if st.Exists {
		c.Equal("I1", "after the release the lease is free, its token kept",
			fmt.Sprintf("held=false released=true token=%d", ga.Token),
			fmt.Sprintf("held=%t released=%t token=%d", st.Held, st.Released, st.Token))
	} else {
		c.Equal("I1", "after the release the lease is free", "held=false", fmt.Sprintf("held=%t", st.Held))
		c.Notef("the backend keeps no record of a released lease; the next token still comes from its own counter")
	}

	_, err = lease.Renew(ctx, renewed)
	c.Equal("I1", "holder-a's renewal after its release fails: it must acquire again", "ErrLost", errKind(err))
	err = lease.Release(ctx, renewed)
	c.Equal("I1", "a second release by holder-a fails and changes nothing", "ErrLost", errKind(err))

	gb, err := lease.Acquire(ctx, leaseName, holderB, ttl)
	c.Must(err, "holder-b acquires right after the release")
	c.NextToken("holder-b acquires right after the release, with a larger token", ga.Token, gb.Token)

	r = c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=101(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's write with token=%d is accepted", gb.Token), true, r.Accepted)

	r = c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.Check("I3", fmt.Sprintf("holder-a's late write with token=%d is rejected", ga.Token), !r.Accepted,
		fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", r.Accepted, r.Floor))

	c.Equal("I3", "the resource's floor is holder-b's token", gb.Token, c.floor(res, scope))
	c.Equal("I3", "summary holds holder-b's content", "rows=101(B) by holder-b token="+gb.Token.String(), c.stored(res, scope, partSummary))
	c.Must(lease.Release(ctx, gb), "holder-b releases")
}
