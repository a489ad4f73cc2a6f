package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

const holderC = "holder-c"

// caseF16 crashes the member of a replicated deployment that serves writes
// and lets another member serve: the boundary the lease-fencing article
// (SOURCES.md) names for I2 ("the token increment must be durable; a
// failover to a replica that lacks it reissues tokens") but never
// constructs.
//
// With synchronous replication (PostgreSQL: synchronous_commit=on and the
// standby in synchronous_standby_names; etcd: a 3-member cluster, whose
// Raft quorum acknowledges nothing a majority lacks) every acknowledged
// grant and floor raise is on the promoted member: the lease, the floor and
// the token counter survive, the next token is larger, stale holders are
// rejected. The negative control promotes an asynchronous standby that was
// held back before the crash: it never saw the last grant, so it hands the
// same token out again, and the fence, whose floor went back with it,
// accepts both holders of that token.
func caseF16(ctx context.Context, c *caseRun, h Harness) {
	rp := need[Replicas](c, h, AbilityReplicas)
	c.Section("synchronous replication", func(c *caseRun) { f16Synchronous(ctx, c, rp) })
	c.Section("negative control: asynchronous standby", func(c *caseRun) { f16Asynchronous(ctx, c, rp) })
}

// f16Clients is one replicated deployment with the clients the case uses.
type f16Clients struct {
	rs    ReplicaSet
	lease leasecore.Lease
	insp  leasecore.LeaseInspector
	res   Resource
}

// startReplicas starts a deployment in mode and opens its clients; a
// backend without the mode skips the section with its reason.
func (c *caseRun) startReplicas(rp Replicas, mode ReplicationMode) f16Clients {
	rs, err := rp.StartReplicas(c.ctx, mode)
	if errors.Is(err, errors.ErrUnsupported) {
		c.Skip(fmt.Sprintf("%s replication: %v", mode, err))
	}
	c.Must(err, fmt.Sprintf("start a deployment with %s replication", mode))
	c.Notef("deployment: %s", rs.Describe())
	lease, err := rs.OpenLease(c.ctx)
	c.Must(err, "open a lease client on the deployment")
	insp, ok := lease.(leasecore.LeaseInspector)
	if !ok {
		c.Fatalf("the deployment's lease client %T does not implement leasecore.LeaseInspector", lease)
	}
	res, err := rs.OpenResource(c.ctx)
	c.Must(err, "open a fenced resource on the deployment")
	return f16Clients{rs: rs, lease: lease, insp: insp, res: res}
}

// failover runs the deployment's failover and waits until the lease
// service answers again; it returns the lease's state then and the moment
// of that first answer (from which a hold, whatever the backend did with
// it during the downtime, ends within its TTL).
func (c *caseRun) failover(d f16Clients, name string) (leasecore.LeaseState, time.Time) {
	how, downtime, err := d.rs.Failover(c.ctx)
	c.Must(err, "fail over")
	c.Notef("failover: %s; writes unavailable for %v", how, downtime.Round(time.Millisecond))
	var st leasecore.LeaseState
	c.retryUnavailable("inspect the lease after the failover", func() (err error) {
		st, err = d.insp.Inspect(c.ctx, name)
		return err
	})
	return st, time.Now()
}

// acquireAfterFailover acquires name once the hold found after the
// failover is over, retrying while the clients reconnect.
func (c *caseRun) acquireAfterFailover(d f16Clients, name, holder string, ttl time.Duration, backAt time.Time, hold string) leasecore.Grant {
	c.waitFree(d.insp, name, ttl, backAt, hold, "the first answer after the failover")
	var g leasecore.Grant
	c.retryUnavailable(holder+" acquires after the failover", func() (err error) {
		g, err = d.lease.Acquire(c.ctx, name, holder, ttl)
		return err
	})
	return g
}

