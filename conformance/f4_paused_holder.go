package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// The F4/F5 timing, from the lease-fencing article (SOURCES.md):
// TTL 1500 ms, renewal every 400 ms, local margin 300 ms, and the parent
// waits 3000 ms (two TTLs) to show that renewal keeps an unpaused holder's
// lease. A backend with a larger minimum TTL stretches all four by the
// same factor; the wait is also never shorter than an unrenewed hold may
// be seen to last (renewingWait).
const (
	pausedTTL     = 1500 * time.Millisecond
	pausedRenew   = 400 * time.Millisecond
	pausedMargin  = 300 * time.Millisecond
	pausedRunning = 3000 * time.Millisecond
)

// frozenHolderRenewTimeout is the renew attempt timeout of a holder that
// a case freezes while it holds (A in F4, F5 and F12): up to its local
// deadline (ttl - margin) instead of the default renew interval. The cases
// are about a holder that is frozen, not one whose renewals are slow; with
// the default, a loaded machine's commit slower than the renew interval is
// cancelled, the next attempt must open a new connection first, and two
// such attempts in a row ended A's hold before the freeze (lib/pq behind
// PgBouncer and the Docker provider, beside two CPU burners). A renewal
// that never answers still ends the hold at the local deadline.
func frozenHolderRenewTimeout(ttl, margin time.Duration) time.Duration {
	return ttl - margin
}

// caseF4 is the main experiment: holder A, a separate OS process, passes
// its pre-write check and is frozen with SIGSTOP right before writing; its
// lease expires by the backend's clock; holder B, another process, takes
// over with a larger token and writes; A is thawed and its very next
// instruction is the write. The resource rejects it.
func caseF4(ctx context.Context, c *caseRun, h Harness) {
	pausedHolder(ctx, c, h, KindFenced)
}

// caseF5 is the negative control: the identical timeline against a
// resource that does not check tokens. The lease behaves identically; the
// stale write lands.
func caseF5(ctx context.Context, c *caseRun, h Harness) {
	pausedHolder(ctx, c, h, KindUnfenced)
}

// caseF4u is F4 with the holders writing the suite's own user tables in
// one fenced transaction (Txn): A is frozen between its check and its
// transaction; thawed, its transaction is rejected and its rows never
// appear.
func caseF4u(ctx context.Context, c *caseRun, h Harness) {
	pausedHolder(ctx, c, h, KindUserData)
}

// caseF4m is the negative control of F4u, the "marker first, rows second"
// pattern: A's marker goes through the fenced part store before the freeze
// and is accepted; its rows follow in a second transaction with no fence,
// after B wrote, and win.
func caseF4m(ctx context.Context, c *caseRun, h Harness) {
	pausedHolder(ctx, c, h, KindMarkerFirst)
}

