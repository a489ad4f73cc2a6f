package etcdkv

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Reader implements backendkit.ResourceReader over one layout's floor, part
// and attempt keys, for every resource of fence-etcd, fenced or not. Each
// read is one request; input is validated first, and bad input or a done
// context returns before anything is sent.
type Reader struct {
	KV     clientv3.KV
	Layout Layout
	Pkg    string // error prefix, e.g. "fenceetcd"
}

// Floor implements backendkit.ResourceReader: 0 when the scope has no floor
// key.
func (r Reader) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	const op = "floor"
	if err := CheckRead(ctx, op, scope); err != nil {
		return 0, err
	}
	return ReadFloor(ctx, r.KV, r.Pkg, op, r.Layout.Floor(scope))
}

// ReadFloor reads the floor at key with one Get, for op of package pkg: 0
// when there is none; a value that is not a token is an error wrapping
// leasecore.ErrConfig (FloorOf).
func ReadFloor(ctx context.Context, kv clientv3.KV, pkg, op, key string) (leasecore.Token, error) {
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return 0, MapError(ctx, pkg, op, err)
	}
	floor, err := FloorOf(resp.Kvs)
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return floor, nil
}

// FloorOf decodes a floor (or any token key) from the result of a Get of
// its key, in a plain Get or inside a transaction: 0 when the key does not
// exist. A value that is not a token was written outside the fence: the
// error wraps leasecore.ErrConfig.
func FloorOf(kvs []*mvccpb.KeyValue) (leasecore.Token, error) {
	if len(kvs) == 0 {
		return 0, nil
	}
	t, err := DecodeToken(string(kvs[0].Value))
	if err != nil {
		return 0, fmt.Errorf("key %q: %w (written outside the fence): %w", kvs[0].Key, err, leasecore.ErrConfig)
	}
	return t, nil
}

// ReadPart implements backendkit.ResourceReader.
func (r Reader) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.readPart(ctx, scope, part, r.Layout.Part(scope, part))
}

// ReadPublished reads the idempotent publisher's publication of (scope,
// part) instead.
func (r Reader) ReadPublished(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.readPart(ctx, scope, part, r.Layout.Published(scope, part))
}

func (r Reader) readPart(ctx context.Context, scope, part, key string) (leasecore.StoredPart, bool, error) {
	const op = "read part"
	if err := CheckRead(ctx, op, scope, part); err != nil {
		return leasecore.StoredPart{}, false, err
	}
	resp, err := r.KV.Get(ctx, key)
	if err != nil {
		return leasecore.StoredPart{}, false, MapError(ctx, r.Pkg, op, err)
	}
	if len(resp.Kvs) == 0 {
		return leasecore.StoredPart{}, false, nil
	}
	rec, err := DecodePart(key, resp.Kvs[0].Value)
	if err != nil {
		return leasecore.StoredPart{}, false, fmt.Errorf("%s: %s: %w", r.Pkg, op, err)
	}
	return rec.StoredPart(scope, part), true, nil
}

// Attempts implements backendkit.ResourceReader: one range read of the
// scope's whole attempt log, sorted by modification revision (each key is
// written once), oldest first: the order in which etcd stored the records.
// That is etcd's order of application for accepted attempts, whose records
// commit with their writes; a rejection's record is stored after the
// rejection is known (fenceetcd.Fence.Commit), so it can follow records of
// later attempts. A batch's key becomes one attempt per part, in the
// batch's order. An attempt whose record carries no floor (the negative
// controls') gets the floor after the previous attempt (see
// AttemptRecord.Floor); 0 before the first.
func (r Reader) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	const op = "attempts"
	if err := CheckRead(ctx, op, scope); err != nil {
		return nil, err
	}
	resp, err := r.KV.Get(ctx, r.Layout.AttemptPrefix(scope), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
	if err != nil {
		return nil, MapError(ctx, r.Pkg, op, err)
	}
	out, err := DecodeAttempts(scope, resp.Kvs, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", r.Pkg, op, err)
	}
	return out, nil
}

// DecodeAttempts decodes attempt keys of scope, in the order given, into
// attempts, a batch's key into one attempt per part; at most limit of them
// when limit > 0. A record without a floor gets the floor of the record
// before it (0 for the first).
func DecodeAttempts(scope string, kvs []*mvccpb.KeyValue, limit int) ([]leasecore.Attempt, error) {
	out := make([]leasecore.Attempt, 0, len(kvs))
	var floor leasecore.Token
	for _, kv := range kvs {
		rec, err := DecodeAttempt(string(kv.Key), kv.Value)
		if err != nil {
			return nil, err
		}
		if rec.Floor != 0 {
			floor = leasecore.Token(rec.Floor)
		}
		// A batch's record stands for one attempt per part, in the
		// batch's order, all with the same outcome.
		for _, part := range rec.PartNames() {
			if limit > 0 && len(out) == limit {
				return out, nil
			}
			out = append(out, leasecore.Attempt{Scope: scope, Part: part, Writer: rec.Writer,
				Token: leasecore.Token(rec.Token), Accepted: rec.Accepted, Floor: floor, At: rec.At})
		}
	}
	return out, nil
}

// CheckRead validates the scope and, for ReadPart, the part, then the
// context.
func CheckRead(ctx context.Context, op, scope string, part ...string) error {
	if err := backendkit.CheckName(op, "scope", scope); err != nil {
		return err
	}
	for _, p := range part {
		if err := backendkit.CheckName(op, "part", p); err != nil {
			return err
		}
	}
	return backendkit.CheckContext(op, ctx)
}
