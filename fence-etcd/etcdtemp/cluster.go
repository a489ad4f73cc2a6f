package etcdtemp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ErrInvalidArgument is wrapped by the errors of StartCluster and of the Cluster methods for an
// argument out of range: a member count or a member index. The message names the argument.
var ErrInvalidArgument = errors.New("etcdtemp: invalid argument")

const (
	// maxMembers is the size of the address plan: member i listens on 127.0.0.(i+1), and
	// 127.0.0.255 is the loopback network's broadcast address.
	maxMembers = 254

	// The raft timings of a Cluster unless WithHeartbeat and WithElection say otherwise: five
	// times Start's. A lone server elects itself whatever the timings; three members on a
	// loaded machine (a race-enabled test binary, two CPUs shared with other tests) miss 10ms
	// heartbeats now and then, and every missed election timeout is a spurious leader change.
	// 500ms keeps the minimum lease TTL (1.5 election timeouts, rounded up to whole seconds) at
	// one second, like Start's, so the conformance suite's TTLs are granted as asked.
	clusterHeartbeat = 50 * time.Millisecond
	clusterElection  = 500 * time.Millisecond

	// statusTimeout bounds one Status request of Leader. Status is answered by the member
	// itself, without a quorum, so only a member that does not run (or is stopped with
	// SIGSTOP) takes that long.
	statusTimeout = time.Second
)

// Cluster is a running etcd cluster of several members, each a child process like a Server's,
// for the failure modes one server cannot show: a leader that dies ([Cluster.Kill]), a member
// cut off from the others ([Cluster.Partition]). Its methods are safe for concurrent use.
//
// Member i (from 0) is named "m<i>" and listens on 127.0.0.(i+1) (all of 127.0.0.0/8 is the
// loopback interface on Linux; other systems may have only 127.0.0.1 configured, and then
// StartCluster fails to bind): its client URL, its own peer listener, and, in front of that, a
// TCP proxy of etcdtemp's own on a port of its own. The proxy's URL is the peer URL the member
// announces, so every message between members crosses the proxy of the member it goes to, which
// is what lets Partition cut a member off without touching the network. Each member has its own
// data directory; its output goes to etcd.log next to it.
//
// A typical failover test:
//
//	c := etcdtemp.StartClusterTB(t, 3)
//	cli, _ := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()})
//	leader, _ := c.Leader(ctx)    // the member a majority follows
//	_ = c.Kill(leader)            // SIGKILL: no flush, no leadership transfer
//	next, _ := c.Leader(ctx)      // waits until the others have elected one
//	_, _ = cli.Put(ctx, "k", "v") // the client moves to a live endpoint by itself
//	_ = c.Restart(ctx, leader)    // same data directory; returns once it serves again
//
// and a partition:
//
//	_ = c.Partition(leader) // it steps down; the others elect a leader and serve writes
//	_ = c.Heal(leader)      // it rejoins and catches up from the leader's log
type Cluster struct {
	log     io.Writer // the WithLog writer, serialized for the members' lines and the cluster's
	tmpDir  string
	version string

	heartbeat, election time.Duration

	members []*Server
	proxies []*peerProxy
	// spawned is each member's latest child, set as soon as it is started (a Server's PID only
	// once it serves), so that the proxies can tell whose connection arrives during start-up.
	spawned []atomic.Int64

	// status holds one client per member, with only that member's endpoint, for Leader. Set
	// before StartCluster returns, closed by Stop.
	status []*clientv3.Client

	// netMu guards the partition state and every proxy's connection set: a connection is
	// allowed or refused under it, and Partition and Heal cut under it, so no connection slips
	// between a decision and a cut. ids is set once StartCluster has read the member IDs.
	netMu       sync.Mutex
	partitioned []bool
	ids         []uint64

	stopMu  sync.Mutex
	stopped atomic.Bool
	stopErr error
	stopRan bool
}

