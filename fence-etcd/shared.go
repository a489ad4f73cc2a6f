package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// ErrStoreClosed is wrapped by the error of an Acquire on a LeaseStore after
// its Close. It wraps leasecore.ErrClosed.
var ErrStoreClosed error = storeClosedError{}

type storeClosedError struct{}

func (storeClosedError) Error() string { return "lease store closed" }
func (storeClosedError) Unwrap() error { return leasecore.ErrClosed }

// sharedKey names a shared etcd lease: one per holder and TTL, since an etcd
// lease has one TTL.
type sharedKey struct {
	holder string
	ttl    time.Duration
}

// sharedLease is the etcd lease that all names of one (holder, ttl) are
// attached to in shared mode.
type sharedLease struct {
	// busy (capacity 1) is held while the lease is granted or refreshed,
	// so that concurrent acquires of one holder wait for one Grant
	// instead of each granting a lease of its own. Waiting for it honours
	// the waiter's context.
	busy chan struct{}

	// Guarded by LeaseStore.mu.
	id clientv3.LeaseID // 0: none yet, or known to be gone
	// refreshed is the local time, with its monotonic reading, read
	// BEFORE the Grant of id or before the last successful keep-alive of
	// id. The lessor starts (or restarts) the TTL only when it handles the
	// request, so id expires no earlier than refreshed + ttl (as long as
	// the clocks run at the same rate; a leader change only lengthens it).
	refreshed time.Time
	// ver is what the last full RenewAll verified about the names attached
	// to id (see RenewAll's fast path); reset whenever id changes.
	ver verified
}

// verified is what a full RenewAll found about one shared etcd lease of a
// holder: the mod revision of the holder's generation key of that lease
// (etcdkv.Layout.HolderGen), and the names whose keys it found attached to
// the lease, with the holder, at the same revision or a later one. Every
// removal of such a key through this package changes or deletes the
// generation key in the same transaction (see releaseGen, Release and
// TakeOver; the lessor's revoke deletes it with the lease), so as long as
// the key still has mod revision genRev, each of those names is still
// attached to the lease with its token.
type verified struct {
	// genRev is the mod revision the generation key was last seen with; 0:
	// not known to exist.
	genRev int64
	// names maps each verified name to its token (the key's mod
	// revision), verified at genRev; nil: none.
	names map[string]leasecore.Token
}

// covers reports whether every grant of gs has TTL ttl and is a verified
// name with its token.
func (v *verified) covers(gs []leasecore.Grant, ttl time.Duration) bool {
	if v.genRev == 0 || v.names == nil {
		return false
	}
	for _, g := range gs {
		if token, ok := v.names[g.Name]; !ok || token != g.Token || g.TTL != ttl {
			return false
		}
	}
	return true
}

// recordVerified records names as verified on sl's etcd lease id at
// generation key revision genRev, if id is still sl's lease: added to the
// names verified at the same revision, or replacing the names of another
// revision.
func (s *LeaseStore) recordVerified(sl *sharedLease, id clientv3.LeaseID, genRev int64, names map[string]leasecore.Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.id != id {
		return
	}
	if sl.ver.genRev == genRev && sl.ver.names != nil {
		maps.Copy(sl.ver.names, names)
		return
	}
	sl.ver = verified{genRev: genRev, names: names}
}

// forgetVerified drops the names verified on sl's etcd lease id, if id is
// still sl's lease, and records that its generation key was last seen with
// mod revision genRev (0: missing).
func (s *LeaseStore) forgetVerified(sl *sharedLease, id clientv3.LeaseID, genRev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.id == id {
		sl.ver = verified{genRev: genRev}
	}
}

// holderGensGone forgets everything verified about holder's shared leases:
// a transaction deleted all of holder's generation keys.
func (s *LeaseStore) holderGensGone(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, sl := range s.pool {
		if k.holder == holder {
			sl.ver = verified{}
		}
	}
}

// isClosed reports whether Close was called.
func (s *LeaseStore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// sharedFor returns the pool entry of (holder, ttl), creating it.
func (s *LeaseStore) sharedFor(holder string, ttl time.Duration) *sharedLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := sharedKey{holder, ttl}
	sl := s.pool[k]
	if sl == nil {
		sl = &sharedLease{busy: make(chan struct{}, 1)}
		s.pool[k] = sl
	}
	return sl
}

