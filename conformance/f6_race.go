package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// raceA and raceB are F6's two writers: A holds token 1 and old data, B
// token 2 and new data.
func raceA(scope string) leasecore.Write {
	return leasecore.Write{Scope: scope, Part: partSummary, Content: "old(A)", Writer: holderA, Token: 1}
}

func raceB(scope string) leasecore.Write {
	return leasecore.Write{Scope: scope, Part: partSummary, Content: "new(B)", Writer: holderB, Token: 2}
}

// caseF6 runs one interleaving against two designs. (a) check-then-write,
// a negative control: A (token 1) reads the floor and pauses; B (token 2)
// reads the same floor, writes; A resumes and writes, moving the floor back.
// (b) the conditional floor update: A advances the floor and pauses before
// committing; B waits on A's lock and, once A commits, is judged against
// the advanced floor. Both orders keep I3.
func caseF6(ctx context.Context, c *caseRun, h Harness) {
	c.Section("a: check-then-write (negative control)", func(c *caseRun) {
		controls := need[NegativeControls](c, h, AbilityNegativeControls)
		const scope = "daily-report-f6a"
		l := newLatch(holderA)
		res, err := controls.CheckThenWriteResource(ctx, l.gap)
		c.Must(err, "open the check-then-write resource")

		aDone := goWrite(ctx, res, raceA(scope))
		c.waitPaused(l) // A has read the floor (0) and decided to write
		rb := c.write(res, raceB(scope))
		close(l.release)
		ra := c.await(aDone, "A's write")

		floor := c.floor(res, scope)
		p, ok := c.readPart(res, scope, partSummary)
		c.Notef("check-then-write: B accepted=%t, A accepted=%t, final %s, floor=%d", rb.Accepted, ra.Accepted, describePart(p, ok), floor)
		c.Exposes("A's check was stale when it wrote: the old token overwrote the new result and the floor moved back from 2 to 1",
			ra.Accepted && floor == 1 && ok && p.Token == 1,
			fmt.Sprintf("floor=%d, summary=%s", floor, describePart(p, ok)))
	})

	c.Section("b: conditional floor update", func(c *caseRun) { conditionalRace(ctx, c, h, partStore, "daily-report-f6b") })
}

// caseF6u is F6(b) writing the suite's own user tables through the fence:
// the check and the user rows are one transaction (Txn), paused between
// the check and the commit.
func caseF6u(ctx context.Context, c *caseRun, h Harness) {
	need[UserDataResources](c, h, AbilityUserData) // before the commit-gap and lock-wait abilities
	c.noteUserTarget(userTables)
	conditionalRace(ctx, c, h, userTables, "daily-report-f6u")
}

// conditionalRace is F6(b) against target t: A (token 1) and B (token 2),
// in both orders, the first paused inside its write after the fence check
// and before the commit; the second is judged against the floor the first
// left. A backend that declares AbilityCommitGap absent runs the atomic
// analogue: the two orders in which the requests can arrive.
func conditionalRace(ctx context.Context, c *caseRun, h Harness, t target, prefix string) {
	orders := []struct {
		name          string
		first, second leasecore.Write
	}{
		{"A then B", raceA(prefix + "-ab"), raceB(prefix + "-ab")},
		{"B then A", raceB(prefix + "-ba"), raceA(prefix + "-ba")},
	}
	if reason, absent := c.traits.Absent[AbilityCommitGap]; absent {
		// No open transaction to pause: the compare and the write are
		// one atomic request. The interleaving collapses to the two
		// orders in which the requests can arrive; run both.
		c.emit(kindSkip, fmt.Sprintf("%s: %s", AbilityCommitGap, reason))
		c.Notef("atomic analogue: the same two writers, each one atomic compare-and-write, in both orders")
		res := t.open(c, h, nil)
		for _, o := range orders {
			r1 := c.write(res, o.first)
			r2 := c.write(res, o.second)
			c.checkRaceOutcome(res, o.name, o.first, o.second, r1, r2)
		}
		return
	}
	probe := need[LockWaitProbe](c, h, AbilityLockWaitProbe)
	for _, order := range orders {
		first, second := order.first, order.second
		l := newLatch(first.Writer)
		res := t.open(c, h, l.gap)

		firstDone := goWrite(ctx, res, first)
		c.waitPaused(l) // first has advanced the floor, not committed
		secondDone := goWrite(ctx, res, second)
		waits := c.waitLockWait(probe)
		c.Check("I3", fmt.Sprintf("%s: %s's write waits for the floor lock held by %s's open transaction", order.name, second.Writer, first.Writer),
			len(waits) > 0, "a lock wait", fmt.Sprint(waits))
		select {
		case o := <-secondDone:
			c.Fatalf("%s: %s's write returned (%+v) while %s's transaction was still open", order.name, second.Writer, o, first.Writer)
		default:
		}
		close(l.release)
		r1 := c.await(firstDone, first.Writer+"'s write")
		r2 := c.await(secondDone, second.Writer+"'s write")
		c.checkRaceOutcome(res, order.name, first, second, r1, r2)
	}
}

// checkRaceOutcome checks one order of F6(b): the second writer is judged
// against the floor the first left, and token 2's data wins either way.
func (c *caseRun) checkRaceOutcome(res Resource, order string, first, second leasecore.Write, r1, r2 leasecore.Result) {
	floor := c.floor(res, first.Scope)
	final := c.stored(res, first.Scope, partSummary)
	c.Notef("%s: %s accepted=%t, %s accepted=%t, final %s, floor=%d", order,
		first.Writer, r1.Accepted, second.Writer, r2.Accepted, final, floor)
	wantSecond := second.Token >= first.Token
	c.Equal("I3", fmt.Sprintf("%s: the second writer (token %d) is judged against the advanced floor", order, second.Token),
		fmt.Sprintf("first=true second=%t", wantSecond), fmt.Sprintf("first=%t second=%t", r1.Accepted, r2.Accepted))
	c.Equal("I3", order+": the final data is token 2's and the floor is 2",
		"new(B) by holder-b token=2, floor=2", fmt.Sprintf("%s, floor=%d", final, floor))
}

// waitLockWait polls the probe until some write waits for a lock. It
// observes the wait instead of assuming it after a sleep.
func (c *caseRun) waitLockWait(probe LockWaitProbe) []string {
	deadline := time.Now().Add(15 * time.Second)
	for {
		waits, err := probe.LockWaits(c.ctx)
		c.Must(err, "probe lock waits")
		if len(waits) > 0 || time.Now().After(deadline) {
			return waits
		}
		select {
		case <-c.ctx.Done():
			return nil
		case <-time.After(5 * time.Millisecond):
		}
	}
}