// pausedHolder runs the paused-holder timeline with holder processes
// writing to the resource of kind.
func pausedHolder(ctx context.Context, c *caseRun, h Harness, kind ResourceKind) {
	var reader Resource
	switch kind {
	case KindUnfenced:
		controls := need[NegativeControls](c, h, AbilityNegativeControls)
		var err error
		reader, err = controls.UnfencedResource(ctx)
		c.Must(err, "open the unfenced resource")
	case KindUserData:
		reader = c.openUserResource(h, nil)
	case KindMarkerFirst:
		ud := need[UserDataResources](c, h, AbilityUserData)
		var err error
		reader, err = ud.MarkerFirstResource(ctx)
		c.Must(err, "open the marker-first control")
	default:
		reader = c.openResource(h)
	}
	hp := need[HolderProcesses](c, h, AbilityHolderProcesses)
	// fenced: the rows are written in the fence's own atomic operation.
	fenced := kind == KindFenced || kind == KindUserData
	// twoStep: the holders PREPARE between their check and their write.
	twoStep := kind == KindUserData || kind == KindMarkerFirst
	prepare := func(p *holderProc, label string, tok leasecore.Token) {
		line := p.call("PREPARE " + scope + " " + partSummary + " marker")
		if kind == KindMarkerFirst {
			c.Equal("I3", label+"'s marker goes through the fenced part store and is accepted",
				fmt.Sprintf("PREPARED accepted=true token=%d", tok), trimFloor(line))
		} else {
			c.Equal(c.id, label+"'s write is one fenced transaction: nothing to prepare", "PREPARED none", line)
		}
	}
	_, insp := c.openLease(h)

	ttl := c.ttl(pausedTTL)
	renew, margin, running := c.scale(pausedRenew, pausedTTL), c.scale(pausedMargin, pausedTTL), c.renewingWait(ttl)
	aRenewTimeout := frozenHolderRenewTimeout(ttl, margin)
	c.Notef("resource=%s; ttl=%v renew=%v margin=%v; holders are separate OS processes; A's renew attempt timeout %v", kind, ttl, renew, margin, aRenewTimeout)
	// acquire is the holder's ACQUIRE command on n times the case's terms.
	// B's part is to take over, write and show that the lease is B's. Its
	// hold must outlast the round trips through its holder process between
	// its acquire and its RENEW command (the write and a read of the floor
	// among them), which a loaded machine stretches past one teaching TTL:
	// B runs on four times A's terms. The check still fails for a backend
	// that loses or refuses B's hold.
	acquire := func(holder string, n time.Duration) string {
		return fmt.Sprintf("ACQUIRE %s %s %v %v %v", leaseName, holder, n*ttl, n*renew, n*margin)
	}

	a := c.startHolder(hp, kind, "A")
	tokA := c.acquiredLine("A acquires the lease", a.call(fmt.Sprintf("%s %v", acquire(holderA, 1), aRenewTimeout)), 0)
	c.record("lease", fmt.Sprintf("token %d issued to holder-a", tokA))
	c.Equal(c.id, "A passes its local-deadline check and stops right before writing", "READY_TO_WRITE", verb(a.call("CHECK")))
	if twoStep {
		prepare(a, "A", tokA)
	}

	c.record("parent", fmt.Sprintf("waits %v (ttl %v)", running, ttl))
	sleep(ctx, running)
	st, err := insp.Inspect(ctx, leaseName)
	c.Must(err, "inspect the lease")
	c.Check("I1", fmt.Sprintf("A's background renewal kept the lease while A ran (waited %v, ttl %v)", running, ttl),
		st.Held && st.Holder == holderA, "held by holder-a", fmt.Sprintf("held=%t by %s", st.Held, st.Holder))

	// A is frozen between two of its renewals: its last renewal was
	// answered before it froze, so its hold ends within the TTL of this
	// moment.
	frozeAt := a.freezeBetweenRenewals(renew, 2*ttl)
	switch kind {
	case KindMarkerFirst:
		c.record("A", "SIGSTOP: frozen after its check and its accepted marker, before its rows")
	case KindUserData:
		c.record("A", "SIGSTOP: frozen after its check, before its transaction")
	default:
		c.record("A", "SIGSTOP: frozen after its check, before its write")
	}
	state := waitProcState(ctx, a.pid, "T")
	c.Equal(c.id, "after SIGSTOP /proc shows A stopped (its renewal goroutine too)", "T", state)
	if st, err := insp.Inspect(ctx, leaseName); err == nil && st.Held {
		c.recordAt(time.Now().Add(st.Remaining), "lease", "A's lease expires (backend clock)")
	}
	freeAt := c.waitFree(insp, leaseName, ttl, frozeAt, "A's hold, its renewals frozen,", "SIGSTOP")
	c.Notef("the lease expired by the backend's clock %v after SIGSTOP", freeAt.Sub(frozeAt).Round(time.Millisecond))

	floorBefore := c.floor(reader, scope)
	b := c.startHolder(hp, kind, "B")
	tokB := c.acquiredLine("B acquires the expired lease with a larger token", b.call(acquire(holderB, 4)), tokA)
	c.record("lease", fmt.Sprintf("token %d issued to holder-b", tokB))
	if twoStep {
		prepare(b, "B", tokB)
	}
	bWrite := b.call("WRITE " + scope + " " + partSummary + " rows=201(B)")
	c.Equal("I3", "B's write is accepted", fmt.Sprintf("WRITE accepted=true token=%d", tokB), trimFloor(bWrite))
	floorAfter := c.floor(reader, scope)
	switch {
	case fenced:
		c.Equal("I3", "B's write moved the floor from 0 to B's token", fmt.Sprintf("0->%d", tokB), fmt.Sprintf("%d->%d", floorBefore, floorAfter))
		c.record("resource", fmt.Sprintf("B's token-%d write accepted, floor %d->%d", tokB, floorBefore, floorAfter))
	case kind == KindMarkerFirst:
		c.record("resource", fmt.Sprintf("B's token-%d marker accepted (floor %d->%d), then its rows with no fence", tokB, floorBefore, floorAfter))
	default:
		c.record("resource", fmt.Sprintf("B's token-%d write accepted (this resource keeps no floor)", tokB))
	}
	c.Equal("I1", "B renews", "RENEW ok=true", verbOK(b.call("RENEW")))
	c.Equal("I1", "B releases", "RELEASED ok=true", b.call("RELEASE"))
	c.record("lease", "released by holder-b")
	c.Must(b.exit(), "B exits")
	c.record("B", "exited")

	// Queue A's write, then thaw it: the write is the very next thing A does.
	a.send("WRITE_AND_RENEW " + scope + " " + partSummary + " rows=200(A)")
	c.Must(thaw(a.pid), "SIGCONT A")
	c.record("A", "SIGCONT: resumes with its write")
	aWrite := a.reply("A's write")
	aRenew := a.reply("A's renewal after its write")
	c.Notef("A after resuming: %s; %s", aWrite, aRenew)
	c.Equal("I1", "A's renewal after its write fails with ErrLost: the lease moved on", "RENEW_AFTER_WRITE ok=false err=ErrLost", aRenew)

	final := c.stored(reader, scope, partSummary)
	floor := c.floor(reader, scope)
	c.Notef("final summary = %s; floor=%d", final, floor)
	if verbAccepted(aWrite) {
		c.record("resource", fmt.Sprintf("A's token-%d write accepted: summary = %s", tokA, final))
	} else {
		c.record("resource", fmt.Sprintf("A's token-%d write rejected (floor %d)", tokA, floor))
	}
	staleWon := verbAccepted(aWrite) && final == fmt.Sprintf("rows=200(A) by holder-a token=%d", tokA)
	switch kind {
	case KindUnfenced:
		c.Exposes("the resource does not check tokens, so A's stale result overwrote B's",
			staleWon, "A: "+aWrite+"; summary: "+final)
		c.Must(a.exit(), "A exits")
		return
	case KindMarkerFirst:
		c.Exposes("marker first, rows second: A's marker was accepted before the freeze, its rows followed with no fence after B wrote, and the stale rows won",
			staleWon, fmt.Sprintf("A: %s; summary: %s; floor=%d", aWrite, final, floor))
		c.Notef("the identical timeline against the fenced transaction is F4u: there A's transaction was rejected and its rows never appeared")
		c.Must(a.exit(), "A exits")
		return
	}
	c.Equal("I3", fmt.Sprintf("A's write with token %d is rejected", tokA), fmt.Sprintf("WRITE accepted=false token=%d", tokA), trimFloor(aWrite))
	c.Equal("I3", "the final summary is B's and the floor is B's token",
		fmt.Sprintf("rows=201(B) by holder-b token=%d, floor=%d", tokB, tokB),
		fmt.Sprintf("%s, floor=%d", final, floor))
	attempts, err := reader.Attempts(ctx, scope)
	c.Must(err, "read the write log")
	rejectedA := 0
	for _, at := range attempts {
		if at.Writer == holderA && !at.Accepted {
			rejectedA++
		}
	}
	if c.traits.AttemptLog == leasecore.LogNone {
		c.Equal("I3", "the write log holds nothing (the harness logs no attempts)", 0, len(attempts))
	} else {
		c.Equal("I3", "the write log holds exactly one rejected attempt by A", 1, rejectedA)
	}
	c.Notef("when A resumed the lease was free (B had released it) and A was still rejected: the resource decides from its own persisted floor")
	c.Must(a.exit(), "A exits")
}