// sharedRefreshed records a successful keep-alive of etcd lease id, sent
// after start, for a name of (holder, ttl): when id is that pair's shared
// lease, start becomes its refresh start. A no-op without shared leases.
func (s *LeaseStore) sharedRefreshed(holder string, ttl time.Duration, id clientv3.LeaseID, start time.Time) {
	if !s.shared {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.pool[sharedKey{holder, ttl}]; sl != nil && sl.id == id && start.After(sl.refreshed) {
		sl.refreshed = start
	}
}

// sharedGone forgets etcd lease id when it is a shared lease: etcd said it
// does not exist (expired or revoked), so the next acquire grants a new one
// at once instead of failing a put first. A no-op without shared leases.
func (s *LeaseStore) sharedGone(id clientv3.LeaseID) {
	if !s.shared {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range s.pool {
		if sl.id == id {
			sl.id, sl.ver = 0, verified{}
		}
	}
}

// sharedLease returns the shared etcd lease of sl (holder, ttl) for an
// acquire, and its refresh start:
//
//   - refreshed less than ttl/3 ago: as it is, with no request;
//   - refreshed between ttl/3 and ttl ago: after one KeepAliveOnce, with the
//     time read before it as the new refresh start (a lease found gone is
//     replaced as below);
//   - none yet, or refreshed ttl or more ago (it may have expired by now):
//     a new lease from one Grant, with the time read before it.
//
// The refresh keeps a new hold useful: the grant's Start is the refresh
// start, so without it a hold acquired late in the shared lease's period
// would have little of its TTL left. It costs one round trip at most once
// per ttl/3 per holder, not per acquire.
func (s *LeaseStore) sharedLease(ctx context.Context, op string, sl *sharedLease, ttl time.Duration) (clientv3.LeaseID, time.Time, error) {
	select {
	case sl.busy <- struct{}{}:
	case <-ctx.Done():
		return 0, time.Time{}, etcdkv.MapError(ctx, pkg, op, ctx.Err())
	}
	defer func() { <-sl.busy }()

	s.mu.Lock()
	id, refreshed, closed := sl.id, sl.refreshed, s.closed
	s.mu.Unlock()
	if closed {
		return 0, time.Time{}, fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	if id != 0 {
		switch age := time.Since(refreshed); {
		case age < ttl/3:
			return id, refreshed, nil
		case age < ttl:
			start := time.Now() // before the request, as in Renew
			err := s.keepAlive(ctx, id)
			switch {
			case err == nil:
				s.mu.Lock()
				if sl.id == id && start.After(sl.refreshed) {
					sl.refreshed = start
				}
				refreshed = sl.refreshed
				s.mu.Unlock()
				return id, refreshed, nil
			case !errors.Is(err, rpctypes.ErrLeaseNotFound):
				return 0, time.Time{}, etcdkv.MapError(ctx, pkg, op, err)
			}
			// Gone (expired or revoked): grant a new one.
		}
		// Not refreshed for a whole ttl: by our clock it has expired (only
		// a leader change, which restarts every lease's TTL, can have kept
		// it). A new lease costs the same one request as a keep-alive
		// that would most likely fail.
	}
	start := time.Now() // before the request: see sharedLease.refreshed
	lg, err := s.leases.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return 0, time.Time{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.revoke(ctx, lg.ID)
		return 0, time.Time{}, fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	sl.id, sl.refreshed, sl.ver = lg.ID, start, verified{}
	s.mu.Unlock()
	return lg.ID, start, nil
}

// acquireShared is Acquire in shared mode: the one transaction of Acquire,
// putting the key with the holder's shared etcd lease (see sharedLease for
// when that costs a Grant or a keep-alive first).
func (s *LeaseStore) acquireShared(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	const op = "acquire"
	key := s.layout.Lease(name)
	// A clean-up of an earlier failed acquire of the name by this store
	// may still run: it must not find our key (see unputIfOurs).
	if err := s.awaitCleanup(ctx, op, key); err != nil {
		return leasecore.Grant{}, err
	}
	sl := s.sharedFor(holder, ttl)
	for retried := false; ; retried = true {
		id, refreshed, err := s.sharedLease(ctx, op, sl, ttl)
		if err != nil {
			return leasecore.Grant{}, err
		}
		// Every key this store created with id has a create revision up to
		// here: the cleanup below must not delete one of those.
		before := s.lastRev.Load()
		resp, err := s.putIfAbsent(ctx, key, holder, id)
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// The shared lease expired or was revoked after we last saw
			// it alive; etcd checked it before writing anything. Replace
			// it and try once more.
			s.sharedGone(id)
			if !retried {
				continue
			}
			return leasecore.Grant{}, fmt.Errorf("%s: %s: the shared lease expired before the key was written, twice (ttl %v): %w: %w",
				pkg, op, ttl, leasecore.ErrUnavailable, err)
		case err != nil:
			// The transaction may have been applied. Its key would then be
			// held by this holder, who does not know it, and kept alive by
			// every renewal of the holder's other names: delete it again.
			s.cleanUp(ctx, []cleanupStep{s.unputIfOurs(key, holder, id, before)})
			return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, op, err)
		case !resp.Succeeded:
			// Held. The shared lease stays, for the holder's other names
			// and its next acquires.
			return leasecore.Grant{}, &leasecore.HoldError{Op: op, Name: name, Holder: holder,
				Reason: s.heldReason(ctx, key), Err: leasecore.ErrHeld}
		}
		s.noteRev(resp.Header.Revision)
		// SAFETY RULE. The key lives exactly as long as the shared etcd
		// lease, which expires at (its last refresh) + ttl by the
		// lessor's clock — possibly EARLIER than (this acquire) + ttl,
		// since the shared lease may have been granted or kept alive a
		// while ago and nothing in this transaction extended it. So Start
		// is the shared lease's refresh start (the local time read before
		// its Grant or its last successful keep-alive), never the time of
		// this request: Start + TTL must not be later than the real
		// expiry, or the holder's local deadline would outlive its hold.
		// sharedLease keeps refreshed within ttl/3 of now, so a new hold
		// has at least 2/3 of its TTL left.
		return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(resp.Header.Revision), TTL: ttl,
			Start: refreshed, Space: tokenSpace(resp.Header)}, nil
	}
}

// noteRev records the revision of a successful shared-mode acquire.
func (s *LeaseStore) noteRev(rev int64) {
	for {
		cur := s.lastRev.Load()
		if rev <= cur || s.lastRev.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// unputIfOurs is the clean-up step (see cleanUp) that deletes key if an
// acquire whose answer was lost created it: the key holds holder, is
// attached to shared lease id, and was created after revision before —
// later than every key this store's earlier acquires created with id, so a
// name the holder already held is left alone. Only an acquire of the same
// name by the same holder on this store could be mistaken for ours: one
// running concurrently with the failed one, or one after it while the step
// still runs in the background — which cleanUp rules out, as such an
// acquire waits for the step first (awaitCleanup).
//
// Unlike Release and TakeOver it leaves the holder's generation keys alone
// (see RenewAll): the key's token, its create revision, was never returned
// to anyone — the acquire that made it failed — so no grant of it exists
// for a RenewAll to have verified, and no store remembers it.
func (s *LeaseStore) unputIfOurs(key, holder string, id clientv3.LeaseID, before int64) cleanupStep {
	return cleanupStep{key: key, run: func(ctx context.Context) error {
		_, err := s.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", holder),
				clientv3.Compare(clientv3.LeaseValue(key), "=", id),
				clientv3.Compare(clientv3.CreateRevision(key), ">", before)).
			Then(clientv3.OpDelete(key)).
			Commit()
		return err
	}}
}

// acquireGenOp is the put of the holder's generation key of its shared
// lease in a shared-mode AcquireAll's transaction (see acquireGen), and
// what the store knew when it was made.
type acquireGenOp struct {
	op     clientv3.Op
	sl     *sharedLease
	id     clientv3.LeaseID
	genRev int64 // the generation key's mod revision as last seen, or 0
}

// acquireGen returns the operation an AcquireAll on sl's etcd lease id runs
// last, in the same transaction as its puts: a put of the holder's
// generation key of id, returning the key as it was (prev_kv), which says
// whether it still had the revision the store last saw. The keys the
// transaction creates are then verified at its revision (acquiredGen), and
// the holder's first RenewAll of them takes the fast path (one read, one
// keep-alive) instead of the full check, whose first transaction writes
// that key. That write is what made renewals queue behind acquires when a
// cluster's writes were saturated (docs/capacity.md): with it here, a
// renewal never writes.
func (s *LeaseStore) acquireGen(sl *sharedLease, id clientv3.LeaseID, holder string) acquireGenOp {
	s.mu.Lock()
	genRev := int64(0)
	if sl.id == id {
		genRev = sl.ver.genRev
	}
	s.mu.Unlock()
	return acquireGenOp{
		op: clientv3.OpPut(s.layout.HolderGen(holder, int64(id)), "", clientv3.WithLease(id), clientv3.WithPrevKV()),
		sl: sl, id: id, genRev: genRev,
	}
}

// acquiredGen updates what the store verified after an AcquireAll whose
// transaction resp (succeeded) ran gen.op last: names are verified at the
// transaction's revision, the generation key's new mod revision; so are the
// names verified before, when the key still had the revision they were
// verified at (nothing of the holder's on the lease was removed between).
func (s *LeaseStore) acquiredGen(gen acquireGenOp, names []string, resp *clientv3.TxnResponse) {
	prev := resp.Responses[len(resp.Responses)-1].GetResponsePut().GetPrevKv()
	same := prev != nil && gen.genRev != 0 && prev.ModRevision == gen.genRev
	rev := resp.Header.Revision
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := gen.sl
	if sl.id != gen.id {
		return
	}
	if !same || sl.ver.genRev != gen.genRev || sl.ver.names == nil {
		sl.ver = verified{genRev: rev, names: make(map[string]leasecore.Token, len(names))}
	}
	sl.ver.genRev = rev
	for _, name := range names {
		sl.ver.names[name] = leasecore.Token(rev)
	}
}

// releaseShared is Release's transaction in shared mode: the delete of key
// while it is g's (and, with lineCheck, while nobody waits in its line),
// with the operation on the holder's generation keys releaseGen chooses.
// When that also compares the key's etcd lease, and a compare fails, a
// read (of the key and the line) says why: the key is no longer g's (an
// ErrLost error), somebody waits (head, for a hand-over), or the key is g's
// on an etcd lease other than the store's — whoever verified the name
// verified it on that lease, whose generation key the store does not know
// — and a second transaction, which deletes all the holder's generation
// keys, releases it. done is false when a compare failed; head is the
// first in line when the read found one.
func (s *LeaseStore) releaseShared(ctx context.Context, op, key string, g leasecore.Grant, lineCheck bool) (done bool, head *mvccpb.KeyValue, err error) {
	gen := s.releaseGen(key, g)
	resp, err := s.releaseTxn(ctx, key, g, gen, lineCheck)
	if err != nil {
		return false, nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	if !resp.Succeeded && gen.sl != nil {
		// The compare on the etcd lease may be the one that failed.
		kvs, first, _, err := s.readHolding(ctx, key, g.Name)
		if err != nil {
			return false, nil, etcdkv.MapError(ctx, pkg, op, err)
		}
		if reason := lostReason(kvs, g); reason != "" {
			return false, nil, lostHold(op, g, reason)
		}
		if first != nil && lineCheck {
			return false, first, nil
		}
		gen = s.releaseGenAll(g.Holder)
		if resp, err = s.releaseTxn(ctx, key, g, gen, lineCheck); err != nil {
			return false, nil, etcdkv.MapError(ctx, pkg, op, err)
		}
	}
	if !resp.Succeeded {
		return false, nil, nil
	}
	s.releasedGen(g, gen, resp)
	return true, nil, nil
}

// releaseTxn sends a shared-mode Release's transaction: the delete of key
// while it is g's (and gen's compares hold, and with lineCheck nobody
// waits in its line), with gen's operation.
func (s *LeaseStore) releaseTxn(ctx context.Context, key string, g leasecore.Grant, gen releaseGenOp, lineCheck bool) (*clientv3.TxnResponse, error) {
	cmps := s.holdingCmps(key, g, lineCheck)
	if gen.sl != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(key), "=", gen.id))
	}
	return s.kv.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(key), gen.op).Commit()
}

