package conformance

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// advanceBound is how long F18 lets B's Advance take while A is frozen (or
// slow) inside its fenced transaction. The fence must hold nothing for A's
// open transaction, so B's Advance waits for nothing of A's: the bound
// covers one request on a busy machine and does not depend on A, which
// stays frozen for at least its TTL (1.5 s) and well past B's Advance. A
// design that holds the floor for A (the control) makes B wait until A
// wakes, or until the server ends A's idle session (5 s by default).
const advanceBound = time.Second

// slowStatementEvery is how often F18's slow holder runs a statement in
// its open transaction: busy, never idle, so no idle timeout ends it.
// slowPast is how many it runs after its lease expired before it commits.
const (
	slowStatementEvery = 100 * time.Millisecond
	slowPast           = 5
)

// caseF18 checks the promise of a fenced transaction: it commits only if,
// when it commits, no larger token has been accepted or advanced for its
// scope, and a newer holder never waits on the fence for it. A holder
// frozen inside its transaction after its first statements, past its
// lease, holds up nobody's Advance and is rejected when it wakes and
// commits; so is one that is slow, not frozen. The negative control is the
// transaction that compares first and holds the floor until it commits.
func caseF18(ctx context.Context, c *caseRun, h Harness) {
	need[UserDataResources](c, h, AbilityUserData)
	c.noteUserTarget(userTables)
	c.Section("a: frozen inside the transaction", func(c *caseRun) { frozenInTx(ctx, c, h, KindUserData) })
	c.Section("b: slow inside the transaction", func(c *caseRun) { slowInTx(ctx, c, h) })
	c.Section("c: the check first, holding the floor (negative control)", func(c *caseRun) { frozenInTx(ctx, c, h, KindCheckFirst) })
}

// timedResult is an Advance's outcome and how long it took.
type timedResult struct {
	res  leasecore.Result
	err  error
	took time.Duration
}

// waitedFor describes how long an Advance took, or that it had not
// returned after waited.
func waitedFor(returned bool, took, waited time.Duration) string {
	if !returned {
		return fmt.Sprintf("not returned after %v", waited)
	}
	return fmt.Sprintf("returned after %v", took.Round(time.Millisecond))
}

// advanceWithin starts res.Advance(cl) in its own goroutine and waits for
// it at most limit. It returns the outcome and true if it came in time;
// otherwise the channel it will arrive on, which is never closed.
func advanceWithin(ctx context.Context, res Advancer, cl leasecore.Claim, limit time.Duration) (timedResult, bool, <-chan timedResult) {
	ch := make(chan timedResult, 1)
	go func() {
		start := time.Now()
		r, err := res.Advance(ctx, cl)
		ch <- timedResult{r, err, time.Since(start)}
	}()
	select {
	case o := <-ch:
		return o, true, ch
	case <-time.After(limit):
		return timedResult{}, false, ch
	}
}

