package fenceetcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
)

// cleanupTimeout bounds a best-effort clean-up that continues in the
// background after the call that needed it returned (see cleanUp): the
// revoke of an etcd lease, the delete of a key an acquire whose answer was
// lost may have created, the release of a name a failed AcquireAll granted.
// What it does not reach expires on its own with its etcd lease, so
// waiting long for an unreachable server gains nothing.
const cleanupTimeout = 2 * time.Second

// cleanupStep is one best-effort clean-up request. key is the lease key it
// may delete, "" when it deletes none that a later acquire could create (a
// revoke of an etcd lease granted for one acquire: no later acquire gets
// the same lease).
type cleanupStep struct {
	key string
	run func(context.Context) error
}

// cleanups is the state of a LeaseStore's background clean-ups, guarded by
// LeaseStore.mu (wg aside).
type cleanups struct {
	wg sync.WaitGroup // one per background clean-up; Close waits for them
	// pending counts, per lease key, the background clean-ups that may
	// still delete it; a later Acquire or AcquireAll of the key through the
	// store waits until none is left (awaitCleanup).
	pending map[string]int
	// changed is closed, and replaced, whenever a background clean-up ends.
	changed chan struct{}
}

// cleanUp runs steps, the best-effort clean-up after a failed call, without
// making the call return later than its ctx allows:
//
//   - while ctx is live, the steps run under ctx, in the caller's goroutine
//     (at most cleanupParallel at once), so the common case — a refused
//     acquire, a lost answer while ctx has time left — costs the round trips
//     TestRoundTrips counts, and leaves nothing running;
//   - the steps ctx left no time for (it had ended, or ended during them)
//     are run again in one goroutine, bounded by cleanupTimeout and
//     detached from ctx's cancellation (ctx is often why the call failed),
//     which Close waits for. Every step is idempotent: a revoke of a lease
//     already revoked fails, a delete or a release under a compare finds
//     nothing to do. Until that goroutine ends, the keys of its steps are
//     pending: a later Acquire or AcquireAll of one of them through this
//     store waits for it first (awaitCleanup), so a clean-up meant for a
//     failed acquire can never delete what a later acquire of the same name,
//     by the same holder, with the same shared lease, created.
//
// After Close nothing goes to the background: the steps ctx left no time
// for are dropped, and what they would have removed expires with its etcd
// lease (in shared mode Close revoked it already).
func (s *LeaseStore) cleanUp(ctx context.Context, steps []cleanupStep) {
	rest := steps
	if ctx.Err() == nil {
		again := make([]bool, len(steps))
		try := func(i int) { again[i] = steps[i].run(ctx) != nil && ctx.Err() != nil }
		if len(steps) == 1 {
			try(0)
		} else {
			inParallel(len(steps), cleanupParallel, try)
		}
		rest = nil
		for i, st := range steps {
			if again[i] {
				rest = append(rest, st)
			}
		}
	}
	if len(rest) == 0 {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if s.cleanups.pending == nil {
		s.cleanups.pending = make(map[string]int)
		s.cleanups.changed = make(chan struct{})
	}
	for _, st := range rest {
		if st.key != "" {
			s.cleanups.pending[st.key]++
		}
	}
	s.cleanups.wg.Add(1)
	s.mu.Unlock()
	detached := context.WithoutCancel(ctx)
	go func() {
		defer s.cleanups.wg.Done()
		bctx, cancel := context.WithTimeout(detached, cleanupTimeout)
		inParallel(len(rest), cleanupParallel, func(i int) { _ = rest[i].run(bctx) })
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, st := range rest {
			if st.key == "" {
				continue
			}
			if s.cleanups.pending[st.key]--; s.cleanups.pending[st.key] <= 0 {
				delete(s.cleanups.pending, st.key)
			}
		}
		close(s.cleanups.changed)
		s.cleanups.changed = make(chan struct{})
	}()
}

// awaitCleanup returns once no background clean-up of this store may still
// delete one of keys (see cleanUp), or with an error wrapping ctx's when ctx
// ends first.
func (s *LeaseStore) awaitCleanup(ctx context.Context, op string, keys ...string) error {
	for {
		s.mu.Lock()
		busy := ""
		if len(s.cleanups.pending) > 0 {
			for _, k := range keys {
				if s.cleanups.pending[k] > 0 {
					busy = k
					break
				}
			}
		}
		changed := s.cleanups.changed
		s.mu.Unlock()
		if busy == "" {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return etcdkv.MapError(ctx, pkg, op,
				fmt.Errorf("waiting for the clean-up of an earlier failed acquire of key %q: %w", busy, ctx.Err()))
		}
	}
}

// waitCleanups waits for the store's background clean-ups (Close).
func (s *LeaseStore) waitCleanups() { s.cleanups.wg.Wait() }

// revoke revokes an etcd lease, best effort (see cleanUp): it holds no key
// we want any more, and expires on its own otherwise.
func (s *LeaseStore) revoke(ctx context.Context, id clientv3.LeaseID) {
	s.cleanUp(ctx, []cleanupStep{{run: func(ctx context.Context) error {
		_, err := s.leases.Revoke(ctx, id)
		return err
	}}})
}
