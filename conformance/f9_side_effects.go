package conformance

import (
	"context"
	"fmt"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF9 shows what deduplication by business key does for a side effect
// that cannot check tokens: it keeps one publication, the first to arrive,
// not the newest. When the stale holder arrives first, its content stays.
// The fenced resource, given the same two orders, keeps the newest in both.
func caseF9(ctx context.Context, c *caseRun, h Harness) {
	const publication = "report-published"
	// Each order has its own scope, so the fenced run of one order does not
	// see the floor the other left behind.
	stale := func(key string) leasecore.Write {
		return leasecore.Write{Scope: key, Part: publication, Content: "report(A-stale)", Writer: holderA, Token: 1}
	}
	fresh := func(key string) leasecore.Write {
		return leasecore.Write{Scope: key, Part: publication, Content: "report(B)", Writer: holderB, Token: 2}
	}
	type order struct {
		name, key     string
		first, second func(string) leasecore.Write
	}
	orders := []order{
		{"order B->A", "daily-report-b-then-a", fresh, stale},
		{"order A->B", "daily-report-a-then-b", stale, fresh},
	}
	run := func(c *caseRun, res Resource, o order) (r1, r2 leasecore.Result, kept leasecore.StoredPart, ok bool) {
		r1 = c.write(res, o.first(o.key))
		r2 = c.write(res, o.second(o.key))
		kept, ok = c.readPart(res, o.key, publication)
		return r1, r2, kept, ok
	}

	c.Section("idempotent publication (negative control)", func(c *caseRun) {
		controls := need[NegativeControls](c, h, AbilityNegativeControls)
		pub, err := controls.IdempotentPublisher(ctx)
		c.Must(err, "open the idempotent publisher")

		bFirst, aSecond, kept, _ := run(c, pub, orders[0])
		c.Equal("F9", "order B->A: A's duplicate publication is dropped by the business key",
			"B accepted=true, A accepted=false, kept report(B)",
			fmt.Sprintf("B accepted=%t, A accepted=%t, kept %s", bFirst.Accepted, aSecond.Accepted, kept.Content))

		aFirst, bSecond, kept, ok := run(c, pub, orders[1])
		c.Notef("order A->B: A accepted=%t, B accepted=%t, kept %s", aFirst.Accepted, bSecond.Accepted, describePart(kept, ok))
		c.Exposes("idempotency keeps one publication, not the newest: the stale holder arrived first and its content stays",
			ok && kept.Writer == holderA && !bSecond.Accepted, "kept "+describePart(kept, ok))
	})

	c.Section("fenced resource, same two orders", func(c *caseRun) {
		res := c.openResource(h)
		for _, o := range orders {
			r1, r2, kept, ok := run(c, res, o)
			c.Equal("I3", o.name+": the fenced resource keeps the newest content",
				"report(B) by holder-b token=2", describePart(kept, ok))
			c.Notef("%s: first accepted=%t, second accepted=%t", o.name, r1.Accepted, r2.Accepted)
		}
	})
}
