package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// caseX2 checks the parts of the Lease contract that a lease service built
// the obvious way on a lock breaks while passing every other case (issue
// 15: etcd's concurrency.Mutex behind leasecore.Lease did). Each section is
// one such way:
//
//   - holds that are over: renew and release of a grant that expired, was
//     taken over or was released fail with ErrLost and change nothing (an
//     unlock that deletes by name returns nil, and ends the next holder's
//     hold);
//   - retried release: a release whose answer was lost, retried, must not
//     end the next holder's hold (AmbiguousOutcomes);
//   - TTLs as asked: Grant.TTL is the TTL asked for, and two names of one
//     holder with two TTLs lapse independently (a session's TTL is
//     neither);
//   - holder that stops renewing: a live holder, not frozen, that stops
//     calling Renew loses the hold within its TTL (a client that renews in
//     the background never does; F4's SIGSTOP freezes that renewal too, so
//     it cannot tell);
//   - re-entrant acquire: the holder's own acquire of a name it holds is
//     refused with ErrHeld and changes nothing;
//   - independent names: "a" and "a/b" (and names differing by case or a
//     LIKE wildcard) are held at the same time, and releasing one ends only
//     its own hold;
//   - second client: renew and release by a non-holder fail, and a release
//     is seen, through an independent client of the same backend, so that
//     bookkeeping inside one client cannot pass for the server's check;
//   - lost acquire answer: an acquire whose answer was lost leaves no
//     holder once its TTL has passed, even while the same holder renews
//     another name through the same client (AmbiguousOutcomes).
//
// Every lease this case waits on has a TTL scaled from the backend's
// minimum, like the other cases'; its expiry is checked within ttl +
// granularity + expiryBound (waitFree).
func caseX2(ctx context.Context, c *caseRun, h Harness) {
	c.Section("holds that are over", func(c *caseRun) { x2OverHolds(c, h) })
	c.Section("retried release", func(c *caseRun) { x2RetriedRelease(c, h) })
	c.Section("TTLs as asked", func(c *caseRun) { x2TTLs(c, h) })
	c.Section("holder that stops renewing", func(c *caseRun) { x2StopsRenewing(c, h) })
	c.Section("re-entrant acquire", func(c *caseRun) { x2Reentrant(c, h) })
	c.Section("independent names", func(c *caseRun) { x2IndependentNames(c, h) })
	c.Section("second client", func(c *caseRun) { x2SecondClient(c, h) })
	c.Section("lost acquire answer", func(c *caseRun) { x2LostAcquire(c, h) })
}

// x2Short is X2's TTL for holds it lets lapse, x2Long for holds that must
// outlive their section.
const (
	x2Short = 300 * time.Millisecond
	x2Long  = 5 * time.Second
)

// freeState is holdState's rendering of a lease nobody holds.
const freeState = "free"

// heldBy renders a held lease the way holdState does.
func heldBy(holder string, token leasecore.Token) string {
	return fmt.Sprintf("held by %s token=%d", holder, token)
}

// holdState renders what the backend says of lease name right now: "free",
// or who holds it with which token.
func (c *caseRun) holdState(insp leasecore.LeaseInspector, name string) string {
	st, err := insp.Inspect(c.ctx, name)
	c.Must(err, "inspect lease "+name)
	if !st.Held {
		return freeState
	}
	return heldBy(st.Holder, st.Token)
}

// granted renders an acquire's outcome: the token, or the sentinel its
// error wraps.
func granted(g leasecore.Grant, err error) string {
	if err != nil {
		return errKind(err)
	}
	return fmt.Sprintf("granted token=%d", g.Token)
}

// holdCall checks one call on a lease: what it returned (got: errKind of
// its error, or granted) and the lease's state right after it, read
// through insp. A call that fails must change nothing, so the state
// expected after a refusal is the state before it.
func (c *caseRun) holdCall(rule, what string, insp leasecore.LeaseInspector, name, want, wantState, got string) bool {
	expected := want + "; " + wantState
	actual := got + "; " + c.holdState(insp, name)
	return c.Check(rule, what, expected == actual, expected, actual)
}

