// Package conformance provides a conformance suite for implementations of
// leasecore: lease services that issue fencing tokens and resources that
// check them.
//
// A backend author writes one test file with an unexported Harness, a
// NewHarness function and a one-line test:
//
//	func TestConformance(t *testing.T) { conformance.Run(t, newHarness) }
//
// Each case of the suite (F1, F2, ...) is one experiment of the design
// article the suite follows, the lease-fencing article (SOURCES.md): the
// normal path, the long-transaction clock, concurrent acquire, the paused
// stale holder, the check-then-write race, fence granularity, a server
// crash, side effects that cannot be fenced. Each check prints "ok", "FAIL"
// or "note" with the invariant it verifies (I1, I2, I3) and the expected
// and actual values. Negative controls run the same timelines against
// designs that look plausible and fail, and pass only when the failure
// really happens on the backend.
//
// Cases F1u, F4u, F6u, F7u and F10u fence user data: the same timelines
// (and advance, raising a scope's floor without data) against rows of the
// suite's own tables written through the backend's public fence API in one
// atomic operation (UserDataResources). F4m is their negative control, a
// fenced marker first and the rows second, losing to a frozen holder.
// F6u and F18 check that such an operation decides when it commits: a
// writer paused before its commit (F6u), a holder process frozen with
// SIGSTOP inside its transaction past its lease, or one slow inside it
// (F18), holds up no newer holder's Advance or write on the fence, and is
// rejected at its commit. F18's negative control (CheckFirstControl) is
// the transaction that checks first and holds the floor until it commits.
//
// Case F9b builds F9's remedy (OutboxResources): the side effect recorded
// as an outbox entry in the same fenced operation as the data and relayed
// with the token as its version to a downstream stand-in (HTTP on
// 127.0.0.1) that deduplicates by the entry's identity and accepts only
// versions at or above the highest it has seen. In F9's two orders the
// stale holder's publication never reaches it (its negative control, an
// unfenced outbox, delivers it); relay processes killed with SIGKILL
// mid-delivery neither lose nor duplicate an accepted delivery.
//
// Cases F11, F12 and F13 elect a leader with leasecore.Campaign: a hand-off
// after the leader steps down (exactly one of several waiters takes over,
// with a larger token), after the leader's process is frozen with SIGSTOP
// (the next leader within the TTL and the waiters' bound, the frozen
// leader's context over by its own clock before the new grant, its late
// write rejected, its campaign leading again later with a larger token),
// and after the leader's network is cut while its function runs (its
// context ends with the loss as cause, before the other campaigner is
// granted the lease).
//
// Case X1 checks the input rule of every entry point instead: bad input is
// rejected with an error that names the field and wraps the sentinel, and
// changes nothing. Its rows are exported (BadInputCalls), so a backend's
// own tests can run them with checks only the backend can make, such as
// every table unchanged or a server nobody listens on.
//
// Case X2 checks the parts of the Lease contract that a lease service built
// on a lock (etcd's concurrency.Mutex) breaks while passing the others:
// renew and release of a hold that is over fail with ErrLost; a release
// whose answer was lost, retried, leaves the next holder alone; a grant
// carries the TTL asked for and one holder's names lapse independently; a
// live holder that stops renewing loses the hold within its TTL; a
// holder's acquire of a name it holds is refused; names that prefix one
// another are held at once; the holder checks hold through a second
// client; an acquire whose answer was lost leaves no holder after its TTL.
// The lost answers need AmbiguousOutcomes. Every case that waits for a
// lease to expire checks that it did within its TTL, the backend's TTL
// granularity and a stated bound (a quarter of the TTL plus 100ms).
//
// Report runs the same cases outside "go test" and writes the line format
// of the lease-fencing article (SOURCES.md), ending in
// "SUMMARY passed=N failed=M".
//
// Abilities only some backends have are optional interfaces of the Harness.
// A case skips only for an ability the backend declares absent (Traits.Absent),
// printing the reason; an ability neither implemented nor declared absent
// fails the case.
package conformance
