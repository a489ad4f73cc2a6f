package etcdconformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/leasecore"
)

var _ conformance.Replicas = (*harness)(nil)

const (
	// minReplicaMembers: killing the leader of fewer than 3 members leaves
	// no quorum (1 of 2 is not a majority), so nothing could serve.
	minReplicaMembers = 3
	// writeBackTimeout bounds the wait for the first write after a leader
	// kill: an election takes one to two election timeouts (500ms to 1s
	// with etcdtemp's cluster timings); the suite retries its own calls
	// for 30 seconds, so a failover that takes longer fails there anyway.
	writeBackTimeout = 30 * time.Second
	// writeAttemptTimeout bounds one write of the probe, writeInterval
	// separates the writes in flight at once (see writeUntilAcknowledged):
	// the downtime is known to within writeInterval.
	writeAttemptTimeout = 5 * time.Second
	writeInterval       = 20 * time.Millisecond
)

// checkReplicaMembers is New's check of Config.ReplicaMembers.
func checkReplicaMembers(n int) error {
	if n != 0 && n < minReplicaMembers {
		return fmt.Errorf("%s: Config.ReplicaMembers = %d: a failover kills the leader and the others must keep a quorum, "+
			"so at least %d (0 declares replicas absent): %w", pkg, n, minReplicaMembers, leasecore.ErrInvalidArgument)
	}
	return nil
}

// declareReplicas adds AbilityReplicas to absent, with the reason, when
// Config.ReplicaMembers does not ask for clusters.
func (h *harness) declareReplicas(absent map[conformance.Ability]string) {
	if h.cfg.ReplicaMembers == 0 {
		absent[conformance.AbilityReplicas] = "etcdconformance.Config.ReplicaMembers is 0: the harness starts no etcd cluster of its own " +
			"(3 starts a 3-member cluster on loopback for each replicated deployment)"
	}
}

// StartReplicas implements conformance.Replicas. Synchronous replication
// is an etcd cluster of Config.ReplicaMembers members started by
// etcdtemp.StartCluster (on 127.0.0.1, 127.0.0.2, ..., each a child
// process of the running binary with its own data directory; options from
// Config.ReplicaOptions): Raft acknowledges a write once a quorum of
// members has it in its fsynced write-ahead log, and only a member with
// every committed entry can be elected, so that is etcd's synchronous
// replication. Asynchronous replication does not exist in etcd, and the
// error says so, wrapping errors.ErrUnsupported. The harness's Close stops
// the cluster.
func (h *harness) StartReplicas(ctx context.Context, mode conformance.ReplicationMode) (conformance.ReplicaSet, error) {
	switch mode {
	case conformance.ReplicationSynchronous:
	case conformance.ReplicationAsynchronous:
		return nil, fmt.Errorf("%s: StartReplicas: etcd has no asynchronous mode: a write is acknowledged once a quorum has it: %w",
			pkg, errors.ErrUnsupported)
	default:
		return nil, fmt.Errorf("%s: StartReplicas: mode %q: want %q or %q: %w", pkg, mode,
			conformance.ReplicationSynchronous, conformance.ReplicationAsynchronous, leasecore.ErrInvalidArgument)
	}
	if h.cfg.ReplicaMembers == 0 {
		return nil, fmt.Errorf("%s: StartReplicas: Config.ReplicaMembers is 0: %w", pkg, errors.ErrUnsupported)
	}
	cl, err := h.startCluster(ctx, "StartReplicas", h.cfg.ReplicaMembers)
	if err != nil {
		return nil, err
	}
	return &replicaSet{h: h, cl: cl}, nil
}

// startCluster starts an etcdtemp cluster of n members with
// Config.ReplicaOptions and registers it with Close (what names the
// caller in errors); one started while Close runs is stopped at once.
func (h *harness) startCluster(ctx context.Context, what string, n int) (*etcdtemp.Cluster, error) {
	cl, err := etcdtemp.StartCluster(ctx, n, h.cfg.ReplicaOptions...)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", pkg, what, err)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = cl.Stop()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	h.clusters = append(h.clusters, cl)
	h.mu.Unlock()
	return cl, nil
}

