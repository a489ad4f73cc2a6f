package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// MaxList is the largest limit of LeaseStore.List and Fence.Floors: one
// read returns at most this many keys.
const MaxList = 10000

// List returns the state of at most limit leases that exist (are held),
// in name order, each as Inspect reports it: one range read of the lease
// keys, then a TimeToLive per etcd lease they are attached to (one per
// shared lease). Released and expired leases have no key and are not
// listed (see Inspect). For operators and dashboards (the leasefence
// command's list); nothing should decide to write from it. limit must be 1
// to MaxList; bad input returns a *leasecore.ArgError before anything is
// sent.
func (s *LeaseStore) List(ctx context.Context, limit int) ([]leasecore.LeaseState, error) {
	const op = "list"
	if err := checkLimit(op, limit); err != nil {
		return nil, err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	prefix := s.layout.LeasePrefix()
	resp, err := s.kv.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	remaining := make(map[int64]time.Duration) // per etcd lease; <0: gone
	out := make([]leasecore.LeaseState, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		name, err := etcdkv.NameOf(prefix, string(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		left, ok := remaining[kv.Lease]
		if !ok {
			ttl, err := s.leases.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				left = -1
			case err != nil:
				return nil, etcdkv.MapError(ctx, pkg, op, err)
			default:
				// TTL -1: revoked since the range read, and the key with
				// it (as in Inspect).
				left = time.Duration(ttl.TTL) * time.Second
			}
			remaining[kv.Lease] = left
		}
		if left < 0 {
			continue
		}
		out = append(out, leasecore.LeaseState{Name: name, Exists: true, Holder: string(kv.Value),
			Token: leasecore.Token(kv.ModRevision), Held: true, Remaining: left})
	}
	return out, nil
}

// TakeOver gives lease name to holder for ttl whatever its state, with a
// new token larger than every token issued before, and returns the grant
// and the state the lease had just before (Exists false when it was free).
// It is an operator's tool (the leasefence command's break), not a way to
// acquire: it ends the current holding period at once — the holder's Renew
// and Release then fail with leasecore.ErrLost — but that holder may not
// notice before its local deadline and may still write. Only the fence
// stops it: advance every scope the lease protects to the returned token
// (Fence.Advance), then Release the grant, so the next holder gets a
// larger token still.
//
// A token is the revision that put the key (its mod revision): TakeOver
// deletes the key in one transaction that holds only while the key is
// still the holding period it read (If(ModRevision(key) == token)), then
// acquires as Acquire does (with this store's mode of
// leases). The etcd lease of the deleted key is left to expire on its own:
// with shared leases the old holder's other names are attached to it. The
// same transaction deletes the old holder's generation keys, so every
// store of that holder reads the name's key at its next RenewAll and finds
// it lost (see RenewAll). An expired or released lease has no key:
// TakeOver is then an Acquire.
//
// Between the delete and the acquire another acquirer (a waiting
// Campaign, which the delete wakes) may take the lease: TakeOver then
// returns the state it ended and a *leasecore.HoldError wrapping
// leasecore.ErrHeld that names the new holder. The holding period it read
// is over all the same, and the new holder's token is larger than its
// token: advancing the scopes to the new holder's token (Inspect) fences
// the old holder off without harming the new one. A key that changes
// between the read and the delete is read again, up to a few times.
//
// Bad input (name, holder, ttl as for Acquire) returns a
// *leasecore.ArgError before anything is sent; after Close it returns an
// error wrapping ErrStoreClosed.
func (s *LeaseStore) TakeOver(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, leasecore.LeaseState, error) {
	const op = "take over"
	if err := checkTakeOver(ctx, op, name, holder, ttl); err != nil {
		return leasecore.Grant{}, leasecore.LeaseState{}, err
	}
	if s.isClosed() {
		return leasecore.Grant{}, leasecore.LeaseState{}, fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	key := s.layout.Lease(name)
	const attempts = 5
	for i := 1; ; i++ {
		prev, err := s.Inspect(ctx, name)
		if err != nil {
			return leasecore.Grant{}, leasecore.LeaseState{}, err
		}
		if prev.Exists {
			// With the key go all of the previous holder's generation
			// keys: any store of that holder that verified the name (see
			// RenewAll) checks it again at its next RenewAll, and finds
			// it lost.
			resp, err := s.kv.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", int64(prev.Token))).
				Then(clientv3.OpDelete(key),
					clientv3.OpDelete(s.layout.HolderGenPrefix(prev.Holder), clientv3.WithPrefix())).
				Commit()
			if err != nil {
				return leasecore.Grant{}, leasecore.LeaseState{}, etcdkv.MapError(ctx, pkg, op, err)
			}
			if !resp.Succeeded {
				// Released, expired or replaced since the read: read the
				// holding period to end again.
				if i == attempts {
					return leasecore.Grant{}, leasecore.LeaseState{}, fmt.Errorf(
						"%s: %s: lease %q changed %d times while it was being taken over: %w",
						pkg, op, name, attempts, leasecore.ErrUnavailable)
				}
				continue
			}
			s.holderGensGone(prev.Holder)
		}
		g, err := s.Acquire(ctx, name, holder, ttl)
		if err != nil {
			var held *leasecore.HoldError
			if errors.As(err, &held) {
				held.Op = op
			}
			return leasecore.Grant{}, prev, err
		}
		return g, prev, nil
	}
}

// TokenCeiling returns the cluster's current revision: no token this
// store, or any store on the same cluster, has issued is above it, since
// a token is a revision and the revision never goes back. A floor
// above it was not set by a token of this cluster: a token-space mix-up
// (the leasefence command's floors warns of it). One request.
func (s *LeaseStore) TokenCeiling(ctx context.Context) (leasecore.Token, error) {
	const op = "token ceiling"
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return 0, err
	}
	resp, err := s.kv.Get(ctx, s.layout.LeasePrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, etcdkv.MapError(ctx, pkg, op, err)
	}
	return leasecore.Token(resp.Header.Revision), nil
}

// Floors returns at most limit floors under the fence's prefix, in scope
// order, with one range read: every scope that ever accepted a check. For
// operators and audits (the leasefence command's floors); Floor reads one
// scope. limit must be 1 to MaxList; bad input returns a
// *leasecore.ArgError before anything is sent.
func (f *Fence) Floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error) {
	const op = "floors"
	if err := checkLimit(op, limit); err != nil {
		return nil, err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	prefix := f.layout.FloorPrefix()
	resp, err := f.kv.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	out := make([]leasecore.ScopeFloor, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		scope, err := etcdkv.NameOf(prefix, string(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		floor, err := etcdkv.DecodeToken(string(kv.Value))
		if err != nil {
			return nil, fmt.Errorf("%s: %s: key %q: %w", pkg, op, kv.Key, err)
		}
		out = append(out, leasecore.ScopeFloor{Scope: scope, Floor: floor})
	}
	return out, nil
}

// rejectedPage is how many attempt keys RejectedAttempts reads per
// request: the records are JSON, so the filter runs here, page by page.
const rejectedPage = 1000

// RejectedAttempts is Attempts for rejected entries only — the audit of
// stale writes the fence turned away: at most q.Limit of them, at or after
// q.Since (by the writers' clocks, see Attempts), oldest first. etcd
// cannot filter values, so it reads the scope's log from q.Since in range
// reads of up to 1000 keys until it has q.Limit rejections or reaches the
// end; with leasecore.LogRejected (the default) every entry is a
// rejection and one read suffices. Bad input returns a *leasecore.ArgError
// before anything is sent.
func (f *Fence) RejectedAttempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	const op = "rejected attempts"
	if err := backendkit.CheckAttemptQuery(ctx, op, q); err != nil {
		return nil, err
	}
	from, end := f.layout.AttemptsAt(q.Scope, q.Since), clientv3.GetPrefixRangeEnd(f.layout.AttemptPrefix(q.Scope))
	var out []leasecore.Attempt
	for {
		resp, err := f.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(rejectedPage))
		if err != nil {
			return nil, etcdkv.MapError(ctx, pkg, op, err)
		}
		page, err := etcdkv.DecodeAttempts(q.Scope, resp.Kvs, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		for _, a := range page {
			if !a.Accepted {
				out = append(out, a)
				if len(out) == q.Limit {
					return out, nil
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, nil
		}
		// The next key after the last one read: keys are unique, so
		// nothing is read twice.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// checkLimit validates the limit of a List or Floors read.
func checkLimit(op string, limit int) error {
	if limit < 1 || limit > MaxList {
		return &leasecore.ArgError{Op: op, Field: "limit", Value: fmt.Sprint(limit),
			Reason: fmt.Sprintf("must be 1 to %d", MaxList)}
	}
	return nil
}

// checkTakeOver validates TakeOver's input as Acquire does, under op's
// name.
func checkTakeOver(ctx context.Context, op, name, holder string, ttl time.Duration) error {
	if err := backendkit.CheckName(op, "name", name); err != nil {
		return err
	}
	if err := backendkit.CheckName(op, "holder", holder); err != nil {
		return err
	}
	if err := backendkit.CheckTTL(op, ttl, MinTTL); err != nil {
		return err
	}
	if err := checkWholeSeconds(op, ttl); err != nil {
		return err
	}
	return backendkit.CheckContext(op, ctx)
}