// releaseGenOp is the operation on the holder's generation keys in a
// shared-mode Release's transaction (see releaseGen), and what the store
// knew when it was made.
type releaseGenOp struct {
	op     clientv3.Op
	sl     *sharedLease     // nil: op deletes every generation key of the holder
	id     clientv3.LeaseID // sl's etcd lease, which the key must be attached to
	genRev int64            // its generation key's mod revision as last seen
}

// releaseGen returns the operation a shared-mode Release of g (whose lease
// key is key) runs beside the delete of key, in the same transaction, so
// that no store's RenewAll keeps reporting g's name renewed on its fast
// path. When this store has seen the generation key of its shared lease id
// for (g.Holder, g.TTL) (a full RenewAll or an AcquireAll did) it is a put
// of that generation key returning the key as it was (prev_kv), which says
// whether it still had the revision the store last saw, and the
// transaction then also compares the key's etcd lease with id (the put
// needs the lease alive, which the key attached to it shows). Otherwise it
// is a delete of all of the holder's generation keys (releaseGenAll), which
// every store of the holder sees at its next RenewAll, and no compare: the
// store has no fast path on its lease to keep, and whoever verified the
// name, on whatever lease, checks again.
func (s *LeaseStore) releaseGen(key string, g leasecore.Grant) releaseGenOp {
	s.mu.Lock()
	sl := s.pool[sharedKey{g.Holder, g.TTL}]
	var (
		id     clientv3.LeaseID
		genRev int64
	)
	if sl != nil {
		id, genRev = sl.id, sl.ver.genRev
	}
	s.mu.Unlock()
	if id == 0 || genRev == 0 {
		return s.releaseGenAll(g.Holder)
	}
	return releaseGenOp{
		op: clientv3.OpPut(s.layout.HolderGen(g.Holder, int64(id)), "", clientv3.WithLease(id), clientv3.WithPrevKV()),
		sl: sl, id: id, genRev: genRev,
	}
}

