package etcdconformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/leasecore"
)

// HolderEnv is the environment variable that makes a process a holder
// process: it carries the holder's backend configuration as JSON.
const HolderEnv = "LEASEFENCE_ETCD_HOLDER"

// holderSpec is what a holder process needs to reach the same keys as the
// harness that started it.
type holderSpec struct {
	Endpoints []string                 `json:"endpoints"`
	Prefix    string                   `json:"prefix"`
	Kind      conformance.ResourceKind `json:"kind"`
	// SharedLeases: the holder's lease store uses
	// fenceetcd.WithSharedLeases, like the harness's (Config.SharedLeases).
	SharedLeases bool `json:"shared_leases,omitempty"`
}

// HolderCommand implements conformance.HolderProcesses: the running binary
// itself, started again with Config.HolderArgs and HolderEnv set (the
// endpoints, the harness's key prefix, the resource kind and the lease
// mode, Config.SharedLeases), so no separate
// build step exists. The binary must call HolderMain early (a test binary
// from TestMain, the lab from its holder subcommand).
func (h *harness) HolderCommand(ctx context.Context, kind conformance.ResourceKind) (*exec.Cmd, error) {
	switch kind {
	case conformance.KindFenced, conformance.KindUnfenced, conformance.KindUserData, conformance.KindMarkerFirst,
		conformance.KindOutbox:
	default:
		return nil, fmt.Errorf("%s: holder command: unknown resource kind %q: %w", pkg, kind, leasecore.ErrInvalidArgument)
	}
	return conformance.HolderSelfCommand(ctx, h.cfg.HolderArgs, HolderEnv,
		holderSpec{Endpoints: h.cfg.Endpoints, Prefix: h.prefix, Kind: kind, SharedLeases: h.cfg.SharedLeases})
}

// IsHolderProcess reports whether this process was started by
// HolderCommand.
func IsHolderProcess() bool { return os.Getenv(HolderEnv) != "" }

// HolderMain runs this process as a holder (conformance.RunHolder on stdin
// and stdout) with the configuration HolderCommand put in the environment,
// and returns the exit code. Call it when IsHolderProcess is true:
//
//	func TestMain(m *testing.M) {
//		if etcdconformance.IsHolderProcess() {
//			os.Exit(etcdconformance.HolderMain())
//		}
//		os.Exit(m.Run())
//	}
func HolderMain() int {
	var spec holderSpec
	return conformance.HolderMain(HolderEnv, &spec, func(ctx context.Context) (leasecore.Lease, leasecore.FencedResource, func(), error) {
		// One client for both: gRPC multiplexes requests on its connection,
		// so the session's background renewal and the holder's writes do
		// not queue behind each other.
		cli, err := Dial(ctx, spec.Endpoints)
		if err != nil {
			return nil, nil, nil, err
		}
		lease, err := fenceetcd.NewLeaseStore(cli, LeaseOptions(spec.Prefix, spec.SharedLeases)...)
		if err != nil {
			_ = closeClient(cli)
			return nil, nil, nil, err
		}
		// The lease store closes before the client: in shared mode this
		// revokes the holder's shared lease, so a clean exit frees its
		// names at once.
		closeAll := func() { _ = lease.Close(); _ = closeClient(cli) }
		prefix := fenceetcd.WithPrefix(spec.Prefix)
		var res leasecore.FencedResource
		switch spec.Kind {
		case conformance.KindFenced:
			res, err = fenceetcd.NewResource(cli, prefix, fenceetcd.WithAttemptLog(leasecore.LogAll))
		case conformance.KindUnfenced:
			var controls *etcdcontrol.Controls
			if controls, err = etcdcontrol.New(cli, prefix); err == nil {
				res = controls.Unfenced()
			}
		case conformance.KindUserData: // no Prepare: PREPARE answers "none"
			res, err = newUserResource(cli, spec.Prefix)
		case conformance.KindMarkerFirst: // Prepare writes the marker
			res, err = newMarkerFirst(cli, spec.Prefix)
		case conformance.KindOutbox: // RELAY runs its relay
			res, err = newOutboxResource(cli, spec.Prefix, true)
		default:
			err = errors.New("unknown resource kind " + string(spec.Kind))
		}
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		return lease, res, closeAll, nil
	})
}
