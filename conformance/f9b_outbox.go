package conformance

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// caseF9b builds F9's remedy and checks it: the side effect ("report
// published") is recorded in a fenced outbox, in the same atomic operation
// as the data, and a relay delivers it with the writer's token as its
// version to a downstream that deduplicates by the entry's identity and
// accepts only versions at or above the highest it has seen.
//
// Same two orders as F9, with B's takeover before either publishes (B
// acquired token 2 and advanced the fence, the README's sequence): A's
// transaction is rejected whole, so its entry never exists and its
// publication never reaches the downstream, in both orders. The negative
// control writes the same orders into the outbox with no fence: the stale
// publication is delivered, and in order A->B the downstream accepts it.
// Last, relay processes are killed with SIGKILL mid-delivery, once before
// the downstream processed the request and once after (its answer lost):
// after a new relay finishes, the downstream accepted every entry exactly
// once.
func caseF9b(ctx context.Context, c *caseRun, h Harness) {
	ob := need[OutboxResources](c, h, AbilityOutbox)
	const publication = "report-published"
	stale := func(scope string) leasecore.Write {
		return leasecore.Write{Scope: scope, Part: publication, Content: "report(A-stale)", Writer: holderA, Token: 1}
	}
	fresh := func(scope string) leasecore.Write {
		return leasecore.Write{Scope: scope, Part: publication, Content: "report(B)", Writer: holderB, Token: 2}
	}
	// takeover is B's Advance right after its acquire.
	takeover := func(scope string) leasecore.Claim { return backendkit.ClaimOf(fresh(scope)) }
	type order struct {
		name, scope string
		aFirst      bool
	}
	orders := []order{
		{"order B->A", "daily-report-f9b-b-then-a", false},
		{"order A->B", "daily-report-f9b-a-then-b", true},
	}
	// publish writes A's and B's publications in o's order and returns
	// their results.
	publish := func(c *caseRun, out Outbox, o order, suffix string) (a, b leasecore.Result) {
		if o.aFirst {
			a = c.write(out, stale(o.scope+suffix))
			b = c.write(out, fresh(o.scope+suffix))
		} else {
			b = c.write(out, fresh(o.scope+suffix))
			a = c.write(out, stale(o.scope+suffix))
		}
		return a, b
	}

	c.Section("fenced outbox, same two orders as F9", func(c *caseRun) {
		out, err := ob.FencedOutbox(ctx)
		c.Must(err, "open the fenced outbox")
		ds := c.startDownstream()
		c.Notef("B took over before either publishes: it acquired token 2 and advanced the fence (Advance right after the acquire); " +
			"A still holds token 1. Each publication is the report row and its outbox entry in one fenced transaction")
		for _, o := range orders {
			adv, err := out.Advance(ctx, takeover(o.scope))
			c.Must(err, "B's advance")
			c.Equal("I3", o.name+": B's takeover advances the fence to token 2", "accepted=true floor=2",
				fmt.Sprintf("accepted=%t floor=%d", adv.Accepted, adv.Floor))
			a, b := publish(c, out, o, "")
			c.Equal("I3", o.name+": A's stale publication (token 1) is rejected by the fence", "accepted=false floor=2",
				fmt.Sprintf("accepted=%t floor=%d", a.Accepted, a.Floor))
			c.Equal("I3", o.name+": B's publication (token 2) is accepted", "accepted=true", fmt.Sprintf("accepted=%t", b.Accepted))
			kept, ok := c.readPart(out, o.scope, publication)
			c.Equal("I3", o.name+": the report row is B's", "report(B) by holder-b token=2", describePart(kept, ok))
			c.Equal("F9b", o.name+": before the relay runs the outbox holds B's entry only: A's transaction was rejected whole, so its entry never existed",
				"[holder-b token=2 report(B)]", describeEntries(c.pending(out, o.scope)))
			n := c.relayOnce(out, ds)
			c.Notef("%s: the suite's relay marked %d delivered", o.name, n)
			c.Equal("F9b", o.name+": the stale holder's publication never reaches the downstream; B's is accepted once, as version 2",
				"received from holder-a: 0; accepted: [holder-b version=2 report(B)]", ds.describeScope(o.scope, holderA))
			c.Equal("F9b", o.name+": nothing is left pending after the relay", "[]", describeEntries(c.pending(out, o.scope)))
		}
	})

	c.Section("unfenced outbox, same two orders (negative control)", func(c *caseRun) {
		out, err := ob.UnfencedOutbox(ctx)
		c.Must(err, "open the unfenced outbox")
		ds := c.startDownstream()
		reached, acceptedFirst := 0, false
		var evidence []string
		for _, o := range orders {
			a, b := publish(c, out, o, "-unfenced")
			c.relayOnce(out, ds)
			scope := o.scope + "-unfenced"
			var verdict string
			for _, dl := range ds.deliveries(scope) {
				if dl.e.Writer == holderA {
					reached++
					verdict = dl.verdict
				}
			}
			if o.aFirst && verdict == verdictAccepted {
				acceptedFirst = true
			}
			c.Notef("%s: A accepted=%t, B accepted=%t by the unfenced outbox; the downstream's verdict on A's publication: %s",
				o.name, a.Accepted, b.Accepted, verdict)
			evidence = append(evidence, fmt.Sprintf("%s: %s", o.name, ds.describeScope(scope, holderA)))
		}
		c.Exposes("without the fence the stale holder's publication reaches the downstream in both orders, and arriving first (order A->B) "+
			"it is accepted: the downstream's version check alone cannot know that a newer version exists",
			reached == len(orders) && acceptedFirst, strings.Join(evidence, "; "))
	})

	c.Section("relay killed with SIGKILL mid-delivery", func(c *caseRun) {
		hp := need[HolderProcesses](c, h, AbilityHolderProcesses)
		out, err := ob.FencedOutbox(ctx)
		c.Must(err, "open the fenced outbox")
		const scope, entries = "daily-report-f9b-relay", 5
		adv, err := out.Advance(ctx, takeover(scope))
		c.Must(err, "B's advance")
		c.Check("I3", "B advances the fence to token 2", adv.Accepted, "accepted=true", fmt.Sprintf("accepted=%t", adv.Accepted))
		payload := func(i int) string { return fmt.Sprintf("report(B) #%d", i) }
		for i := 1; i <= entries; i++ {
			r := c.write(out, leasecore.Write{Scope: scope, Part: fmt.Sprintf("%s-%d", publication, i), Content: payload(i),
				Writer: holderB, Token: 2})
			if !r.Accepted {
				c.Fatalf("B's publication %d was rejected: floor %d", i, r.Floor)
			}
		}
		written := c.pending(out, scope)
		c.Equal("F9b", "B's five publications are pending, in order", "[#1 #2 #3 #4 #5]", describeOrder(written))
		ds := c.startDownstream()

		// R1 is killed while the downstream holds entry 2 before
		// processing it: the entry was sent and never processed.
		held := ds.holdOnce(payload(2), false)
		r1 := c.startHolder(hp, KindOutbox, "R1")
		r1.send("RELAY " + ds.url)
		c.waitHeld(held, r1, "entry 2 reached the downstream")
		c.record("parent", "entry 2 held unprocessed; SIGKILL to R1")
		ended := r1.kill()
		c.Check("F9b", "relay R1 was killed with SIGKILL while the downstream held entry 2 unprocessed", ended == "signal: killed",
			"signal: killed", ended)

		// R2 is killed after the downstream processed entry 4 and before
		// its answer arrived: processed, never acknowledged to the relay.
		held = ds.holdOnce(payload(4), true)
		r2 := c.startHolder(hp, KindOutbox, "R2")
		r2.send("RELAY " + ds.url)
		c.waitHeld(held, r2, "entry 4 reached the downstream")
		c.record("parent", "entry 4 processed, answer held; SIGKILL to R2")
		ended = r2.kill()
		c.Check("F9b", "relay R2 was killed with SIGKILL after the downstream processed entry 4, before its answer arrived",
			ended == "signal: killed", "signal: killed", ended)

		r3 := c.startHolder(hp, KindOutbox, "R3")
		reply := r3.call("RELAY " + ds.url)
		c.Must(r3.exit(), "relay R3's exit")
		c.Notef("a new relay, R3, ran to the end: %s", reply)

		// What the downstream saw, per entry (by its payload, which is
		// unique here: the identity is what is under test).
		type seen struct {
			received, accepted int
			ids                []string
		}
		per := map[string]*seen{}
		var wire []string
		for _, dl := range ds.deliveries(scope) {
			p := string(dl.e.Payload)
			s := per[p]
			if s == nil {
				s = &seen{}
				per[p] = s
			}
			s.received++
			if dl.verdict == verdictAccepted {
				s.accepted++
			}
			if !slices.Contains(s.ids, dl.e.ID) {
				s.ids = append(s.ids, dl.e.ID)
			}
			wire = append(wire, fmt.Sprintf("#%s %s", strings.TrimPrefix(p, "report(B) #"), dl.verdict))
		}
		var lost, counts []string
		for i := 1; i <= entries; i++ {
			s := per[payload(i)]
			if s == nil {
				s = &seen{}
			}
			if s.accepted == 0 {
				lost = append(lost, fmt.Sprintf("#%d", i))
			}
			counts = append(counts, fmt.Sprintf("#%d:%d", i, s.accepted))
		}
		c.Notef("the wire, in arrival order: %s", strings.Join(wire, ", "))
		describe := func(i int) string {
			s := per[payload(i)]
			if s == nil {
				return "received 0 times"
			}
			return fmt.Sprintf("received %d times with %d identities, accepted %d", s.received, len(s.ids), s.accepted)
		}
		c.Equal("F9b", "entry 2, sent by R1 but never processed when R1 was killed, was not marked delivered: the next relay delivered it again and it was accepted",
			"received 2 times with 1 identities, accepted 1", describe(2))
		c.Equal("F9b", "entry 4, processed when R2 was killed before its answer, came again from the next relay with the same identity and was a no-op",
			"received 2 times with 1 identities, accepted 1", describe(4))
		c.Equal("F9b", "no accepted entry was lost: the downstream accepted every entry the fence accepted, though two relays were killed mid-delivery",
			"lost: none", "lost: "+orNone(lost))
		c.Equal("F9b", "no accepted entry was duplicated: the downstream accepted each exactly once (redeliveries on the wire were no-ops)",
			"#1:1 #2:1 #3:1 #4:1 #5:1", strings.Join(counts, " "))
		c.Equal("F9b", "nothing is left pending after the last relay", "[]", describeEntries(c.pending(out, scope)))
	})
}