// StartCluster starts an etcd cluster of n members (1 to 254) in child processes and returns
// when every member serves linearizable reads. ctx bounds the start only (at most 30 seconds);
// the cluster runs until Stop. On error nothing is left running and no files are left behind.
//
// It takes Start's options. WithHeartbeat and WithElection default to 50ms and 500ms here (five
// times a lone server's: three members on a loaded machine would miss 10ms heartbeats and
// change leaders for nothing), which keeps etcd's minimum lease TTL at one second. The child is
// the running binary, with the hook the package documentation describes.
func StartCluster(ctx context.Context, n int, opts ...Option) (*Cluster, error) {
	if n < 1 || n > maxMembers {
		return nil, &argError{fmt.Errorf("etcdtemp: StartCluster: n = %d: a cluster has 1 to %d members (member i listens on 127.0.0.(i+1))", n, maxMembers)}
	}
	cfg := config{
		heartbeat: clusterHeartbeat,
		election:  clusterElection,
		log:       io.Discard,
		args:      []string{"-test.run=^$"},
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, &argError{err}
	}
	if cfg.tls != nil || cfg.auth {
		return nil, &argError{errors.New("etcdtemp: StartCluster: WithClientTLS and WithAuth are for Start only (a cluster's members listen on 127.0.0.2 and up, and its Leader and Status clients speak plain HTTP without a user)")}
	}
	if err := ctx.Err(); err != nil {
		return nil, opError("StartCluster", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: finding the running binary to re-execute: %w", err)
	}
	tmp, err := os.MkdirTemp("", "etcdtemp-cluster-")
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: %w", err)
	}
	if abs, err := filepath.Abs(tmp); err == nil {
		tmp = abs
	}
	c := &Cluster{
		log:         &lockedWriter{w: cfg.log},
		tmpDir:      tmp,
		heartbeat:   cfg.heartbeat,
		election:    cfg.election,
		spawned:     make([]atomic.Int64, n),
		partitioned: make([]bool, n),
	}
	if err := c.start(ctx, n, exe, cfg); err != nil {
		c.discard()
		return nil, err
	}
	return c, nil
}

// StartClusterTB is StartCluster for tests: it fails the test with tb.Fatal if the cluster
// cannot start, and registers Stop with tb.Cleanup.
func StartClusterTB(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	c, err := StartCluster(tb.Context(), n, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("etcdtemp: stop cluster: %v", err)
		}
	})
	return c
}

