package conformance

import (
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// X2's sections on lost answers (AmbiguousOutcomes): the state an operation
// left although its caller was told it failed.

// x2RetriedRelease: holder-a's release takes effect but its answer is lost;
// holder-b acquires; holder-a retries its release, as a caller does after
// ErrUnavailable. The retry must fail with ErrLost and leave holder-b's
// hold alone. A release that deletes by name ends holder-b's hold instead,
// and a third holder gets in while holder-b still believes it holds the
// lease (etcd issue #22082, SOURCES.md).
func x2RetriedRelease(c *caseRun, h Harness) {
	ao := need[AmbiguousOutcomes](c, h, AbilityAmbiguousOutcomes)
	ctx := c.ctx
	lease, insp := c.openLease(h)
	amb, loseNextAnswer, err := ao.AmbiguousLease(ctx)
	c.Must(err, "open a lease client whose answers can be lost")
	const name = "x2-retried"
	long := c.ttl(x2Long)

	// Acquiring through the client also warms it up for the release.
	ga, err := amb.Acquire(ctx, name, holderA, long)
	c.Must(err, "holder-a acquires "+name+" through that client")
	loseNextAnswer()
	err = amb.Release(ctx, ga)
	if !c.Check(c.id, "holder-a's release whose answer is lost returns an error: holder-a cannot tell that it took effect",
		err != nil, "an error", errKind(err)) {
		c.stop()
	}
	// Without this the retry below would rightly succeed: the experiment
	// needs a release that took effect.
	if !c.Equal(c.id, "holder-a's release whose answer was lost took effect on the server", freeState, c.holdState(insp, name)) {
		c.stop()
	}

	gb, err := lease.Acquire(ctx, name, holderB, long)
	c.Must(err, "holder-b acquires "+name)
	c.NextToken("holder-b acquires the released lease with a larger token", ga.Token, gb.Token)
	hb := heldBy(holderB, gb.Token)
	err = c.untilAvailable(func() error { return amb.Release(ctx, ga) })
	c.holdCall("I1", "holder-a's retried release (its first release took effect, its answer was lost) fails with ErrLost; holder-b's hold is unaffected",
		insp, name, errKind(leasecore.ErrLost), hb, errKind(err))
	g, err := lease.Acquire(ctx, name, "holder-c", long)
	c.holdCall("I1", "holder-c's acquire after the retry is refused with ErrHeld: holder-b still holds the lease",
		insp, name, errKind(leasecore.ErrHeld), hb, granted(g, err))
	c.Must(lease.Release(ctx, gb), "holder-b releases "+name)
}

// x2LostAcquire: holder-g holds x2-keep through a client; its acquire of
// x2-ghost through the same client takes effect but the answer is lost, so
// holder-g never learns it may hold x2-ghost and will never release it.
// holder-g goes on renewing x2-keep through that client. x2-ghost must be
// free within its TTL of that acquire: a client library that keeps the
// lost acquire's hold in its session (renewed with the holder's other
// names) leaves a holder nobody knows of, for ever.
func x2LostAcquire(c *caseRun, h Harness) {
	ao := need[AmbiguousOutcomes](c, h, AbilityAmbiguousOutcomes)
	ctx := c.ctx
	lease, insp := c.openLease(h)
	amb, loseNextAnswer, err := ao.AmbiguousLease(ctx)
	c.Must(err, "open a lease client whose answers can be lost")
	const keep, ghost, holderG = "x2-keep", "x2-ghost", "holder-g"
	// One TTL for both names: a holder's names that share a TTL are the
	// ones a session-based client would attach to one server-side lease.
	ttl := c.ttl(x2Short)

	gk, err := amb.Acquire(ctx, keep, holderG, ttl)
	c.Must(err, "holder-g acquires "+keep+" through that client")
	loseNextAnswer()
	sent := time.Now()
	g, err := amb.Acquire(ctx, ghost, holderG, ttl)
	if !c.Check(c.id, fmt.Sprintf("holder-g's acquire of %s whose answer is lost returns an error: holder-g cannot tell that it may hold %s", ghost, ghost),
		err != nil, "an error", granted(g, err)) {
		c.stop()
	}
	c.Notef("right after the lost acquire %s is %s (the acquire took effect unless the client undid it)", ghost, c.holdState(insp, ghost))

	every := ttl / 4
	last := time.Now()
	var renewErr error
	renewKeep := func() {
		if renewErr != nil || time.Since(last) < every {
			return
		}
		last = time.Now()
		g, err := amb.Renew(ctx, gk)
		switch {
		case err == nil:
			gk = g
		case errors.Is(err, leasecore.ErrUnavailable):
			// The client is reconnecting after the cut; the next
			// tick tries again.
		default:
			renewErr = err
		}
	}
	c.awaitFree(insp, ghost, ttl, sent,
		fmt.Sprintf("%s, acquired by holder-g with the answer lost, while holder-g renews %s through the same client every %v,", ghost, keep, every),
		"that acquire", renewKeep)
	if renewErr != nil {
		// A client that took longer than the TTL to reconnect lost
		// x2-keep; the check above still held, with fewer renewals.
		c.Notef("holder-g's renewal of %s failed during the wait (%s): it was not renewed after that", keep, describeErr(renewErr))
	}
	// holder-b's hold is not under test: a long TTL, so that a slow
	// machine cannot let it lapse before its release.
	gb, err := lease.Acquire(ctx, ghost, holderB, c.ttl(x2Long))
	c.Must(err, "holder-b acquires "+ghost+" after it was seen free")
	c.Must(lease.Release(ctx, gb), "holder-b releases "+ghost)
	// Best effort: x2-keep may have lapsed while the client reconnected.
	_ = c.untilAvailable(func() error { return amb.Release(ctx, gk) })
}
