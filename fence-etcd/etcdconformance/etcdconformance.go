// Package etcdconformance provides the etcd harness for the leasefence
// conformance suite: fenceetcd's lease store and fenced resource,
// etcdcontrol's negative controls, the suite's own user data behind a
// fenceetcd.Fence (F1u, F4u, F4m, F6u, F7u, F10u: keys under <prefix>/user/),
// holder processes (F4, F5, F4u, F4m), a server crash (F8; on a cluster,
// CrashLeader), the fenced outbox (fenceetcd.Outbox, F9b), failover in
// clusters of its own (F16, Config.ReplicaMembers; replicas.go) and a
// cluster of its own to move scopes to (F17, moves.go).
//
//	func TestConformance(t *testing.T) {
//		srv := etcdtemp.StartTB(t)
//		conformance.Run(t, etcdconformance.New(etcdconformance.Config{
//			Endpoints:  srv.Endpoints(),
//			HolderArgs: []string{"-test.run=^$"},
//			Crash:      ..., // srv.KillRestart
//		}))
//	}
//
// Every harness works under a fresh random key prefix
// ("/leasefence-test/<16 hex>"), so each case starts from nothing without
// deleting anything, and several runs can share one etcd.
//
// What etcd cannot do is declared absent, with the reason: a long
// transaction (F2), a commit gap and a lock-wait probe (F6b) — an etcd
// transaction is one atomic request, with nothing open in between.
package etcdconformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Config says where etcd is and which optional abilities the harness has.
type Config struct {
	// Endpoints are the etcd client URLs, e.g. etcdtemp's Server.Endpoints.
	Endpoints []string

	// HolderArgs are the arguments that make the running binary a holder
	// process (F4, F5), e.g. []string{"-test.run=^$"} for a test binary
	// whose TestMain calls HolderMain, or []string{"holder"} for the lab.
	// Nil declares holder processes absent.
	HolderArgs []string

	// Crash kills the etcd server without letting it shut down and starts
	// it again on the same data (F8); it returns how, for the output, and
	// the downtime. Nil declares crash-and-restart absent.
	Crash func(ctx context.Context) (how string, downtime time.Duration, err error)

	// SharedLeases runs the suite with fenceetcd.WithSharedLeases: every
	// lease store the harness opens, its holder processes' included,
	// attaches all names of one holder to one etcd lease. The traits'
	// name is then "etcd/shared-leases".
	SharedLeases bool

	// ReplicaMembers is the size of the etcd cluster the harness starts
	// for each replicated deployment F16 asks for (conformance.Replicas,
	// replicas.go): at least 3, so that the others keep a quorum when the
	// leader is killed. 0 declares replicas absent.
	ReplicaMembers int
	// ReplicaOptions are passed to etcdtemp.StartCluster, for F16's
	// clusters and for the one-member cluster F17 moves a scope to
	// (moves.go), e.g. etcdtemp.WithArgs("etcd-server") for a program
	// whose subcommand runs etcdtemp.Serve (a test binary needs none: its
	// TestMain does).
	ReplicaOptions []etcdtemp.Option
}

// New returns the suite's factory for cfg. Each call of the factory picks a
// fresh key prefix and returns a harness; its Close closes every client it
// opened. Nothing is deleted: the keys stay under their prefix.
func New(cfg Config) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		if len(cfg.Endpoints) == 0 {
			return nil, fmt.Errorf("%s: Config.Endpoints is empty: %w", pkg, leasecore.ErrInvalidArgument)
		}
		if err := checkReplicaMembers(cfg.ReplicaMembers); err != nil { // replicas.go
			return nil, err
		}
		if err := backendkit.CheckContext("new harness", ctx); err != nil {
			return nil, err
		}
		return &harness{cfg: cfg, prefix: NewPrefix()}, nil
	}
}

const pkg = "etcdconformance"

// NewPrefix returns a fresh random key prefix, "/leasefence-test/<16 hex>".
func NewPrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return "/leasefence-test/" + hex.EncodeToString(b[:])
}

type harness struct {
	cfg    Config
	prefix string // every store and control of this harness, and its holders

	mu      sync.Mutex
	clients []*clientv3.Client      // closed by Close
	stores  []*fenceetcd.LeaseStore // closed by Close, before the clients
	// clusters are the replicated deployments StartReplicas started (and
	// F17's second cluster, moves.go), stopped by Close after the clients.
	clusters []*etcdtemp.Cluster
	closed   bool

	moves moves // F17's second cluster and its mover (moves.go)
}

var (
	_ conformance.Harness           = (*harness)(nil)
	_ conformance.NegativeControls  = (*harness)(nil)
	_ conformance.HolderProcesses   = (*harness)(nil)
	_ conformance.CrashRestarter    = (*harness)(nil)
	_ conformance.UserDataResources = (*harness)(nil)
)

// Traits implements conformance.Harness.
func (h *harness) Traits() conformance.Traits {
	absent := map[conformance.Ability]string{
		conformance.AbilityLongTransaction: "etcd has no interactive transactions: a Txn is one atomic request, " +
			"and lease expiry is decided by the leader's lessor, not by a transaction clock",
		conformance.AbilityCommitGap: "an etcd Txn is one atomic request: there is no open transaction to pause " +
			"between the floor compare and the write",
		conformance.AbilityLockWaitProbe: "an etcd Txn takes no lock a client could wait on",
		conformance.AbilityCheckFirst: "an etcd Txn is one atomic request: its compare cannot run first and hold " +
			"anything while the client goes on",
	}
	if h.cfg.HolderArgs == nil {
		absent[conformance.AbilityHolderProcesses] = "etcdconformance.Config.HolderArgs is not set: this binary cannot re-execute itself as a holder"
	}
	if h.cfg.Crash == nil {
		absent[conformance.AbilityCrashRestart] = "etcdconformance.Config.Crash is not set: no server this harness may crash"
	}
	h.declareReplicas(absent) // replicas.go
	name := "etcd"
	if h.cfg.SharedLeases {
		name = "etcd/shared-leases"
	}
	return conformance.Traits{
		Name:           name,
		MinTTL:         fenceetcd.MinTTL,
		TTLGranularity: time.Second,
		TokenStep:      0, // tokens are revisions: every write to the cluster advances them
		AttemptLog:     leasecore.LogAll,
		Absent:         absent,
	}
}

