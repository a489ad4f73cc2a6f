package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestKeepAliveStream checks the store's one keep-alive stream: concurrent
// renewals of many holders share it, callers whose ctx ends leave the
// others' answers right, and after the server is killed and restarted a
// renewal succeeds on a new stream.
func TestKeepAliveStream(t *testing.T) {
	srv := etcdtemp.StartTB(t)
	rc := &rpcCounter{}
	cli := dialWith(t, srv.Endpoints(), grpc.WithChainStreamInterceptor(rc.streams))
	s, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(etcdtest.Prefix()), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const holders = 32
	gs := make([]leasecore.Grant, holders)
	for i := range gs {
		if gs[i], err = s.Acquire(ctx, fmt.Sprintf("name-%d", i), fmt.Sprintf("holder-%d", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	// Every other caller gives up at once; the rest must each get their
	// own answer (a mismatch would break the stream and fail them).
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make([]error, holders)
		for i := range gs {
			wg.Go(func() {
				rctx := ctx
				if i%2 == 1 {
					var cancel context.CancelFunc
					rctx, cancel = context.WithTimeout(ctx, time.Duration(round)*time.Microsecond)
					defer cancel()
				}
				_, errs[i] = s.Renew(rctx, gs[i])
			})
		}
		wg.Wait()
		for i, err := range errs {
			switch {
			case i%2 == 0 && err != nil:
				t.Fatalf("round %d: renew of holder %d: %v", round, i, err)
			case i%2 == 1 && err != nil && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("round %d: renew of holder %d with a short ctx: %v, want nil or DeadlineExceeded", round, i, err)
			}
		}
	}
	if got := rc.keepAliveStreams(); got != 1 {
		t.Errorf("keep-alive streams opened: %d, want 1", got)
	}

	// The stream breaks with the server; the next renewal retries until
	// the restarted server answers.
	if _, err := srv.KillRestart(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.Renew(rctx, gs[0]); err != nil {
		t.Fatalf("renew after the server restarted: %v", err)
	}
	if got := rc.keepAliveStreams(); got < 2 {
		t.Errorf("keep-alive streams opened: %d, want a new one after the restart", got)
	}
	_, lost, err := s.RenewAll(rctx, gs[1:2])
	if err != nil || lost[0] != nil {
		t.Fatalf("RenewAll after the restart: %v, lost %v", err, lost)
	}
}

// TestKeepAliveStreamToLeader: on a 3-member cluster, with the client's
// endpoints listing a follower first, the store's keep-alives are answered
// by the leader (a follower would forward each one to it). After the
// leadership moves, the keep-alives follow it: the first answer of the new
// term retires the stream, and the next ones come from the new leader.
func TestKeepAliveStreamToLeader(t *testing.T) {
	c := etcdtemp.StartClusterTB(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eps := c.Endpoints()
	follower := (leader + 1) % len(eps)
	ordered := []string{eps[follower], eps[leader], eps[(leader+2)%len(eps)]}
	rc := &rpcCounter{}
	var genReadMember atomic.Uint64 // the member that answered the last generation-key read
	cli := dialWith(t, ordered,
		grpc.WithChainStreamInterceptor(rc.streams),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if r, ok := req.(*etcdserverpb.RangeRequest); ok && err == nil && strings.Contains(string(r.Key), "/holdergen/") {
				genReadMember.Store(reply.(*etcdserverpb.RangeResponse).Header.GetMemberId())
			}
			return err
		}),
	)
	memberOf := func(ep string) uint64 {
		t.Helper()
		st, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatal(err)
		}
		return st.Header.MemberId
	}
	leaderID, followerID := memberOf(eps[leader]), memberOf(eps[follower])

	s, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(etcdtest.Prefix()), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g, err := s.Acquire(ctx, "name", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	renew := func() {
		t.Helper()
		if g, err = s.Renew(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	if got := rc.lastKeepAliveMember(); got != leaderID {
		t.Fatalf("keep-alive answered by member %x, want the leader %x", got, leaderID)
	}
	// RenewAll's fast path reads the generation key on the stream's
	// connection, at the leader, too (the first RenewAll is the full check).
	for range 2 {
		if _, _, err := s.RenewAll(ctx, []leasecore.Grant{g}); err != nil {
			t.Fatal(err)
		}
	}
	if got := genReadMember.Load(); got != leaderID {
		t.Fatalf("generation key read at member %x, want the leader %x", got, leaderID)
	}

	// Move the leadership to the follower (asked of the leader).
	lcli := etcdtest.Dial(t, []string{eps[leader]})
	if _, err := lcli.MoveLeader(ctx, followerID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		renew()
		if rc.lastKeepAliveMember() == followerID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keep-alives still answered by member %x 30 s after the leadership moved to %x",
				rc.lastKeepAliveMember(), followerID)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKeepAliveStoppedMemberAndLeaderChange: a holder's renewals on a
// 3-member cluster keep within their interval (TTL/3, leasecore's default)
// while one follower is stopped (SIGSTOP: it holds its connections open
// and answers nothing, Status included):
//
//   - a store's first renewal opens its keep-alive stream after a Status
//     of every endpoint, to find the leader: the first member that answers
//     that it leads is taken, and the stopped one is not waited for (it
//     used to be, for 2 s: longer than the interval of a 3 s TTL);
//   - the leadership moves between the two live members: the first answer
//     of the new term ends the stream, and the renewals go on at the new
//     leader. etcd itself stalls them around the move (a renewal sent to
//     the old leader is forwarded once the new one's lessor is primary,
//     seen 1.3-1.4 s here), so this holder has a 15 s TTL (interval 5 s).
//
// Each RenewAll runs under a context of its interval and must return with
// every name renewed.
func TestKeepAliveStoppedMemberAndLeaderChange(t *testing.T) {
	c := etcdtemp.StartClusterTB(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eps := c.Endpoints()
	live, stopped := (leader+1)%len(eps), (leader+2)%len(eps)
	rc := &rpcCounter{}
	// The stopped member first: the Status lookups ask every endpoint at
	// once, whatever the order.
	cli := dialWith(t, []string{eps[stopped], eps[leader], eps[live]}, grpc.WithChainStreamInterceptor(rc.streams))
	st, err := cli.Status(ctx, eps[live])
	if err != nil {
		t.Fatal(err)
	}
	liveID := st.Header.MemberId

	// Two holders, each on a store of its own, acquire before the stop.
	// Their renewals read nothing through the client's balancer (which may
	// pick the stopped member): the generation key is read on the keep-alive
	// stream's connection to the leader.
	type holder struct {
		s        *fenceetcd.LeaseStore
		gs       []leasecore.Grant
		interval time.Duration
	}
	newHolder := func(name string, ttl time.Duration) *holder {
		s, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(etcdtest.Prefix()), fenceetcd.WithSharedLeases())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		gs, _, err := s.AcquireAll(ctx, []string{"a", "b", "c"}, name, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return &holder{s: s, gs: gs, interval: ttl / 3}
	}
	renew := func(h *holder, what string) time.Duration {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, h.interval)
		defer rcancel()
		start := time.Now()
		renewed, lost, err := h.s.RenewAll(rctx, h.gs)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: RenewAll after %v: %v; want renewed within the renew interval %v", what, took, err, h.interval)
		}
		for i, l := range lost {
			if l != nil {
				t.Fatalf("%s: %s lost: %v", what, h.gs[i].Name, l)
			}
		}
		h.gs = renewed
		return took
	}
	long := newHolder("holder-long", 15*time.Second)
	short := newHolder("holder-short", 3*time.Second)
	renew(long, "before the stop") // its stream opens now

	pid := c.PID(stopped)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	renew(long, "with a member stopped")
	opened := renew(short, "a stream opened with a member stopped")
	renew(short, "again")

	lcli := etcdtest.Dial(t, []string{eps[leader]})
	if _, err := lcli.MoveLeader(ctx, liveID); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; {
		slowest = max(slowest, renew(long, "after the leadership moved"))
		if rc.lastKeepAliveMember() == liveID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keep-alives still answered by member %x 30 s after the leadership moved to %x", rc.lastKeepAliveMember(), liveID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 3 {
		slowest = max(slowest, renew(long, "on the new leader's stream"))
	}
	t.Logf("one member stopped: a renewal that opened a stream took %v (interval %v); the slowest across the move %v (interval %v)",
		opened, short.interval, slowest, long.interval)
}
