package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// waitSpread is added to a wait's bound once for the lessor's expiry round
// (it revokes expired leases about every 500 ms, then deletes their keys
// through raft) and once more, at random, to spread waiters that read the
// same remaining TTL.
const waitSpread = 500 * time.Millisecond

// WaitFree implements backendkit.Waiter with a watch: it reads the lease's
// key and returns at once when the key is absent (never held, released or
// expired). Otherwise it watches the key from the revision after that read,
// so a delete that happened since is still delivered, and returns on the
// key's next event: a delete — a Release deletes the key, and so does the
// lessor when it revokes an expired etcd lease — or a put, a Release that
// hands the lease to the first caller waiting in line (AcquireQueued),
// which ends the holding period too (the lease is then held again; a
// caller that acquires next is refused and waits again). As a bound in case that event is
// missed, it also returns when the etcd lease's remaining TTL (whole
// seconds, rounded down: plus one second) and up to 500 ms of jitter have
// passed; a renewal meanwhile makes that wake-up early. A compacted
// revision ends the wait early too. The watch is cancelled before WaitFree
// returns.
//
// In shared mode the bound is the shared etcd lease's TTL; the key's own
// delete still wakes the waiter at once.
//
// Errors: a *leasecore.ArgError for an invalid name; ctx's error when ctx
// ends; leasecore.ErrUnavailable when the server cannot be read or the
// member has no leader (the watch requires one); ErrStoreClosed after
// Close, and when Close is called while it waits. WaitFree reads only: it
// takes no lock and changes nothing.
func (s *LeaseStore) WaitFree(ctx context.Context, name string) error {
	const op = "wait free"
	if err := backendkit.CheckName(op, "name", name); err != nil {
		return err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return err
	}
	if s.isClosed() {
		return fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	key := s.layout.Lease(name)
	resp, err := s.kv.Get(ctx, key)
	if err != nil {
		return etcdkv.MapError(ctx, pkg, op, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	kv := resp.Kvs[0]

	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the watch
	if kv.Lease != 0 {
		ttl, err := s.leases.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return nil // revoked since the read, and the key with it
		case err != nil:
			return etcdkv.MapError(ctx, pkg, op, err)
		}
		if ttl.TTL < 0 {
			return nil // revoked since the read (etcd answers an unknown lease with TTL -1), and the key with it
		}
		// Whole seconds rounded down (+1 s), the lessor's expiry round
		// (about every 500 ms) and its delete through raft (+waitSpread),
		// and jitter that spreads waiters (+up to waitSpread).
		bound := time.Duration(ttl.TTL+1)*time.Second + waitSpread + rand.N(waitSpread)
		wctx, cancel = context.WithTimeout(wctx, bound)
		defer cancel()
	}
	ch := s.watcher.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(resp.Header.Revision+1))
	for {
		var (
			wresp clientv3.WatchResponse
			open  bool
		)
		closed := false
		select {
		case wresp, open = <-ch:
		case <-wctx.Done():
		case <-s.closing:
			closed = true
		}
		switch {
		case closed:
			return fmt.Errorf("%s: %s %q: %w", pkg, op, name, ErrStoreClosed)
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %s %q: %w", pkg, op, name, ctxError(ctx))
		case wctx.Err() != nil:
			return nil // the bound: the etcd lease's remaining time has passed
		case !open:
			return fmt.Errorf("%s: %s: the watch ended (client closed?): %w", pkg, op, leasecore.ErrUnavailable)
		case wresp.CompactRevision != 0:
			return nil // the revisions after the read are gone: read again
		case wresp.Err() != nil:
			return etcdkv.MapError(ctx, pkg, op, wresp.Err())
		}
		if len(wresp.Events) > 0 {
			// A delete, or a put: a Release that hands the lease to the
			// first in line (AcquireQueued) puts the key to that waiter.
			// Either ends the holding period that was read.
			return nil
		}
	}
}

// ctxError is ctx's error, with its cause when the cause says more.
func ctxError(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%w: %w", ctx.Err(), cause)
	}
	return ctx.Err()
}