// OpenLease implements conformance.Harness: a lease store on a new client,
// with its own connection, sharing one etcd lease per holder when
// Config.SharedLeases is set. Close closes it (revoking its shared leases)
// before it closes the client.
func (h *harness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	store, err := fenceetcd.NewLeaseStore(cli, LeaseOptions(h.prefix, h.cfg.SharedLeases)...)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = store.Close()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	h.stores = append(h.stores, store)
	return store, nil
}

// LeaseOptions returns the options of a lease store under prefix, with
// fenceetcd.WithSharedLeases when shared is set.
func LeaseOptions(prefix string, shared bool) []fenceetcd.Option {
	opts := []fenceetcd.Option{fenceetcd.WithPrefix(prefix)}
	if shared {
		opts = append(opts, fenceetcd.WithSharedLeases())
	}
	return opts
}

// OpenResource implements conformance.Harness: a fenced resource on a new
// client, logging every attempt (the suite reads accepted attempts too).
func (h *harness) OpenResource(ctx context.Context) (conformance.Resource, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	return fenceetcd.NewResource(cli, fenceetcd.WithPrefix(h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
}

// UnfencedResource implements conformance.NegativeControls.
func (h *harness) UnfencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, (*etcdcontrol.Controls).Unfenced)
}

// CheckThenWriteResource implements conformance.NegativeControls.
func (h *harness) CheckThenWriteResource(ctx context.Context, gap conformance.Gap) (conformance.Resource, error) {
	return h.control(ctx, func(c *etcdcontrol.Controls) *etcdcontrol.Resource { return c.CheckThenWrite(gap) })
}

// RowFencedResource implements conformance.NegativeControls.
func (h *harness) RowFencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, (*etcdcontrol.Controls).RowFenced)
}

// IdempotentPublisher implements conformance.NegativeControls.
func (h *harness) IdempotentPublisher(ctx context.Context) (conformance.Resource, error) {
	return h.control(ctx, (*etcdcontrol.Controls).IdempotentPublisher)
}

func (h *harness) control(ctx context.Context, pick func(*etcdcontrol.Controls) *etcdcontrol.Resource) (conformance.Resource, error) {
	cli, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	c, err := etcdcontrol.New(cli, fenceetcd.WithPrefix(h.prefix))
	if err != nil {
		return nil, err
	}
	return pick(c), nil
}

// CrashRestart implements conformance.CrashRestarter with Config.Crash.
func (h *harness) CrashRestart(ctx context.Context) (string, time.Duration, error) {
	if h.cfg.Crash == nil {
		return "", 0, fmt.Errorf("%s: crash restart: Config.Crash is not set", pkg)
	}
	return h.cfg.Crash(ctx)
}

// Close implements conformance.Harness: it closes every lease store the
// harness opened (in shared mode that revokes their shared etcd leases),
// then every client, then stops the clusters StartReplicas started.
func (h *harness) Close() error {
	h.mu.Lock()
	clients, stores, clusters := h.clients, h.stores, h.clusters
	h.clients, h.stores, h.clusters, h.closed = nil, nil, nil, true
	h.mu.Unlock()
	var errs []error
	for _, s := range stores {
		errs = append(errs, s.Close())
	}
	for _, c := range slices.Backward(clients) {
		errs = append(errs, closeClient(c))
	}
	for _, c := range clusters {
		errs = append(errs, c.Stop())
	}
	return errors.Join(errs...)
}

// dial opens a new client, with a connection of its own, checks that it
// reaches etcd, and registers it with Close. Clients open concurrently
// (the suite may open its 16 lease clients at once); one opened while
// Close runs is closed at once.
func (h *harness) dial(ctx context.Context) (*clientv3.Client, error) {
	return h.dialEndpoints(ctx, h.cfg.Endpoints)
}

// Dial opens an etcd client for the suite and its holder processes, and
// waits until it has answered one request (a count of the keys under a
// prefix nobody uses), so a case never races connection set-ups.
//
// The client logs nothing, and it reconnects within half a second after a
// server restart: gRPC's default reconnect backoff grows to 120 s, and
// after F8's restart a client could then sleep through the short TTL of
// the lease the case wants to see again.
func Dial(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	return dial(ctx, endpoints)
}

func dial(ctx context.Context, endpoints []string, extra ...grpc.DialOption) (*clientv3.Client, error) {
	const op = "dial"
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints,
		Logger:    zap.NewNop(),
		DialOptions: append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		})}, extra...),
	})
	if err != nil {
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	if _, err := cli.Get(ctx, "/leasefence-test/dial", clientv3.WithCountOnly()); err != nil {
		_ = closeClient(cli)
		return nil, etcdkv.MapError(ctx, pkg, op, err)
	}
	return cli, nil
}

// closeClient closes cli; a context error from Close only says it was
// closing.
func closeClient(cli *clientv3.Client) error {
	if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: close client: %w", pkg, err)
	}
	return nil
}
