// Package leasecore defines leases that issue fencing tokens, resources that
// check them, and a client-side Session that keeps a lease alive.
//
// A lease alone cannot make "only one instance writes" true: a holder can be
// paused (GC, SIGSTOP, a slow network) between its last check and its write,
// its lease can expire meanwhile, and another holder can take over. When the
// paused holder resumes, its very next instruction is the write. The fix is a
// fencing token: every acquire atomically issues a strictly larger Token, and
// the protected resource, in the same atomic operation as the write, rejects
// any token below the largest it has accepted for the scope.
//
// The package states the contract as three invariants that every backend
// must keep and that the conformance suite checks:
//
//   - I1 (efficiency only): by the backend's clock, a lease has at most one
//     unexpired holder at any moment.
//   - I2: tokens of one lease are strictly increasing and never reused, also
//     after the backend crashes and restarts.
//   - I3: within one scope, the tokens a FencedResource accepts are
//     non-decreasing; once it accepted token n, every later write with a
//     token below n is rejected, whichever part it targets.
//
// Correctness rests on I2 and I3 together; I1 only keeps most of the work
// from being done twice.
//
// Tokens are comparable only within one lease service (one token space):
// a scope is fenced by exactly one lease service. Grants name their space
// (Grant.Space), claims built with Grant.Claim or Session.Claim carry it,
// and a fence that stored the space with the floor reports a rejection by a
// floor from another space as ErrTokenSpace rather than as a stale token.
//
// The typical call sequence is:
//
//	sess, err := leasecore.NewSession(ctx, leases, "daily-report", "holder-a",
//		leasecore.WithTTL(15*time.Second))
//	if errors.Is(err, leasecore.ErrHeld) {
//		return nil // another instance does the work
//	}
//	defer sess.Close(context.Background())
//	report := build()                         // the long part
//	res, err := resource.Write(ctx, leasecore.Write{
//		Scope: "daily-report", Part: "summary", Content: report,
//		Writer: "holder-a", Token: sess.Token(),
//	})
//	if err == nil && !res.Accepted {
//		// A newer holder wrote first: our result is stale, drop it.
//	}
//
// Run makes that sequence one call for a job only one instance may run:
// it acquires, runs the caller's function with the grant and a context
// that ends with the session, and releases when the function returns.
//
// A replica that should lead continuously calls Campaign instead: it waits
// for the lease (in line when the Lease can hand a lease over at release,
// else through its WaitFree when it has one, else by polling), runs the caller's function with the grant and a context that
// ends when the lease can no longer be trusted (Session.Context), and
// campaigns again after a loss.
//
// Errors wrap the sentinels below and are matched with errors.Is; callers
// may wrap them further.
//
// Backend authors find the input validators, limits, optional interfaces
// and other tools a Lease or FencedResource implementation needs in package
// github.com/leasefence/leasefence/leasecore/backendkit.
package leasecore
