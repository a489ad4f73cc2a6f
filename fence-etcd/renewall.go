package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// MaxTxnOps is the most operations fence-etcd puts in one transaction:
// etcd's default limit (the server's --max-txn-ops, embed.DefaultMaxTxnOps).
// RenewAll reads its keys in transactions of at most MaxTxnOps operations
// each. A server configured with a lower limit refuses a full RenewAll (see
// RenewAll) of about as many names as its limit or more ("too many
// operations in txn request").
const MaxTxnOps = 128

// keepAliveParallel bounds the keep-alives RenewAll has in flight at once.
const keepAliveParallel = 16

// RenewAll implements backendkit.BatchRenewer: it renews one holder's leases
// gs, each by Renew's rule and each keeping its own token.
//
// With WithSharedLeases all of a holder's names with one TTL share one etcd
// lease, and RenewAll usually costs ONE Get of one key and ONE keep-alive,
// whatever the number of names, and reads no lease key (the fast path
// below). Otherwise, and whenever the fast path does not apply, it runs the
// full check:
//
//   - about ceil((len(gs)+1)/MaxTxnOps) transactions (the first has room
//     for a generation key per TTL among gs, see below, and one operation
//     less) that read every lease key, checking that each key still exists
//     with the grant's token and holder; then
//   - one KeepAliveOnce per distinct etcd lease the matching keys are
//     attached to (as with Renew, that keeps alive every other name
//     attached to it too).
//
// Without shared leases every name has an etcd lease of its own and the
// full check sends one keep-alive per name, up to 16 at a time: correct,
// but the slow path.
//
// # The fast path (shared leases)
//
// Beside each shared etcd lease the store keeps one generation key of the
// holder (<prefix>/holdergen/<holder>/<lease ID in hex>), attached to that
// lease, so it goes with it. Every Release and TakeOver of a name of the
// holder, through any store, deletes or rewrites the holder's generation
// keys in the transaction that deletes the name's key. The full check reads
// the generation key of the store's shared lease for (holder, TTL) in its
// first transaction, at the same revision as (or an earlier one than) the
// lease keys, and creates it there when it is missing; the store then
// remembers, for that etcd lease, the key's mod revision and the names
// (with their tokens) it found attached to the lease. A later RenewAll whose
// grants all have one TTL and are all among those names, with the same
// tokens, reads only the generation key, with the one keep-alive sent
// beside the read (the two overlap): found with the same mod revision, no
// key of those names was deleted since they were read, so it reports them
// all renewed (or all lost, "expired", when the keep-alive found the lease
// gone). Concurrent fast renewals through one store read their generation
// keys in one read-only transaction, and a store sends its keep-alives on
// one stream, to the leader of a cluster (see docs/capacity.md for what
// that measured). Any other finding drops what the
// store remembered and runs the full check. So the full check runs on the
// first RenewAll of a shared lease; after a take-over of any name of the
// holder, or a release through another store (a Release through this store
// of a name on its shared lease, once the store has read that lease's
// generation key, rewrites the key and, when it still had the revision the
// store remembered, keeps the fast path for the names it still holds); when
// gs has a name acquired since the last full check, or
// several TTLs; and after the shared lease was replaced.
//
// Delete lease keys only through Release or TakeOver. A lease key deleted
// or overwritten by other means (etcdctl, a raw client, an application's
// transaction) leaves the generation key as it is: a store that verified
// the name keeps reporting it renewed while the shared etcd lease lives —
// even after another holder acquired it (the fence still rejects the old
// token once the new holder's token has advanced its scopes) — until its
// next full check: after a take-over of a name of the holder, a release of
// one through another store, a RenewAll with a name acquired since, or a new
// shared lease. Deleting the holder's generation keys by hand (etcdctl del
// --prefix <prefix>/holdergen/<PathEscape(holder)>/) forces the full check
// at every store's next RenewAll of the holder. Renew (of one name) always
// reads the name's key.
//
// renewed[i] is gs[i] with a new Start — the time read before the keep-alive
// of its etcd lease (on the fast path: before the keep-alive and the read
// of the generation key) — and the cluster's Space (as Acquire's), and lost[i] is nil; or
// lost[i] is a *leasecore.HoldError wrapping leasecore.ErrLost (Op "renew")
// whose Reason says, as Renew's does, why: the key is gone ("no such lease
// (expired or released)"), carries another token or holder, or its etcd
// lease expired between the read and the keep-alive ("expired"). err is for
// the call as a whole: bad input (backendkit.CheckRenewAll, TTLs of whole
// seconds), etcd unreachable, ctx done; then some leases may have been
// renewed, none for certain, and renewed and lost are nil.
func (s *LeaseStore) RenewAll(ctx context.Context, gs []leasecore.Grant) (renewed []leasecore.Grant, lost []error, err error) {
	const op = "renew all"
	if err := backendkit.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	for i, g := range gs {
		if g.TTL%time.Second != 0 {
			return nil, nil, &leasecore.ArgError{Op: op, Field: fmt.Sprintf("grants[%d].ttl", i), Value: g.TTL.String(),
				Reason: "must be a whole number of seconds: etcd lease TTLs are whole seconds"}
		}
	}
	if s.shared {
		renewed, lost, done, err := s.renewAllFast(ctx, op, gs)
		if done || err != nil {
			return renewed, lost, err
		}
	}
	return s.renewAllFull(ctx, op, gs)
}