// frozenInTx is F18's timeline with holder processes: A (kind: the fenced
// user resource, or the check-first control) is frozen with SIGSTOP inside
// its transaction after its first row, until its lease expired; B, in this
// process, acquires, advances and writes the same rows with no fence; A is
// thawed and goes on with a statement, its other rows and its commit.
func frozenInTx(ctx context.Context, c *caseRun, h Harness, kind ResourceKind) {
	control := kind == KindCheckFirst
	if control {
		need[CheckFirstControl](c, h, AbilityCheckFirst)
	}
	ud := need[UserDataResources](c, h, AbilityUserData)
	hp := need[HolderProcesses](c, h, AbilityHolderProcesses)
	res := c.openUserResource(h, nil)
	plain, err := ud.MarkerFirstResource(ctx) // its Write: the rows with no fence
	c.Must(err, "open the unfenced rows (B's plain writes)")
	lease, insp := c.openLease(h)
	name, sc := leaseName+"-f18a", scope+"-f18a"
	if control {
		name, sc = leaseName+"-f18c", scope+"-f18c"
	}
	ttl := c.ttl(pausedTTL)
	renew, margin := c.scale(pausedRenew, pausedTTL), c.scale(pausedMargin, pausedTTL)
	c.Notef("resource=%s; ttl=%v renew=%v margin=%v; A is a separate OS process, B runs in this one", kind, ttl, renew, margin)

	a := c.startHolder(hp, kind, "A")
	tokA := c.acquiredLine("A acquires the lease", a.call(fmt.Sprintf("ACQUIRE %s %s %v %v %v", name, holderA, ttl, renew, margin)), 0)
	c.Equal(c.id, "A passes its local-deadline check", "READY_TO_WRITE", verb(a.call("CHECK")))
	a.send(fmt.Sprintf("WRITE_FROZEN %s %s rows=300(A)", sc, partSummary))
	c.Equal(c.id, "A's write has begun its transaction and written its first row", fmt.Sprintf("IN_TX token=%d", tokA),
		a.reply("A's write, inside its transaction"))
	frozeAt := time.Now()
	c.Must(freeze(a.pid), "SIGSTOP A")
	c.record("A", "SIGSTOP: frozen inside its fenced transaction, after its first row")
	c.Equal(c.id, "after SIGSTOP /proc shows A stopped (its renewal goroutine too)", "T", waitProcState(ctx, a.pid, "T"))
	c.waitFree(insp, name, ttl, frozeAt, "A's hold, its renewals frozen,", "SIGSTOP")

	gb, err := lease.Acquire(ctx, name, holderB, c.ttl(5*time.Second))
	c.Must(err, "holder-b acquires "+name)
	c.LargerToken("B acquires the expired lease with a larger token", tokA, gb.Token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-b", gb.Token))
	adv, returned, advDone := advanceWithin(ctx, res, leasecore.Claim{Scope: sc, Writer: holderB, Token: gb.Token}, 2*advanceBound)

	if control {
		c.Exposes(fmt.Sprintf("the check first holds the floor for A's open transaction: B's Advance had not returned %v after it was sent, A still frozen", 2*advanceBound),
			!returned, waitedFor(returned, adv.took, 2*advanceBound))
		if probe, ok := h.(LockWaitProbe); ok && !returned {
			waits, err := probe.LockWaits(ctx)
			c.Must(err, "probe lock waits")
			c.Notef("B's Advance waits: %v", waits)
		}
		c.Must(thaw(a.pid), "SIGCONT A")
		c.record("A", "SIGCONT: goes on with its transaction")
		aWrite := a.reply("A's write after the thaw")
		if !returned {
			adv = <-advDone
		}
		c.Must(adv.err, "B's advance")
		final := c.stored(res, sc, partSummary)
		c.Notef("A after the thaw: %s; B's Advance accepted=%t floor=%d after %v; summary now %s", aWrite, adv.res.Accepted, adv.res.Floor,
			adv.took.Round(time.Millisecond), final)
		c.Exposes(fmt.Sprintf("A, frozen past its lease, committed its rows with token %d after B had been granted token %d and had called Advance", tokA, gb.Token),
			verbAccepted(aWrite) && final == fmt.Sprintf("rows=300(A) by holder-a token=%d", tokA),
			fmt.Sprintf("A: %s; summary: %s", aWrite, final))
		c.Must(a.exit(), "A exits")
		return
	}

	c.Check(c.id, fmt.Sprintf("B's Advance returns within %v while A is frozen inside its transaction: the fence holds nothing for A's open transaction", advanceBound),
		returned && adv.took <= advanceBound, fmt.Sprintf("returned within %v", advanceBound),
		waitedFor(returned, adv.took, 2*advanceBound))
	if !returned {
		adv = <-advDone
	}
	c.Must(adv.err, "B's advance")
	c.Equal("I3", "B's advance is accepted and the floor is B's token",
		fmt.Sprintf("accepted=true floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", adv.res.Accepted, adv.res.Floor))
	c.record("resource", fmt.Sprintf("B's advance to %d accepted in %v", gb.Token, adv.took.Round(time.Millisecond)))

	// B's rows, with no fence of their own, while A is still frozen. On a
	// backend with row locks they wait for A's first row: the one wait the
	// fence does not remove, bounded by A's idle-in-transaction timeout.
	wb := leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=301(B)", Writer: holderB, Token: gb.Token}
	bStart := time.Now()
	var bTook time.Duration
	bDone := goWrite(ctx, writerFunc(func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		defer func() { bTook = time.Since(bStart) }()
		return plain.Write(ctx, w)
	}), wb)
	sleep(ctx, 100*time.Millisecond) // B's rows are sent before A wakes
	thawedAt := time.Now()
	c.Must(thaw(a.pid), "SIGCONT A")
	c.record("A", "SIGCONT: goes on with a statement, its other rows and its commit")
	aWrite := a.reply("A's write after the thaw")
	rb := c.await(bDone, "B's plain rows")
	if bTook >= thawedAt.Sub(bStart) {
		c.Notef("B's rows (no fence) took %v: they waited for A's first row, locked by A's open transaction, until A woke and its transaction ended (a row lock of the user's own table, not the fence)", bTook.Round(time.Millisecond))
	} else {
		c.Notef("B's rows (no fence) took %v, stored while A was still frozen", bTook.Round(time.Millisecond))
	}
	c.Equal("I3", fmt.Sprintf("A's transaction, thawed, is rejected at its commit: token %d is below B's floor", tokA),
		fmt.Sprintf("WRITE accepted=false token=%d floor=%d", tokA, gb.Token), aWrite)
	c.Check(c.id, "B's rows are stored", rb.Accepted, "accepted=true", fmt.Sprintf("accepted=%t", rb.Accepted))
	c.Equal("I3", "the final rows are B's in every user table, none of A's, and the floor is B's token",
		fmt.Sprintf("rows=301(B) by holder-b token=%d, floor=%d", gb.Token, gb.Token),
		fmt.Sprintf("%s, floor=%d", c.stored(res, sc, partSummary), c.floor(res, sc)))
	c.Must(a.exit(), "A exits")
	c.Must(lease.Release(ctx, gb), "holder-b releases")
}