// releaseGenAll is the operation of a Release that deletes all of holder's
// generation keys.
func (s *LeaseStore) releaseGenAll(holder string) releaseGenOp {
	return releaseGenOp{op: clientv3.OpDelete(s.layout.HolderGenPrefix(holder), clientv3.WithPrefix())}
}

// releasedGen updates what the store verified after the Release of g,
// whose transaction resp ran gen.op: g's name is no longer verified; when
// the generation key was rewritten from the revision the names were
// verified at, they stay verified at its new revision (nothing else of the
// holder's on that lease was removed between: the key had not changed);
// when it had changed, nothing on that lease stays verified; when all
// generation keys of the holder were deleted, nothing of the holder's
// stays verified.
func (s *LeaseStore) releasedGen(g leasecore.Grant, gen releaseGenOp, resp *clientv3.TxnResponse) {
	if gen.sl == nil {
		s.holderGensGone(g.Holder)
		return
	}
	prev := resp.Responses[1].GetResponsePut().GetPrevKv()
	same := prev != nil && prev.ModRevision == gen.genRev
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := gen.sl
	if sl.id != gen.id {
		return
	}
	switch {
	case !same:
		sl.ver = verified{genRev: resp.Header.Revision}
	case sl.ver.genRev == gen.genRev:
		delete(sl.ver.names, g.Name)
		sl.ver.genRev = resp.Header.Revision
	default:
		delete(sl.ver.names, g.Name)
	}
}

