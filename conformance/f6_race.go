package conformance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
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

// caseF6u is F6(b)'s interleaving on the suite's own user tables written
// through the fence, whose transaction (Txn) decides at commit: the first
// writer pauses after its rows, before its commit, and the second writer
// never waits on the fence for it. A then B: B's token reaches the floor
// while A's transaction is open, and A's commit is then rejected. B then
// A: A's write returns while B's transaction is open (rejected by the
// floor B already raised, or accepted before B commits: either keeps I3).
// Unlike F6(b)'s part store, whose write is one statement, a transaction
// the caller fills can be held open by a paused client for any length of
// time; a check that held the floor row for it would make every newer
// writer wait (F18's negative control).
func caseF6u(ctx context.Context, c *caseRun, h Harness) {
	need[UserDataResources](c, h, AbilityUserData) // before the commit-gap ability
	c.noteUserTarget(userTables)
	const prefix = "daily-report-f6u"
	if reason, absent := c.traits.Absent[AbilityCommitGap]; absent {
		c.Notef("%s absent (%s): the atomic analogue runs instead: A and B released together behind a barrier, each one atomic compare-and-write, %d rounds on fresh scopes",
			AbilityCommitGap, reason, atomicRounds)
		atomicRace(c, userTables.open(c, h, nil), prefix)
		return
	}
	// A then B.
	a, b := raceA(prefix+"-ab"), raceB(prefix+"-ab")
	l := newLatch(a.Writer)
	res := userTables.open(c, h, l.gap)
	aDone := goWrite(ctx, res, a)
	c.waitPaused(l) // A wrote its rows and has not committed
	bDone := goWrite(ctx, res, b)
	floor := c.waitFloor(res, b.Scope, b.Token, 10*time.Second)
	c.Equal("I3", "A then B: B's token reaches the floor while A's transaction is open: nothing of the fence waits for A",
		b.Token, floor)
	close(l.release)
	ra := c.await(aDone, "A's write")
	rb := c.await(bDone, "B's write")
	c.Equal("I3", "A then B: A's commit, after B's token reached the floor, is rejected; B is accepted",
		"first=false second=true", fmt.Sprintf("first=%t second=%t", ra.Accepted, rb.Accepted))
	c.checkFinal(res, "A then B", b.Scope)

	// B then A.
	a, b = raceA(prefix+"-ba"), raceB(prefix+"-ba")
	l = newLatch(b.Writer)
	res = userTables.open(c, h, l.gap)
	bDone = goWrite(ctx, res, b)
	c.waitPaused(l) // B wrote its rows and has not committed
	aDone = goWrite(ctx, res, a)
	var oa outcome
	returned := false
	select {
	case oa = <-aDone:
		returned = true
	case <-time.After(10 * time.Second):
	}
	c.Check("I3", "B then A: A's write returns while B's transaction is open: nothing of the fence waits for B",
		returned, "returned", fmt.Sprintf("returned=%t", returned))
	close(l.release)
	if !returned {
		oa = <-aDone
	}
	c.Must(oa.err, "A's write")
	rb = c.await(bDone, "B's write")
	c.Notef("B then A: A accepted=%t floor=%d (accepted only if it committed before B's token reached the floor), B accepted=%t",
		oa.res.Accepted, oa.res.Floor, rb.Accepted)
	c.Check("I3", "B then A: B, committing after A, is accepted", rb.Accepted, "accepted=true", fmt.Sprintf("accepted=%t", rb.Accepted))
	c.checkFinal(res, "B then A", b.Scope)
}

// waitFloor polls the floor of scope until it is at least want or limit
// passed, and returns the last floor read.
func (c *caseRun) waitFloor(res backendkit.ResourceReader, scope string, want leasecore.Token, limit time.Duration) leasecore.Token {
	deadline := time.Now().Add(limit)
	for {
		f := c.floor(res, scope)
		if f >= want || time.Now().After(deadline) {
			return f
		}
		sleep(c.ctx, 5*time.Millisecond)
	}
}

// checkFinal checks that token 2's data and floor are what F6's race left.
func (c *caseRun) checkFinal(res Resource, order, scope string) {
	c.Equal("I3", order+": the final data is token 2's and the floor is 2",
		"new(B) by holder-b token=2, floor=2", fmt.Sprintf("%s, floor=%d", c.stored(res, scope, partSummary), c.floor(res, scope)))
}

// conditionalRace is F6(b) against target t: A (token 1) and B (token 2),
// in both orders, the first paused inside its write after the fence check
// and before the commit; the second is judged against the floor the first
// left. A backend that declares AbilityCommitGap absent runs the atomic
// analogue: the two writers' requests racing (atomicRace).
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
		// one atomic request. What remains of the interleaving is the
		// race between the two requests: release them together, many
		// times, and check what must hold whichever arrives first.
		c.Notef("%s absent (%s): the atomic analogue runs instead: A and B released together behind a barrier, each one atomic compare-and-write, %d rounds on fresh scopes",
			AbilityCommitGap, reason, atomicRounds)
		atomicRace(c, t.open(c, h, nil), prefix)
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

// atomicRounds is how many times the atomic analogue races A and B.
const atomicRounds = 8

// atomicRace races A (token 1) and B (token 2) on res, atomicRounds times,
// each round on a scope of its own. Whichever request arrives first, B's
// token is at least any floor A can leave, so B is accepted and its data
// and floor are what stays; A is accepted only when it arrived first.
func atomicRace(c *caseRun, res Resource, prefix string) {
	bAccepted, newest, aAccepted := 0, 0, 0
	for i := range atomicRounds {
		sc := fmt.Sprintf("%s-race-%d", prefix, i)
		var ra, rb leasecore.Result
		var ea, eb error
		var ready, done sync.WaitGroup
		barrier := make(chan struct{})
		racer := func(w leasecore.Write, r *leasecore.Result, e *error) {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-barrier
				*r, *e = res.Write(c.ctx, w)
			}()
		}
		// Start the two goroutines in alternating order, so neither is
		// favoured by the order it was started in.
		if i%2 == 0 {
			racer(raceA(sc), &ra, &ea)
			racer(raceB(sc), &rb, &eb)
		} else {
			racer(raceB(sc), &rb, &eb)
			racer(raceA(sc), &ra, &ea)
		}
		ready.Wait()
		close(barrier)
		done.Wait()
		c.Must(ea, fmt.Sprintf("round %d: A's write", i+1))
		c.Must(eb, fmt.Sprintf("round %d: B's write", i+1))
		floor := c.floor(res, sc)
		final := c.stored(res, sc, partSummary)
		if rb.Accepted {
			bAccepted++
		}
		if ra.Accepted {
			aAccepted++
		}
		if final == "new(B) by holder-b token=2" && floor == 2 {
			newest++
		} else {
			c.Notef("round %d: A accepted=%t, B accepted=%t, final %s, floor=%d", i+1, ra.Accepted, rb.Accepted, final, floor)
		}
	}
	rounds := func(n int) string { return fmt.Sprintf("%d of %d rounds", n, atomicRounds) }
	c.Equal("I3", "the race: B (token 2) is accepted whichever request arrives first", rounds(atomicRounds), rounds(bAccepted))
	c.Equal("I3", "the race: the final data is token 2's and the floor is 2", rounds(atomicRounds), rounds(newest))
	c.Notef("the race: A (token 1) arrived first and was accepted in %d of %d rounds, and was rejected after B in %d",
		aAccepted, atomicRounds, atomicRounds-aAccepted)
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
