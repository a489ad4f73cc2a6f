package fenceetcd

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Outbox is a fenced outbox for side effects the downstream system cannot
// fence itself ("report published" sent to another service, a message, a
// webhook; conformance case F9): the side effect is recorded as an entry in the same
// Txn as the data it announces, under the fence, and a relay delivers it
// afterwards with the writer's token as its version.
//
// The call sequence: the entry's operation in the Then of the Txn that
// Fence.Commit runs for the same claim,
//
//	entry, err := outbox.Add(claim, "report-published", payload)
//	if err != nil { ... }
//	res, _, err := fence.Commit(ctx, claim, fenceetcd.Txn{Then: []clientv3.Op{
//		clientv3.OpPut("/app/report/2026-12-03", report), entry,
//	}})
//
// and in a relay (any process, any number of them):
//
//	n, err := outbox.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
//		return postToDownstream(ctx, e) // nil only once the downstream acknowledged e
//	})
//
// Keys, under the prefix set by WithPrefix, one per pending entry:
// <prefix>/outbox/<scope>/<20-digit number>-<id>, scope escaped with
// url.PathEscape, the number increasing within the writing process (the
// entries of one Txn keep the order their operations were built in); the
// value is a JSON line (id, scope, writer, token, topic, at) followed by
// the payload's bytes. A relay deletes the key once the downstream
// acknowledged the entry. An entry's Seq is its key's create revision.
//
// What it guarantees:
//
//   - An entry exists only if a transaction applied it with the scope's
//     floor equal to its token: Add's operation is itself guarded (a nested
//     Txn under Fence.Guard of the claim), so inside Commit it is applied
//     with the caller's keys, atomically, and a stale holder's Commit is
//     rejected whole, entry included — and even in a Txn of the caller's
//     that forgot the guard, the entry is not written unless the floor
//     equals its token.
//   - Every entry is delivered at least once, in Seq order, and deleted
//     only after deliver returned nil for it. A relay that dies between
//     the downstream's acknowledgement and the delete leaves the entry
//     pending: the next relay delivers it again, with the same ID.
//   - Relays may run concurrently, and a frozen relay may wake up: two
//     relays can then deliver the same entry, even at the same moment, and
//     one relay's late delivery of an old entry can arrive after another's
//     of newer ones. Nothing prevents it (etcd has no lock a relay could
//     hold across the downstream's answer without a lease of its own). It
//     stays correct for a downstream that deduplicates by OutboxEntry.ID
//     and, per scope, rejects a token below the largest it accepted (see
//     leasecore.OutboxEntry): a duplicate is a no-op, and no entry arrives
//     for the first time after a newer version of its scope was accepted,
//     because each relay delivers in Seq order and moves on only after an
//     acknowledgement, and a Txn with a larger token of a scope is applied
//     after every Txn with a smaller one (the floor only rises). Run one
//     relay (under a lease, with leasecore.Campaign) to avoid the duplicate
//     traffic, not for correctness.
//
// What it does not guarantee: exactly-once delivery (the downstream must
// deduplicate); delivery at all while no relay runs or the downstream
// refuses (entries wait); an order across scopes (the entries of one Txn
// share a Seq: a relay delivers them scope by scope); anything about a downstream that ignores the
// version or forgets IDs it may still see again. Each relay pass reads all
// pending entries with one range read: keep the backlog small (run the
// relay continuously).
//
// An Outbox is safe for concurrent use.
type Outbox struct {
	kv     clientv3.KV
	layout etcdkv.Layout
}

// NewOutbox returns the outbox on cli, with keys under the prefix set by
// WithPrefix: use the prefix of the Fence whose Commit writes the entries
// (Add's guard reads that Fence's floor). The other options are ignored. A
// nil cli or an invalid prefix returns a *leasecore.ArgError. The caller
// keeps ownership of cli and closes it.
func NewOutbox(cli *clientv3.Client, opts ...Option) (*Outbox, error) {
	const op = "new outbox"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	_, l, err := options(op, opts)
	if err != nil {
		return nil, err
	}
	return &Outbox{kv: cli.KV, layout: l}, nil
}

