package torture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
)

// clusterMembers is the size of the etcd cluster: the smallest that
// survives the loss of a member.
const clusterMembers = 3

// clusterWait bounds each wait of the nemesis on the cluster: for a leader
// (an election takes one or two election timeouts, 500ms each, more on a
// loaded machine) and for a killed member to serve again. Only a cluster
// that is badly broken takes that long; the run then fails.
const clusterWait = 30 * time.Second

// memberServer is a server of several members (the etcd cluster): the
// nemesis can cut one off, and the figures count the leader elections.
type memberServer interface {
	server
	// partition cuts a member off from the others for f.Dur (the leader if
	// f.Leader, else member f.Slot modulo the members), then heals it; it
	// returns the member and what happened.
	partition(ctx context.Context, f plannedFault) (target, how string, err error)
	// term is the cluster's current raft term (the highest a member
	// reports): every election raises it.
	term(ctx context.Context) (uint64, error)
}

// etcdClusterServer is a 3-member etcd cluster (etcdtemp.StartCluster:
// each member a child process of this binary on its own loopback address,
// 127.0.0.1 to 127.0.0.3, behind a peer proxy of etcdtemp's own) with every
// key of one run under a fresh prefix. Each holder gets one proxy per
// member and all three as its client's endpoints, so it goes on through
// the loss of any one member, as a client of a real cluster does.
type etcdClusterServer struct {
	c      *etcdtemp.Cluster
	cli    *clientv3.Client // the parent's reads, on every member's endpoint, not through the proxies
	prefix string
}

var _ memberServer = (*etcdClusterServer)(nil)

// startEtcdCluster starts the cluster with etcdtemp's cluster timings
// (heartbeat 50ms, election timeout 500ms: a leader change pauses writes
// for about 0.5-1s); the binary's TestMain must call etcdtemp.Serve when
// etcdtemp.IsServeProcess.
func startEtcdCluster(ctx context.Context) (*etcdClusterServer, error) {
	c, err := etcdtemp.StartCluster(ctx, clusterMembers)
	if err != nil {
		return nil, err
	}
	cli, err := dialEtcd(c.Endpoints())
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &etcdClusterServer{c: c, cli: cli, prefix: "/torture-" + hex.EncodeToString(b[:])}, nil
}

func (s *etcdClusterServer) name() string {
	return fmt.Sprintf("etcd cluster of %d members", clusterMembers)
}

func (s *etcdClusterServer) backend() string { return "etcd" }

func (s *etcdClusterServer) describe() string { return s.c.Describe() }

// targets are the members' client addresses, member 0 first.
func (s *etcdClusterServer) targets() []string {
	eps := s.c.Endpoints()
	for i, e := range eps {
		eps[i] = strings.TrimPrefix(e, "http://")
	}
	return eps
}

func (s *etcdClusterServer) holderSpec(proxyAddrs []string) holderSpec {
	return etcdHolderSpec(proxyAddrs, s.prefix)
}

func (s *etcdClusterServer) read(ctx context.Context, scope string, _ flavor) (Snapshot, error) {
	return readEtcd(ctx, s.cli, s.prefix, scope)
}

// crash kills the leader: SIGKILL of the member a majority follows (no
// flush, no leadership transfer), a wait for the other two to elect a new
// one, and a restart of the killed member on its data directory, which
// returns once it recovered from its WAL and caught up with the leader.
// The other two members serve throughout, writes pausing for the
// election. downtime is the killed member's, from the SIGKILL until it
// served again.
func (s *etcdClusterServer) crash(ctx context.Context) (time.Duration, string, error) {
	lctx, cancel := context.WithTimeout(ctx, clusterWait)
	defer cancel()
	leader, err := s.c.Leader(lctx)
	if err != nil {
		return 0, "", err
	}
	pid := s.c.PID(leader)
	t0 := time.Now()
	if err := s.c.Kill(leader); err != nil {
		return 0, "", err
	}
	next, err := s.nextLeader(lctx, leader)
	elected := time.Since(t0)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), clusterWait)
	defer rcancel()
	// Restarted whatever the election did: a member left down would make
	// the next fault the loss of a majority.
	if rerr := s.c.Restart(rctx, leader); rerr != nil {
		return time.Since(t0), "", errors.Join(err, rerr)
	}
	down := time.Since(t0)
	if err != nil {
		return down, "", fmt.Errorf("no new leader after the kill of m%d: %w", leader, err)
	}
	return down, fmt.Sprintf("SIGKILL of the leader m%d (pid %d); the other two members elected m%d %v after it; "+
		"m%d restarted on its data directory and caught up", leader, pid, next, elected.Round(time.Millisecond), leader), nil
}

// nextLeader waits for the cluster to follow a leader other than old.
// Right after a leader is killed or cut off, the others still report it
// until their election timeout passes, so Leader alone would name it.
func (s *etcdClusterServer) nextLeader(ctx context.Context, old int) (int, error) {
	for {
		i, err := s.c.Leader(ctx)
		if err != nil {
			return -1, err
		}
		if i != old {
			return i, nil
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return -1, context.Cause(ctx)
		}
	}
}

// partition cuts one member off from the other two through etcdtemp's
// peer proxies (Cluster.Partition: its peer traffic, both ways, is held
// and discarded, never delivered late), for f.Dur, then heals it. Its
// clients, the holders' proxies and the parent's reads, still reach it:
// the partition is between the servers. A partitioned follower cannot
// commit or serve a linearizable read (its requests time out or fail); a
// partitioned leader steps down once it misses a quorum for an election
// timeout, and the other two elect a new one. The cluster keeps a majority
// throughout: the runner never partitions and kills at the same time.
func (s *etcdClusterServer) partition(ctx context.Context, f plannedFault) (string, string, error) {
	lctx, cancel := context.WithTimeout(ctx, clusterWait)
	defer cancel()
	leader, err := s.c.Leader(lctx)
	if err != nil {
		return "", "", err
	}
	member := f.Slot % clusterMembers
	if f.Leader {
		member = leader
	}
	role := "a follower"
	if member == leader {
		role = "the leader"
	}
	target := fmt.Sprintf("etcd m%d", member)
	t0 := time.Now()
	healAt := t0.Add(f.Dur)
	if err := s.c.Partition(member); err != nil {
		return target, "", err
	}
	how := fmt.Sprintf("m%d (%s) cut off from the other members, its clients still reaching it", member, role)
	if member == leader {
		// The election, timed within the partition; a partition too short
		// for it ends with the old leader leading on.
		wctx, wcancel := context.WithDeadline(ctx, healAt)
		next, err := s.nextLeader(wctx, member)
		wcancel()
		if err == nil {
			how += fmt.Sprintf("; the other two elected m%d %v after the cut", next, time.Since(t0).Round(time.Millisecond))
		} else {
			how += "; no other leader before the heal"
		}
	}
	sleepCtx(ctx, time.Until(healAt))
	// Healed whatever happens: a member left cut off would outlive the
	// history.
	if err := s.c.Heal(member); err != nil {
		return target, how, err
	}
	how += fmt.Sprintf("; healed after %v", time.Since(t0).Round(time.Millisecond))
	return target, how, nil
}

// term asks every member for its raft term and returns the highest.
func (s *etcdClusterServer) term(ctx context.Context) (uint64, error) {
	var best uint64
	var errs []error
	for _, ep := range s.c.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := s.cli.Status(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		best = max(best, st.RaftTerm)
	}
	if best == 0 {
		return 0, errors.Join(errs...)
	}
	return best, nil
}

func (s *etcdClusterServer) close() error {
	_ = s.cli.Close()
	return s.c.Stop()
}
