// Package mixed runs the conformance suite on the realistic pairing of two
// backends: leases (and so tokens) from etcd, the fenced report on
// PostgreSQL. Tokens are numbers, so any lease backend can fence any
// resource backend; the suite proves this pairing keeps I1-I3.
//
// The resource side is pgconformance's harness, forwarded ability by
// ability; the lease side is fenceetcd on clients of its own, under a
// fresh key prefix per harness.
package mixed

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/leasecore"
)

// Config says where the two backends are.
type Config struct {
	EtcdEndpoints []string
	// Resource is the PostgreSQL side; its HolderArgs and Cluster are
	// ignored (the pair starts its own holders and crashes nothing).
	Resource pgconformance.Config
	// HolderArgs re-execute the running binary as a holder of the pair
	// (its main or TestMain calls HolderMain when IsHolderProcess).
	HolderArgs []string
}

// New returns the suite's factory for the pair.
func New(cfg Config) conformance.NewHarness {
	return func(ctx context.Context) (conformance.Harness, error) {
		res := cfg.Resource
		res.HolderArgs, res.Cluster = nil, nil
		inner, err := pgconformance.New(res)(ctx)
		if err != nil {
			return nil, err
		}
		return &harness{cfg: cfg, pg: inner, prefix: etcdconformance.NewPrefix()}, nil
	}
}

type harness struct {
	cfg    Config
	pg     conformance.Harness // the resource side
	prefix string              // the lease side's keys

	mu      sync.Mutex
	clients []*clientv3.Client
}

var (
	_ conformance.Harness            = (*harness)(nil)
	_ conformance.NegativeControls   = (*harness)(nil)
	_ conformance.CommitGapResources = (*harness)(nil)
	_ conformance.LockWaitProbe      = (*harness)(nil)
	_ conformance.HolderProcesses    = (*harness)(nil)
	_ conformance.UserDataResources  = (*harness)(nil)
	_ conformance.OutboxResources    = (*harness)(nil)
	_ conformance.CheckFirstControl  = (*harness)(nil)
)

// Traits: timing and tokens follow the lease backend.
func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{
		Name:           "etcd lease + postgres/" + h.cfg.Resource.Driver + " resource",
		MinTTL:         fenceetcd.MinTTL,
		TTLGranularity: time.Second,
		TokenStep:      0,
		AttemptLog:     h.pg.Traits().AttemptLog, // the resources are the PostgreSQL harness's
		Absent: map[conformance.Ability]string{
			conformance.AbilityLongTransaction: "the lease lives on etcd, which has no transaction clock (F2 on PostgreSQL shows it)",
			conformance.AbilityCrashRestart:    "each backend's crash is its own F8 (postgres, etcd); the pair adds nothing to it",
			conformance.AbilityReplicas:        "each backend's failover is its own F16 (postgres, etcd); the pair adds nothing to it",
		},
	}
}

// OpenLease opens an etcd client of its own and a lease store on it.
func (h *harness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	cli, err := etcdconformance.Dial(ctx, h.cfg.EtcdEndpoints)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.clients = append(h.clients, cli)
	h.mu.Unlock()
	return fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(h.prefix))
}

// AmbiguousLease implements conformance.AmbiguousOutcomes on the etcd side:
// a client whose next lease transaction's answer can be lost.
func (h *harness) AmbiguousLease(ctx context.Context) (leasecore.Lease, func(), error) {
	cli, lose, err := etcdconformance.DialLosingAnswers(ctx, h.cfg.EtcdEndpoints)
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	h.clients = append(h.clients, cli)
	h.mu.Unlock()
	store, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(h.prefix))
	if err != nil {
		return nil, nil, err
	}
	return store, lose, nil
}

// The resource side, forwarded to the PostgreSQL harness.

func (h *harness) OpenResource(ctx context.Context) (conformance.Resource, error) {
	return h.pg.OpenResource(ctx)
}

func (h *harness) UnfencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.pg.(conformance.NegativeControls).UnfencedResource(ctx)
}