// renewAllFast is RenewAll's fast path (see RenewAll): done is false when
// it does not apply, or found the generation key changed; then the full
// check must run.
func (s *LeaseStore) renewAllFast(ctx context.Context, op string, gs []leasecore.Grant) (renewed []leasecore.Grant, lost []error, done bool, err error) {
	holder, ttl := gs[0].Holder, gs[0].TTL
	s.mu.Lock()
	sl := s.pool[sharedKey{holder, ttl}]
	ok := sl != nil && sl.id != 0 && sl.ver.covers(gs, ttl)
	var (
		id     clientv3.LeaseID
		genRev int64
	)
	if ok {
		id, genRev = sl.id, sl.ver.genRev
	}
	s.mu.Unlock()
	if !ok {
		return nil, nil, false, nil
	}

	// Start is read before the Get, not just before the keep-alive as on
	// the full path: both are before the keep-alive, which is what the
	// rule needs (the lessor restarts the TTL when it handles it, so Start
	// + TTL is never later than the new expiry), and the earlier reading
	// is the conservative one — the local deadline can only come sooner —
	// whatever the order or overlap of the two requests.
	//
	// The keep-alive is sent first and its answer awaited after the read,
	// so the two overlap: a renewal waits for the slower of the two, not
	// for both in turn. Their order does not matter: the names are
	// reported renewed only when both succeed — the read shows none of
	// them deleted up to its revision, the keep-alive that the lease (and
	// so every key still attached to it) lives on from when the lessor
	// handled it — and a release through another store between the two
	// goes unseen until the next renewal, in either order, as any release
	// running concurrently with a renewal. When the read sends the call to
	// the full check, the keep-alive was one more than needed.
	//
	// The read goes through the store's genReader, which reads the keys
	// of concurrent fast renewals in one request.
	start := time.Now()
	ka := s.keepAliveBegin(ctx, id)
	gen, header, err := s.gens.read(ctx, s.layout.HolderGen(holder, int64(id)))
	if err != nil {
		return nil, nil, true, etcdkv.MapError(ctx, pkg, op, err)
	}
	if gen == nil || gen.ModRevision != genRev {
		// A name of the holder was released or taken over since the
		// names were read (or the lease is gone): check every name.
		seen := int64(0)
		if gen != nil {
			seen = gen.ModRevision
		}
		s.forgetVerified(sl, id, seen)
		return nil, nil, false, nil
	}
	space := tokenSpace(header)
	renewed = make([]leasecore.Grant, len(gs))
	lost = make([]error, len(gs))
	err = s.keepAliveFinish(ctx, ka)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// Expired (or revoked) around the read, and
		// every name attached to it with it.
		s.sharedGone(id)
		for i, g := range gs {
			lost[i] = lostHold("renew", g, "expired")
		}
		return renewed, lost, true, nil
	case err != nil:
		return nil, nil, true, etcdkv.MapError(ctx, pkg, op, err)
	}
	for i, g := range gs {
		g.Start, g.Space = start, space
		renewed[i] = g
	}
	s.sharedRefreshed(holder, ttl, id, start)
	return renewed, lost, true, nil
}

