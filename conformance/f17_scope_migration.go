package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// caseF17 moves a scope to another server: what users do to grow past one
// database or cluster. A fence decides from its own floor only (Chubby
// §2.4: the resource never asks the lease service), so the floor must move
// with the data, in the same steps, and the old location must stop
// accepting the scope.
//
// The timeline: A acquires and writes, then pauses, holding its token; its
// lease expires and B takes over with a larger token and writes; the scope
// is moved to the second location; A wakes and writes to where the scope
// now lives. With the floor moved (section "move with the floor") A's
// token is below B's floor at the new location and A is rejected, before B
// wrote anything there; the old location rejects A and B alike and names
// the destination, and B writes on at the new location with its token.
// With the data copied and the floor left behind (section "negative
// control"), the new location has no floor: A's stale write is accepted and
// overwrites B's data there, and the old location, never sealed, still
// accepts B's writes, which the new location never sees.
func caseF17(ctx context.Context, c *caseRun, h Harness) {
	mv := need[ScopeMoves](c, h, AbilityScopeMoves)
	dest, label, err := mv.MoveTarget(ctx)
	c.Must(err, "open the second location")
	c.Notef("the scope moves from the harness's resource to the second location %q", label)
	c.Section("move with the floor", func(c *caseRun) { scopeMove(ctx, c, h, mv, dest, label, MoveWithFloor) })
	c.Section("negative control: data moved without its floor", func(c *caseRun) {
		scopeMove(ctx, c, h, mv, dest, label, MoveDataOnly)
	})
}