// replicaSet is an etcdtemp cluster with the harness's clients on it.
type replicaSet struct {
	h  *harness
	cl *etcdtemp.Cluster
}

// Describe implements conformance.ReplicaSet.
func (r *replicaSet) Describe() string {
	n := r.cl.Len()
	return fmt.Sprintf("etcd %s, %d members; Raft acknowledges a write once %d of %d have it in their fsynced WAL (etcd has no other mode): %s",
		r.cl.Version(), n, n/2+1, n, r.cl.Describe())
}

// OpenLease implements conformance.ReplicaSet: the harness's lease store
// (its prefix, shared leases when Config.SharedLeases is set) on a client
// with every member's endpoint, which moves to another member by itself
// when one stops answering. The harness's Close closes it.
func (r *replicaSet) OpenLease(ctx context.Context) (leasecore.Lease, error) {
	cli, err := r.h.dialEndpoints(ctx, r.cl.Endpoints())
	if err != nil {
		return nil, err
	}
	store, err := fenceetcd.NewLeaseStore(cli, LeaseOptions(r.h.prefix, r.h.cfg.SharedLeases)...)
	if err != nil {
		return nil, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.h.closed {
		_ = store.Close()
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	r.h.stores = append(r.h.stores, store)
	return store, nil
}

// OpenResource implements conformance.ReplicaSet: the harness's fenced
// resource on a client with every member's endpoint.
func (r *replicaSet) OpenResource(ctx context.Context) (conformance.Resource, error) {
	cli, err := r.h.dialEndpoints(ctx, r.cl.Endpoints())
	if err != nil {
		return nil, err
	}
	return fenceetcd.NewResource(cli, fenceetcd.WithPrefix(r.h.prefix), fenceetcd.WithAttemptLog(leasecore.LogAll))
}

// HoldBackStandby implements conformance.ReplicaSet: it is unsupported. A
// member that lags cannot become leader: Raft elects only a candidate
// whose log holds every committed entry, and a write is committed, and
// acknowledged, only once a quorum has it. There is no lagging standby to
// promote.
func (r *replicaSet) HoldBackStandby(ctx context.Context) error {
	return fmt.Errorf("%s: HoldBackStandby: an etcd member that lacks acknowledged writes cannot be elected leader "+
		"(Raft's election restriction), so no failover can promote one: %w", pkg, errors.ErrUnsupported)
}

// Failover implements conformance.ReplicaSet: SIGKILL to the Raft leader,
// which is not restarted; the others elect a leader among themselves. The
// downtime is from the kill until a write through every member's endpoint
// (a key under the harness's prefix) is acknowledged again.
func (r *replicaSet) Failover(ctx context.Context) (string, time.Duration, error) {
	k, err := killLeader(ctx, r.cl, r.h.prefix+"/failover-probe")
	if err != nil {
		return "", 0, fmt.Errorf("%s: Failover: %w", pkg, err)
	}
	return k.describe("not restarted"), k.downtime, nil
}

// CrashLeader returns a Config.Crash for a harness on cl (Config.Endpoints
// = cl.Endpoints()): F8's server crash on a cluster. It sends SIGKILL to
// the Raft leader, waits until a write through every endpoint is
// acknowledged again (the others have elected a leader), then restarts the
// killed member on its data directory and waits until it serves. The
// downtime it returns is that of writes, from the kill to the first
// acknowledged write; the member's own restart is in the description.
func CrashLeader(cl *etcdtemp.Cluster) func(ctx context.Context) (string, time.Duration, error) {
	return func(ctx context.Context) (string, time.Duration, error) {
		k, err := killLeader(ctx, cl, "/leasefence-test/crash-probe")
		if err != nil {
			return "", 0, fmt.Errorf("%s: crash the leader: %w", pkg, err)
		}
		t0 := time.Now()
		if err := cl.Restart(ctx, k.killed); err != nil {
			return "", 0, fmt.Errorf("%s: crash the leader: restart m%d: %w", pkg, k.killed, err)
		}
		return k.describe(fmt.Sprintf("then restarted on its data directory, serving again after %v",
			time.Since(t0).Round(time.Millisecond))), k.downtime, nil
	}
}

// leaderKill is what killLeader did, for the output.
type leaderKill struct {
	killed, elected int
	pid             int
	member          etcdtemp.Member
	running, size   int // members running after the kill, of size
	downtime        time.Duration
}

func (k leaderKill) describe(after string) string {
	elected := "an unknown member"
	if k.elected >= 0 {
		elected = fmt.Sprintf("m%d", k.elected)
	}
	return fmt.Sprintf("SIGKILL to the Raft leader %s (pid %d, client %s), %s; the remaining %d of %d members elected %s, "+
		"and a write through every endpoint was acknowledged %v after the kill",
		k.member.Name, k.pid, strings.TrimPrefix(k.member.ClientURL, "http://"), after, k.running, k.size, elected,
		k.downtime.Round(time.Millisecond))
}

// killLeader kills cl's leader with SIGKILL and writes key through a
// client of every endpoint until a write is acknowledged. It refuses when
// the members left running would not be a quorum: no write could then
// ever be acknowledged.
func killLeader(ctx context.Context, cl *etcdtemp.Cluster, key string) (leaderKill, error) {
	running := 0
	for i := range cl.Len() {
		if cl.PID(i) != 0 {
			running++
		}
	}
	if running-1 <= cl.Len()/2 {
		return leaderKill{}, fmt.Errorf("%d of %d members run: killing the leader would leave no quorum", running, cl.Len())
	}
	// The client is connected before the kill, so the downtime does not
	// include setting it up.
	cli, err := Dial(ctx, cl.Endpoints())
	if err != nil {
		return leaderKill{}, err
	}
	defer closeClient(cli)
	lead, err := cl.Leader(ctx)
	if err != nil {
		return leaderKill{}, err
	}
	k := leaderKill{killed: lead, elected: -1, pid: cl.PID(lead), member: cl.Members()[lead], running: running - 1, size: cl.Len()}
	t0 := time.Now()
	if err := cl.Kill(lead); err != nil {
		return leaderKill{}, err
	}
	if err := writeUntilAcknowledged(ctx, cli, key); err != nil {
		return leaderKill{}, fmt.Errorf("after SIGKILL to the leader m%d: %w", lead, err)
	}
	k.downtime = time.Since(t0)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if i, err := cl.Leader(lctx); err == nil {
		k.elected = i
	}
	return k, nil
}

// writeUntilAcknowledged sends a put of key every writeInterval, each
// with writeAttemptTimeout, until one is acknowledged, for at most
// writeBackTimeout, and waits for the puts still in flight before it
// returns.
//
// One put at a time would measure the timeout of a put, not the downtime: a
// put that reaches a follower before the follower has noticed the leader's
// death is forwarded to the dead leader and lost, and waits for its
// timeout, while a put sent a moment later, to the new leader, is
// acknowledged at once.
func writeUntilAcknowledged(ctx context.Context, cli *clientv3.Client, key string) error {
	ctx, cancel := context.WithTimeout(ctx, writeBackTimeout)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	ok := make(chan struct{}, 1)
	errc := make(chan error, 1)
	tick := time.NewTicker(writeInterval)
	defer tick.Stop()
	for {
		wg.Go(func() {
			actx, acancel := context.WithTimeout(ctx, writeAttemptTimeout)
			defer acancel()
			if _, err := cli.Put(actx, key, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
				select {
				case errc <- err:
				default:
				}
				return
			}
			select {
			case ok <- struct{}{}:
			default:
			}
		})
		select {
		case <-ok:
			cancel() // the puts still in flight end now
			return nil
		case <-ctx.Done():
			var last error
			select {
			case last = <-errc:
			default:
			}
			return fmt.Errorf("no write acknowledged within %v (an error: %v): %w", writeBackTimeout, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// dialEndpoints is dial on endpoints other than Config.Endpoints: a client
// of the harness, closed by Close.
func (h *harness) dialEndpoints(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	cli, err := Dial(ctx, endpoints)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		_ = closeClient(cli)
		return nil, fmt.Errorf("%s: harness is closed", pkg)
	}
	h.clients = append(h.clients, cli)
	return cli, nil
}