// genCheck is the generation key a full RenewAll reads for one (holder,
// TTL) of its grants: the key of the store's shared lease id of that pair.
type genCheck struct {
	ttl    time.Duration
	sl     *sharedLease
	id     clientv3.LeaseID
	ensure bool // not known to exist: create it if missing (a write)
	rev    int64
}

// maxGenChecks bounds the generation keys one full RenewAll reads (one per
// TTL among its grants), so that they fit in its first transaction.
const maxGenChecks = 8

// genChecks returns the generation keys a full RenewAll of gs reads, one per
// TTL among gs whose shared lease this store has and last refreshed less
// than a TTL ago (an older one has expired by our clock), and the
// operation of each for the first read transaction: a Get when the store
// has seen the key, else a nested transaction that creates the key when it
// does not exist and reads it otherwise. The full check records names only
// for these leases.
func (s *LeaseStore) genChecks(gs []leasecore.Grant) ([]genCheck, []clientv3.Op) {
	if !s.shared {
		return nil, nil
	}
	holder := gs[0].Holder
	var out []genCheck
	var ops []clientv3.Op
	s.mu.Lock()
	defer s.mu.Unlock()
next:
	for _, g := range gs {
		for _, c := range out {
			if c.ttl == g.TTL {
				continue next
			}
		}
		if len(out) == maxGenChecks {
			break
		}
		sl := s.pool[sharedKey{holder, g.TTL}]
		if sl == nil || sl.id == 0 || time.Since(sl.refreshed) >= g.TTL {
			continue
		}
		c := genCheck{ttl: g.TTL, sl: sl, id: sl.id, ensure: sl.ver.genRev == 0}
		key := s.layout.HolderGen(holder, int64(sl.id))
		if c.ensure {
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(key, "", clientv3.WithLease(sl.id))},
				[]clientv3.Op{clientv3.OpGet(key)}))
		} else {
			ops = append(ops, clientv3.OpGet(key))
		}
		out = append(out, c)
	}
	return out, ops
}

// renewAllFull is RenewAll's full check (see RenewAll).
func (s *LeaseStore) renewAllFull(ctx context.Context, op string, gs []leasecore.Grant) (renewed []leasecore.Grant, lost []error, err error) {
	gens, genOps := s.genChecks(gs)
	kvs, space, genResps, err := s.readLeaseKeys(ctx, op, gs, genOps)
	if err != nil {
		return nil, nil, err
	}
	if genResps == nil {
		gens = nil // not read: see readLeaseKeys
	}
	for j := range gens {
		gens[j].rev = genRevOf(genResps.responses[j], genResps.revision)
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
	alive := make(map[clientv3.LeaseID]bool, len(ids))
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
		alive[id] = true
		for _, i := range idx {
			g := gs[i]
			g.Start, g.Space = starts[k], space
			renewed[i] = g
		}
		s.sharedRefreshed(gs[idx[0]].Holder, gs[idx[0]].TTL, id, starts[k])
	}

	// Remember, per shared lease whose generation key was read, the names
	// found attached to it with their tokens and the holder.
	for _, c := range gens {
		switch {
		case c.rev == 0:
			// Missing (deleted since the store last saw it, by a release
			// or take-over elsewhere): the next full check creates it.
			s.forgetVerified(c.sl, c.id, 0)
		case alive[c.id]:
			names := make(map[string]leasecore.Token, len(members[c.id]))
			for _, i := range members[c.id] {
				if gs[i].TTL == c.ttl {
					names[gs[i].Name] = gs[i].Token
				}
			}
			s.recordVerified(c.sl, c.id, c.rev, names)
		default:
			// No name of gs on it, or it expired: only the key's
			// revision is news.
			s.forgetVerified(c.sl, c.id, c.rev)
		}
	}
	return renewed, lost, nil
}

