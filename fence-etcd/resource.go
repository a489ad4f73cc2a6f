package fenceetcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// Resource is a fenced resource on etcd: report parts grouped in scopes, a
// floor key per scope (the largest token accepted), and a log of every
// write attempt (leasecore.FencedResource, I3). It also implements
// leasecore.BatchWriter and leasecore.ResourceReader. It never reads a lease key: it decides from its
// own floor only. It is safe for concurrent use.
//
// Keys, under the prefix set by WithPrefix, each name escaped with
// url.PathEscape:
//
//	<prefix>/floor/<scope>              the floor, a 20-digit zero-padded decimal
//	<prefix>/part/<scope>/<part>        JSON {content (base64), writer, token, written_at}
//	<prefix>/attempt/<scope>/<16 hex>   JSON {part, writer, token, accepted, floor, at}
//	                                    (a batch: {parts: [...], writer, ...}, see WriteBatch)
type Resource struct {
	kv     clientv3.KV
	layout etcdkv.Layout
	read   etcdkv.Reader
}

var (
	_ leasecore.FencedResource = (*Resource)(nil)
	_ leasecore.BatchWriter    = (*Resource)(nil)
	_ leasecore.ResourceReader = (*Resource)(nil)
)

// NewResource returns a fenced resource on cli, with keys under the prefix
// set by WithPrefix. A nil cli or an invalid prefix returns a
// *leasecore.ArgError. The caller keeps ownership of cli and closes it.
func NewResource(cli *clientv3.Client, opts ...Option) (*Resource, error) {
	const op = "new resource"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	l, err := layout(op, opts)
	if err != nil {
		return nil, err
	}
	return &Resource{kv: cli.KV, layout: l, read: etcdkv.Reader{KV: cli.KV, Layout: l, Pkg: pkg}}, nil
}

// Write implements leasecore.FencedResource with one transaction, one
// round trip:
//
//	If(Value(floor) > enc(w.Token))
//	Then(Put(attempt, rejected), Get(floor))
//	Else(Put(floor, enc(w.Token)), Put(part, record), Put(attempt, accepted))
//
// where enc is the 20-digit encoding, whose byte order is numeric order.
// etcd applies the compare and the branch it selects as one atomic step in
// its serial apply loop: no other write can fall between the check and the
// write, as it can with a read of the floor followed by a separate write
// (the check-then-write race, etcdcontrol.CheckThenWrite). So the token is
// compared with the floor the previous write of the scope left, whoever
// made it, and I3 holds for concurrent writers without any lock.
//
// The compare is written as "floor above the token" so that a scope seen
// for the first time needs no second branch: etcd fails every value compare
// on a missing key, and a missing floor falls through to the accepting
// Else. (The equivalent "If(Value(floor) <= token) Then(puts)
// Else(If(CreateRevision(floor) == 0) Then(puts) Else(reject)))" carries
// the part twice in the request: a write of leasecore.MaxContentLen bytes
// would exceed etcd's default 1.5 MiB request limit.)
//
// An equal token is accepted (the same holding period writing again); a
// lower one is rejected whichever part it targets, the floor and the part
// are left alone, and the attempt is still logged. A rejection is a Result,
// not an error. Result.Floor is the floor after the attempt: w.Token when
// accepted, the larger floor read in the same transaction when rejected.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := leasecore.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	part := clientv3.OpPut(r.layout.Part(w.Scope, w.Part), etcdkv.NewPartRecord(w).Encode())
	return r.fence(ctx, op, w.Scope, w.Token, []clientv3.Op{part},
		etcdkv.NewAttemptRecord(w, false, 0).Encode(), etcdkv.NewAttemptRecord(w, true, w.Token).Encode())
}