// x2OverHolds: renew and release of a grant whose holding period is over
// fail with ErrLost and change nothing, whichever way it ended: expired
// with nobody taking over, expired and taken over, released.
func x2OverHolds(c *caseRun, h Harness) {
	ctx := c.ctx
	lease, insp := c.openLease(h)
	const name = "x2-over"
	short, long := c.ttl(x2Short), c.ttl(x2Long)
	lost := errKind(leasecore.ErrLost)

	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, short)
	c.Must(err, "holder-a acquires "+name)
	c.waitFree(insp, name, short, sent, "holder-a's hold of "+name+", never renewed,", "its acquire")
	_, err = lease.Renew(ctx, ga)
	c.holdCall("I1", "holder-a's renewal after its hold expired, nobody having taken over, fails with ErrLost and changes nothing",
		insp, name, lost, freeState, errKind(err))
	c.holdCall("I1", "holder-a's release after its hold expired, nobody having taken over, fails with ErrLost and changes nothing",
		insp, name, lost, freeState, errKind(lease.Release(ctx, ga)))

	gb, err := lease.Acquire(ctx, name, holderB, long)
	c.Must(err, "holder-b acquires "+name)
	c.NextToken("holder-b acquires the expired lease with a larger token", ga.Token, gb.Token)
	hb := heldBy(holderB, gb.Token)
	_, err = lease.Renew(ctx, ga)
	c.holdCall("I1", "holder-a's renewal of its expired grant, after holder-b took over, fails with ErrLost; holder-b's hold is unaffected",
		insp, name, lost, hb, errKind(err))
	c.holdCall("I1", "holder-a's release of its expired grant, after holder-b took over, fails with ErrLost; holder-b's hold is unaffected",
		insp, name, lost, hb, errKind(lease.Release(ctx, ga)))

	c.holdCall("I1", "holder-b releases its hold", insp, name, "nil", freeState, errKind(lease.Release(ctx, gb)))
	c.holdCall("I1", "holder-b's second release fails with ErrLost and changes nothing", insp, name, lost, freeState,
		errKind(lease.Release(ctx, gb)))
}

// x2TTLs: a grant carries the TTL asked for, and one holder's two names
// with two TTLs live on their own: the one the holder stops renewing lapses
// while it renews the other. A lease service that attaches every name of a
// holder to one session gets both wrong: the session's TTL, and one expiry
// for all.
func x2TTLs(c *caseRun, h Harness) {
	ctx := c.ctx
	lease, insp := c.openLease(h)
	const shortName, longName = "x2-ttl-short", "x2-ttl-long"
	short := c.ttl(x2Short)
	long := c.ttl(4 * short) // another TTL, also after rounding to the granularity

	gl, err := lease.Acquire(ctx, longName, holderA, long)
	c.Must(err, "holder-a acquires "+longName)
	c.Equal("TTL", fmt.Sprintf("holder-a's grant of %s carries the TTL asked for", longName), "ttl="+long.String(), "ttl="+gl.TTL.String())
	sent := time.Now()
	gs, err := lease.Acquire(ctx, shortName, holderA, short)
	c.Must(err, "holder-a acquires "+shortName)
	c.Equal("TTL", fmt.Sprintf("holder-a's grant of %s, its second name, carries the TTL asked for, not the first name's", shortName),
		"ttl="+short.String(), "ttl="+gs.TTL.String())

	// holder-a keeps its long name alive, often enough that a renewal
	// shared with the short name would keep that one alive too.
	every := short / 4
	last := time.Now()
	var renewErr error
	renewLong := func() {
		if renewErr != nil || time.Since(last) < every {
			return
		}
		last = time.Now()
		g, err := lease.Renew(ctx, gl)
		if err != nil {
			renewErr = err
			return
		}
		gl = g
	}
	c.awaitFree(insp, shortName, short, sent,
		fmt.Sprintf("holder-a's hold of %s, not renewed while holder-a renews %s every %v,", shortName, longName, every), "its acquire", renewLong)
	if renewErr != nil {
		c.Fatalf("holder-a's renewal of %s failed: %s", longName, describeErr(renewErr))
	}
	c.Equal("I1", fmt.Sprintf("%s, renewed throughout, is still held by holder-a", longName), heldBy(holderA, gl.Token), c.holdState(insp, longName))
	c.Must(lease.Release(ctx, gl), "holder-a releases "+longName)
}

// x2StopsRenewing: a holder that is alive, not frozen, its client open and
// in use, and that stops calling Renew, loses the hold within its TTL. Only
// Renew extends a hold: a client that renews on its own in the background
// (a session's keep-alive) keeps it for ever, and F4/F5 cannot see that,
// since SIGSTOP freezes that renewal too.
func x2StopsRenewing(c *caseRun, h Harness) {
	ctx := c.ctx
	lease, insp := c.openLease(h)
	const name = "x2-idle"
	short := c.ttl(x2Short)
	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, short)
	c.Must(err, "holder-a acquires "+name)
	// waitFree inspects through the same client: it stays open and in use.
	c.waitFree(insp, name, short, sent, "holder-a's hold of "+name+", alive and not frozen, its client open and in use, but never renewed,", "its acquire")
	// holder-b's hold is not under test: a long TTL, so that a slow
	// machine cannot let it lapse before its release.
	gb, err := lease.Acquire(ctx, name, holderB, c.ttl(x2Long))
	c.Must(err, "holder-b acquires "+name)
	c.NextToken("holder-b acquires "+name+" after holder-a stopped renewing, with a larger token", ga.Token, gb.Token)
	c.Must(lease.Release(ctx, gb), "holder-b releases "+name)
}