// genResponses are the results of the generation key operations of a full
// RenewAll's first transaction, and that transaction's revision.
type genResponses struct {
	responses []*etcdserverpb.ResponseOp
	revision  int64
}

// genRevOf returns the mod revision of a generation key from the result of
// its operation in genChecks (a Get, or the nested transaction that puts it
// at revision rev when missing and gets it otherwise); 0 when it does not
// exist.
func genRevOf(r *etcdserverpb.ResponseOp, rev int64) int64 {
	if t := r.GetResponseTxn(); t != nil {
		if t.Succeeded {
			return rev // put by this transaction
		}
		if len(t.Responses) == 0 {
			return 0
		}
		r = t.Responses[0]
	}
	if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
		return kvs[0].ModRevision
	}
	return 0
}

// readLeaseKeys reads the lease key of every grant, MaxTxnOps operations
// per transaction, and returns each key's result (empty when the key does
// not exist), in the order of gs, and the cluster's token space from the
// responses' headers (see tokenSpace). The operations extra (genChecks')
// come first in the first transaction, which is then a write when one of
// them may put, and their results come back in gr; the transactions are
// read-only otherwise. Should that first transaction fail because an etcd
// lease a put names is gone, the keys are read again without extra, and gr
// is nil.
func (s *LeaseStore) readLeaseKeys(ctx context.Context, op string, gs []leasecore.Grant, extra []clientv3.Op) (kvs [][]*mvccpb.KeyValue, space string, gr *genResponses, err error) {
	kvs = make([][]*mvccpb.KeyValue, len(gs))
	lo := 0
	for first := true; lo < len(gs); first = false {
		var ops []clientv3.Op
		room := MaxTxnOps
		if first && len(extra) > 0 {
			ops = append(ops, extra...)
			// etcd allows a nested transaction MaxTxnOps minus the
			// operations of the one it is in, and extra may hold one.
			room = MaxTxnOps - 1
		}
		hi := min(lo+room-len(ops), len(gs))
		for _, g := range gs[lo:hi] {
			ops = append(ops, clientv3.OpGet(s.layout.Lease(g.Name)))
		}
		// No compare: Then always runs. A transaction of reads only is
		// served like a linearizable range read.
		resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
		if first && len(extra) > 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// A shared lease expired since the store last refreshed it:
			// the put of its generation key failed, and with it the
			// whole transaction, before anything was read or written.
			return s.readLeaseKeys(ctx, op, gs, nil)
		}
		if err != nil {
			return nil, "", nil, etcdkv.MapError(ctx, pkg, op, err)
		}
		if len(resp.Responses) != len(ops) {
			return nil, "", nil, fmt.Errorf("%s: %s: etcd answered %d operations with %d results", pkg, op, len(ops), len(resp.Responses))
		}
		rs := resp.Responses
		if first && len(extra) > 0 {
			gr = &genResponses{responses: rs[:len(extra)], revision: resp.Header.Revision}
			rs = rs[len(extra):]
		}
		for j, r := range rs {
			kvs[lo+j] = r.GetResponseRange().GetKvs()
		}
		space = tokenSpace(resp.Header)
		lo = hi
	}
	return kvs, space, gr, nil
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
		err := s.keepAlive(ctx, ids[0])
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
			err := s.keepAlive(kctx, id)
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
