package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// moveWriter is the writer an install's attempt record names.
const moveWriter = "leasefence scope move"

// Seal seals scope at this cluster, which the scope is moving away from to
// the location the caller labels to ("etcd-eu"), and runs reads — Gets of
// the scope's keys, to copy them — in the same transaction: the data read
// is exactly the data at the seal (see leasecore.ScopeSeal for the whole
// move). It raises the scope's floor to leasecore.SealedFloor, above every
// token, so that every later Commit, Advance, Guard and Resource write of
// the scope here is rejected — by the compare each already makes — and puts
// the seal's record (to, the floor it had, that floor's token space) in the
// key <prefix>/moved/<scope>. It returns the leasecore.ScopeSeal to give
// to Install at the new cluster, and the responses of reads (Responses[i]
// is reads[i]'s; Header the transaction's).
//
// It takes two requests, whatever the scope's writers do:
//
//	If(Version(moved) == 0)
//	Then(reads..., Get(floorspace), Put(floor, enc(SealedFloor), prev_kv), Put(moved, pending record))
//	Else(reads..., Get(floorspace), Get(floor), Get(moved))
//
// then, the floor the put replaced now known, a put of the whole record
// over the pending one (If ModRevision(moved) == the seal's revision). The
// seal's compare is on its own record only, never on the floor, so writers
// that raise the floor without pause cannot make it fail: a guarded
// transaction that etcd applied before the seal is in what reads see and
// in the floor it returns; one it would apply after finds the sealed floor
// and is not applied.
//
// An error after the seal applied (ctx ended before the record was
// completed) leaves the scope sealed with a pending record: call Seal
// again, which completes the record from the floor's value just before the
// seal's revision and returns the seal. Should that revision have been
// compacted away meanwhile, Seal says so and the floor must come from
// elsewhere (Install with a floor at least every token issued here, e.g.
// the lease store's TokenCeiling).
//
// Sealing a sealed scope writes nothing (beyond completing a pending
// record) and returns the ScopeSeal of the first seal, with reads run in
// the same one transaction, so a move that crashed after its seal can run
// again. When that first seal named another destination, Seal returns that
// ScopeSeal with a *leasecore.ScopeMovedError (errors.Is
// leasecore.ErrScopeMoved) and no response. A scope that never had a floor
// here is sealed too, with Floor 0.
//
// Every op of reads must be a Get: the old copy of the data is deleted, if
// at all, after the install committed (a delete here before that would
// lose the scope if the move stopped halfway). Bad input — scope and to
// as names (backendkit.CheckSeal), an op that is not a Get — returns a
// *leasecore.ArgError naming the field before anything is sent. etcd's
// limit of operations per transaction (--max-txn-ops, 128 by default)
// applies to reads plus the seal's three operations.
func (f *Fence) Seal(ctx context.Context, scope, to string, reads ...clientv3.Op) (leasecore.ScopeSeal, *clientv3.TxnResponse, error) {
	const op = "seal"
	if err := backendkit.CheckSeal(ctx, op, scope, to); err != nil {
		return leasecore.ScopeSeal{}, nil, err
	}
	for i, o := range reads {
		if !o.IsGet() {
			return leasecore.ScopeSeal{}, nil, &leasecore.ArgError{Op: op, Field: "reads[" + strconv.Itoa(i) + "]",
				Reason: "must be a Get: the seal reads the scope's data; delete the old copy only after the install committed"}
		}
	}
	floorKey, spaceKey, movedKey := f.layout.Floor(scope), f.layout.FloorSpace(scope), f.layout.Moved(scope)
	n := len(reads)
	pending := etcdkv.SealRecord{To: to, Pending: true, At: time.Now().UTC()}
	resp, err := f.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(movedKey), "=", 0)).
		Then(append(reads[:n:n], clientv3.OpGet(spaceKey),
			clientv3.OpPut(floorKey, etcdkv.EncodeToken(leasecore.SealedFloor), clientv3.WithPrevKV()),
			clientv3.OpPut(movedKey, pending.Encode()))...).
		Else(append(reads[:n:n], clientv3.OpGet(spaceKey), clientv3.OpGet(floorKey), clientv3.OpGet(movedKey))...).
		Commit()
	if err != nil {
		return leasecore.ScopeSeal{}, nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	spaceKvs := resp.Responses[n].GetResponseRange().Kvs
	if !resp.Succeeded {
		// Sealed before: the first seal's record (completed if it is
		// pending), and the reads of this transaction, which saw the
		// sealed floor.
		floor, err := etcdkv.FloorOf(resp.Responses[n+1].GetResponseRange().Kvs)
		if err != nil {
			return leasecore.ScopeSeal{}, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		moved := resp.Responses[n+2].GetResponseRange().Kvs[0]
		s, err := f.sealOf(scope, floor, moved.Key, moved.Value)
		if err != nil {
			return leasecore.ScopeSeal{}, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		if rec, _ := etcdkv.DecodeSeal(string(moved.Key), moved.Value); rec.Pending {
			if s, err = f.completePendingSeal(ctx, op, scope, rec, moved.CreateRevision); err != nil {
				return leasecore.ScopeSeal{}, nil, err
			}
		}
		if s.To != to {
			return s, nil, &leasecore.ScopeMovedError{Op: op, Scope: scope, To: s.To, Floor: s.Floor}
		}
		return s, subResponse(resp, 0, n), nil
	}
	var prev []*mvccpb.KeyValue
	if kv := resp.Responses[n+1].GetResponsePut().GetPrevKv(); kv != nil {
		prev = []*mvccpb.KeyValue{kv}
	}
	s, err := sealFrom(scope, to, prev, spaceKvs)
	if err != nil {
		// The floor was written outside the fence; the scope is sealed
		// all the same (the safe side), its record pending.
		return leasecore.ScopeSeal{}, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	if err := f.completeSeal(ctx, op, s, resp.Header.Revision); err != nil {
		return leasecore.ScopeSeal{}, nil, err
	}
	return s, subResponse(resp, 0, n), nil
}

// sealFrom is the seal of scope to to, given the floor key and the
// floorspace key as they were just before the seal (no kv when missing).
func sealFrom(scope, to string, floorKvs, spaceKvs []*mvccpb.KeyValue) (leasecore.ScopeSeal, error) {
	floor, err := etcdkv.FloorOf(floorKvs)
	if err != nil {
		return leasecore.ScopeSeal{}, err
	}
	if floor == leasecore.SealedFloor {
		return leasecore.ScopeSeal{}, fmt.Errorf("scope %q: the floor was the sealed floor before the seal, with no seal record: "+
			"key %q was written outside the fence: %w", scope, floorKvs[0].Key, leasecore.ErrConfig)
	}
	s := leasecore.ScopeSeal{Scope: scope, To: to, Floor: floor}
	if len(spaceKvs) > 0 && floor > 0 {
		// The space belongs to the floor only when its token is the
		// floor's (see Fence).
		if t, space, err := etcdkv.DecodeFloorSpace(string(spaceKvs[0].Value)); err == nil && t == floor {
			s.Space = space
		}
	}
	return s, nil
}

// completeSeal replaces the pending record the seal at revision rev put
// with the record of s. A record changed since (another Seal completed it,
// from the same floor) is left as it is.
func (f *Fence) completeSeal(ctx context.Context, op string, s leasecore.ScopeSeal, rev int64) error {
	movedKey := f.layout.Moved(s.Scope)
	_, err := f.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(movedKey), "=", rev)).
		Then(clientv3.OpPut(movedKey, etcdkv.NewSealRecord(s).Encode())).
		Commit()
	if err != nil {
		return fmt.Errorf("%s: %s: scope %q is sealed, its record not yet completed (call Seal again): %w",
			pkg, op, s.Scope, etcdkv.MapError(ctx, pkg, op, err))
	}
	return nil
}

// completePendingSeal completes the pending record rec of a seal of scope
// made at revision rev, whose sealer stopped before it completed it: the
// floor it replaced is the floor key's value at rev-1.
func (f *Fence) completePendingSeal(ctx context.Context, op, scope string, rec etcdkv.SealRecord, rev int64) (leasecore.ScopeSeal, error) {
	floorResp, err := f.kv.Get(ctx, f.layout.Floor(scope), clientv3.WithRev(rev-1))
	if err == nil {
		var spaceResp *clientv3.GetResponse
		if spaceResp, err = f.kv.Get(ctx, f.layout.FloorSpace(scope), clientv3.WithRev(rev-1)); err == nil {
			s, err := sealFrom(scope, rec.To, floorResp.Kvs, spaceResp.Kvs)
			if err != nil {
				return leasecore.ScopeSeal{}, fmt.Errorf("%s: %s: %w", pkg, op, err)
			}
			return s, f.completeSeal(ctx, op, s, rev)
		}
	}
	if errors.Is(err, rpctypes.ErrCompacted) {
		return leasecore.ScopeSeal{}, fmt.Errorf("%s: %s: scope %q was sealed at revision %d, its record left pending, and the floor's value "+
			"before that revision was compacted away: install it with a floor at least every token issued here (the lease store's TokenCeiling)",
			pkg, op, scope, rev)
	}
	return leasecore.ScopeSeal{}, etcdkv.MapError(ctx, pkg, op, err)
}

// sealOf decodes the seal record of scope, whose floor is floor.
func (f *Fence) sealOf(scope string, floor leasecore.Token, key, value []byte) (leasecore.ScopeSeal, error) {
	rec, err := etcdkv.DecodeSeal(string(key), value)
	if err != nil {
		return leasecore.ScopeSeal{}, err
	}
	if floor != leasecore.SealedFloor {
		return leasecore.ScopeSeal{}, fmt.Errorf("scope %q: key %q holds a seal record but the floor is %d, not the sealed floor: "+
			"the floor was written outside the fence: %w", scope, key, floor, leasecore.ErrConfig)
	}
	return rec.ScopeSeal(scope), nil
}

// subResponse is the part of resp that answers n of its operations from
// the i-th on, with resp's header.
func subResponse(resp *clientv3.TxnResponse, i, n int) *clientv3.TxnResponse {
	return &clientv3.TxnResponse{Header: resp.Header, Succeeded: true, Responses: resp.Responses[i : i+n]}
}

// Install installs at this cluster a scope sealed at its old location, and
// applies writes — the puts of the scope's keys — in the same transaction,
// only if it is accepted (see leasecore.ScopeSeal for the whole move). It
// is Advance with s.Floor as the token, the writes in its accepting
// branch:
//
//	If(Value(floor) > enc(s.Floor)) Then(Get(floor))
//	Else(writes..., Put(floor, enc(s.Floor)) [, Put(floorspace) with s.Space] [, Put(attempt) with LogAll])
//
// one request. Accepted (the floor here was absent or at most s.Floor, and
// is now s.Floor, with s.Space as its token space): writes were applied,
// and the response's Responses are theirs. A holder whose token is below
// s.Floor is rejected here from then on, as it was at the old cluster; the
// holder whose token is s.Floor writes on. Rejected (Result.Floor is the
// larger floor here; nothing applied, no response): a holder with a newer
// token has already been accepted here — the move was completed and used,
// and the copy would overwrite newer keys. A scope sealed here (it moved
// away from this cluster before) is rejected with a
// *leasecore.ScopeMovedError: a sealed floor never goes down, so a scope
// does not come back to a cluster it left.
//
// Running it again after it was applied, before any holder wrote here, is
// accepted and writes the same keys again: the move can be rerun until the
// routing is switched. With s.Floor 0 (the scope never accepted a check at
// the old cluster) nothing is raised: writes are applied when the scope has
// no floor here (If(Version(floor) > 0) Then(Get(floor)) Else(writes...)),
// and the install is rejected when it has one.
//
// writes must not write the fence's keys; such writes, and a seal
// backendkit.CheckScopeSeal refuses (the sealed floor itself, a space
// without a floor, ...), return a *leasecore.ArgError naming the field
// before anything is sent. A rejection is logged like Advance's (writer
// "leasefence scope move"). etcd's limit of operations per transaction
// applies to writes plus up to three of the install's own.
func (f *Fence) Install(ctx context.Context, s leasecore.ScopeSeal, writes ...clientv3.Op) (leasecore.Result, *clientv3.TxnResponse, error) {
	const op = "install"
	if err := backendkit.CheckScopeSeal(ctx, op, s); err != nil {
		return leasecore.Result{}, nil, err
	}
	if err := f.checkWrites(op, "writes", writes); err != nil {
		return leasecore.Result{}, nil, err
	}
	floorKey := f.layout.Floor(s.Scope)
	c := leasecore.Claim{Scope: s.Scope, Writer: moveWriter, Token: s.Floor, Space: s.Space}
	at := time.Now()
	attemptKey := f.layout.NewAttempt(s.Scope, at)
	accept := append([]clientv3.Op(nil), writes...)
	cond := clientv3.Compare(clientv3.Version(floorKey), ">", 0)
	if s.Floor > 0 {
		enc := etcdkv.EncodeToken(s.Floor)
		cond = clientv3.Compare(clientv3.Value(floorKey), ">", enc)
		accept = append(accept, clientv3.OpPut(floorKey, enc))
		if s.Space != "" {
			accept = append(accept, clientv3.OpPut(f.layout.FloorSpace(s.Scope), etcdkv.EncodeFloorSpace(s.Floor, s.Space)))
		}
		if f.log == leasecore.LogAll {
			accept = append(accept, clientv3.OpPut(attemptKey, etcdkv.NewClaimAttemptRecord(c, true, s.Floor, at).Encode()))
		}
	}
	resp, err := f.kv.Txn(ctx).If(cond).Then(clientv3.OpGet(floorKey)).Else(accept...).Commit()
	if err != nil {
		return leasecore.Result{}, nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	if !resp.Succeeded {
		res := leasecore.Result{Accepted: true, Floor: s.Floor}
		if s.Floor > 0 && f.observe != nil {
			f.report(op, c, res, nil)
		}
		return res, &clientv3.TxnResponse{Header: resp.Header, Succeeded: true, Responses: resp.Responses[:len(writes)]}, nil
	}
	floor, err := etcdkv.FloorOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return leasecore.Result{}, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	res := leasecore.Result{Floor: floor}
	if s.Floor == 0 {
		// No token to log or to compare spaces with; a sealed floor still
		// says where the scope went.
		return res, nil, f.diagnose(ctx, op, c, floor)
	}
	err = f.rejected(ctx, op, c, attemptKey, etcdkv.NewClaimAttemptRecord(c, false, floor, at))
	f.report(op, c, res, err)
	return res, nil, err
}

// diagnose is the rejection path's diagnosis of claim c rejected by floor:
// a sealed scope (movedError) or a floor from another token space
// (spaceError). An ordinary stale rejection costs what it did before: only
// a claim with a space reads anything.
func (f *Fence) diagnose(ctx context.Context, op string, c leasecore.Claim, floor leasecore.Token) error {
	if floor == leasecore.SealedFloor {
		return f.movedError(ctx, op, c)
	}
	return f.spaceError(ctx, op, c)
}

// movedError reads the scope's floor and seal record in one read-only
// transaction (after a rejection by the sealed floor) and returns the
// *leasecore.ScopeMovedError the record describes.
func (f *Fence) movedError(ctx context.Context, op string, c leasecore.Claim) error {
	resp, err := f.kv.Txn(ctx).Then(clientv3.OpGet(f.layout.Floor(c.Scope)), clientv3.OpGet(f.layout.Moved(c.Scope))).Commit()
	if err != nil {
		return etcdkv.MapError(ctx, pkg, op+": read the seal", err)
	}
	floor, err := etcdkv.FloorOf(resp.Responses[0].GetResponseRange().Kvs)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("%s: %s: scope %q: the floor is the sealed floor but key %q holds no seal record: it was written outside the fence: %w",
			pkg, op, c.Scope, f.layout.Moved(c.Scope), leasecore.ErrConfig)
	}
	s, err := f.sealOf(c.Scope, floor, kvs[0].Key, kvs[0].Value)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return &leasecore.ScopeMovedError{Op: op, Scope: c.Scope, Token: c.Token, To: s.To, Floor: s.Floor}
}