func f16Synchronous(ctx context.Context, c *caseRun, rp Replicas) {
	const name = "daily-report-f16-sync"
	d := c.startReplicas(rp, ReplicationSynchronous)
	ttl := c.ttl(1500 * time.Millisecond)

	ga, err := d.lease.Acquire(ctx, name, holderA, ttl)
	c.Must(err, "holder-a acquires")
	c.FirstToken("holder-a acquires the free lease", ga.Token)
	ra := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=400(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's write with token=%d is accepted", ga.Token), true, ra.Accepted)
	c.Must(d.lease.Release(ctx, ga), "holder-a releases")
	gb, err := d.lease.Acquire(ctx, name, holderB, ttl)
	c.Must(err, "holder-b acquires")
	c.NextToken("holder-b acquires next", ga.Token, gb.Token)
	rb := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=401(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's write with token=%d is accepted before the crash", gb.Token), true, rb.Accepted)

	st, backAt := c.failover(d, name)
	c.Equal("I2", "the lease is on the promoted member: holder-b with its token",
		fmt.Sprintf("%s/%d", holderB, gb.Token), fmt.Sprintf("%s/%d", st.Holder, st.Token))
	var floor leasecore.Token
	c.retryUnavailable("read the floor after the failover", func() (err error) {
		floor, err = d.res.Floor(ctx, name)
		return err
	})
	c.Equal("I3", "the floor is on the promoted member", gb.Token, floor)

	gc := c.acquireAfterFailover(d, name, holderC, ttl, backAt, "holder-b's hold, never renewed,")
	c.NextToken(fmt.Sprintf("holder-c's token after the failover is larger than every token handed out before it (%d, %d): none is reused", ga.Token, gb.Token),
		gb.Token, gc.Token)
	rc := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=402(C)", Writer: holderC, Token: gc.Token})
	c.Equal("I3", fmt.Sprintf("holder-c's write with token=%d is accepted", gc.Token), true, rc.Accepted)
	for _, stale := range []struct {
		holder  string
		token   leasecore.Token
		content string
	}{{holderB, gb.Token, "rows=401(B)"}, {holderA, ga.Token, "rows=400(A)"}} {
		r := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: stale.content, Writer: stale.holder, Token: stale.token})
		c.Check("I3", fmt.Sprintf("%s's late write with token=%d, issued before the crash, is rejected", stale.holder, stale.token), !r.Accepted,
			fmt.Sprintf("accepted=false floor=%d", gc.Token), fmt.Sprintf("accepted=%t floor=%d", r.Accepted, r.Floor))
	}
	p, ok := c.readPart(d.res, name, partSummary)
	c.Equal("I3", "the part holds holder-c's content", fmt.Sprintf("rows=402(C) by %s token=%d", holderC, gc.Token), describePart(p, ok))
}

func f16Asynchronous(ctx context.Context, c *caseRun, rp Replicas) {
	const name = "daily-report-f16-async"
	d := c.startReplicas(rp, ReplicationAsynchronous)
	ttl := c.ttl(1500 * time.Millisecond)

	ga, err := d.lease.Acquire(ctx, name, holderA, ttl)
	c.Must(err, "holder-a acquires")
	ra := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=500(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's write with token=%d is accepted", ga.Token), true, ra.Accepted)
	// The standby has everything so far, then falls behind: from here on
	// the primary acknowledges commits the standby never receives.
	c.Must(d.rs.HoldBackStandby(ctx), "hold back the standby")
	c.Notef("the standby has applied holder-a's grant and write, and is held back from here on")
	c.Must(d.lease.Release(ctx, ga), "holder-a releases (acknowledged by the primary only)")
	gb, err := d.lease.Acquire(ctx, name, holderB, ttl)
	c.Must(err, "holder-b acquires (acknowledged by the primary only)")
	c.NextToken("holder-b acquires next", ga.Token, gb.Token)
	rb := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=501(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's write with token=%d is accepted before the crash", gb.Token), true, rb.Accepted)

	st, backAt := c.failover(d, name)
	var floor leasecore.Token
	c.retryUnavailable("read the floor after the failover", func() (err error) {
		floor, err = d.res.Floor(ctx, name)
		return err
	})
	c.Notef("after the failover the lease reads held=%t by %s token=%d and the floor reads %d: holder-a's release, holder-b's grant and its write were acknowledged, and are gone",
		st.Held, backendkit.Quote(st.Holder), st.Token, floor)

	gc := c.acquireAfterFailover(d, name, holderC, ttl, backAt, "the hold found after the failover")
	c.Exposes(fmt.Sprintf("the promoted asynchronous standby hands out token %d again: holder-b got it before the crash, holder-c after the failover", gb.Token),
		gc.Token <= gb.Token, fmt.Sprintf("holder-b token=%d acknowledged before the crash; holder-c token=%d", gb.Token, gc.Token))

	// What the fence then does: its floor went back with the standby, so
	// it cannot tell the two holders of one token apart. holder-c writes
	// first; holder-b, which still believes in its grant, writes late.
	rc := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=502(C)", Writer: holderC, Token: gc.Token})
	rb2 := c.write(d.res, leasecore.Write{Scope: name, Part: partSummary, Content: "rows=501(B)", Writer: holderB, Token: gb.Token})
	p, ok := c.readPart(d.res, name, partSummary)
	c.Exposes("the fence accepts both holders of the reissued token: holder-b's late write overwrites holder-c's",
		rc.Accepted && rb2.Accepted && ok && p.Writer == holderB,
		fmt.Sprintf("holder-c token=%d accepted=%t; holder-b token=%d accepted=%t; summary: %s", gc.Token, rc.Accepted, gb.Token, rb2.Accepted, describePart(p, ok)))
	c.Notef("a failover may only promote a member that has every acknowledged commit (LIMITS.md, evidence/26)")
}
