package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF8 crashes the backend's server without a checkpoint and restarts it
// on the same data: the lease (holder and token) and the floor come back,
// the next acquire gets a larger token (I2 across a crash), and the old
// holder's write is rejected. On PostgreSQL the downtime counts against
// the TTL; etcd's leader refreshes lease TTLs when it takes office.
func caseF8(ctx context.Context, c *caseRun, h Harness) {
	cr := need[CrashRestarter](c, h, AbilityCrashRestart)
	lease, insp := c.openLease(h)
	res := c.openResource(h)
	ttl := c.ttl(1500 * time.Millisecond)

	g1, err := lease.Acquire(ctx, leaseName, holderB, ttl)
	c.Must(err, "holder-b acquires")
	c.FirstToken("holder-b acquires the free lease", g1.Token)
	c.Must(lease.Release(ctx, g1), "holder-b releases")
	ga, err := lease.Acquire(ctx, leaseName, holderA, ttl)
	c.Must(err, "holder-a acquires")
	c.NextToken("holder-a acquires next", g1.Token, ga.Token)
	r := c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=300(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's write with token=%d is accepted before the crash", ga.Token), true, r.Accepted)

	how, downtime, err := cr.CrashRestart(ctx)
	c.Must(err, "crash and restart the server")
	c.Notef("crash: %s; down for %v", how, downtime.Round(time.Millisecond))

	var st leasecore.LeaseState
	c.retryUnavailable("inspect the lease after the restart", func() (err error) {
		st, err = insp.Inspect(ctx, leaseName)
		return err
	})
	// The server answers, so it is back (etcd: a leader is in office,
	// which restarted the TTLs of the leases it found): whatever the
	// backend does with the downtime, the hold ends within the TTL of
	// this moment.
	backAt := time.Now()
	c.Equal("I2", "the lease is back after recovery: holder-a with its token",
		fmt.Sprintf("%s/%d", holderA, ga.Token), fmt.Sprintf("%s/%d", st.Holder, st.Token))
	c.Notef("after the restart the lease is held=%t with %v left of its ttl %v (down for %v): whether downtime counts against the TTL is the backend's choice",
		st.Held, st.Remaining.Round(time.Millisecond), ttl, downtime.Round(time.Millisecond))
	var floor leasecore.Token
	c.retryUnavailable("read the floor after the restart", func() (err error) {
		floor, err = res.Floor(ctx, scope)
		return err
	})
	c.Equal("I3", "the floor is back after recovery", ga.Token, floor)

	c.waitFree(insp, leaseName, ttl, backAt, "holder-a's hold, never renewed,", "the server's first answer after the restart")
	var gb leasecore.Grant
	c.retryUnavailable("holder-b acquires after the restart", func() (err error) {
		gb, err = lease.Acquire(ctx, leaseName, holderB, ttl)
		return err
	})
	c.NextToken("the next acquire after the restart gets a larger token: no reuse", ga.Token, gb.Token)
	rb := c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=301(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's write with token=%d is accepted", gb.Token), true, rb.Accepted)
	ra := c.write(res, leasecore.Write{Scope: scope, Part: partSummary, Content: "rows=300(A)", Writer: holderA, Token: ga.Token})
	c.Check("I3", fmt.Sprintf("holder-a's write with token=%d is rejected", ga.Token), !ra.Accepted,
		fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", ra.Accepted, ra.Floor))
}

// retryUnavailable runs fn until it stops failing with ErrUnavailable (the
// clients reconnecting after a restart), for at most 30 seconds.
func (c *caseRun) retryUnavailable(what string, fn func() error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if !errors.Is(err, leasecore.ErrUnavailable) || time.Now().After(deadline) {
			c.Fatalf("%s: %v", what, err)
		}
		sleep(c.ctx, 50*time.Millisecond)
	}
}
