package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// rpcCounter records every gRPC call a client makes — unary calls, stream
// opens, and each keep-alive sent on a LeaseKeepAlive stream (the store
// keeps one stream open and sends its keep-alives on it; clientv3's
// KeepAliveOnce opens a stream per keep-alive) — by method name, in order.
// The opens of LeaseKeepAlive streams are counted apart, in kaStreams. It
// sits inside etcd's own retry interceptor, so a retried call counts every
// time it is sent.
type rpcCounter struct {
	mu        sync.Mutex
	calls     []string
	kaStreams int
	kaMembers []uint64 // the member that answered each keep-alive
}

// countedStream records each message sent on a LeaseKeepAlive stream.
type countedStream struct {
	grpc.ClientStream
	rc *rpcCounter
}

func (s countedStream) SendMsg(m any) error {
	s.rc.record("/LeaseKeepAlive")
	return s.ClientStream.SendMsg(m)
}

func (s countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*etcdserverpb.LeaseKeepAliveResponse); ok && err == nil {
		s.rc.mu.Lock()
		s.rc.kaMembers = append(s.rc.kaMembers, r.Header.GetMemberId())
		s.rc.mu.Unlock()
	}
	return err
}

// lastKeepAliveMember returns the member that answered the last keep-alive.
func (c *rpcCounter) lastKeepAliveMember() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.kaMembers) == 0 {
		return 0
	}
	return c.kaMembers[len(c.kaMembers)-1]
}

// streams is the stream interceptor of a counted client.
func (c *rpcCounter) streams(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
	method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if !strings.HasSuffix(method, "/LeaseKeepAlive") {
		c.record(method)
		return streamer(ctx, desc, cc, method, opts...)
	}
	c.mu.Lock()
	c.kaStreams++
	c.mu.Unlock()
	st, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return countedStream{st, c}, nil
}

// keepAliveStreams returns how many LeaseKeepAlive streams were opened.
func (c *rpcCounter) keepAliveStreams() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kaStreams
}

func (c *rpcCounter) record(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, method[strings.LastIndexByte(method, '/')+1:])
}

// waitFor waits until method has been called since the last take.
func (c *rpcCounter) waitFor(t *testing.T, method string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		seen := strings.Contains(" "+strings.Join(c.calls, " ")+" ", " "+method+" ")
		c.mu.Unlock()
		if seen {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s call within 10s", method)
		}
	}
}

// take returns the calls since the last take, space-separated, and forgets
// them.
func (c *rpcCounter) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.Join(c.calls, " ")
	c.calls = nil
	return s
}

