package etcdtemp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// dialEndpoints returns a client of the given members, closed when the test ends (closing it
// earlier as well is harmless).
func dialEndpoints(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// putRetry writes until a write is acknowledged (the client moving off a dead endpoint, an
// election under way) and returns its revision and when it was acknowledged.
func putRetry(t *testing.T, cli *clientv3.Client, key, val string) (int64, time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		resp, err := cli.Put(ctx, key, val)
		cancel()
		if err == nil {
			return resp.Header.Revision, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %s: no write acknowledged for 30s: %v", key, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func leader(t *testing.T, c *Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// newLeader waits until the cluster follows a leader other than old and returns it.
func newLeader(t *testing.T, c *Cluster, old int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if i := leader(t, c); i != old {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("m%d still leads after 30s", old)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClusterPartitionLeader cuts the leader off from the other two members: they elect a new
// leader and serve writes, the old leader steps down and can serve no linearizable read, and
// after Heal it catches up with what was written without it.
func TestClusterPartitionLeader(t *testing.T) {
	ctx := t.Context()
	t0 := time.Now()
	c := StartClusterTB(t, 3, WithLog(testLog{t}))
	t.Logf("StartCluster took %v: %s", time.Since(t0).Round(time.Millisecond), c.Describe())
	eps := c.Endpoints()
	for i, ep := range eps {
		if want := fmt.Sprintf("http://127.0.0.%d:", i+1); !strings.HasPrefix(ep, want) {
			t.Errorf("member %d's endpoint %s, want %sPORT", i, ep, want)
		}
	}
	for i, m := range c.Members() {
		if m.PeerURL == m.ListenPeerURL || !strings.HasPrefix(m.PeerURL, fmt.Sprintf("http://127.0.0.%d:", i+1)) {
			t.Errorf("member %d announces %s and listens on %s: want a proxy of its own on 127.0.0.%d", i, m.PeerURL, m.ListenPeerURL, i+1)
		}
	}

	old := leader(t, c)
	all := dialEndpoints(t, eps...)
	before, _ := putRetry(t, all, "before", "1")

	t1 := time.Now()
	if err := c.Partition(old); err != nil {
		t.Fatal(err)
	}
	next := newLeader(t, c, old)
	elected := time.Since(t1)
	var survivors []string
	for i, ep := range eps {
		if i != old {
			survivors = append(survivors, ep)
		}
	}
	during, _ := putRetry(t, dialEndpoints(t, survivors...), "during", "2")
	t.Logf("partitioned leader m%d: the others elected m%d in %v and acknowledged a write at revision %d",
		old, next, elected.Round(time.Millisecond), during)
	if during <= before {
		t.Errorf("revision %d after the partition, not above %d", during, before)
	}

	// The old leader steps down once an election timeout passes without hearing from a
	// quorum (etcd always runs raft with CheckQuorum).
	cut := dialEndpoints(t, eps[old])
	id := c.Members()[old].ID
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err := cut.Status(ctx, eps[old])
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader != id {
			t.Logf("m%d reports leader %x (term %d) %v after the partition: it stepped down",
				old, st.Leader, st.RaftTerm, time.Since(t1).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("m%d still reports itself leader 10s after the partition", old)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	resp, err := cut.Get(rctx, "during")
	cancel()
	if err == nil {
		t.Fatalf("the partitioned member served a linearizable read: %v", resp.Kvs)
	}
	t.Logf("linearizable read on the partitioned member: %v", err)
	if resp, err := cut.Get(ctx, "during", clientv3.WithSerializable()); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("serializable read on the partitioned member = %v, %v: want no key (the write never reached it)", resp, err)
	}

	t2 := time.Now()
	if err := c.Heal(old); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cut.Get(rctx, "during")
		cancel()
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "2" {
			t.Logf("after Heal m%d served the write made without it %v later", old, time.Since(t2).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("m%d has not caught up 30s after Heal: %v, %v", old, resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l := leader(t, c); l < 0 {
		t.Errorf("no leader after Heal")
	}
}

// TestClusterPartitionFollower cuts off a follower: the leader keeps its office and serves
// writes, the follower serves no linearizable read, and catches up after Heal. It also checks
// that partitioning twice and healing twice change nothing.
func TestClusterPartitionFollower(t *testing.T) {
	ctx := t.Context()
	c := StartClusterTB(t, 3, WithLog(testLog{t}))
	eps := c.Endpoints()
	l := leader(t, c)
	f := (l + 1) % 3
	cut := dialEndpoints(t, eps[f])
	lease, err := cut.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Partition(f); err != nil {
			t.Fatal(err)
		}
	}
	// A follower forwards a lease renewal to the leader's peer URL in a request without
	// X-Server-From, on a connection of its own. Until its election timeout passes it still
	// knows the leader and forwards; the leader's proxy must see that the connection is the
	// follower's (its process owns the other end) and hold it.
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = cut.KeepAliveOnce(kctx, lease.ID)
	cancel()
	if err == nil {
		t.Errorf("the partitioned follower m%d renewed a lease: its forwarded renewal reached the leader", f)
	}
	putRetry(t, dialEndpoints(t, eps[l]), "k", "v")
	if got := leader(t, c); got != l {
		t.Errorf("the leader changed from m%d to m%d when follower m%d was cut off", l, got, f)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = cut.Get(rctx, "k")
	cancel()
	if err == nil {
		t.Fatalf("the partitioned follower m%d served a linearizable read", f)
	}
	for range 2 {
		if err := c.Heal(f); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cut.Get(rctx, "k")
		cancel()
		if err == nil && len(resp.Kvs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("m%d has not caught up 30s after Heal: %v", f, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterKillLeader kills the leader: the others elect one and serve writes; the killed
// member, restarted on its data directory, rejoins and catches up. Then it checks KillRestart
// on a follower, the errors for bad calls, and that Stop leaves nothing behind.
func TestClusterKillLeader(t *testing.T) {
	requireProc(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := t.Context()
	c := StartClusterTB(t, 3, WithLog(testLog{t}))
	eps := c.Endpoints()
	proxies := []string{}
	for _, m := range c.Members() {
		proxies = append(proxies, m.PeerURL)
	}
	all := dialEndpoints(t, eps...)
	before, _ := putRetry(t, all, "before", "1")

	old := leader(t, c)
	pid := c.PID(old)
	t0 := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	if !pidGone(pid) || c.PID(old) != 0 {
		t.Errorf("after Kill: pid %d gone %t, PID() = %d", pid, pidGone(pid), c.PID(old))
	}
	next := newLeader(t, c, old)
	elected := time.Since(t0)
	after, ackAt := putRetry(t, all, "after", "2")
	t.Logf("killed leader m%d (pid %d): m%d elected %v after SIGKILL; a write through all endpoints acknowledged %v after it, revision %d",
		old, pid, next, elected.Round(time.Millisecond), ackAt.Sub(t0).Round(time.Millisecond), after)
	if after <= before {
		t.Errorf("revision %d after the kill, not above %d", after, before)
	}
	if err := c.Kill(old); !errors.Is(err, ErrNotServing) {
		t.Errorf("Kill of a killed member = %v, want ErrNotServing", err)
	}

	t1 := time.Now()
	if err := c.Restart(ctx, old); err != nil {
		t.Fatal(err)
	}
	if c.PID(old) == 0 || c.PID(old) == pid {
		t.Errorf("PID() = %d after Restart, want a new child (was %d)", c.PID(old), pid)
	}
	rejoined := dialEndpoints(t, eps[old])
	resp, err := rejoined.Get(ctx, "after")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("restarted m%d reads %v, %v: want the write made while it was down", old, resp, err)
	}
	t.Logf("m%d restarted on its data directory and caught up in %v", old, time.Since(t1).Round(time.Millisecond))
	if err := c.Restart(ctx, old); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Kill it first") {
		t.Errorf("Restart of a running member = %v, want ErrInvalidArgument", err)
	}

	follower := (leader(t, c) + 1) % 3
	downtime, err := c.KillRestart(ctx, follower)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("KillRestart of follower m%d: down for %v", follower, downtime.Round(time.Millisecond))
	putRetry(t, all, "end", "3")

	for _, call := range []struct {
		name string
		err  error
	}{
		{"Kill(-1)", c.Kill(-1)},
		{"Kill(3)", c.Kill(3)},
		{"Restart(3)", c.Restart(ctx, 3)},
		{"Partition(3)", c.Partition(3)},
		{"Heal(-1)", c.Heal(-1)},
		{"KillRestart(7)", func() error { _, err := c.KillRestart(ctx, 7); return err }()},
	} {
		if !errors.Is(call.err, ErrInvalidArgument) || !strings.Contains(call.err.Error(), "member ") {
			t.Errorf("%s = %v, want an error naming the member, wrapping ErrInvalidArgument", call.name, call.err)
		}
	}
	if c.PID(3) != 0 || c.PID(-1) != 0 {
		t.Errorf("PID out of range = %d, %d; want 0", c.PID(3), c.PID(-1))
	}

	all.Close()
	rejoined.Close()
	pids := []int{c.PID(0), c.PID(1), c.PID(2)}
	t2 := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop took %v", time.Since(t2).Round(time.Millisecond))
	for _, p := range pids {
		if !pidGone(p) {
			t.Errorf("pid %d still alive after Stop", p)
		}
	}
	assertNothingLeft(t, tmp)
	for _, u := range slices.Concat(eps, proxies) {
		assertRefuses(t, u)
	}
	for _, op := range []error{c.Kill(0), c.Partition(0), func() error { _, err := c.Leader(ctx); return err }()} {
		if !errors.Is(op, ErrNotServing) {
			t.Errorf("after Stop: %v, want ErrNotServing", op)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, stacks := clientGoroutines()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Stop:\n%s", n, stacks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestClusterBadArguments(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, tc := range []struct {
		n    int
		opts []Option
		want string
	}{
		{0, nil, "n = 0"},
		{-1, nil, "n = -1"},
		{255, nil, "n = 255"},
		{3, []Option{WithHeartbeat(0)}, "WithHeartbeat(0s)"},
		{3, []Option{WithElection(100 * time.Millisecond)}, "shorter than 5 heartbeats"},
	} {
		c, err := StartCluster(t.Context(), tc.n, tc.opts...)
		if err == nil {
			c.Stop()
			t.Errorf("StartCluster(%d) succeeded, want an error containing %q", tc.n, tc.want)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartCluster(%d) = %q, want ErrInvalidArgument and %q", tc.n, err, tc.want)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := StartCluster(ctx, 3); !errors.Is(err, context.Canceled) {
		t.Errorf("StartCluster(cancelled) = %v, want context.Canceled", err)
	}
	assertNothingLeft(t, tmp)
}

// TestClusterSocketOwner checks the lookup the proxies use for peer requests without an
// X-Server-From header: the process owning the other end of a loopback connection.
func TestClusterSocketOwner(t *testing.T) {
	requireProc(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if got := socketOwner(in, []int{0, 1, os.Getpid()}); got != 2 {
		t.Errorf("socketOwner = %d, want 2 (this process)", got)
	}
	if got := socketOwner(in, []int{1}); got != -1 {
		t.Errorf("socketOwner among others = %d, want -1", got)
	}
}
