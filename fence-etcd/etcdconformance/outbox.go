package etcdconformance

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The suite's fenced outbox (conformance.OutboxResources, F9b) on etcd: the
// report in the first user table's key and the entry's operation from
// fenceetcd.Outbox.Add, in one fenceetcd.Fence.Commit — the calls a user
// makes. The negative control puts both in a plain Txn, the entry as a
// bare put of its key (no guard). Both relay with fenceetcd.Outbox.Relay.

var _ conformance.OutboxResources = (*harness)(nil)

// FencedOutbox implements conformance.OutboxResources on a new client.
func (h *harness) FencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	return newOutboxResource(cli, h.prefix, true)
}

// UnfencedOutbox implements conformance.OutboxResources on a new client.
func (h *harness) UnfencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	return newOutboxResource(cli, h.prefix, false)
}

// outboxResource is conformance.Outbox on fenceetcd.Outbox.
type outboxResource struct {
	*userResource // the fence, its floor and log, the user keys
	outbox        *fenceetcd.Outbox
	layout        etcdkv.Layout // the negative control's bare put
	fenced        bool
}

func newOutboxResource(cli *clientv3.Client, prefix string, fenced bool) (*outboxResource, error) {
	u, err := newUserResource(cli, prefix)
	if err != nil {
		return nil, err
	}
	o, err := fenceetcd.NewOutbox(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		return nil, err
	}
	opts := etcdkv.NewOptions()
	opts.Prefix = prefix
	l, err := etcdkv.NewLayout("outbox", opts)
	if err != nil {
		return nil, err
	}
	return &outboxResource{userResource: u, outbox: o, layout: l, fenced: fenced}, nil
}

// Write implements leasecore.FencedResource: the report key and the entry
// (topic w.Part, payload w.Content) in one Fence.Commit; for the negative
// control in one Txn with no fence.
func (r *outboxResource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	c := backendkit.ClaimOf(w)
	report := r.puts(w)[0] // the first user table: ReadPart's
	if !r.fenced {
		rec := etcdkv.NewOutboxRecord(c, w.Part)
		entry := clientv3.OpPut(r.layout.OutboxKey(rec), rec.Encode([]byte(w.Content)))
		if _, err := r.kv.Txn(ctx).Then(report, entry).Commit(); err != nil {
			return leasecore.Result{}, etcdkv.MapError(ctx, pkg, op, err)
		}
		floor, err := r.fence.Floor(ctx, w.Scope)
		return leasecore.Result{Accepted: true, Floor: floor}, err
	}
	entry, err := r.outbox.Add(c, w.Part, []byte(w.Content))
	if err != nil {
		return leasecore.Result{}, err
	}
	res, _, err := r.fence.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{report, entry}})
	return res, err
}

// Pending implements conformance.Outbox: fenceetcd.Outbox.Pending, the
// scope's entries.
func (r *outboxResource) Pending(ctx context.Context, scope string) ([]leasecore.OutboxEntry, error) {
	all, err := r.outbox.Pending(ctx, backendkit.MaxAttemptsRead)
	if err != nil {
		return nil, err
	}
	var out []leasecore.OutboxEntry
	for _, e := range all {
		if e.Scope == scope {
			out = append(out, e)
		}
	}
	return out, nil
}

// Relay implements conformance.OutboxRelay: fenceetcd.Outbox.Relay.
func (r *outboxResource) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	return r.outbox.Relay(ctx, deliver)
}