// dialWith returns a client of endpoints with the tests' dial options
// (interceptors), closed when the test ends.
func dialWith(t *testing.T, endpoints []string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop(),
		DialTimeout: 30 * time.Second, DialOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// countingClient returns a client of the shared server whose calls rc
// records, connected (the connecting request is forgotten), closed when the
// test ends.
func countingClient(t *testing.T) (*clientv3.Client, *rpcCounter) {
	t.Helper()
	rc := &rpcCounter{}
	cli := dialWith(t, etcdtest.Server(t).Endpoints(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			rc.record(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(rc.streams),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/leasefence-test/dial", clientv3.WithCountOnly()); err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "Range" {
		t.Fatalf("the counter saw %q for one Get", got)
	}
	return cli, rc
}

// TestRoundTrips counts the gRPC calls of every operation, uncontended, and
// sets them beside etcd's own concurrency.Mutex with one session (Lock is
// one Txn, Unlock one DeleteRange).
func TestRoundTrips(t *testing.T) {
	cli, rc := countingClient(t)
	ctx := context.Background()
	prefix := etcdtest.Prefix()
	newStore := func(opts ...fenceetcd.Option) *fenceetcd.LeaseStore {
		s, err := fenceetcd.NewLeaseStore(cli, append([]fenceetcd.Option{fenceetcd.WithPrefix(prefix)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	shared, perAcquire := newStore(fenceetcd.WithSharedLeases()), newStore()
	res, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Minute // no shared-lease refresh falls due during the test

	step := func(what, want string, f func() error) {
		t.Helper()
		rc.take()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := rc.take()
		t.Logf("%-56s %d: %s", what, len(strings.Fields(got)), got)
		if got != want {
			t.Errorf("%s: calls %q, want %q", what, got, want)
		}
	}
	acquire := func(s *fenceetcd.LeaseStore, name string, g *leasecore.Grant) func() error {
		return func() (err error) { *g, err = s.Acquire(ctx, name, "holder-a", ttl); return err }
	}
	// A refused acquire by the holder itself: in shared mode its shared
	// lease exists already. The refusal is decided by the Txn; the Range
	// after it only reads who holds the name, for the error (the Txn has
	// no Else branch, which every successful acquire would pay for).
	held := func(s *fenceetcd.LeaseStore, name string) func() error {
		return func() error {
			if _, err := s.Acquire(ctx, name, "holder-a", ttl); err == nil || !isHeld(err) {
				return fmt.Errorf("acquire of a held name: %v", err)
			}
			return nil
		}
	}

	// etcd's own lock, for comparison.
	var sess *concurrency.Session
	step("concurrency.NewSession (once per process)", "LeaseGrant LeaseKeepAlive", func() (err error) {
		sess, err = concurrency.NewSession(cli, concurrency.WithTTL(60))
		if err == nil {
			// The session opens its keep-alive stream in the background.
			rc.waitFor(t, "LeaseKeepAlive")
		}
		return err
	})
	defer sess.Close()
	m := concurrency.NewMutex(sess, prefix+"/mutex/")
	step("concurrency.Mutex.Lock", "Txn", func() error { return m.Lock(ctx) })
	step("concurrency.Mutex.Unlock", "DeleteRange", func() error { return m.Unlock(ctx) })

	var g0, g1, g2 leasecore.Grant
	step("shared: first Acquire of a holder", "LeaseGrant Txn", acquire(shared, "shard-0", &g0))
	step("shared: Acquire", "Txn", acquire(shared, "shard-1", &g1))
	step("shared: Release", "Txn", func() error { return shared.Release(ctx, g1) })
	step("shared: Acquire of a held name (refused)", "Txn Range", held(shared, "shard-0"))
	step("shared: Renew", "Txn LeaseKeepAlive", func() (err error) { g0, err = shared.Renew(ctx, g0); return err })

	step("per-acquire lease: Acquire", "LeaseGrant Txn", acquire(perAcquire, "solo", &g2))
	step("per-acquire lease: Release", "Txn LeaseRevoke", func() error { return perAcquire.Release(ctx, g2) })
	step("per-acquire lease: Acquire of a held name (refused)", "LeaseGrant Txn LeaseRevoke Range", held(perAcquire, "shard-0"))

	// The fence, with the default attempt log (rejections only). A write
	// whose token equals the floor is one Txn; the first write of a token
	// fails the guard, reads the floor, advances it and sends the guarded
	// Txn again. A failed guard reads the floor in a Range of its own: the
	// guarded Txn has no Else branch to read it, which every accepted
	// write would carry.
	write := func(scope string, token leasecore.Token, wantAccepted bool) func() error {
		return func() error {
			r, err := res.Write(ctx, leasecore.Write{Scope: scope, Part: "p", Content: "x", Writer: "holder-a", Token: token})
			if err == nil && r.Accepted != wantAccepted {
				err = fmt.Errorf("token %d: %+v", token, r)
			}
			return err
		}
	}
	step("Resource.Write, first of a scope (advances the floor)", "Txn Range Txn Txn", write("s", g0.Token, true))
	step("Resource.Write, floor == token", "Txn", write("s", g0.Token, true))
	step("Resource.Write, new token (advances the floor)", "Txn Range Txn Txn", write("s", g0.Token+1, true))
	step("Resource.Write, rejected (logs the rejection after)", "Txn Range Put", write("s", g0.Token, false))
	batch := leasecore.Batch{Scope: "s", Writer: "holder-a", Token: g0.Token + 1}
	for i := range backendkit.MaxBatchParts {
		batch.Parts = append(batch.Parts, leasecore.PartContent{Part: fmt.Sprintf("part-%02d", i), Content: "x"})
	}
	step("Resource.WriteBatch, 64 parts, floor == token", "Txn", func() error {
		r, err := res.WriteBatch(ctx, batch)
		if err == nil && !r.Accepted {
			err = fmt.Errorf("rejected: %+v", r)
		}
		return err
	})

	fence, err := fenceetcd.NewFence(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := fenceetcd.NewFence(cli, fenceetcd.WithPrefix(prefix), fenceetcd.WithAttemptLog(leasecore.LogNone))
	if err != nil {
		t.Fatal(err)
	}
	newer := leasecore.Claim{Scope: "job", Writer: "holder-b", Token: g0.Token + 2}
	older := leasecore.Claim{Scope: "job", Writer: "holder-a", Token: g0.Token + 1}
	own := fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(prefix+"/own/a", "1"), clientv3.OpPut(prefix+"/own/b", "2")}}
	commit := func(f *fenceetcd.Fence, c leasecore.Claim, wantAccepted bool) func() error {
		return func() error {
			r, _, err := f.Commit(ctx, c, own)
			if err == nil && r.Accepted != wantAccepted {
				err = fmt.Errorf("token %d: %+v", c.Token, r)
			}
			return err
		}
	}
	step("Fence.Advance", "Txn", func() error {
		r, err := fence.Advance(ctx, newer)
		if err == nil && !r.Accepted {
			err = fmt.Errorf("rejected: %+v", r)
		}
		return err
	})
	step("Fence.Commit after Advance (floor == token)", "Txn", commit(fence, newer, true))
	step("Fence.Commit, rejected (logs the rejection after)", "Txn Range Put", commit(fence, older, false))
	step("Fence.Commit, rejected, LogNone", "Txn Range", commit(quiet, older, false))
	step("Fence.Advance, rejected (logs the rejection after)", "Txn Put", func() error {
		r, err := fence.Advance(ctx, older)
		if err == nil && r.Accepted {
			err = fmt.Errorf("accepted: %+v", r)
		}
		return err
	})
	step("Fence.Commit, first of a scope", "Txn Range Txn Txn", commit(fence, leasecore.Claim{Scope: "job-2", Writer: "holder-b", Token: newer.Token}, true))
	// Claims that name their token space: the accepted path is what it
	// was (the space rides in the advance's Txn), and only a rejection
	// reads the floor and its space, one Txn more.
	spaced := leasecore.Claim{Scope: "job-3", Writer: "holder-b", Token: newer.Token, Space: "test:a"}
	step("Fence.Advance, claim with a space", "Txn", func() error {
		r, err := fence.Advance(ctx, spaced)
		if err == nil && !r.Accepted {
			err = fmt.Errorf("rejected: %+v", r)
		}
		return err
	})
	step("Fence.Commit, claim with a space, floor == token", "Txn", commit(fence, spaced, true))
	step("Fence.Commit, claim with a space, rejected (log, then the floor's space)", "Txn Range Put Txn",
		commit(fence, leasecore.Claim{Scope: "job-3", Writer: "holder-a", Token: older.Token, Space: "test:a"}, false))
	step("Fence.Commit, claim of another space, rejected (log, then the floor's space)", "Txn Range Put Txn", func() error {
		r, _, err := fence.Commit(ctx, leasecore.Claim{Scope: "job-3", Writer: "holder-c", Token: older.Token, Space: "test:b"}, own)
		if !errors.Is(err, leasecore.ErrTokenSpace) || r.Accepted {
			return fmt.Errorf("%+v, %v; want a rejection with ErrTokenSpace", r, err)
		}
		return nil
	})
	step("Fence.Attempts", "Range", func() error {
		as, err := fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "job", Limit: 100})
		if err == nil && len(as) != 2 {
			err = fmt.Errorf("attempts %+v, want the two logged rejections", as)
		}
		return err
	})
	step("Fence.PruneAttempts", "DeleteRange", func() error {
		n, err := fence.PruneAttempts(ctx, "job", time.Now())
		if err == nil && n != 2 {
			err = fmt.Errorf("pruned %d, want 2", n)
		}
		return err
	})

	// RenewAll of one holder's 1000 names: ceil(1000/128) = 8 reads and one
	// keep-alive in shared mode.
	const n = 1000
	gs := []leasecore.Grant{g0}
	for i := 1; i < n; i++ {
		g, err := shared.Acquire(ctx, fmt.Sprintf("shard-%d", i), "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	step(fmt.Sprintf("shared: RenewAll of %d names", n), strings.Repeat("Txn ", (n+127)/128)+"LeaseKeepAlive", func() error {
		renewed, lost, err := shared.RenewAll(ctx, gs)
		if err != nil {
			return err
		}
		for i := range gs {
			if lost[i] != nil || renewed[i].Token != gs[i].Token {
				return fmt.Errorf("grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
			}
		}
		return nil
	})

	// The slow path: without shared leases, one keep-alive per name.
	var pg []leasecore.Grant
	for i := range 3 {
		g, err := perAcquire.Acquire(ctx, fmt.Sprintf("solo-%d", i), "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		pg = append(pg, g)
	}
	step("per-acquire lease: RenewAll of 3 names", "Txn LeaseKeepAlive LeaseKeepAlive LeaseKeepAlive", func() error {
		_, _, err := perAcquire.RenewAll(ctx, pg)
		return err
	})

	// Every keep-alive above went on one stream per store (etcd's session
	// has one more): a stream per keep-alive would be a dozen.
	if got := rc.keepAliveStreams(); got != 3 {
		t.Errorf("LeaseKeepAlive streams opened: %d, want 3 (the session's, and one per store)", got)
	}

	step("shared: Close (one holder, one TTL)", "LeaseRevoke", shared.Close)
	step("per-acquire lease: Close", "", perAcquire.Close)

	// After Close, a keep-alive (Renew keeps working) is a KeepAliveOnce:
	// a stream of its own.
	step("per-acquire lease: Renew after Close", "Txn LeaseKeepAlive", func() (err error) {
		_, err = perAcquire.Renew(ctx, pg[0])
		return err
	})
	if got := rc.keepAliveStreams(); got != 4 {
		t.Errorf("LeaseKeepAlive streams opened: %d, want 4 (Renew after Close opens one)", got)
	}
}

func isHeld(err error) bool { return errors.Is(err, leasecore.ErrHeld) }