// slowInTx is F18's slow holder, in this process: A's transaction is not
// frozen but runs a statement every slowStatementEvery, and goes on past
// its lease (never renewed); B acquires, advances and writes the rows
// meanwhile; A then writes its other rows and commits, and is rejected.
func slowInTx(ctx context.Context, c *caseRun, h Harness) {
	ud := need[UserDataResources](c, h, AbilityUserData)
	res := c.openUserResource(h, nil)
	plain, err := ud.MarkerFirstResource(ctx)
	c.Must(err, "open the unfenced rows (B's plain writes)")
	lease, insp := c.openLease(h)
	name, sc := leaseName+"-f18b", scope+"-f18b"
	ttl := c.ttl(pausedTTL)

	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, ttl)
	c.Must(err, "holder-a acquires "+name)
	var statements atomic.Int64
	finish := make(chan struct{})
	slow := func(ctx context.Context, w leasecore.Write, stmt TxStatement) error {
		for {
			if err := stmt(ctx); err != nil {
				return err
			}
			statements.Add(1)
			select {
			case <-finish:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(slowStatementEvery):
			}
		}
	}
	wa := leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=400(A)", Writer: holderA, Token: ga.Token}
	aDone := goWrite(withInTransaction(ctx, slow), res, wa)
	c.record("A", fmt.Sprintf("its transaction begins and runs a statement every %v; its lease is never renewed", slowStatementEvery))
	freeAt := c.waitFree(insp, name, ttl, sent, "A's hold, never renewed,", "its acquire")
	atExpiry := statements.Load()

	gb, err := lease.Acquire(ctx, name, holderB, c.ttl(5*time.Second))
	c.Must(err, "holder-b acquires "+name)
	c.LargerToken("B acquires the expired lease with a larger token", ga.Token, gb.Token)
	adv, returned, advDone := advanceWithin(ctx, res, leasecore.Claim{Scope: sc, Writer: holderB, Token: gb.Token}, 2*advanceBound)
	c.Check(c.id, fmt.Sprintf("B's Advance returns within %v while A's transaction is open and busy", advanceBound),
		returned && adv.took <= advanceBound && adv.res.Accepted, fmt.Sprintf("accepted within %v", advanceBound),
		fmt.Sprintf("%s, accepted=%t", waitedFor(returned, adv.took, 2*advanceBound), returned && adv.res.Accepted))
	var bDone <-chan outcome
	if returned {
		c.Must(adv.err, "B's advance")
		bDone = goWrite(ctx, plain, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=401(B)", Writer: holderB, Token: gb.Token})
		// A goes on, busy, past its lease and past B's takeover.
		for deadline := time.Now().Add(5 * time.Second); statements.Load()-atExpiry < slowPast && time.Now().Before(deadline); {
			sleep(ctx, slowStatementEvery/4)
		}
	}
	close(finish)
	if !returned {
		adv = <-advDone // behind A: let A finish first
		c.Must(adv.err, "B's advance")
		bDone = goWrite(ctx, plain, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=401(B)", Writer: holderB, Token: gb.Token})
	}
	ra := c.await(aDone, "A's slow transaction")
	rb := c.await(bDone, "B's plain rows")
	past := statements.Load() - atExpiry
	c.Notef("A ran %d statements in its transaction, %d of them after its lease was seen free (%v after its acquire)",
		statements.Load(), past, freeAt.Sub(sent).Round(time.Millisecond))
	c.Check(c.id, "A's transaction kept running statements after its lease had expired (busy, not idle)",
		past >= slowPast, fmt.Sprintf("%d or more statements after the expiry", slowPast), fmt.Sprintf("%d", past))
	c.Equal("I3", fmt.Sprintf("A's slow transaction is rejected at its commit: token %d is below B's floor", ga.Token),
		fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", ra.Accepted, ra.Floor))
	c.Check(c.id, "B's rows are stored", rb.Accepted, "accepted=true", fmt.Sprintf("accepted=%t", rb.Accepted))
	c.Equal("I3", "the final rows are B's in every user table, none of A's, and the floor is B's token",
		fmt.Sprintf("rows=401(B) by holder-b token=%d, floor=%d", gb.Token, gb.Token),
		fmt.Sprintf("%s, floor=%d", c.stored(res, sc, partSummary), c.floor(res, sc)))
	c.Must(lease.Release(ctx, gb), "holder-b releases")
}

// writerFunc is a function as a leasecore.FencedResource.
type writerFunc func(ctx context.Context, w leasecore.Write) (leasecore.Result, error)

func (f writerFunc) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return f(ctx, w)
}
