package backendkit

import "context"

// Waiter is an optional interface that may be implemented by a
// leasecore.Lease. It lets a caller that was refused with leasecore.ErrHeld
// wait until the lease may be free instead of polling: PostgreSQL with
// LISTEN/NOTIFY on release, etcd with a watch on the lease key.
// leasecore.Campaign uses it when the Lease has it, and leasecore.Observe
// when its LeaseInspector has it.
//
// Without it, a caller polls: it retries Acquire after a random pause
// between half the poll interval and the whole of it (see
// leasecore.WithPollInterval), so a release is noticed within one poll
// interval and an expiry within one poll interval after the TTL ran out.
// That fallback is also what works where notifications do not (a
// transaction pooler in front of PostgreSQL): such a backend should not
// implement Waiter, or return an error from WaitFree, which makes Campaign
// poll for that wait.
type Waiter interface {
	// WaitFree blocks until the lease name may be free, and then returns
	// nil; the caller then tries Acquire, which may still fail with ErrHeld
	// (another waiter was faster, or the wake-up was early). It returns:
	//
	//   - at once when name is free (never held, released or expired) at
	//     the time of the call. The state must be read after the
	//     notification channel is open (LISTEN before SELECT; a watch
	//     from the revision of the read), so that a release between the
	//     caller's refused Acquire and this call is never missed;
	//   - soon after the holding period is released;
	//   - at the latest when the holding period's remaining time, by the
	//     backend's clock, has passed (plus jitter, to spread waiters);
	//     a renewal meanwhile makes that wake-up early, which is allowed;
	//   - with an error wrapping ctx's when ctx ends, or another error
	//     (ErrUnavailable for connection trouble) when it cannot wait.
	//
	// WaitFree must not change the lease, and must not take locks a holder
	// renewing the lease waits for. Early wake-ups are allowed but should
	// be rare: each costs the caller one refused Acquire. Campaign bounds
	// every wait by the TTL on its own clock as a safety net, so a missed
	// notification costs at most one TTL.
	WaitFree(ctx context.Context, name string) error
}
