package conformance_test

import (
	"context"
	"testing"

	"github.com/leasefence/leasefence/conformance"
)

// F15 must be able to fail: a lease service that never expires a lease
// (nothing for A's slow clock to be wrong about), one whose clock runs so
// fast that the margin no longer covers A's slow clock, and a resource that
// lets the stale holder's write through.

func TestF15FailsALeaseThatNeverExpires(t *testing.T) {
	t.Parallel()
	sum, out := report(t, newServerClockHarness(frozenServerClock()), "F15")
	wantLines(t, sum, out,
		"  FAIL [TTL] A's hold, which A's slow clock has not renewed, ends by the backend's clock within ttl + granularity + bound of A's acquire request was sent (expected=free within ",
		// A's own clock still ends its session when the margin covers
		// it: that section passes, and the failure is the server's.
		"  ok   [session] A's session, never renewed, ends at its local deadline (expected=ErrLocalDeadline, actual=ErrLocalDeadline)")
}

func TestF15FailsAServerClockTheMarginDoesNotCover(t *testing.T) {
	t.Parallel()
	// The server's clock runs twice as fast as real time: together with
	// A's clock at 0.8, A's deadline comes at 0.83 ttl of real time and the
	// server's expiry at 0.5 ttl. The margin (ttl/3) covers ρ = 0.2, not
	// that.
	sum, out := report(t, newServerClockHarness(fastServerClock()), "F15")
	wantLines(t, sum, out,
		"  FAIL [I1] when A's session had ended, the backend still held the lease for A: A stopped before the lease could pass to anyone (expected=held by \"holder-a\" token=1, actual=")
}

func TestF15FailsAResourceWithoutTokenCheck(t *testing.T) {
	t.Parallel()
	sum, out := report(t, func(ctx context.Context) (conformance.Harness, error) {
		h, _ := newMemHarness(ctx)
		return unfencedAsFenced{h.(*memHarness)}, nil
	}, "F15")
	wantLines(t, sum, out,
		"  FAIL [I3] A's write with token 1, sent while its session was valid by its own clock, is rejected with B's token as the floor (expected=accepted=false floor=2, actual=accepted=true")
}
