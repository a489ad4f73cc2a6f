package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

var _ backendkit.BatchAcquirer = (*LeaseStore)(nil)

// cleanupParallel bounds the cleanup requests AcquireAll has in flight at
// once (unputIfOurs, or Release of a grant it gives back).
const cleanupParallel = 32

// AcquireAll implements backendkit.BatchAcquirer.
//
// With WithSharedLeases every name of the batch is put with the holder's
// one shared etcd lease of ttl (granted or refreshed first when needed, as
// for Acquire: see LeaseStore), 127 names (MaxTxnOps-1) per transaction:
//
//	If(CreateRevision(key_1) == 0, ..., CreateRevision(key_n) == 0).
//	Then(Put(key_1, holder, WithLease(id)), ..., Put(key_n, holder, WithLease(id)),
//	     Put(gen, WithLease(id), prev_kv))
//
// The last operation rewrites the holder's generation key of the shared
// lease (see RenewAll's fast path): the store then knows every name the
// transaction created as verified, and the holder's first RenewAll of them
// reads one key and sends one keep-alive, with no write — renewals do not
// queue behind acquires on a cluster whose writes are saturated.
//
// A transaction creates all its keys or none. When it succeeds, each of its
// names is granted with the transaction's revision as token — the create
// revision of each key, as Acquire's token — so the names of one
// transaction share one token value. That loses nothing: a token is
// compared only with tokens of the same name (a fence per scope), and each
// name's tokens stay strictly increasing, since every create of its key has
// a larger revision than every earlier one. Grant.Start is the shared
// lease's refresh start, exactly as Acquire's in shared mode (see Acquire):
// the keys live only as long as the shared lease, which may expire before
// (this call) + ttl. When the compare fails (some key of the transaction
// exists: held by anyone, or not yet deleted by the lessor), that
// transaction's names are acquired one by one with Acquire, which grants
// the free ones and refuses the others with ErrHeld. 1000 new names thus
// cost 8 transactions instead of 1000.
//
// Without shared leases every name needs an etcd lease of its own (one
// Grant each, which a transaction cannot carry), so AcquireAll is one
// Acquire per name, in order: correct, with no saving.
//
// errs[i] is what Acquire returned for names[i]; the grants of the other
// names stand. err is for the call as a whole — bad input
// (backendkit.CheckAcquireAll with MinTTL, a TTL of whole seconds), the
// store closed (ErrStoreClosed), or a shared-mode transaction, or the
// shared lease it needs, that failed (etcd unavailable, ctx done) — and
// then the caller holds none of the names: the keys of a transaction whose
// outcome is unknown are deleted again if it created them (as Acquire
// does), and the names this call granted before the failure are released,
// both best effort, under ctx while it lasts and then in the background for
// up to 2 seconds (see Acquire), so the call itself returns when ctx ends;
// a later Acquire or AcquireAll of one of those names through this store
// waits for its clean-up first. A key either clean-up missed lapses with
// the shared lease when the holder stops renewing.
func (s *LeaseStore) AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) (grants []leasecore.Grant, errs []error, err error) {
	const op = "acquire all"
	if err := backendkit.CheckAcquireAll(ctx, names, holder, ttl, MinTTL); err != nil {
		return nil, nil, err
	}
	if err := checkWholeSeconds(op, ttl); err != nil {
		return nil, nil, err
	}
	if s.isClosed() {
		return nil, nil, fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	grants, errs = make([]leasecore.Grant, len(names)), make([]error, len(names))
	if !s.shared {
		for i, name := range names {
			grants[i], errs[i] = s.Acquire(ctx, name, holder, ttl)
		}
		return grants, errs, nil
	}

	sl := s.sharedFor(holder, ttl)
	for lo := 0; lo < len(names); lo += acquireAllChunk {
		hi := min(lo+acquireAllChunk, len(names))
		put, err := s.putAllShared(ctx, op, sl, names[lo:hi], holder, ttl, grants[lo:hi])
		if err != nil {
			s.giveBack(ctx, grants[:lo], errs[:lo])
			return nil, nil, err
		}
		if !put {
			for i := lo; i < hi; i++ {
				grants[i], errs[i] = s.Acquire(ctx, names[i], holder, ttl)
			}
		}
	}
	return grants, errs, nil
}

// acquireAllChunk is the most names one AcquireAll transaction puts: the
// put of the generation key (acquireGen) is one operation more.
const acquireAllChunk = MaxTxnOps - 1

// putAllShared is AcquireAll's transaction for names (at most acquireAllChunk):
// put every key with the shared lease of sl if none exists. put reports
// whether it did; then grants (len(names)) holds the grants. An error is
// AcquireAll's err: the keys the transaction may have created are deleted
// again first.
func (s *LeaseStore) putAllShared(ctx context.Context, op string, sl *sharedLease, names []string, holder string,
	ttl time.Duration, grants []leasecore.Grant) (put bool, err error) {
	keys := make([]string, len(names))
	cmps := make([]clientv3.Cmp, len(names))
	for i, name := range names {
		keys[i] = s.layout.Lease(name)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(keys[i]), "=", 0)
	}
	// Clean-ups of earlier failed acquires of these names by this store may
	// still run: they must not find our keys (see unputIfOurs).
	if err := s.awaitCleanup(ctx, op, keys...); err != nil {
		return false, err
	}
	for retried := false; ; retried = true {
		id, refreshed, err := s.sharedLease(ctx, op, sl, ttl)
		if err != nil {
			return false, err
		}
		puts := make([]clientv3.Op, len(names), len(names)+1)
		for i, key := range keys {
			puts[i] = clientv3.OpPut(key, holder, clientv3.WithLease(id))
		}
		gen := s.acquireGen(sl, id, holder)
		puts = append(puts, gen.op)
		// Every key this store created with id has a create revision up to
		// here: the cleanup below must not delete one of those.
		before := s.lastRev.Load()
		resp, err := s.kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// The shared lease expired or was revoked after we last saw it
			// alive; etcd checked it before writing anything. Replace it
			// and try once more, as Acquire does.
			s.sharedGone(id)
			if !retried {
				continue
			}
			return false, fmt.Errorf("%s: %s: the shared lease expired before the keys were written, twice (ttl %v): %w: %w",
				pkg, op, ttl, leasecore.ErrUnavailable, err)
		case err != nil:
			// The transaction may have been applied: its keys would be
			// held by this holder, who does not know it, and kept alive by
			// every renewal of the holder's other names. Delete them again.
			steps := make([]cleanupStep, len(keys))
			for i, key := range keys {
				steps[i] = s.unputIfOurs(key, holder, id, before)
			}
			s.cleanUp(ctx, steps)
			return false, etcdkv.MapError(ctx, pkg, op, err)
		case !resp.Succeeded:
			return false, nil // some key exists: name by name
		}
		s.noteRev(resp.Header.Revision)
		for i, name := range names {
			// Start: the shared lease's refresh start, never this request's
			// time (acquireShared's SAFETY RULE).
			grants[i] = leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(resp.Header.Revision), TTL: ttl,
				Start: refreshed, Space: tokenSpace(resp.Header)}
		}
		s.acquiredGen(gen, names, resp)
		return true, nil
	}
}

// giveBack releases, best effort, the grants of a failed AcquireAll (those
// whose errs entry is nil): under ctx while it lasts, the rest in the
// background within cleanupTimeout (see cleanUp), their names pending until
// then, so a later acquire of one of them through the store waits for its
// release instead of finding it held.
func (s *LeaseStore) giveBack(ctx context.Context, grants []leasecore.Grant, errs []error) {
	var steps []cleanupStep
	for i, g := range grants {
		if errs[i] == nil && g.Token != 0 {
			steps = append(steps, cleanupStep{key: s.layout.Lease(g.Name), run: func(ctx context.Context) error {
				err := s.Release(ctx, g)
				if errors.Is(err, leasecore.ErrLost) {
					return nil // released already (by an earlier try of this step), or expired
				}
				return err
			}})
		}
	}
	s.cleanUp(ctx, steps)
}

// inParallel runs f(0), ..., f(n-1), at most limit at once, and returns
// when all have returned.
func inParallel(n, limit int, f func(i int)) {
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}
