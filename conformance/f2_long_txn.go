package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF2 shows why lease operations must run in autocommit: inside a long
// transaction PostgreSQL's now() is the transaction's start time, so an
// acquire there judges expiry by a stale clock. It also shows the converse
// rule of tokens: one token is one continuous holding period, so a second
// write with an equal token is accepted.
func caseF2(ctx context.Context, c *caseRun, h Harness) {
	c.Section("long transaction now()", func(c *caseRun) {
		lt := need[LongTransactions](c, h, AbilityLongTransaction)
		lease, insp := c.openLease(h)
		ttl := c.ttl(300 * time.Millisecond)

		sent := time.Now()
		ga, err := lease.Acquire(ctx, leaseName, holderA, ttl)
		c.Must(err, "holder-a acquires")
		// The transaction starts while the lease is held, so its now()
		// stays before the expiry for as long as it is open.
		tx, err := lt.BeginLongTransaction(ctx)
		c.Must(err, "begin the long transaction")
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		now0, err := tx.Now(ctx)
		c.Must(err, "now() in the transaction")

		began := time.Now()
		freeAt := c.waitFree(insp, leaseName, ttl, sent, "holder-a's hold, never renewed,", "its acquire")
		c.Notef("an autocommit read saw the lease expire %v after the transaction began (ttl %v)", freeAt.Sub(began).Round(time.Millisecond), ttl)

		now1, err := tx.Now(ctx)
		c.Must(err, "now() in the transaction, again")
		clock1, err := tx.ClockNow(ctx)
		c.Must(err, "clock_timestamp() in the transaction")
		c.Equal("clock", "now() does not advance within one transaction", now0.UTC().Format(time.RFC3339Nano), now1.UTC().Format(time.RFC3339Nano))
		c.Check("clock", "clock_timestamp() has moved past now()", clock1.After(now1),
			"clock_timestamp() > now()", fmt.Sprintf("clock_timestamp()-now()=%v", clock1.Sub(now1).Round(time.Millisecond)))

		_, err = tx.Acquire(ctx, leaseName, holderB, ttl)
		c.Equal("I1", "an autocommit read sees the lease expired, yet an acquire inside the long transaction is refused (it judges expiry at the transaction's start)",
			"ErrHeld", errKind(err))
		c.Must(tx.Rollback(ctx), "roll back the long transaction")

		gb, err := lease.Acquire(ctx, leaseName, holderB, ttl)
		c.Must(err, "holder-b acquires in autocommit")
		c.NextToken("in autocommit the acquire succeeds", ga.Token, gb.Token)
	})

	c.Section("equal token", func(c *caseRun) {
		lease, _ := c.openLease(h)
		res := c.openResource(h)
		const name = "daily-report-equal-token"
		g, err := lease.Acquire(ctx, name, holderA, c.ttl(5*time.Second))
		c.Must(err, "holder-a acquires "+name)
		w := leasecore.Write{Scope: name, Part: partSummary, Content: "rows=1(A, first pass)", Writer: holderA, Token: g.Token}
		r1 := c.write(res, w)
		w.Content = "rows=2(A, second pass)"
		r2 := c.write(res, w)
		c.Equal("I3", fmt.Sprintf("a repeated write with an equal token=%d is accepted (one token = one holding period, many writes)", g.Token),
			"first=true second=true", fmt.Sprintf("first=%t second=%t", r1.Accepted, r2.Accepted))
		p, ok := c.readPart(res, name, partSummary)
		c.Equal("I3", "the second write's content is stored", "rows=2(A, second pass) by holder-a token="+g.Token.String(), describePart(p, ok))
		c.Must(lease.Release(ctx, g), "holder-a releases")
	})
}
