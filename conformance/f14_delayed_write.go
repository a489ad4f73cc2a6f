package conformance

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// f14TTL is F14's lease TTL before scaling: the hold lasts about one TTL
// plus the backend's expiry latency.
const f14TTL = time.Second

// caseF14 is a write delayed by the network, not by its writer: holder A
// sends its write while its lease is valid, and the request sits in the
// network (a TCP proxy of the case's, holdProxy) while the lease expires by
// the backend's clock and holder B takes over with a larger token and
// writes. Then the network delivers A's request. Nothing in A could have
// stopped it: the write had left A before the lease ran out. Only the
// resource, deciding when the request arrives, can reject it — the fenced
// resource does (section "fenced"), the unfenced one, on the identical
// timeline, lets A's stale content overwrite B's (section "negative
// control").
func caseF14(ctx context.Context, c *caseRun, h Harness) {
	dn := need[DelayedNetwork](c, h, AbilityDelayedNetwork)
	addr := dn.ResourceAddress()
	if _, _, err := net.SplitHostPort(addr); err != nil {
		c.Fatalf("the harness's ResourceAddress %q is no host:port: %v", addr, err)
	}
	ttl := c.ttl(f14TTL)
	c.Notef("ttl=%v; A's resource client connects through a TCP proxy on 127.0.0.1 to %s; the lease clients and B's resource client connect directly", ttl, addr)
	c.Section("fenced", func(c *caseRun) { delayedWrite(ctx, c, h, dn, ttl, true) })
	c.Section("negative control", func(c *caseRun) { delayedWrite(ctx, c, h, dn, ttl, false) })
}