// pending reads scope's pending entries, ending the case on an error.
func (c *caseRun) pending(out Outbox, scope string) []leasecore.OutboxEntry {
	es, err := out.Pending(c.ctx, scope)
	c.Must(err, "read the pending entries of "+scope)
	return es
}

// relayOnce runs one pass of out's relay in the suite's process,
// delivering to ds, and returns how many entries it marked.
func (c *caseRun) relayOnce(out OutboxRelay, ds *downstream) int {
	n, err := out.Relay(c.ctx, ds.deliver)
	c.Must(err, "relay")
	return n
}

// describeEntries lists entries as "[writer token=N payload, ...]".
func describeEntries(es []leasecore.OutboxEntry) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = fmt.Sprintf("%s token=%d %s", e.Writer, e.Token, e.Payload)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// describeOrder lists the relay section's entries by number: "[#1 #2 ...]".
func describeOrder(es []leasecore.OutboxEntry) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = "#" + strings.TrimPrefix(string(e.Payload), "report(B) #")
	}
	return "[" + strings.Join(s, " ") + "]"
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

// kill sends SIGKILL to the holder process (os.Process.Kill) and waits for
// it to exit; it returns how the process ended ("signal: killed").
func (p *holderProc) kill() (ended string) {
	proc, err := os.FindProcess(p.pid)
	p.c.Must(err, "find relay process "+p.label)
	p.c.Must(proc.Kill(), "SIGKILL to "+p.label)
	p.c.record(p.label, "SIGKILL")
	for range p.replies { // until its stdout closes
	}
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		ended = "exit status 0"
		if err != nil {
			ended = err.Error()
		}
	case <-time.After(30 * time.Second):
		p.c.Fatalf("%s: %v 30s after SIGKILL", p.label, errNotKilled)
	}
	p.c.record(p.label, "exited: "+ended)
	return ended
}