// scopeMove runs F17's timeline with the move of mode.
func scopeMove(ctx context.Context, c *caseRun, h Harness, mv ScopeMoves, dest Resource, label string, mode MoveMode) {
	suffix := "sealed"
	if mode == MoveDataOnly {
		suffix = "data-only"
	}
	// Names of their own: the sections must not see each other's lease,
	// floor or seal.
	name, sc := leaseName+"-f17-"+suffix, scope+"-f17-"+suffix
	old := c.openResource(h)
	lease, insp := c.openLease(h)
	short := c.ttl(300 * time.Millisecond)

	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, short)
	c.Must(err, "holder-a acquires")
	c.record("lease", fmt.Sprintf("token %d issued to holder-a", ga.Token))
	ra := c.write(old, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", fmt.Sprintf("holder-a's write with token=%d at the old location is accepted", ga.Token), true, ra.Accepted)
	c.record("A", fmt.Sprintf("writes with token %d, then pauses, holding its token", ga.Token))

	c.waitFree(insp, name, short, sent, "holder-a's hold, never renewed,", "its acquire")
	gb, err := lease.Acquire(ctx, name, holderB, c.ttl(5*time.Second))
	c.Must(err, "holder-b acquires")
	c.NextToken("holder-b acquires the expired lease with a larger token", ga.Token, gb.Token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-b", gb.Token))
	bMoved := fmt.Sprintf("rows=200(B) by %s token=%d", holderB, gb.Token)
	rb := c.write(old, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=200(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b's write with token=%d at the old location is accepted", gb.Token), true, rb.Accepted)

	c.Must(mv.MoveScope(ctx, sc, mode), fmt.Sprintf("move the scope to %q (%s)", label, mode))
	c.record("mover", fmt.Sprintf("moves the scope to %s (%s)", label, mode))
	c.Equal(c.id, "the new location holds the scope's data: holder-b's summary", bMoved, c.stored(dest, sc, partSummary))
	if mode == MoveWithFloor {
		c.Equal("I3", "the new location's floor is holder-b's token, moved with the data", gb.Token, c.floor(dest, sc))
		c.Equal(c.id, "the old location's floor is the sealed floor (leasecore.SealedFloor), above every token", leasecore.SealedFloor, c.floor(old, sc))
		c.Must(mv.MoveScope(ctx, sc, mode), "move the scope again, as after a crash between its steps")
		c.Equal(c.id, "the move run again changes nothing: the new location's floor and data",
			fmt.Sprintf("floor=%d %s", gb.Token, bMoved), fmt.Sprintf("floor=%d %s", c.floor(dest, sc), c.stored(dest, sc, partSummary)))
	}

	// A wakes up and writes where the scope now lives, before B wrote
	// anything there: only a floor that moved with the data can stop it.
	wa, err := dest.Write(ctx, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=101(A)", Writer: holderA, Token: ga.Token})
	c.Must(err, "holder-a writes at the new location")
	c.record("A", fmt.Sprintf("wakes and writes with token %d at the new location: accepted=%t", ga.Token, wa.Accepted))
	if mode == MoveDataOnly {
		c.Exposes("a move that leaves the floor behind: holder-a's stale write is accepted at the new location and overwrites holder-b's moved data",
			wa.Accepted && c.stored(dest, sc, partSummary) == fmt.Sprintf("rows=101(A) by %s token=%d", holderA, ga.Token),
			fmt.Sprintf("token %d written over token %d: accepted=%t floor=%d, summary %s", ga.Token, gb.Token, wa.Accepted, wa.Floor,
				c.stored(dest, sc, partSummary)))
		late, err := old.Write(ctx, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=201(B)", Writer: holderB, Token: gb.Token})
		c.Must(err, "holder-b writes at the old location")
		c.Exposes("a move that does not seal the old location: holder-b's write there after the move is accepted, and the new location never sees it",
			late.Accepted, fmt.Sprintf("accepted=%t floor=%d at the old location; the new location's summary %s", late.Accepted, late.Floor,
				c.stored(dest, sc, partSummary)))
		c.Must(lease.Release(ctx, gb), "holder-b releases")
		return
	}
	c.Check("I3", fmt.Sprintf("holder-a's write with its old token=%d at the new location is rejected by the floor that moved", ga.Token),
		!wa.Accepted && wa.Floor == gb.Token, fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", wa.Accepted, wa.Floor))
	c.Equal("I3", "the new location's summary is still holder-b's", bMoved, c.stored(dest, sc, partSummary))

	for _, w := range []struct {
		holder string
		token  leasecore.Token
		what   string
	}{{holderA, ga.Token, "stale"}, {holderB, gb.Token, "current, its routing stale"}} {
		res, err := old.Write(ctx, leasecore.Write{Scope: sc, Part: partSummary, Content: "late(" + w.holder + ")", Writer: w.holder, Token: w.token})
		var moved *leasecore.ScopeMovedError
		if err != nil && !errors.As(err, &moved) {
			c.Must(err, w.holder+" writes at the old location")
		}
		c.Check("I3", fmt.Sprintf("%s's write with token=%d (%s) at the old location is rejected: the old location is sealed for everyone", w.holder, w.token, w.what),
			!res.Accepted && res.Floor == leasecore.SealedFloor, fmt.Sprintf("accepted=false floor=%d", leasecore.SealedFloor),
			fmt.Sprintf("accepted=%t floor=%d", res.Accepted, res.Floor))
		got := "no error"
		if moved != nil {
			got = fmt.Sprintf("%T to=%q floor=%d", moved, moved.To, moved.Floor)
		} else if err != nil {
			got = err.Error()
		}
		c.Equal(c.id, fmt.Sprintf("%s learns where the scope went: a *leasecore.ScopeMovedError naming the destination and the floor at the seal", w.holder),
			fmt.Sprintf("*leasecore.ScopeMovedError to=%q floor=%d", label, gb.Token), got)
	}
	c.record("resource", "the old location rejects holder-a and holder-b: the scope moved")
	c.Equal(c.id, "the old location's data is as it was at the seal", bMoved, c.stored(old, sc, partSummary))

	rb2 := c.write(dest, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=202(B)", Writer: holderB, Token: gb.Token})
	c.Equal("I3", fmt.Sprintf("holder-b writes on at the new location with its token=%d, without acquiring again", gb.Token),
		fmt.Sprintf("accepted=true floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", rb2.Accepted, rb2.Floor))
	c.Equal("I3", "the new location holds holder-b's latest data", fmt.Sprintf("rows=202(B) by %s token=%d", holderB, gb.Token),
		c.stored(dest, sc, partSummary))
	c.Must(lease.Release(ctx, gb), "holder-b releases")
}