// start opens the proxies, starts every member, and waits for each to serve.
func (c *Cluster) start(ctx context.Context, n int, exe string, cfg config) error {
	t0 := time.Now()
	// The proxies first: their URLs are the members' announced peer URLs, which the initial
	// cluster lists and each member's ID is derived from. Their listeners stay open from here
	// on, so no other program can take their ports.
	var initial []string
	for i := range n {
		p, err := newPeerProxy(c, i, memberHost(i))
		if err != nil {
			return err
		}
		c.proxies = append(c.proxies, p)
		initial = append(initial, memberNameOf(i)+"="+p.url())
	}
	token := filepath.Base(c.tmpDir)
	for i := range n {
		dir := filepath.Join(c.tmpDir, memberNameOf(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("etcdtemp: %w", err)
		}
		s := &Server{
			log:              c.log,
			exe:              exe,
			args:             cfg.args,
			tmpDir:           dir,
			dataDir:          filepath.Join(dir, "data"),
			logPath:          filepath.Join(dir, "etcd.log"),
			clusterSize:      n,
			advertisePeerURL: c.proxies[i].url(),
			logName:          memberNameOf(i),
		}
		s.serve = serveConfig{
			Name:             memberNameOf(i),
			DataDir:          s.dataDir,
			AdvertisePeerURL: s.advertisePeerURL,
			InitialCluster:   strings.Join(initial, ","),
			// One token per cluster, so that its member and cluster IDs are its own.
			ClusterToken: token,
			ClusterState: "new",
			HeartbeatMs:  uint(cfg.heartbeat / time.Millisecond),
			ElectionMs:   uint(cfg.election / time.Millisecond),
			ParentPID:    os.Getpid(),
		}
		c.members = append(c.members, s)
	}

	// Every member is started before any is waited for: a member serves only once a quorum
	// runs. s.proc is set at once, so that discard kills what a failed start leaves; PID
	// reports the child only once it serves.
	for i, s := range c.members {
		p, err := c.spawnFresh(i)
		if err != nil {
			return err
		}
		s.proc = p
	}
	for i, s := range c.members {
		p := s.proc
		for attempt := 1; ; attempt++ {
			_, err := s.waitReady(ctx, p)
			if err == nil {
				break
			}
			p.kill()
			s.proc = nil
			if attempt == autoPortAttempts || !errors.Is(err, errPortInUse) {
				return err
			}
			// Another program took the client or peer port between freePorts and etcd's bind.
			// The member can start again on other ports without the others noticing: they know
			// it by its proxy's URL, which stays, and its ID, derived from that URL.
			s.logf("a port was taken before etcd could bind it; trying other ports")
			if err := os.RemoveAll(s.dataDir); err != nil {
				return fmt.Errorf("etcdtemp: %w", err)
			}
			if p, err = c.spawnFresh(i); err != nil {
				return err
			}
			s.proc = p
		}
		s.pid.Store(int64(p.pid))
	}
	c.version = c.members[0].version

	// The member IDs, for the proxies (they see a sender's ID in its requests) and for Leader.
	ids := make([]uint64, n)
	for i, s := range c.members {
		ids[i] = s.memberID
	}
	c.netMu.Lock()
	c.ids = ids
	c.netMu.Unlock()

	for _, s := range c.members {
		cli, err := statusClient(s.clientURL)
		if err != nil {
			return err
		}
		c.status = append(c.status, cli)
	}
	c.logf("started a cluster of %d members of etcd %s in %.2fs: %s", n, c.version, time.Since(t0).Seconds(), c.Describe())
	return nil
}

// spawnFresh picks free ports for member i and starts its child on them; the proxy forwards to
// the new peer port.
func (c *Cluster) spawnFresh(i int) (*child, error) {
	s := c.members[i]
	host := memberHost(i)
	clientPort, peerPort, err := freePorts(host)
	if err != nil {
		return nil, err
	}
	s.clientURL = "http://" + net.JoinHostPort(host, strconv.Itoa(clientPort))
	s.peerURL = "http://" + net.JoinHostPort(host, strconv.Itoa(peerPort))
	s.serve.ClientURL, s.serve.PeerURL = s.clientURL, s.peerURL
	c.proxies[i].setTarget(net.JoinHostPort(host, strconv.Itoa(peerPort)))
	return c.spawn(i)
}

// spawn starts member i's child and records its pid for the proxies.
func (c *Cluster) spawn(i int) (*child, error) {
	p, err := c.members[i].spawn()
	if err != nil {
		return nil, err
	}
	c.spawned[i].Store(int64(p.pid))
	return p, nil
}

// discard undoes a failed StartCluster: whatever runs dies, the files go.
func (c *Cluster) discard() {
	for _, cli := range c.status {
		_ = cli.Close()
	}
	for _, s := range c.members {
		if p := s.proc; p != nil {
			s.proc = nil
			s.pid.Store(0)
			p.kill()
		}
	}
	for _, p := range c.proxies {
		p.close()
	}
	_ = os.RemoveAll(c.tmpDir)
}

func memberNameOf(i int) string { return "m" + strconv.Itoa(i) }

// memberHost is member i's loopback address, 127.0.0.(i+1).
func memberHost(i int) string { return "127.0.0." + strconv.Itoa(i+1) }

// statusClient is a client of one member for Leader. gRPC's default reconnect backoff grows to
// two minutes; a member killed and restarted would stay unseen that long.
func statusClient(endpoint string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{endpoint},
		Logger:    zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdtemp: status client of %s: %w", endpoint, err)
	}
	return cli, nil
}

// Len returns the number of members.
func (c *Cluster) Len() int { return len(c.members) }

// Endpoints returns every member's client URL, member 0 first, for clientv3.Config.Endpoints
// (the client moves to another endpoint by itself when one stops answering). They stay the
// same across Kill and Restart. The slice is the caller's.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, s := range c.members {
		eps[i] = s.clientURL
	}
	return eps
}

// Version returns the etcd server version the members report, such as "3.7.3".
func (c *Cluster) Version() string { return c.version }

// Timings returns the heartbeat interval and the election timeout the members run with.
func (c *Cluster) Timings() (heartbeat, election time.Duration) { return c.heartbeat, c.election }

