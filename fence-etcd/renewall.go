package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// MaxTxnOps is the most operations fence-etcd puts in one transaction:
// etcd's default limit (the server's --max-txn-ops, embed.DefaultMaxTxnOps).
// RenewAll reads its keys in transactions of at most MaxTxnOps reads each.
// A server configured with a lower limit refuses a RenewAll of more names
// than its limit ("too many operations in txn request").
const MaxTxnOps = 128

// keepAliveParallel bounds the keep-alives RenewAll has in flight at once.
const keepAliveParallel = 16

// RenewAll implements leasecore.BatchRenewer: it renews one holder's leases
// gs, each by Renew's rule and each keeping its own token, in
//
//   - ceil(len(gs)/MaxTxnOps) read-only transactions, each with one Get per
//     lease key, that check every key still exists with the grant's token
//     and holder; then
//   - one KeepAliveOnce per distinct etcd lease the matching keys are
//     attached to.
//
// With WithSharedLeases all of a holder's names with one TTL share one etcd
// lease, so renewing 1000 names costs 8 reads and ONE keep-alive (and, as
// with Renew, keeps alive every other name attached to that lease too).
// Without it every name has an etcd lease of its own and RenewAll sends one
// keep-alive per name, up to 16 at a time: correct, but the slow path.
//
// renewed[i] is gs[i] with a new Start — the time read before the keep-alive
// of its etcd lease — and the cluster's Space (as Acquire's), and lost[i] is nil; or lost[i] is a
// *leasecore.HoldError wrapping leasecore.ErrLost (Op "renew") whose Reason
// says, as Renew's does, why: the key is gone ("no such lease (expired or
// released)"), carries another token or holder, or its etcd lease expired
// between the read and the keep-alive ("expired"). err is for the call as a
// whole: bad input (leasecore.CheckRenewAll, TTLs of whole seconds), etcd
// unreachable, ctx done; then some leases may have been renewed, none for
// certain, and renewed and lost are nil.
func (s *LeaseStore) RenewAll(ctx context.Context, gs []leasecore.Grant) (renewed []leasecore.Grant, lost []error, err error) {
	const op = "renew all"
	if err := leasecore.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	for i, g := range gs {
		if g.TTL%time.Second != 0 {
			return nil, nil, &leasecore.ArgError{Op: op, Field: fmt.Sprintf("grants[%d].ttl", i), Value: g.TTL.String(),
				Reason: "must be a whole number of seconds: etcd lease TTLs are whole seconds"}
		}
	}
	kvs, space, err := s.readLeaseKeys(ctx, op, gs)
	if err != nil {
		return nil, nil, err
	}

	renewed = make([]leasecore.Grant, len(gs))
	lost = make([]error, len(gs))
	var ids []clientv3.LeaseID                     // distinct etcd leases, in order of first use
	members := make(map[clientv3.LeaseID][]int, 1) // the grants attached to each
	for i, g := range gs {
		if reason := lostReason(kvs[i], g); reason != "" {
			lost[i] = lostHold("renew", g, reason)
			continue
		}
		id := clientv3.LeaseID(kvs[i][0].Lease)
		if _, seen := members[id]; !seen {
			ids = append(ids, id)
		}
		members[id] = append(members[id], i)
	}

	starts, results, err := s.keepAliveAll(ctx, ids)
	if err != nil {
		return nil, nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	for k, id := range ids {
		idx := members[id]
		if errors.Is(results[k], rpctypes.ErrLeaseNotFound) {
			// Expired (or revoked) between the read and the keep-alive.
			s.sharedGone(id)
			for _, i := range idx {
				lost[i] = lostHold("renew", gs[i], "expired")
			}
			continue
		}
		for _, i := range idx {
			g := gs[i]
			g.Start, g.Space = starts[k], space
			renewed[i] = g
		}
		s.sharedRefreshed(gs[idx[0]].Holder, gs[idx[0]].TTL, id, starts[k])
	}
	return renewed, lost, nil
}

// readLeaseKeys reads the lease key of every grant, MaxTxnOps keys per
// read-only transaction, and returns each key's result (empty when the key
// does not exist), in the order of gs, and the cluster's token space from
// the responses' headers (see tokenSpace).
func (s *LeaseStore) readLeaseKeys(ctx context.Context, op string, gs []leasecore.Grant) ([][]*mvccpb.KeyValue, string, error) {
	out := make([][]*mvccpb.KeyValue, len(gs))
	space := ""
	for lo := 0; lo < len(gs); lo += MaxTxnOps {
		hi := min(lo+MaxTxnOps, len(gs))
		gets := make([]clientv3.Op, 0, hi-lo)
		for _, g := range gs[lo:hi] {
			gets = append(gets, clientv3.OpGet(s.layout.Lease(g.Name)))
		}
		// No compare: Then always runs. A transaction of reads only is
		// served like a linearizable range read.
		resp, err := s.kv.Txn(ctx).Then(gets...).Commit()
		if err != nil {
			return nil, "", etcdkv.MapError(ctx, pkg, op, err)
		}
		if len(resp.Responses) != hi-lo {
			return nil, "", fmt.Errorf("%s: %s: etcd answered %d reads with %d results", pkg, op, hi-lo, len(resp.Responses))
		}
		for j, r := range resp.Responses {
			out[lo+j] = r.GetResponseRange().GetKvs()
		}
		space = tokenSpace(resp.Header)
	}
	return out, space, nil
}

// keepAliveAll sends one KeepAliveOnce per etcd lease in ids, up to
// keepAliveParallel at a time, each with the time read before it in
// starts. results[k] is nil or rpctypes.ErrLeaseNotFound; any other error
// stops the rest and is returned as err (the first one).
func (s *LeaseStore) keepAliveAll(ctx context.Context, ids []clientv3.LeaseID) (starts []time.Time, results []error, err error) {
	starts = make([]time.Time, len(ids))
	results = make([]error, len(ids))
	if len(ids) == 1 { // the shared-lease case: no goroutine
		starts[0] = time.Now()
		_, err := s.leases.KeepAliveOnce(ctx, ids[0])
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, nil, err
		}
		results[0] = err
		return starts, results, nil
	}

	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, keepAliveParallel)
	var wg sync.WaitGroup
	for k, id := range ids {
		select {
		case sem <- struct{}{}:
		case <-kctx.Done():
		}
		if kctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			starts[k] = time.Now()
			_, err := s.leases.KeepAliveOnce(kctx, id)
			if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
				return
			}
			results[k] = err
		})
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, nil, firstErr
	}
	return starts, results, nil
}