// delayedWrite runs F14's timeline with A writing through the proxy to the
// fenced resource (fenced) or to the unfenced control.
func delayedWrite(ctx context.Context, c *caseRun, h Harness, dn DelayedNetwork, ttl time.Duration, fenced bool) {
	label := "control"
	if fenced {
		label = "fenced"
	}
	// Names of their own: the sections must not see each other's lease or
	// floor.
	name, sc := leaseName+"-f14-"+label, scope+"-f14-"+label

	proxy, err := startHoldProxy(dn.ResourceAddress())
	c.Must(err, "start the proxy")
	// Closing the proxy also ends A's write if the section stops while it
	// is held: its connection is closed and the write returns an error.
	defer func() { c.Must(proxy.close(), "close the proxy") }()
	viaFenced, viaUnfenced, err := dn.ResourcesVia(ctx, proxy.addr())
	c.Must(err, "open the resource clients through the proxy")
	resA := viaUnfenced
	if fenced {
		resA = viaFenced
	}
	direct := c.openResource(h) // B's writes and the case's reads: no proxy
	lease, insp := c.openLease(h)

	// A's own reckoning: its lease cannot expire on the server before one
	// TTL after the acquire request was sent (the server starts the TTL
	// when it executes the request, later).
	sent := time.Now()
	ga, err := lease.Acquire(ctx, name, holderA, ttl)
	c.Must(err, "holder-a acquires")
	validUntil := sent.Add(ttl)
	c.FirstToken("A acquires the free lease", ga.Token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-a", ga.Token))

	// A first write through the proxy, unheld: the connection is set up,
	// statements prepared, so what the proxy holds next is the write.
	warm := c.write(resA, leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=100(A)", Writer: holderA, Token: ga.Token})
	c.Equal("I3", "A's first write through the proxy, not held, is accepted", true, warm.Accepted)

	proxy.hold()
	heldFrom := time.Now()
	c.record("network", "the proxy holds what A's resource client sends")
	aWrite := leasecore.Write{Scope: sc, Part: partSummary, Content: "rows=200(A)", Writer: holderA, Token: ga.Token}
	pending := goWrite(ctx, resA, aWrite)
	c.record("A", fmt.Sprintf("sends its write with token %d", ga.Token))

	// The write has left A once its bytes are in the proxy.
	var held int
	var seenAt time.Time
	for give := validUntil.Add(5 * time.Second); ; {
		if held = proxy.held(); held > 0 {
			seenAt = time.Now()
			break
		}
		if time.Now().After(give) {
			c.Fatalf("A's write never reached the proxy (5s past A's validity): the client does not send through ResourcesVia's address")
		}
		if len(pending) > 0 {
			c.Fatalf("A's write returned while the proxy held its connection, and nothing reached the proxy: the client wrote over another connection")
		}
		sleep(ctx, time.Millisecond)
	}
	c.record("network", fmt.Sprintf("%d bytes of A's write held", held))
	c.Check(c.id, "A's write left A and reached the network while A's lease was valid by A's own clock (before the acquire request was sent + ttl)",
		seenAt.Before(validUntil), fmt.Sprintf("held bytes > 0 before %v after the acquire was sent", ttl),
		fmt.Sprintf("%d bytes held %v after it", held, seenAt.Sub(sent).Round(time.Millisecond)))

	freeAt := c.waitFree(insp, name, ttl, sent, "A's hold, never renewed,", "A's acquire request was sent")
	c.record("lease", "A's lease expired (backend clock)")
	gb, err := lease.Acquire(ctx, name, holderB, ttl)
	c.Must(err, "holder-b acquires")
	c.NextToken("B acquires the expired lease with a larger token", ga.Token, gb.Token)
	c.record("lease", fmt.Sprintf("token %d issued to holder-b", gb.Token))
	bContent := "rows=201(B)"
	rb := c.write(direct, leasecore.Write{Scope: sc, Part: partSummary, Content: bContent, Writer: holderB, Token: gb.Token})
	c.Equal("I3", "B's write, not through the proxy, is accepted", fmt.Sprintf("accepted=true floor=%d", gb.Token),
		fmt.Sprintf("accepted=%t floor=%d", rb.Accepted, rb.Floor))
	c.record("resource", fmt.Sprintf("B's token-%d write accepted", gb.Token))
	state := "pending"
	if len(pending) > 0 {
		state = "returned"
	}
	c.Equal(c.id, "A's write is still waiting for its answer: it is in the network, not at the server", "pending", state)

	stillHeld := proxy.held()
	deliveredAt := time.Now()
	n := proxy.deliver()
	c.record("network", fmt.Sprintf("the proxy delivers A's write (%d bytes)", n))
	c.Notef("A's write was held in the network for %v (%d bytes; first seen %v after the hold began); the lease was seen free %v after A's acquire was sent, B was granted token %d",
		deliveredAt.Sub(heldFrom).Round(time.Millisecond), stillHeld, seenAt.Sub(heldFrom).Round(time.Millisecond),
		freeAt.Sub(sent).Round(time.Millisecond), gb.Token)
	ra := c.await(pending, "A's delayed write")
	c.Must(lease.Release(ctx, gb), "holder-b releases")
	final := c.stored(direct, sc, partSummary)
	floor := c.floor(direct, sc)
	c.Notef("A's delayed write: accepted=%t floor=%d; summary = %s; floor=%d", ra.Accepted, ra.Floor, final, floor)
	aWon := fmt.Sprintf("%s by %s token=%d", aWrite.Content, holderA, ga.Token)
	if !fenced {
		if ra.Accepted {
			c.record("resource", fmt.Sprintf("A's token-%d write accepted: summary = %s", ga.Token, final))
		}
		c.Exposes("the resource does not check tokens, so A's write, sent while its lease was valid and delivered after B's, overwrote B's content",
			ra.Accepted && final == aWon, fmt.Sprintf("A: accepted=%t; summary: %s", ra.Accepted, final))
		return
	}
	c.record("resource", fmt.Sprintf("A's token-%d write rejected (floor %d)", ga.Token, ra.Floor))
	c.Equal("I3", fmt.Sprintf("A's delayed write with token %d is rejected with B's token as the floor", ga.Token),
		fmt.Sprintf("accepted=false floor=%d", gb.Token), fmt.Sprintf("accepted=%t floor=%d", ra.Accepted, ra.Floor))
	c.Equal("I3", "the summary is still B's and the floor B's token",
		fmt.Sprintf("%s by %s token=%d, floor=%d", bContent, holderB, gb.Token, gb.Token), fmt.Sprintf("%s, floor=%d", final, floor))
}