func (h *harness) CheckThenWriteResource(ctx context.Context, gap conformance.Gap) (conformance.Resource, error) {
	return h.pg.(conformance.NegativeControls).CheckThenWriteResource(ctx, gap)
}

func (h *harness) RowFencedResource(ctx context.Context) (conformance.Resource, error) {
	return h.pg.(conformance.NegativeControls).RowFencedResource(ctx)
}

func (h *harness) IdempotentPublisher(ctx context.Context) (conformance.Resource, error) {
	return h.pg.(conformance.NegativeControls).IdempotentPublisher(ctx)
}

func (h *harness) FencedResourceWithGap(ctx context.Context, gap conformance.Gap) (conformance.Resource, error) {
	return h.pg.(conformance.CommitGapResources).FencedResourceWithGap(ctx, gap)
}

func (h *harness) UserDataResource(ctx context.Context, gap conformance.Gap) (conformance.UserResource, error) {
	return h.pg.(conformance.UserDataResources).UserDataResource(ctx, gap)
}

func (h *harness) MarkerFirstResource(ctx context.Context) (conformance.MarkerFirst, error) {
	return h.pg.(conformance.UserDataResources).MarkerFirstResource(ctx)
}

func (h *harness) CheckFirstResource(ctx context.Context) (conformance.UserResource, error) {
	return h.pg.(conformance.CheckFirstControl).CheckFirstResource(ctx)
}

func (h *harness) FencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	return h.pg.(conformance.OutboxResources).FencedOutbox(ctx)
}

func (h *harness) UnfencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	return h.pg.(conformance.OutboxResources).UnfencedOutbox(ctx)
}

func (h *harness) LockWaits(ctx context.Context) ([]string, error) {
	return h.pg.(conformance.LockWaitProbe).LockWaits(ctx)
}

// Close closes the etcd clients and the PostgreSQL side.
func (h *harness) Close() error {
	h.mu.Lock()
	clients := h.clients
	h.clients = nil
	h.mu.Unlock()
	var errs []error
	for _, c := range clients {
		if err := c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, h.pg.Close())...)
}

// HolderEnv marks a holder process of the pair and carries its spec.
const HolderEnv = "LEASEFENCE_MIXED_HOLDER"

type holderSpec struct {
	EtcdEndpoints []string                 `json:"etcd_endpoints"`
	Prefix        string                   `json:"prefix"`
	ResourceDSN   string                   `json:"resource_dsn"`
	Driver        string                   `json:"driver"`
	Kind          conformance.ResourceKind `json:"kind"`
}

// HolderCommand re-executes the running binary as a holder with an etcd
// lease and the PostgreSQL resource.
func (h *harness) HolderCommand(ctx context.Context, kind conformance.ResourceKind) (*exec.Cmd, error) {
	return conformance.HolderSelfCommand(ctx, h.cfg.HolderArgs, HolderEnv, holderSpec{EtcdEndpoints: h.cfg.EtcdEndpoints,
		Prefix: h.prefix, ResourceDSN: h.cfg.Resource.ResourceDSN, Driver: h.cfg.Resource.Driver, Kind: kind})
}

// IsHolderProcess reports whether this process is a holder of the pair.
func IsHolderProcess() bool { return os.Getenv(HolderEnv) != "" }

// HolderMain runs this process as a holder of the pair and returns its exit
// code.
func HolderMain() int {
	var spec holderSpec
	return conformance.HolderMain(HolderEnv, &spec, func(ctx context.Context) (leasecore.Lease, leasecore.FencedResource, func(), error) {
		cli, err := etcdconformance.Dial(ctx, spec.EtcdEndpoints)
		if err != nil {
			return nil, nil, nil, err
		}
		lease, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(spec.Prefix))
		if err != nil {
			_ = cli.Close()
			return nil, nil, nil, err
		}
		res, closeRes, err := pgconformance.OpenHolderResource(ctx, spec.Driver, spec.ResourceDSN, spec.Kind)
		if err != nil {
			_ = cli.Close()
			return nil, nil, nil, err
		}
		return lease, res, func() { _ = closeRes(); _ = cli.Close() }, nil
	})
}