// Member describes one member of a Cluster.
type Member struct {
	Name string // "m0", "m1", ...
	ID   uint64 // etcd's member ID
	// ClientURL is where clients connect, such as "http://127.0.0.2:40123".
	ClientURL string
	// PeerURL is the URL the member announces to the others: its proxy's. ListenPeerURL is
	// etcd's own peer listener, behind the proxy.
	PeerURL, ListenPeerURL string
	DataDir                string // its etcd.log is next to it
}

// Members describes every member, member 0 first.
func (c *Cluster) Members() []Member {
	ms := make([]Member, len(c.members))
	for i, s := range c.members {
		ms[i] = Member{Name: s.serve.Name, ID: s.memberID, ClientURL: s.clientURL,
			PeerURL: s.advertisePeerURL, ListenPeerURL: s.peerURL, DataDir: s.dataDir}
	}
	return ms
}

// Describe names the members and their addresses in one line, for logs and reports:
// "m0 client 127.0.0.1:41001 peer 127.0.0.1:41003 (proxy of :41002), m1 ...; heartbeat 50ms,
// election 500ms".
func (c *Cluster) Describe() string {
	var parts []string
	for _, m := range c.Members() {
		parts = append(parts, fmt.Sprintf("%s client %s peer %s (proxy of %s)", m.Name,
			strings.TrimPrefix(m.ClientURL, "http://"), strings.TrimPrefix(m.PeerURL, "http://"),
			strings.TrimPrefix(m.ListenPeerURL, "http://")))
	}
	return fmt.Sprintf("%s; heartbeat %v, election %v", strings.Join(parts, ", "), c.heartbeat, c.election)
}

// PID returns the process id of member i's child, or 0 when it does not run (after Kill, after
// Stop, for an index out of range). It changes with every Restart.
func (c *Cluster) PID(i int) int {
	if i < 0 || i >= len(c.members) {
		return 0
	}
	return c.members[i].PID()
}

func (c *Cluster) member(op string, i int) (*Server, error) {
	if i < 0 || i >= len(c.members) {
		return nil, &argError{fmt.Errorf("etcdtemp: %s: member %d: the cluster has members 0 to %d", op, i, len(c.members)-1)}
	}
	if c.stopped.Load() {
		return nil, opError(op, fmt.Errorf("%w: Stop was called", ErrNotServing))
	}
	return c.members[i], nil
}

// Leader returns the index of the member that a majority of the members report as their leader
// in the same Raft term: the leader the cluster follows. A member cut off by Partition, or a
// leader that has not noticed yet that it lost its quorum, is outvoted. It waits, polling every
// 10ms, while there is none (an election under way, no quorum running) until ctx ends; the
// error then says what each member reported.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	if c.stopped.Load() {
		return -1, opError("Leader", fmt.Errorf("%w: Stop was called", ErrNotServing))
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		i, reports := c.leaderOnce(ctx)
		if i >= 0 {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, opError("Leader", fmt.Errorf("no leader a majority follows (%s): %w", strings.Join(reports, "; "), ctx.Err()))
		case <-tick.C:
		}
	}
}

// leaderOnce asks every running member whom it follows, at once, and returns the leader a
// majority names in the same term, or -1 and what each said.
func (c *Cluster) leaderOnce(ctx context.Context) (int, []string) {
	type report struct {
		leader, term uint64
		err          error
	}
	reports := make([]report, len(c.members))
	var wg sync.WaitGroup
	for i, s := range c.members {
		if s.PID() == 0 {
			reports[i].err = errors.New("not running")
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			st, err := c.status[i].Status(ctx, s.clientURL)
			if err != nil {
				reports[i].err = err
				return
			}
			reports[i] = report{leader: st.Leader, term: st.RaftTerm}
		})
	}
	wg.Wait()
	type vote struct{ leader, term uint64 }
	votes := map[vote]int{}
	var text []string
	for i, r := range reports {
		if r.err != nil {
			text = append(text, fmt.Sprintf("%s: %v", memberNameOf(i), r.err))
			continue
		}
		text = append(text, fmt.Sprintf("%s: leader %x term %d", memberNameOf(i), r.leader, r.term))
		if r.leader != 0 {
			votes[vote{r.leader, r.term}]++
		}
	}
	for v, n := range votes {
		if n > len(c.members)/2 {
			if i := slices.Index(c.ids, v.leader); i >= 0 {
				return i, text
			}
		}
	}
	return -1, text
}

