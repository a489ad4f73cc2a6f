package etcdconformance

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

var _ conformance.ScopeMoves = (*harness)(nil)

// moves is a harness's second cluster (F17), started on first use, and
// the fences of its mover on both clusters.
type moves struct {
	mu        sync.Mutex
	cl        *etcdtemp.Cluster
	label     string // the second cluster's endpoint: the destination the seal records
	newCli    *clientv3.Client
	oldFence  *fenceetcd.Fence
	newFence  *fenceetcd.Fence
	oldClient *clientv3.Client
}

// MoveTarget implements conformance.ScopeMoves: a cluster of its own, one
// member started by etcdtemp.StartCluster (options from
// Config.ReplicaOptions) the first time it is asked for, and a fenced
// resource there under the harness's prefix, logging every attempt. The
// label is the member's client URL. The harness's Close closes the clients
// and stops the cluster.
func (h *harness) MoveTarget(ctx context.Context) (conformance.Resource, string, error) {
	m, err := h.moveTarget(ctx)
	if err != nil {
		return nil, "", err
	}
	cli, err := h.dialEndpoints(ctx, m.cl.Endpoints())
	if err != nil {
		return nil, "", err
	}
	res, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
	return res, m.label, err
}

// moveTarget starts the second cluster and opens the mover's clients, once
// per harness.
func (h *harness) moveTarget(ctx context.Context) (*moves, error) {
	m := &h.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cl != nil {
		return m, nil
	}
	cl, err := h.startCluster(ctx, "move target", 1)
	if err != nil {
		return nil, err
	}
	newCli, err := h.dialEndpoints(ctx, cl.Endpoints())
	if err != nil {
		return nil, err
	}
	oldCli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	opts := []fenceetcd.Option{fenceetcd.WithPrefix(h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll)}
	if m.oldFence, err = fenceetcd.NewFence(oldCli, opts...); err != nil {
		return nil, err
	}
	if m.newFence, err = fenceetcd.NewFence(newCli, opts...); err != nil {
		return nil, err
	}
	m.cl, m.label, m.newCli, m.oldClient = cl, cl.Endpoints()[0], newCli, oldCli
	return m, nil
}

// MoveScope implements conformance.ScopeMoves, as a user's mover does it:
// Fence.Seal at the harness's cluster with a Get of the scope's part keys
// in its transaction, then Fence.Install at the second cluster with the
// puts of those keys in its transaction (same keys: the same prefix on
// both clusters). A rejected install applies nothing and is returned as an
// error. conformance.MoveDataOnly reads the keys with a plain Get and puts
// them in a plain Txn: no seal, no install.
func (h *harness) MoveScope(ctx context.Context, scope string, mode conformance.MoveMode) error {
	const op = "move scope"
	if mode != conformance.MoveWithFloor && mode != conformance.MoveDataOnly {
		return fmt.Errorf("%s: %s: mode %q: want %q or %q: %w", pkg, op, mode, conformance.MoveWithFloor, conformance.MoveDataOnly,
			leasecore.ErrInvalidArgument)
	}
	if err := backendkit.CheckName(op, "scope", scope); err != nil {
		return err
	}
	m, err := h.moveTarget(ctx)
	if err != nil {
		return err
	}
	layout, err := etcdkv.NewLayout(op, etcdkv.Options{Prefix: h.prefix})
	if err != nil {
		return err
	}
	read := clientv3.OpGet(layout.PartPrefix(scope), clientv3.WithPrefix())
	if mode == conformance.MoveDataOnly {
		resp, err := m.oldClient.Get(ctx, layout.PartPrefix(scope), clientv3.WithPrefix())
		if err != nil {
			return etcdkv.MapError(ctx, pkg, op+": read at the old cluster", err)
		}
		if _, err := m.newCli.Txn(ctx).Then(putsOf(resp.Kvs)...).Commit(); err != nil {
			return etcdkv.MapError(ctx, pkg, op+": write at "+m.label, err)
		}
		return nil
	}
	seal, resp, err := m.oldFence.Seal(ctx, scope, m.label, read)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	res, _, err := m.newFence.Install(ctx, seal, putsOf(resp.Responses[0].GetResponseRange().Kvs)...)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	if !res.Accepted {
		return fmt.Errorf("%s: %s: the install was rejected: the scope's floor at %s is %d, above the floor %d at the seal (a newer token was accepted there)",
			pkg, op, m.label, res.Floor, seal.Floor)
	}
	return nil
}

// putsOf returns puts of the keys and values read (etcd's
// *mvccpb.KeyValue, named by its methods so that this module need not
// require etcd's api module directly).
func putsOf[KV interface {
	GetKey() []byte
	GetValue() []byte
}](kvs []KV) []clientv3.Op {
	ops := make([]clientv3.Op, len(kvs))
	for i, kv := range kvs {
		ops[i] = clientv3.OpPut(string(kv.GetKey()), string(kv.GetValue()))
	}
	return ops
}
