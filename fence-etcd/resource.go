package fenceetcd

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Resource is a fenced resource on etcd: report parts grouped in scopes,
// written under a Fence (leasecore.FencedResource, I3). It is one user of
// the fence, with the same floors: a write is Fence.Commit of a
// transaction that puts the part. It also implements backendkit.BatchWriter
// and backendkit.ResourceReader. It never reads a lease key: it decides from
// the scope's floor only. It is safe for concurrent use.
//
// Keys, under the prefix set by WithPrefix, each name escaped with
// url.PathEscape:
//
//	<prefix>/floor/<scope>                         the floor, a 20-digit zero-padded decimal
//	<prefix>/part/<scope>/<part>                   JSON {content (base64), writer, token, written_at}
//	<prefix>/attempt/<scope>/<20-digit ns>-<8 hex> JSON {part, writer, token, accepted, floor, at}
//	                                               (a batch: {parts: [...], writer, ...}, see WriteBatch)
//
// Which attempts are logged is WithAttemptLog's choice: by default only
// rejected ones (an accepted write's part record already names its writer
// and token); the lab and the conformance suite use leasecore.LogAll.
type Resource struct {
	fence *Fence
	read  etcdkv.Reader
}

var (
	_ leasecore.FencedResource  = (*Resource)(nil)
	_ backendkit.BatchWriter    = (*Resource)(nil)
	_ backendkit.ResourceReader = (*Resource)(nil)
)

// NewResource returns a fenced resource on cli, with keys under the prefix
// set by WithPrefix and the attempt log set by WithAttemptLog (default
// leasecore.LogRejected). A nil cli, an invalid prefix or an invalid log
// mode returns a *leasecore.ArgError. The caller keeps ownership of cli and
// closes it.
func NewResource(cli *clientv3.Client, opts ...Option) (*Resource, error) {
	const op = "new resource"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	o, l, err := options(op, opts)
	if err != nil {
		return nil, err
	}
	return &Resource{fence: &Fence{kv: cli.KV, layout: l, log: o.AttemptLog, observe: o.FenceObserver},
		read: etcdkv.Reader{KV: cli.KV, Layout: l, Pkg: pkg}}, nil
}

// Write implements leasecore.FencedResource: Fence.Commit of a
// transaction that puts the part,
//
//	If(Value(floor) == enc(w.Token))
//	Then(Put(part, record) [, Put(attempt, accepted) with leasecore.LogAll])
//
// one request when the floor already equals the token (the holder wrote
// before, or called Fence.Advance); the first write of a new token reads
// the floor, advances it and sends the write again (four requests); a
// rejection is two (the write, then the read of the floor that beat the
// token); see Fence.Commit for the rejection, its log record and why I3
// holds. etcd applies the
// compare and the branch it selects as one atomic step in its serial apply
// loop: no other write can fall between the check and the write, as it can
// with a read of the floor followed by a separate write (the
// check-then-write race, etcdcontrol.Controls.CheckThenWrite).
//
// The first write of a new token raises the floor in a request of its own
// (as Fence.Advance) before the guarded write, and that raise stays when
// the write is then rejected (a newer token advanced the floor in between)
// or fails (ctx ended, connection lost): Write returns the rejection or the
// error with the floor raised to w.Token. What took effect then is safe —
// the raise cuts off the holders of older tokens — and nothing of the part
// was written, unless the error came after the write's own request was
// sent: then, as for Fence.Commit, the outcome is unknown, and ReadPart
// tells (the part's record names its writer, token and content).
//
// An equal token is accepted (the same holding period writing again); a
// lower one is rejected whichever part it targets, and the floor and the
// part are left alone. A rejection is a Result, not an error (but for a
// floor from another token space, see Fence). Result.Floor
// is the floor after the attempt: w.Token when accepted, the larger floor
// when rejected. The part is carried once in each request, so a write of
// backendkit.MaxContentLen bytes (base64 in its record) stays inside etcd's
// default 1.5 MiB request limit.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	at := time.Now()
	part := clientv3.OpPut(r.fence.layout.Part(w.Scope, w.Part), etcdkv.EncodePartRecord(w, at))
	res, _, err := r.fence.commit(ctx, op, backendkit.ClaimOf(w), Txn{Then: []clientv3.Op{part}}, at, false,
		func(accepted bool, floor leasecore.Token) etcdkv.AttemptRecord {
			return etcdkv.NewAttemptRecordAt(w, accepted, floor, at)
		})
	return res, err
}

// WriteBatch implements backendkit.BatchWriter like Write, with one put per
// part in the caller's branch of the guarded transaction:
//
//	If(Value(floor) == enc(b.Token))
//	Then(Put(part, record) for each part [, Put(attempt, accepted)])
//
// The token is compared with the floor once, and every part is stored or
// none, in one atomic step. Each part's record is encoded as in Write.
//
// The batch logs ONE attempt key, whose record lists all its parts (an
// attempt record with "parts" instead of "part", see Resource); Attempts
// expands it into one leasecore.Attempt per part, in the batch's order, so
// a reader sees one entry per part, as on PostgreSQL. A batch is one
// attempt: all its parts share one outcome. (One key per part would also
// not fit: etcd allows at most 128 operations per transaction by default.)
//
// backendkit.CheckBatch limits the content to backendkit.MaxContentLen in all,
// which as base64 with its records stays below etcd's default request limit
// (1.5 MiB) for ordinary names. Near-maximal content with the longest names
// full of characters that must be escaped can still exceed it: etcd then
// refuses the request, nothing is written, and WriteBatch returns an error
// wrapping leasecore.ErrInvalidArgument.
func (r *Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	const op = "write batch"
	if err := backendkit.CheckBatch(ctx, b); err != nil {
		return leasecore.Result{}, err
	}
	at := time.Now()
	parts := make([]clientv3.Op, len(b.Parts))
	for i, p := range b.Parts {
		w := leasecore.Write{Scope: b.Scope, Part: p.Part, Content: p.Content, Writer: b.Writer, Token: b.Token}
		parts[i] = clientv3.OpPut(r.fence.layout.Part(b.Scope, p.Part), etcdkv.EncodePartRecord(w, at))
	}
	c := leasecore.Claim{Scope: b.Scope, Writer: b.Writer, Token: b.Token, Space: b.Space}
	res, _, err := r.fence.commit(ctx, op, c, Txn{Then: parts}, at, false,
		func(accepted bool, floor leasecore.Token) etcdkv.AttemptRecord {
			return etcdkv.NewBatchAttemptRecord(b, accepted, floor, at)
		})
	return res, err
}

// Floor implements backendkit.ResourceReader: the scope's floor, 0 when the
// scope never accepted a write.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements backendkit.ResourceReader: the part's current content;
// ok is false when it was never written. WrittenAt is the writer's clock.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements backendkit.ResourceReader: the scope's whole attempt
// log (what WithAttemptLog records; Fence.Attempts reads it in bounded
// pieces), in the order etcd stored the records (by revision). An accepted
// attempt's record is stored with its write, so accepted attempts appear in
// the order etcd applied them; a rejection's record is stored just after
// the rejection is known, and can follow the records of later attempts.
// Every record carries the floor after its attempt. A batch's single
// attempt key becomes one attempt per part, in the batch's order, with the
// batch's outcome, floor and time.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}
