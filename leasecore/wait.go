package leasecore

import (
	"context"
	"math/rand/v2"
	"time"
)

// freeWaiter is backendkit.Waiter, which documents it for backends:
// Campaign and Observe wait with it when the lease has it, and poll
// otherwise.
type freeWaiter interface {
	WaitFree(ctx context.Context, name string) error
}

// queuedAcquirer is backendkit.QueuedAcquirer, which documents it for
// backends: Campaign waits in line with it when the lease has it.
type queuedAcquirer interface {
	AcquireQueued(ctx context.Context, name, holder string, ttl time.Duration) (Grant, error)
}

// jitter returns a random duration in [d/2, d]: bounded above, so a pause
// never exceeds what the caller configured, and spread below, so waiters
// that were refused together do not retry together.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// sleep waits d on clock; it returns false when ctx ended first.
func sleep(ctx context.Context, clock Clock, d time.Duration) bool {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}
