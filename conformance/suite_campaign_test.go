package conformance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// F12 and F13 must be able to fail: lease services that keep a frozen or
// cut-off leader's lease for ever, that let the next leader in before the
// old one's local deadline, that reuse tokens, or that let two lead at once.
// The holder processes of F12 reach the same memfence.Leases over RPC
// (memholder_test.go), so a broken server clock breaks them too.

// serverClockHarness is the in-memory harness on a lease service whose
// clock is now. Its lease clients hide memfence's Waiter: its WaitFree
// sleeps in real time for the remaining time by the server's clock, which
// a doctored clock makes meaningless; the campaigners poll instead.
type serverClockHarness struct{ *memHarness }

func newServerClockHarness(now func() time.Time) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		m := h.(*memHarness)
		m.leases = memfence.NewLeases(now)
		return serverClockHarness{m}, nil
	}
}

// pollingLease is a lease client without WaitFree.
type pollingLease struct {
	leasecore.Lease
	leasecore.LeaseInspector
}

// serverClockScale stretches F12's and F13's terms on a doctored server
// clock (the terms of the lease-fencing article, SOURCES.md: TTL 1500 ms,
// renewal every 400 ms, margin 300 ms; polls every ttl/8), as a backend
// with a larger minimum TTL would (Traits.MinTTL). Such a clock must fall
// between two bounds: A, renewing, keeps its lease (a lease lasting ttl/r
// real time outlives the renew interval and the renewal's lateness), and a
// waiter, polling, is in before A's local deadline (ttl/r plus a poll and
// the waiter's lateness before ttl - margin). At these terms and r = 2 that
// leaves 350 ms and 262 ms of lateness; the flake hunt measured renewals
// 325 ms late, elections 310 ms late and timers up to 370 ms late on a
// loaded 2-CPU machine, and these tests failed 11 of 20. Three times the
// terms leave 1050 ms and 790 ms; every bound the cases check is still
// derived from the stretched terms.
const serverClockScale = 3

func (h serverClockHarness) Traits() conformance.Traits {
	t := h.memHarness.Traits()
	t.MinTTL = serverClockScale * 1500 * time.Millisecond
	return t
}

func (h serverClockHarness) OpenLease(context.Context) (leasecore.Lease, error) {
	return pollingLease{h.leases, h.leases}, nil
}

// frozenServerClock never moves: a lease is held until released, so a
// frozen or cut-off leader keeps it for ever.
func frozenServerClock() func() time.Time {
	t := time.Now()
	return func() time.Time { return t }
}

// fastServerClock runs twice as fast as real time: a lease expires after
// half its TTL, before the holder's local deadline (TTL - margin, with the
// suite's margin of a fifth of the TTL).
func fastServerClock() func() time.Time {
	start := time.Now()
	return func() time.Time { return start.Add(2 * time.Since(start)) }
}

// wantLines checks that out has every line of want, and that the summary
// counted failures.
func wantLines(t *testing.T, sum conformance.Summary, out string, want ...string) {
	t.Helper()
	missing := false
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
			missing = true
		}
	}
	if missing { // what happened when, to tell which failure came first and why
		for _, c := range sum.Cases {
			for _, ev := range c.Timeline {
				t.Logf("%s timeline %9.3fs %-8s %s", c.ID, ev.At.Seconds(), ev.Lane, ev.Text)
			}
		}
	}
	if sum.Failed == 0 {
		t.Errorf("Summary.Failed = 0:\n%s", out)
	}
}

func TestF12F13FailALeaseThatNeverExpires(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"F12", "F13"} {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			sum, out := report(t, newServerClockHarness(frozenServerClock()), id)
			want := map[string]string{
				"F12": "  FAIL the hand-off after A froze: no campaigner was elected within ",
				"F13": "  FAIL B's takeover: no campaigner was elected within ",
			}[id]
			wantLines(t, sum, out, want)
			if id == "F13" {
				// A's own clock still ends its lead context: that half of
				// the case passes, and the failure is the server's.
				wantLines(t, sum, out, "  ok   [campaign] A's lead context is cancelled with a cause wrapping ErrLocalDeadline (or ErrLost) (expected=ErrLocalDeadline or ErrLost, actual=ErrLocalDeadline)")
			}
		})
	}
}

func TestF12F13FailALeaseThatExpiresBeforeTheLocalDeadline(t *testing.T) {
	t.Parallel()
	t.Run("F12", func(t *testing.T) {
		t.Parallel()
		sum, out := report(t, newServerClockHarness(fastServerClock()), "F12")
		wantLines(t, sum, out,
			"  FAIL [F12] A's local deadline (by A's clock, set before it froze) passed before the new leader's winning Acquire was sent, so before the server granted it (expected=deadline < acquire sent, actual=deadline ",
			// The token check still rejects the frozen leader's write:
			// fencing does not depend on the clocks.
			"  ok   [I3] A's late write with its lead token 1 is rejected (expected=WRITE accepted=false token=1, actual=WRITE accepted=false token=1)")
	})
	t.Run("F13", func(t *testing.T) {
		t.Parallel()
		sum, out := report(t, newServerClockHarness(fastServerClock()), "F13")
		wantLines(t, sum, out,
			"  FAIL [F13] A's lead context was cancelled before B's winning Acquire was sent, so before the server granted B the lease (expected=lead end < acquire sent, actual=lead ended ",
			"  FAIL [I1] B was granted the lease only after the server's expiry of A's hold: its Acquire returned at least one ttl after A's last successful renewal was sent (expected=>= 4.5s, actual=")
	})
}

func TestF12F13FailReusedTokens(t *testing.T) {
	t.Parallel()
	reused := func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return reusedTokenHarness{h.(*memHarness)}, nil
	}
	t.Run("F12", func(t *testing.T) {
		t.Parallel()
		// The holder process gets memfence's real token 1; the in-process
		// leader is told 1 for its real 2, and its write lets A's through.
		sum, out := report(t, reused, "F12")
		wantLines(t, sum, out,
			"  FAIL [I2] the new leader's token is larger than A's (expected=token=2, actual=token=1)",
			"  FAIL [I3] A's late write with its lead token 1 is rejected (expected=WRITE accepted=false token=1, actual=WRITE accepted=true token=1)")
	})
	t.Run("F13", func(t *testing.T) {
		t.Parallel()
		sum, out := report(t, reused, "F13")
		wantLines(t, sum, out, "  FAIL [I2] B's token is larger than A's (expected=token=2, actual=token=1)")
	})
}

func TestF12F13FailSplitBrain(t *testing.T) {
	t.Parallel()
	split := func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return splitBrain{h.(*memHarness)}, nil
	}
	for id, want := range map[string]string{
		"F12": "  FAIL [I1] while A leads and renews, no waiter is elected (waited 3s, ttl 1.5s) (expected=no election, actual=campaigner-",
		"F13": "  FAIL [I1] while A leads and renews, B is not elected (waited 1.5s, ttl 1.5s) (expected=no election, actual=campaigner-b elected with token 1)",
	} {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			sum, out := report(t, split, id)
			wantLines(t, sum, out, want)
		})
	}
}