// Kill sends SIGKILL to member i and waits until its process is gone: no flush, no leadership
// transfer, no goodbye to the others. It stays down until Restart. Its proxy keeps listening and
// closes each connection the others open to it at once, since nothing listens behind it: to them
// it looks like a host whose etcd is gone, not like a host that is unreachable.
func (c *Cluster) Kill(i int) error {
	s, err := c.member("Kill", i)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = c.killLocked(s)
	return err
}

func (c *Cluster) killLocked(s *Server) (time.Time, error) {
	if s.stopped {
		return time.Time{}, opError("Kill", fmt.Errorf("%w: Stop was called", ErrNotServing))
	}
	p := s.proc
	if p == nil {
		return time.Time{}, opError("Kill", fmt.Errorf("%w: member %s is down already", ErrNotServing, s.logName))
	}
	s.logf("crash: SIGKILL to etcd pid %d", p.pid)
	t0 := time.Now()
	s.proc = nil
	s.pid.Store(0)
	p.kill()
	s.logf("etcd pid %d gone %v after SIGKILL", p.pid, time.Since(t0).Round(time.Millisecond))
	return t0, nil
}

// Restart starts member i again after Kill, on the same data directory and ports, and returns
// when it serves linearizable reads again: it has recovered from its write-ahead log, found the
// leader, and applied the log up to the leader's commit index. That takes a quorum it can reach:
// a member still cut off by Partition does not get there before ctx ends (at most 30 seconds);
// Heal it first. On failure the member is left down.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	s, err := c.member("Restart", i)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = c.restartLocked(ctx, i, s)
	return err
}

