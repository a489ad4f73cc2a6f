package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// rpcCounter records every gRPC call a client makes — unary calls and
// stream opens (a KeepAliveOnce opens one stream, sends one request and
// reads one answer) — by method name, in order. It sits inside etcd's own
// retry interceptor, so a retried call counts every time it is sent.
type rpcCounter struct {
	mu    sync.Mutex
	calls []string
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

// countingClient returns a client of the shared server whose calls rc
// records, connected (the connecting request is forgotten), closed when the
// test ends.
func countingClient(t *testing.T) (*clientv3.Client, *rpcCounter) {
	t.Helper()
	rc := &rpcCounter{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   etcdtest.Server(t).Endpoints(),
		Logger:      zap.NewNop(),
		DialTimeout: 30 * time.Second,
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
				cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				rc.record(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
				method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				rc.record(method)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
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
		t.Logf("%-52s %d: %s", what, len(strings.Fields(got)), got)
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
	step("shared: Renew", "Range LeaseKeepAlive", func() (err error) { g0, err = shared.Renew(ctx, g0); return err })

	step("per-acquire lease: Acquire", "LeaseGrant Txn", acquire(perAcquire, "solo", &g2))
	step("per-acquire lease: Release", "Txn LeaseRevoke", func() error { return perAcquire.Release(ctx, g2) })
	step("per-acquire lease: Acquire of a held name (refused)", "LeaseGrant Txn LeaseRevoke Range", held(perAcquire, "shard-0"))

	step("Resource.Write", "Txn", func() error {
		_, err := res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Content: "x", Writer: "holder-a", Token: g0.Token})
		return err
	})
	batch := leasecore.Batch{Scope: "s", Writer: "holder-a", Token: g0.Token}
	for i := range leasecore.MaxBatchParts {
		batch.Parts = append(batch.Parts, leasecore.PartContent{Part: fmt.Sprintf("part-%02d", i), Content: "x"})
	}
	step("Resource.WriteBatch, 64 parts", "Txn", func() error {
		r, err := res.WriteBatch(ctx, batch)
		if err == nil && !r.Accepted {
			err = fmt.Errorf("rejected: %+v", r)
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

	step("shared: Close (one holder, one TTL)", "LeaseRevoke", shared.Close)
	step("per-acquire lease: Close", "", perAcquire.Close)
}

func isHeld(err error) bool { return errors.Is(err, leasecore.ErrHeld) }