// Add records an entry for claim c — topic, payload, and c's scope, writer
// and token as the entry's version — as fencepg's Outbox.Add does, but in
// etcd's way: it returns the operation that records it, for the Then of the
// Txn that Fence.Commit runs for the same claim c (or a Txn of the caller's
// guarded by Fence.Guard(c)). It sends nothing, and the entry exists only
// once that Txn is applied; each call draws a new entry ID.
//
// The operation is a nested transaction that puts the entry only if the
// scope's floor equals c.Token — Fence.Guard(c) — so an entry can never be
// recorded outside a fenced transaction of its token. Inside Commit (or
// under Guard) that always holds; its response in the caller's
// TxnResponse is a nested TxnResponse whose Succeeded says so. Put it in
// the Then of the caller's Txn, not inside a nested Txn of the caller's
// own compares (etcd's limit of one write per key and per request applies
// as usual).
//
// Bad input (see backendkit.CheckOutboxEntry) returns a *leasecore.ArgError.
func (o *Outbox) Add(c leasecore.Claim, topic string, payload []byte) (clientv3.Op, error) {
	const op = "outbox add"
	if err := backendkit.CheckOutboxEntry(context.Background(), op, c, topic, payload); err != nil {
		return clientv3.Op{}, err
	}
	rec := etcdkv.NewOutboxRecord(c, topic)
	guard := clientv3.Compare(clientv3.Value(o.layout.Floor(c.Scope)), "=", etcdkv.EncodeToken(c.Token))
	return clientv3.OpTxn([]clientv3.Cmp{guard},
		[]clientv3.Op{clientv3.OpPut(o.layout.OutboxKey(rec), rec.Encode(payload))}, nil), nil
}

// Relay delivers the pending entries, oldest (lowest Seq) first, in the
// caller's goroutine: for each it calls deliver and, when deliver returns
// nil, deletes the entry's key (one request). It returns the number of
// entries it delivered once none is pending (entries added while it runs
// are delivered too), at the first error of deliver — that entry and every
// later one stay pending, so order is kept; the error wraps deliver's —
// or when ctx ends (an error wrapping ctx's), and when a read or a delete
// fails (ErrUnavailable, ...). Call it again, in a loop with a pause, to
// keep relaying. ctx bounds the delete too: an entry whose delete ctx left
// no time for stays pending and is delivered again (with the same ID).
//
// deliver must return nil only once the downstream has acknowledged the
// entry: accepted it, or recognised it as a duplicate (its ID) or as
// superseded (a token below one it accepted for the scope) — a rejection
// as stale is an answer, not a failure, and returning an error for it
// would block the outbox. See Outbox for what concurrent relays do.
func (o *Outbox) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	const op = "relay"
	if err := backendkit.CheckRelay(ctx, op, deliver); err != nil {
		return 0, err
	}
	n := 0
	for {
		pending, err := o.pending(ctx, op)
		if err != nil || len(pending) == 0 {
			return n, err
		}
		for _, p := range pending {
			if err := ctx.Err(); err != nil {
				return n, fmt.Errorf("%s: %s: %w", pkg, op, err)
			}
			e := p.entry
			if err := deliver(ctx, e); err != nil {
				return n, fmt.Errorf("%s: %s: deliver entry %s (seq %d, scope %q, token %d): %w", pkg, op, e.ID, e.Seq, e.Scope, e.Token, err)
			}
			// Under ctx, like every request of Relay: when ctx ends right
			// after the downstream acknowledged, the entry stays pending
			// and is delivered again, with the same ID, by the next relay.
			if _, err := o.kv.Delete(ctx, p.key); err != nil {
				return n, etcdkv.MapError(ctx, pkg, op+": delete the delivered entry (it stays pending and is delivered again)", err)
			}
			n++
		}
	}
}

// Pending returns at most limit (1 to backendkit.MaxAttemptsRead) entries
// not yet delivered, of every scope, oldest first: what the relays have
// still to do. One range read of every pending entry.
func (o *Outbox) Pending(ctx context.Context, limit int) ([]leasecore.OutboxEntry, error) {
	const op = "outbox pending"
	if limit < 1 || limit > backendkit.MaxAttemptsRead {
		return nil, &leasecore.ArgError{Op: op, Field: "limit", Value: fmt.Sprint(limit),
			Reason: fmt.Sprintf("must be 1 to %d", backendkit.MaxAttemptsRead)}
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	pending, err := o.pending(ctx, op)
	if err != nil {
		return nil, err
	}
	out := make([]leasecore.OutboxEntry, 0, min(limit, len(pending)))
	for _, p := range pending[:min(limit, len(pending))] {
		out = append(out, p.entry)
	}
	return out, nil
}

type pendingEntry struct {
	key   string
	entry leasecore.OutboxEntry
}

// pending reads every outbox key in one range read and returns the
// entries in outbox order: by create revision, then by key (the entries of
// one Txn share a revision; within a scope the keys keep the order their
// operations were built in). Sorting
// here rather than asking etcd to (WithSort) costs the same: etcd reads the
// whole range to sort it anyway.
func (o *Outbox) pending(ctx context.Context, op string) ([]pendingEntry, error) {
	resp, err := o.kv.Get(ctx, o.layout.OutboxPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	out := make([]pendingEntry, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		e, err := etcdkv.DecodeOutbox(string(kv.Key), kv.Value, kv.CreateRevision)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
		}
		out = append(out, pendingEntry{string(kv.Key), e})
	}
	// Stable: the keys came sorted, which orders the entries of one Txn.
	slices.SortStableFunc(out, func(a, b pendingEntry) int { return cmp.Compare(a.entry.Seq, b.entry.Seq) })
	return out, nil
}