// closeParallel bounds the revocations Close sends at once.
const closeParallel = 16

// Close ends the store's use of etcd leases. In shared mode it revokes the
// shared etcd lease of every holder and TTL the store acquired for, which
// deletes all the names attached to them at once: a clean shutdown frees the
// holder's names for other holders without waiting for their TTL. Without
// shared leases it revokes nothing: each name's etcd lease is its own, and
// its grant can still be renewed and released.
//
// Revoking is best effort, bounded by 2 seconds in all: a lease Close could
// not revoke expires after its TTL. Close returns the errors of failed
// revocations (a lease already expired is not one). A lease the store
// replaced because it had not been refreshed for a whole TTL is not revoked:
// by the local clock it has expired already. Close also waits for the
// store's clean-ups still running in the background (a failed call's
// best-effort revoke or delete that its context left no time for, each
// bounded by 2 seconds from when its call failed: see Acquire), so no
// goroutine of the store outlives Close, and Close still returns within
// about 2 seconds.
//
// Close ends the waits in progress: an AcquireQueued leaves the line and
// returns an error wrapping ErrStoreClosed, as does a WaitFree.
//
// After Close, Acquire fails with an error wrapping ErrStoreClosed; Renew,
// RenewAll, Release and Inspect keep working (in shared mode they find the
// revoked names gone). An Acquire running concurrently with Close may return
// a grant whose name Close has already deleted; its Renew then fails with
// leasecore.ErrLost. Close is idempotent. It does not close the client.
func (s *LeaseStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing) // ends AcquireQueued's and WaitFree's waits
	var ids []clientv3.LeaseID
	for _, sl := range s.pool {
		if sl.id != 0 {
			ids = append(ids, sl.id)
			sl.id, sl.ver = 0, verified{}
		}
	}
	s.mu.Unlock()
	// No clean-up starts in the background from now on (cleanUp checks
	// closed); those running end within cleanupTimeout of their start.
	defer s.waitCleanups()
	s.ka.close() // later keep-alives (Renew after Close) open a stream each
	if len(ids) == 0 {
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	errs := make([]error, len(ids))
	inParallel(len(ids), closeParallel, func(i int) {
		_, err := s.leases.Revoke(ctx, ids[i])
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs[i] = etcdkv.MapError(ctx, pkg, fmt.Sprintf("close: revoke shared lease %x", int64(ids[i])), err)
		}
	})
	return errors.Join(errs...)
}