// WriteBatch implements leasecore.BatchWriter with one transaction, one
// round trip, like Write's:
//
//	If(Value(floor) > enc(b.Token))
//	Then(Put(attempt, rejected), Get(floor))
//	Else(Put(floor, enc(b.Token)), Put(part, record) for each part, Put(attempt, accepted))
//
// The token is compared with the floor once, and every part is stored or
// none, in one atomic step. Each part's record is encoded as in Write.
//
// The batch logs ONE attempt key, whose record lists all its parts (an
// etcdkv.AttemptRecord with "parts" instead of "part"); Attempts expands it
// into one leasecore.Attempt per part, in the batch's order, so a reader
// sees one entry per part, as on PostgreSQL. One attempt key per part
// would not fit: etcd allows at most 128 operations per transaction by
// default, and a floor, leasecore.MaxBatchParts (64) parts and 64 attempt
// keys are 129. A batch is one attempt anyway: all its parts share one
// outcome.
//
// leasecore.CheckBatch limits the content to leasecore.MaxContentLen in all,
// which as base64 with its records stays below etcd's default request limit
// (1.5 MiB) for ordinary names. Near-maximal content with the longest names
// full of characters that must be escaped can still exceed it: etcd then
// refuses the request, nothing is written, and WriteBatch returns an error
// wrapping leasecore.ErrInvalidArgument.
func (r *Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	const op = "write batch"
	if err := leasecore.CheckBatch(ctx, b); err != nil {
		return leasecore.Result{}, err
	}
	at := time.Now()
	parts := make([]clientv3.Op, len(b.Parts))
	for i, p := range b.Parts {
		w := leasecore.Write{Scope: b.Scope, Part: p.Part, Content: p.Content, Writer: b.Writer, Token: b.Token}
		parts[i] = clientv3.OpPut(r.layout.Part(b.Scope, p.Part), etcdkv.NewPartRecordAt(w, at).Encode())
	}
	return r.fence(ctx, op, b.Scope, b.Token, parts,
		etcdkv.NewBatchAttemptRecord(b, false, 0, at).Encode(), etcdkv.NewBatchAttemptRecord(b, true, b.Token, at).Encode())
}

// fence runs the fenced transaction of Write and WriteBatch for scope and
// token: when the floor is above token, it logs rejected; otherwise it sets
// the floor to token, applies parts and logs accepted, all in one
// transaction.
func (r *Resource) fence(ctx context.Context, op, scope string, token leasecore.Token, parts []clientv3.Op,
	rejected, accepted string) (leasecore.Result, error) {
	floorKey, attemptKey := r.layout.Floor(scope), r.layout.NewAttempt(scope)
	enc := etcdkv.EncodeToken(token)
	accept := make([]clientv3.Op, 0, len(parts)+2)
	accept = append(accept, clientv3.OpPut(floorKey, enc))
	accept = append(accept, parts...)
	accept = append(accept, clientv3.OpPut(attemptKey, accepted))
	resp, err := r.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(floorKey), ">", enc)).
		Then(
			clientv3.OpPut(attemptKey, rejected),
			clientv3.OpGet(floorKey)).
		Else(accept...).
		Commit()
	if err != nil {
		return leasecore.Result{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	if !resp.Succeeded {
		return leasecore.Result{Accepted: true, Floor: token}, nil
	}
	floor, err := etcdkv.FloorOf(resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return leasecore.Result{}, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return leasecore.Result{Floor: floor}, nil
}

// Floor implements leasecore.ResourceReader: the scope's floor, 0 when the
// scope never accepted a write.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements leasecore.ResourceReader: the part's current content;
// ok is false when it was never written. WrittenAt is the writer's clock.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements leasecore.ResourceReader: every write attempt of the
// scope, accepted or rejected, in the order etcd applied them (by revision).
// A rejected attempt's record has no floor — the transaction could not copy
// the floor's value into it — and Attempts reports the floor after the
// previous attempt, which is exact because every change of the floor is
// logged, with the new floor, in the transaction that makes it. Keep the
// log whole: deleting attempt keys loses that. A batch's single attempt key
// becomes one attempt per part, in the batch's order, with the batch's
// outcome, floor and time.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}