func (c *Cluster) restartLocked(ctx context.Context, i int, s *Server) (time.Time, error) {
	if s.stopped {
		return time.Time{}, opError("Restart", fmt.Errorf("%w: Stop was called", ErrNotServing))
	}
	if s.proc != nil {
		return time.Time{}, &argError{fmt.Errorf("etcdtemp: Restart: member %d runs (pid %d): Kill it first", i, s.proc.pid)}
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, opError("Restart", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	t0 := time.Now()
	p, err := c.spawn(i)
	if err != nil {
		return time.Time{}, opError("Restart", err)
	}
	readyAt, err := s.waitReady(ctx, p)
	if err != nil {
		p.kill()
		return time.Time{}, opError("Restart", err)
	}
	s.proc = p
	s.pid.Store(int64(p.pid))
	s.logf("restarted as pid %d on %s, recovered from the WAL and caught up, in %v",
		p.pid, s.clientURL, readyAt.Sub(t0).Round(time.Millisecond))
	return readyAt, nil
}

// KillRestart is Kill then Restart of member i. downtime is the time from SIGKILL until the
// member served linearizable reads again. If ctx is already done nothing is killed.
func (c *Cluster) KillRestart(ctx context.Context, i int) (downtime time.Duration, err error) {
	s, err := c.member("KillRestart", i)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, opError("KillRestart", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t0, err := c.killLocked(s)
	if err != nil {
		return 0, err
	}
	readyAt, err := c.restartLocked(ctx, i, s)
	if err != nil {
		return time.Since(t0), err
	}
	return readyAt.Sub(t0), nil
}

// Partition cuts member i off from every other member, both ways, until Heal(i); its clients
// still reach it (the partition is between the servers). What crosses the proxies:
//
//   - Member i's proxy forwards nothing: every connection to it is held (accepted, read and
//     discarded, never answered), as a network that drops packets would leave it.
//   - The other members' proxies hold every connection that member i opens. etcd's peer
//     transport sends a message from X to Y both on stream connections that Y dialed to X
//     (Y reads what X writes) and in pipeline POSTs that X makes to Y's URL, so cutting member
//     i's own proxy alone would not cut it off: its POSTs, and its stream connections to the
//     others, would still carry its messages. A proxy tells who opened a connection from the
//     X-Server-From header (the sender's member ID in hex) of its first request, which every
//     request of etcd's raft transport carries; for the peer requests that do not (a lease
//     renewal a follower forwards to the leader, version checks, probes), by looking up which
//     member's process owns the connection's other end (Linux: /proc/net/tcp and
//     /proc/<pid>/fd; elsewhere those connections are not attributed and pass).
//   - The connections already open between member i and the others are closed at once.
//
// Partitioning several members cuts each off from all others. Partitioning a member twice is
// allowed and changes nothing.
func (c *Cluster) Partition(i int) error {
	if _, err := c.member("Partition", i); err != nil {
		return err
	}
	c.netMu.Lock()
	defer c.netMu.Unlock()
	c.partitioned[i] = true
	cut := 0
	for _, p := range c.proxies {
		cut += p.cutLocked()
	}
	c.logf("%s: partitioned from the other members; %d open peer connections cut", memberNameOf(i), cut)
	return nil
}

// Heal ends Partition(i): new connections between member i and the others are forwarded
// again, and the ones that were held are closed, so that etcd dials afresh instead of waiting
// for its 5-second read timeout. Healing a member that is not partitioned changes nothing.
func (c *Cluster) Heal(i int) error {
	if _, err := c.member("Heal", i); err != nil {
		return err
	}
	c.netMu.Lock()
	defer c.netMu.Unlock()
	c.partitioned[i] = false
	released := 0
	for _, p := range c.proxies {
		released += p.releaseLocked()
	}
	c.logf("%s: healed; %d held peer connections closed", memberNameOf(i), released)
	return nil
}

// blockedLocked reports whether a connection from member from (-1: not attributed to a member)
// to member to must not pass. c.netMu is held.
func (c *Cluster) blockedLocked(from, to int) bool {
	if c.partitioned[to] {
		return true
	}
	return from >= 0 && from != to && c.partitioned[from]
}

// memberByIDLocked returns the index of the member with etcd member ID id, or -1 while the IDs
// are not known yet (during StartCluster, when nothing is partitioned) or for a stranger.
func (c *Cluster) memberByIDLocked(id uint64) int {
	return slices.Index(c.ids, id)
}

// memberPIDs returns each member's latest child's pid, 0 for a member never started.
func (c *Cluster) memberPIDs() []int {
	pids := make([]int, len(c.spawned))
	for i := range c.spawned {
		pids[i] = int(c.spawned[i].Load())
	}
	return pids
}

// Stop kills every member (SIGKILL, all at once), closes the proxies and the clients of
// Leader, and removes the cluster's temporary directory, data directories included. Nothing of
// the cluster is left running: no process, no goroutine. It is idempotent and safe to call
// concurrently: later calls wait for the first and return its result.
//
// Unlike Server.Stop it does not ask the members to shut down: with the data about to be
// removed, a graceful shutdown brings nothing and costs time. A leader asked to stop first hands
// its leadership to the peer it has been connected to longest, and it still counts a peer that
// exited a few milliseconds ago as connected (etcd notices a closed connection on its next
// write to it), so it waits etcd's whole request timeout, 5s plus two election timeouts, for a
// peer that will never take office.
func (c *Cluster) Stop() error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopRan {
		return c.stopErr
	}
	c.stopRan = true
	c.stopped.Store(true)
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, s := range c.members {
		wg.Go(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.stopped = true
			if p := s.proc; p != nil {
				s.proc = nil
				p.kill()
			}
			s.pid.Store(0)
		})
	}
	wg.Wait()
	for _, p := range c.proxies {
		p.close()
	}
	var errs []error
	for _, cli := range c.status {
		if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("etcdtemp: closing a status client: %w", err))
		}
	}
	if err := os.RemoveAll(c.tmpDir); err != nil {
		errs = append(errs, fmt.Errorf("etcdtemp: stop: removing %s: %w", c.tmpDir, err))
	}
	c.stopErr = errors.Join(errs...)
	c.logf("stopped (SIGKILL to every member) and removed %s in %.2fs", c.tmpDir, time.Since(t0).Seconds())
	return c.stopErr
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "etcdtemp: cluster: "+format+"\n", args...)
}

// lockedWriter serializes the progress lines of the members and the cluster, which are written
// from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// argError marks an argument out of range: its text names the argument, and it matches
// ErrInvalidArgument.
type argError struct{ err error }

func (e *argError) Error() string   { return e.err.Error() }
func (e *argError) Unwrap() []error { return []error{e.err, ErrInvalidArgument} }
