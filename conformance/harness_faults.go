package conformance

import (
	"context"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

// DelayedNetwork is an optional interface that may be implemented by a
// Harness whose resource clients talk to their server over TCP (F14). The
// case puts a TCP proxy of its own, on a loopback address, between a
// resource client and the server, and holds a write's bytes in it while the
// writer's lease expires and another holder writes; then it delivers them.
type DelayedNetwork interface {
	// ResourceAddress is the host:port the harness's resource clients
	// connect to (a loopback address): where the proxy forwards.
	ResourceAddress() string
	// ResourcesVia returns clients of the harness's resource storage that
	// connect to addr instead of ResourceAddress: fenced (as OpenResource
	// returns) and unfenced (as NegativeControls.UnfencedResource returns:
	// it ignores tokens). Both share the storage and the floor of
	// OpenResource. Each has a connection of its own, established before
	// ResourcesVia returns, so that what the proxy holds later is a write,
	// not a handshake. The Harness closes them in Close.
	ResourcesVia(ctx context.Context, addr string) (fenced, unfenced Resource, err error)
}

// ReplicationMode says when a replicated deployment acknowledges a commit.
type ReplicationMode string

// The modes of Replicas.StartReplicas.
const (
	// ReplicationSynchronous acknowledges a commit only once the member
	// failover promotes has it: PostgreSQL's synchronous_commit=on with the
	// standby in synchronous_standby_names; an etcd cluster's Raft quorum.
	ReplicationSynchronous ReplicationMode = "synchronous"
	// ReplicationAsynchronous acknowledges a commit before any standby has
	// it (PostgreSQL's default streaming replication): the negative control.
	ReplicationAsynchronous ReplicationMode = "asynchronous"
)

// Replicas is an optional interface that may be implemented by a Harness
// whose backend replicates (F16). It starts a replicated deployment of the
// backend of its own, for one case.
type Replicas interface {
	// StartReplicas starts a deployment whose every member listens on a
	// loopback address, replicated in mode. A backend without mode (etcd
	// has no asynchronous one) returns an error wrapping
	// errors.ErrUnsupported; the case then says so in a note. The
	// Harness's Close stops the deployment.
	StartReplicas(ctx context.Context, mode ReplicationMode) (ReplicaSet, error)
}

// ReplicaSet is a replicated deployment started by Replicas.StartReplicas.
type ReplicaSet interface {
	// Describe names the members and the settings that make the mode, for
	// the output: "primary 127.0.0.1:5433 + standby 127.0.0.1:5434,
	// synchronous_commit=on, synchronous_standby_names='*'".
	Describe() string
	// OpenLease and OpenResource are the Harness's, on this deployment.
	// Their clients follow a failover by themselves (a proxy or a virtual
	// address that moves to the new primary; etcd's endpoint list); until
	// then their calls fail with leasecore.ErrUnavailable, which the case
	// retries for up to 30 seconds. The lease client must also implement
	// leasecore.LeaseInspector.
	OpenLease(ctx context.Context) (leasecore.Lease, error)
	OpenResource(ctx context.Context) (Resource, error)
	// HoldBackStandby waits until the member a failover will promote has
	// applied every commit acknowledged so far, then stops it from
	// receiving more until Failover (PostgreSQL: the replication connection
	// cut and the standby's processes stopped with SIGSTOP — SIGSTOP alone
	// is not enough, the kernel buffers the WAL the primary keeps sending
	// and the standby replays it when resumed): a lagging asynchronous
	// standby at the moment of a crash.
	// In synchronous mode it returns an error wrapping
	// errors.ErrUnsupported: a synchronous standby held back would stop
	// every commit.
	HoldBackStandby(ctx context.Context) error
	// Failover crashes the member that serves writes without letting it
	// flush (PostgreSQL: immediate stop of the primary; etcd: SIGKILL of
	// the Raft leader) and makes another member serve (PostgreSQL: the
	// standby, resumed if held back, promoted; etcd: the remaining quorum
	// elects a leader). It returns how, for the output, and how long
	// writes were unavailable.
	Failover(ctx context.Context) (how string, downtime time.Duration, err error)
}