// x2Reentrant: "while another holding period is unexpired (whoever holds
// it, the same holder included)" Acquire returns ErrHeld. A lock that is
// re-entrant hands the holder its old token instead, and one release then
// ends both "holds".
func x2Reentrant(c *caseRun, h Harness) {
	ctx := c.ctx
	l1, insp := c.openLease(h)
	l2, _ := c.openLease(h)
	const name = "x2-reentrant"
	long := c.ttl(x2Long)
	held := errKind(leasecore.ErrHeld)

	ga, err := l1.Acquire(ctx, name, holderA, long)
	c.Must(err, "holder-a acquires "+name)
	ha := heldBy(holderA, ga.Token)
	g, err := l1.Acquire(ctx, name, holderA, long)
	c.holdCall("I1", "holder-a's second acquire of a name it already holds is refused with ErrHeld and changes nothing",
		insp, name, held, ha, granted(g, err))
	g, err = l2.Acquire(ctx, name, holderA, long)
	c.holdCall("I1", "holder-a's acquire of a name it already holds, through a second client, is refused with ErrHeld and changes nothing",
		insp, name, held, ha, granted(g, err))
	rg, err := l1.Renew(ctx, ga)
	c.holdCall("I1", "holder-a's original grant still renews: its hold is unaffected", insp, name, "nil", ha, errKind(err))
	if err != nil {
		rg = ga
	}
	c.holdCall("I1", "holder-a releases with its original grant", insp, name, "nil", freeState, errKind(l1.Release(ctx, rg)))
}

// x2Names are lease names a backend must keep apart, in the order X2
// acquires them: each is a prefix of another or has one, or differs from
// "a" only in case or by a LIKE wildcard. "a/b" is first so that "a" is
// acquired while a name it prefixes is held, and "a/b/c" while a name that
// prefixes it is.
var x2Names = []string{"a/b", "a", "a/b/c", "a/", "ab", "a%", "a_", "A"}

// x2IndependentNames: names are data, compared whole. Every name of
// x2Names is held at the same time, each by its own holder; releasing "a"
// ends only its own hold.
func x2IndependentNames(c *caseRun, h Harness) {
	ctx := c.ctx
	lease, insp := c.openLease(h)
	long := c.ttl(x2Long)
	var quoted []string
	for _, n := range x2Names {
		quoted = append(quoted, backendkit.Quote(n))
	}
	list := strings.Join(quoted, ", ")

	grants := map[string]leasecore.Grant{}
	var refused []string
	for i, name := range x2Names {
		holder := fmt.Sprintf("holder-%d", i+1)
		g, err := lease.Acquire(ctx, name, holder, long)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s by %s: %s", backendkit.Quote(name), holder, errKind(err)))
			continue
		}
		grants[name] = g
	}
	all := len(x2Names)
	actual := fmt.Sprintf("%d of %d acquired", len(grants), all)
	if len(refused) > 0 {
		actual += "; refused " + strings.Join(refused, ", ")
	}
	c.Check("I1", fmt.Sprintf("names that prefix one another or differ by case or a LIKE wildcard (%s) are acquired while the others are held, each by its own holder", list),
		len(refused) == 0, fmt.Sprintf("%d of %d acquired", all, all), actual)

	// asAcquired counts the names whose state is still their grant's,
	// and describes the others.
	asAcquired := func() (int, []string) {
		n := 0
		var wrong []string
		for _, name := range x2Names {
			g, ok := grants[name]
			if !ok {
				continue
			}
			want, got := heldBy(g.Holder, g.Token), c.holdState(insp, name)
			if got == want {
				n++
			} else {
				wrong = append(wrong, fmt.Sprintf("%s %s, want %s", backendkit.Quote(name), got, want))
			}
		}
		return n, wrong
	}
	render := func(n int, wrong []string) string {
		s := fmt.Sprintf("%d of %d as acquired", n, len(grants))
		if len(wrong) > 0 {
			s += "; " + strings.Join(wrong, "; ")
		}
		return s
	}
	n, wrong := asAcquired()
	c.Check("I1", "Inspect shows each name held by its own holder with its own token", len(wrong) == 0,
		render(len(grants), nil), render(n, wrong))

	const first = "a"
	ga, ok := grants[first]
	if !ok {
		c.Fatalf("cannot go on without a hold of %s", backendkit.Quote(first))
	}
	err := lease.Release(ctx, ga)
	delete(grants, first)
	n, wrong = asAcquired()
	c.Check("I1", fmt.Sprintf("releasing %s ends only its own hold: the names it prefixes stay held", backendkit.Quote(first)),
		err == nil && len(wrong) == 0, fmt.Sprintf("nil; %s %s; %s", backendkit.Quote(first), freeState, render(len(grants), nil)),
		fmt.Sprintf("%s; %s %s; %s", errKind(err), backendkit.Quote(first), c.holdState(insp, first), render(n, wrong)))

	released := 0
	var failed []string
	for _, name := range x2Names {
		g, ok := grants[name]
		if !ok {
			continue
		}
		if err := lease.Release(ctx, g); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %s", backendkit.Quote(name), errKind(err)))
			continue
		}
		released++
	}
	actual = fmt.Sprintf("%d of %d released", released, len(grants))
	if len(failed) > 0 {
		actual += "; " + strings.Join(failed, ", ")
	}
	c.Check("I1", "each other name releases with its own grant", len(failed) == 0, fmt.Sprintf("%d of %d released", len(grants), len(grants)), actual)
}

