package backendkit

import (
	"context"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

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

// QueuedAcquirer is an optional interface that may be implemented by a
// leasecore.Lease whose Release can hand the lease to a waiting caller in
// the same atomic step that ends the holding period, so the next holder
// starts after one write instead of a release, a wake-up and an acquire.
// leasecore.Campaign uses it, when the Lease has it, instead of WaitFree
// and a new Acquire after a refusal: fence-etcd's LeaseStore implements it
// with a line of waiting keys.
type QueuedAcquirer interface {
	// AcquireQueued acquires name for holder for ttl as Acquire does, and
	// while another holder has it, waits until it is handed over or free,
	// instead of returning ErrHeld. The grant's Token obeys I2 as
	// Acquire's does (larger than every token issued before for name),
	// and its Start must be no later than the start of the TTL the server
	// counts for the hold: a grant handed over while the caller waited
	// may be dated before the call returned. It returns an error wrapping
	// ctx's when ctx ends, having left the line; a waiter that cannot
	// wait (connection trouble) returns ErrUnavailable.
	//
	// It must bound its own wait: Campaign does not, as a waiter that
	// gives up loses its place in line. It must wake up at the latest when
	// the holding period's remaining time, by the backend's clock, has
	// passed, even if a notification was lost.
	AcquireQueued(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error)
}