// acquiredLine checks an "ACQUIRED token=N" reply: the first token of a
// fresh lease when prev is 0, else the token after prev (exactly prev+step
// with a declared step, strictly greater otherwise). It returns N.
func (c *caseRun) acquiredLine(what, line string, prev leasecore.Token) leasecore.Token {
	var t leasecore.Token
	if _, err := fmt.Sscanf(line, "ACQUIRED token=%d", &t); err != nil {
		c.Fatalf("%s: reply %q", what, line)
	}
	switch step := c.traits.TokenStep; {
	case step != 0 && prev == 0:
		c.Equal("I2", what, "ACQUIRED token=1", line)
	case step != 0:
		c.Equal("I2", what, fmt.Sprintf("ACQUIRED token=%d", prev+step), line)
	default:
		c.Check("I2", what, t > prev, fmt.Sprintf("ACQUIRED token>%d", prev), line)
	}
	return t
}

// sleep waits d or until ctx is done. F4's waits are the experiment's
// timeline, not synchronisation.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitProcState polls /proc until the process is in state want (SIGSTOP is
// delivered asynchronously) and returns the last state read.
func waitProcState(ctx context.Context, pid int, want string) string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := procState(pid)
		if err != nil {
			return "error: " + err.Error()
		}
		if st == want || time.Now().After(deadline) {
			return st
		}
		sleep(ctx, time.Millisecond)
	}
}
