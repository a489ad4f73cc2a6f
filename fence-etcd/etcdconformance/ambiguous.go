package etcdconformance

import (
	"context"
	"fmt"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// txnMethod is the gRPC method of an etcd transaction: the request that
// creates a lease key (Acquire) or deletes it (Release). Grants, revokes
// and keep-alives around it are preparatory or clean-up.
const txnMethod = "/etcdserverpb.KV/Txn"

// DialLosingAnswers is Dial for a client whose answers can be lost: once
// loseNextAnswer is called, the client's next transaction (the Txn that
// creates or deletes a lease key) is sent and carried out by the server,
// and its answer is replaced by a gRPC Unavailable error, as a connection
// lost after the request was sent would leave it. Only that one call is
// affected. For conformance.AmbiguousOutcomes.
//
// The interceptor is added after clientv3's own, so it sits between them
// and the connection: clientv3 retries a mutating call only when the
// request was never sent, which its error does not claim, so the lost
// answer reaches the caller as it would from the network.
func DialLosingAnswers(ctx context.Context, endpoints []string) (cli *clientv3.Client, loseNextAnswer func(), err error) {
	var armed atomic.Bool
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != txnMethod || !armed.Load() {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		armed.Store(false)
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err // the server did not carry it out: nothing to lose
		}
		return status.Error(codes.Unavailable, "etcdconformance: the answer to this transaction was lost after the server carried it out (AmbiguousOutcomes)")
	}
	cli, err = dial(ctx, endpoints, grpc.WithChainUnaryInterceptor(lose))
	if err != nil {
		return nil, nil, err
	}
	return cli, func() { armed.Store(true) }, nil
}

// AmbiguousLease implements conformance.AmbiguousOutcomes with a client
// from DialLosingAnswers and a lease store of the harness's prefix and
// lease mode on it.
func (h *harness) AmbiguousLease(ctx context.Context) (leasecore.Lease, func(), error) {
	cli, lose, err := DialLosingAnswers(ctx, h.cfg.Endpoints)
	if err != nil {
		return nil, nil, err
	}
	store, err := fenceetcd.NewLeaseStore(cli, LeaseOptions(h.prefix, h.cfg.SharedLeases)...)
	if err != nil {
		_ = closeClient(cli)
		return nil, nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = store.Close()
		_ = closeClient(cli)
		return nil, nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	h.clients = append(h.clients, cli)
	h.stores = append(h.stores, store)
	return store, lose, nil
}
