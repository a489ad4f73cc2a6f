package pgconformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/leasecore"
)

// HolderEnv is the environment variable that makes a process a holder
// process: it carries the holder's backend configuration as JSON.
const HolderEnv = "LEASEFENCE_PG_HOLDER"

// holderSpec is what a holder process needs to reach the same databases.
type holderSpec struct {
	Driver      string                   `json:"driver"`
	LeaseDSN    string                   `json:"lease_dsn"`
	ResourceDSN string                   `json:"resource_dsn"`
	Kind        conformance.ResourceKind `json:"kind"`
	Pooler      string                   `json:"pooler,omitempty"`
	// SharedLeases: the holder's lease store uses
	// fencepg.WithSharedLeases, like the harness's.
	SharedLeases bool `json:"shared_leases,omitempty"`
	// DefaultAttemptLog: the holder's resource keeps fencepg's default
	// attempt log, like the harness's.
	DefaultAttemptLog bool `json:"default_attempt_log,omitempty"`
}

// HolderCommand implements conformance.HolderProcesses: the running binary
// itself, started again with Config.HolderArgs and HolderEnv set, so no
// separate build step exists. The binary must call HolderMain early (a
// test binary from TestMain, the lab from its holder subcommand).
func (h *harness) HolderCommand(ctx context.Context, kind conformance.ResourceKind) (*exec.Cmd, error) {
	switch kind {
	case conformance.KindFenced, conformance.KindUnfenced, conformance.KindUserData, conformance.KindMarkerFirst,
		conformance.KindOutbox, conformance.KindCheckFirst:
	default:
		return nil, fmt.Errorf("%s: holder command: unknown resource kind %q: %w", pkg, kind, leasecore.ErrInvalidArgument)
	}
	return conformance.HolderSelfCommand(ctx, h.cfg.HolderArgs, HolderEnv,
		holderSpec{Driver: h.cfg.Driver, LeaseDSN: h.cfg.LeaseDSN, ResourceDSN: h.cfg.ResourceDSN, Kind: kind, Pooler: h.cfg.Pooler,
			SharedLeases: h.cfg.SharedLeases, DefaultAttemptLog: h.cfg.DefaultAttemptLog})
}

// IsHolderProcess reports whether this process was started by
// HolderCommand.
func IsHolderProcess() bool { return os.Getenv(HolderEnv) != "" }

// HolderMain runs this process as a holder (conformance.RunHolder on stdin
// and stdout) with the configuration HolderCommand put in the environment,
// and returns the exit code. Call it when IsHolderProcess is true:
//
//	func TestMain(m *testing.M) {
//		if pgconformance.IsHolderProcess() {
//			os.Exit(pgconformance.HolderMain())
//		}
//		os.Exit(m.Run())
//	}
func HolderMain() int {
	var spec holderSpec
	return conformance.HolderMain(HolderEnv, &spec, func(ctx context.Context) (leasecore.Lease, leasecore.FencedResource, func(), error) {
		// Two connections each: the session's background renewal and the
		// holder's own statements must not queue behind each other.
		leasePool, err := pgopen.Open(ctx, spec.Driver, spec.LeaseDSN, 2)
		if err != nil {
			return nil, nil, nil, err
		}
		lease, err := leasePool.LeaseStore(Config{Pooler: spec.Pooler, SharedLeases: spec.SharedLeases}.leaseOptions()...)
		if err != nil {
			_ = leasePool.Close()
			return nil, nil, nil, err
		}
		res, closeRes, err := openHolderResource(ctx, spec.Driver, spec.ResourceDSN, spec.Kind,
			Config{DefaultAttemptLog: spec.DefaultAttemptLog}.logOption())
		if err != nil {
			_ = leasePool.Close()
			return nil, nil, nil, err
		}
		return lease, res, func() { _ = closeRes(); _ = leasePool.Close() }, nil
	})
}

// OpenHolderResource opens the resource a holder process writes to: the
// fenced resource, the unfenced negative control, the suite's user tables
// behind fencepg.Fence, the marker-first control, or the fenced outbox
// (whose relay the holder's RELAY runs), on the resource
// database with driver, every check logged (leasecore.LogAll). A holder
// whose lease lives on another backend (the etcd-lease, PostgreSQL-resource
// pairing) uses it too. close closes the pool.
func OpenHolderResource(ctx context.Context, driver, dsn string, kind conformance.ResourceKind) (res leasecore.FencedResource, close func() error, err error) {
	return openHolderResource(ctx, driver, dsn, kind, Config{}.logOption())
}

// openHolderResource is OpenHolderResource with the fences' attempt log.
func openHolderResource(ctx context.Context, driver, dsn string, kind conformance.ResourceKind, log fencepg.Option) (res leasecore.FencedResource, close func() error, err error) {
	pool, err := pgopen.Open(ctx, driver, dsn, 2)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = pool.Close()
		}
	}()
	switch kind {
	case conformance.KindFenced:
		res, err = pool.Resource(log)
	case conformance.KindUnfenced:
		var controls *pgcontrol.Controls
		if controls, err = pool.Controls(); err == nil {
			res = controls.Unfenced()
		}
	case conformance.KindOutbox: // RELAY runs its relay
		res, err = newOutboxResource(pool, true, log)
	default:
		res, err = holderUserResource(pool, kind, log)
	}
	if err != nil {
		return nil, nil, err
	}
	return res, pool.Close, nil
}