// x2SecondClient: the holder checks of Renew and Release are the server's,
// not bookkeeping in the client that acquired. A second, independent
// client of the same backend (its own connection) presents a non-holder's
// grant and a token never issued, and must be refused; the holder's own
// grant works through it; a release through it is seen by the first.
func x2SecondClient(c *caseRun, h Harness) {
	ctx := c.ctx
	l1, insp1 := c.openLease(h)
	l2, insp2 := c.openLease(h)
	const name = "x2-clients"
	long := c.ttl(x2Long)
	lost := errKind(leasecore.ErrLost)

	ga, err := l1.Acquire(ctx, name, holderA, long)
	c.Must(err, "holder-a acquires "+name+" through the first client")
	ha := heldBy(holderA, ga.Token)
	stranger := ga
	stranger.Holder = holderB
	forged := ga
	forged.Token = ga.Token + 1

	// The state after a call through one client is read through the other.
	_, err = l2.Renew(ctx, stranger)
	c.holdCall("I1", "renewal by a non-holder (holder-b with holder-a's token) through a second client fails with ErrLost and changes nothing",
		insp1, name, lost, ha, errKind(err))
	c.holdCall("I1", "release by a non-holder (holder-b with holder-a's token) through a second client fails with ErrLost and changes nothing",
		insp1, name, lost, ha, errKind(l2.Release(ctx, stranger)))
	_, err = l2.Renew(ctx, forged)
	c.holdCall("I1", fmt.Sprintf("renewal of holder-a's hold with token %d, never issued to it, through a second client fails with ErrLost and changes nothing", forged.Token),
		insp1, name, lost, ha, errKind(err))
	c.holdCall("I1", fmt.Sprintf("release of holder-a's hold with token %d, never issued to it, through a second client fails with ErrLost and changes nothing", forged.Token),
		insp1, name, lost, ha, errKind(l2.Release(ctx, forged)))

	rg, err := l2.Renew(ctx, ga)
	c.holdCall("I1", "holder-a's own grant renews through the second client: the hold is the server's, not the first client's",
		insp1, name, "nil", ha, errKind(err))
	if err != nil {
		rg = ga
	}
	c.holdCall("I1", "holder-a's own grant releases through the second client", insp1, name, "nil", freeState, errKind(l2.Release(ctx, rg)))
	_, err = l1.Renew(ctx, ga)
	c.holdCall("I1", "holder-a's renewal through the first client, after the release through the second, fails with ErrLost",
		insp2, name, lost, freeState, errKind(err))
	c.holdCall("I1", "holder-a's release through the first client, after the release through the second, fails with ErrLost",
		insp2, name, lost, freeState, errKind(l1.Release(ctx, ga)))
}

// untilAvailable runs fn until it returns anything but an error wrapping
// leasecore.ErrUnavailable (a client reconnecting after its connection was
// cut), for at most 30 seconds, and returns what it returned last: what a
// caller retrying an ambiguous call meets.
func (c *caseRun) untilAvailable(fn func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := fn()
		if !errors.Is(err, leasecore.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		sleep(c.ctx, 50*time.Millisecond)
	}
}
