package conformance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/conformance"
)

// F9b must be able to fail: broken variants of the in-memory outbox, each
// failing F9b's check named for what it breaks.

// outboxMutant returns the in-memory harness with its outbox broken by
// set.
func outboxMutant(set func(h *memHarness)) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		set(h.(*memHarness))
		return h, nil
	}
}

var outboxMutants = []struct {
	name string
	set  func(h *memHarness)
	want []string
}{
	{
		// The entry is added outside the fenced operation: the report row
		// is fenced, the announcement goes in whatever the fence decided.
		name: "outbox written outside the fenced transaction",
		set:  func(h *memHarness) { h.outboxOutsideFence = true },
		want: []string{
			"  FAIL [F9b] order B->A: before the relay runs the outbox holds B's entry only: A's transaction was rejected whole, so its entry never existed (expected=[holder-b token=2 report(B)], actual=[holder-b token=2 report(B), holder-a token=1 report(A-stale)])",
			"  FAIL [F9b] order B->A: the stale holder's publication never reaches the downstream; B's is accepted once, as version 2 (expected=received from holder-a: 0; accepted: [holder-b version=2 report(B)], actual=received from holder-a: 1; accepted: [holder-b version=2 report(B)])",
			"  FAIL [F9b] order A->B: the stale holder's publication never reaches the downstream; B's is accepted once, as version 2 (expected=received from holder-a: 0; accepted: [holder-b version=2 report(B)], actual=received from holder-a: 1; accepted: [holder-a version=1 report(A-stale), holder-b version=2 report(B)])",
		},
	},
	{
		// The relay marks an entry delivered, then sends it: a relay
		// killed in between loses it.
		name: "relay marks delivered before the downstream acknowledged",
		set:  func(h *memHarness) { h.relayMutant = relayMarkFirst },
		want: []string{
			"  FAIL [F9b] entry 2, sent by R1 but never processed when R1 was killed, was not marked delivered: the next relay delivered it again and it was accepted (expected=received 2 times with 1 identities, accepted 1, actual=received 1 times with 1 identities, accepted 0)",
			"  FAIL [F9b] no accepted entry was lost: the downstream accepted every entry the fence accepted, though two relays were killed mid-delivery (expected=lost: none, actual=lost: #2)",
		},
	},
	{
		// The relay gives an entry a new identity on every delivery: the
		// downstream cannot tell a redelivery from a new entry.
		name: "relay with a fresh identity per delivery",
		set:  func(h *memHarness) { h.relayMutant = relayFreshIDs },
		want: []string{
			"  FAIL [F9b] entry 4, processed when R2 was killed before its answer, came again from the next relay with the same identity and was a no-op (expected=received 2 times with 1 identities, accepted 1, actual=received 2 times with 2 identities, accepted 2)",
			"  FAIL [F9b] no accepted entry was duplicated: the downstream accepted each exactly once (redeliveries on the wire were no-ops) (expected=#1:1 #2:1 #3:1 #4:1 #5:1, actual=#1:1 #2:1 #3:1 #4:2 #5:1)",
		},
	},
}

func TestF9bFailsBrokenOutboxes(t *testing.T) {
	t.Parallel()
	for _, mt := range outboxMutants {
		t.Run(mt.name, func(t *testing.T) {
			t.Parallel()
			sum, out := report(t, outboxMutant(mt.set), "F9b")
			wantLines(t, sum, out, mt.want...)
		})
	}
}

// withoutOutbox is the in-memory harness without OutboxResources,
// declaring it absent when reason is set.
type withoutOutbox struct {
	conformance.Harness // hides memHarness's optional methods
	reason              string
}

func (h withoutOutbox) Traits() conformance.Traits {
	t := h.Harness.Traits()
	if h.reason != "" {
		t.Absent[conformance.AbilityOutbox] = h.reason
	}
	return t
}

// F9b skips, printing why, for a harness that declares the outbox absent,
// and fails for one that neither implements nor declares it.
func TestF9bWithoutOutbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reason, want string
		failed       int
	}{
		{"no transactions to put an outbox in", "  skip fenced outbox: no transactions to put an outbox in", 0},
		{"", "  FAIL the harness neither implements *conformance.OutboxResources (fenced outbox) nor declares it absent in Traits.Absent", 1},
	} {
		sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
			h, _ := newMemHarness(ctx)
			return withoutOutbox{h, tc.reason}, nil
		}, "F9b")
		if !strings.Contains(out, tc.want) || sum.Failed != tc.failed {
			t.Errorf("failed=%d (want %d), want %q:\n%s", sum.Failed, tc.failed, tc.want, out)
		}
	}
}

// withoutHolders is the in-memory harness with holder processes declared
// absent: F9b's relay section skips, the orders and the control still run.
type withoutHolders struct{ *memHarness }

func (h withoutHolders) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.Absent[conformance.AbilityHolderProcesses] = "no re-executable binary"
	return t
}

func TestF9bWithoutHolderProcesses(t *testing.T) {
	t.Parallel()
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return withoutHolders{h.(*memHarness)}, nil
	}, "F9b")
	if sum.Failed != 0 || !strings.Contains(out, "  skip holder processes: no re-executable binary") ||
		!strings.Contains(out, "  ok   negative control exposes: without the fence") {
		t.Errorf("failed=%d:\n%s", sum.Failed, out)
	}
}
