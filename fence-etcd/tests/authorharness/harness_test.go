// Package authorharness_test is conformance/README.md's "Running the
// conformance suite against your own backend" example, compiled and run:
// the test file a backend author on etcd writes, using only exported API
// (fenceetcd's LeaseStore stands in for the author's lease). Keep it and
// that page's copy the same (TestREADMECopy).
package authorharness_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// TestMain: etcdtemp runs its server in this test binary, started again
// with etcdtemp.ServeEnv set; without this hook etcdtemp.StartTB fails.
func TestMain(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	os.Exit(m.Run())
}

func TestConformance(t *testing.T) {
	srv := etcdtemp.StartTB(t) // stopped when the test ends
	conformance.Run(t, func(ctx context.Context) (conformance.Harness, error) {
		// Fresh, empty state for every case: a key prefix nobody used.
		return &harness{srv: srv, prefix: etcdconformance.NewPrefix()}, nil
	})
}

type harness struct {
	srv    *etcdtemp.Server
	prefix string

	mu      sync.Mutex         // the suite opens clients concurrently
	clients []*clientv3.Client // closed by Close
}

func (h *harness) Traits() conformance.Traits {
	return conformance.Traits{
		Name:           "mystore",
		MinTTL:         fenceetcd.MinTTL, // the shortest TTL the lease honours
		TTLGranularity: time.Second,      // etcd leases have whole seconds; 0 for exact TTLs
		TokenStep:      0,                // tokens only increase (1: always the previous + 1)
		AttemptLog:     leasecore.LogAll, // as OpenResource's resources log (the suite reads the log)
		Absent: map[conformance.Ability]string{ // each with the reason the skip prints
			conformance.AbilityLongTransaction:  "etcd has no interactive transactions",
			conformance.AbilityCommitGap:        "an etcd Txn is one request: nothing to pause",
			conformance.AbilityLockWaitProbe:    "an etcd Txn takes no lock",
			conformance.AbilityNegativeControls: "not wired in this example",
			conformance.AbilityHolderProcesses:  "not wired in this example",
			conformance.AbilityUserData:         "not wired in this example",
			conformance.AbilityOutbox:           "not wired in this example",
			conformance.AbilityDelayedNetwork:   "not wired in this example",
			conformance.AbilityReplicas:         "not wired in this example",
			conformance.AbilityScopeMoves:       "not wired in this example",
		},
	}
}

// keep registers a client with Close.
func (h *harness) keep(cli *clientv3.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clients = append(h.clients, cli)
}

// OpenLease returns your lease, which is also a leasecore.LeaseInspector,
// on a client of its own.
func (h *harness) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	cli, err := etcdconformance.Dial(ctx, h.srv.Endpoints())
	if err != nil {
		return nil, err
	}
	h.keep(cli)
	return fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(h.prefix))
}

func (h *harness) OpenResource(ctx context.Context) (conformance.Resource, error) {
	cli, err := etcdconformance.Dial(ctx, h.srv.Endpoints())
	if err != nil {
		return nil, err
	}
	h.keep(cli)
	return fenceetcd.NewResource(cli, fenceetcd.WithPrefix(h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
}

// AmbiguousLease (X2): your lease on a client whose next Txn is carried
// out and its answer lost. (A lease whose release is not a Txn needs an
// interceptor of its own for that request: see conformance/README.md.)
func (h *harness) AmbiguousLease(ctx context.Context) (leasecore.Lease, func(), error) {
	cli, lose, err := etcdconformance.DialLosingAnswers(ctx, h.srv.Endpoints())
	if err != nil {
		return nil, nil, err
	}
	h.keep(cli)
	lease, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(h.prefix))
	return lease, lose, err
}

// CrashRestart (F8): SIGKILL to the server, restarted on its data.
func (h *harness) CrashRestart(ctx context.Context) (string, time.Duration, error) {
	d, err := h.srv.KillRestart(ctx)
	return "SIGKILL to etcd, restart on the same data", d, err
}

func (h *harness) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, cli := range h.clients {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	h.clients = nil
	return errors.Join(errs...)
}
