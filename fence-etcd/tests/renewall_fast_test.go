package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// RenewAll in shared mode: after one full check (a read of every name's
// key), a RenewAll of the same grants reads one generation key and sends
// one keep-alive; every release or take-over of one of the holder's names,
// through any store, brings the full check back, so a name reported
// renewed is still attached to the holder's etcd lease with its token.

// acquireN acquires names prefix-0 .. prefix-(n-1) for holder on s.
func acquireN(t *testing.T, s *fenceetcd.LeaseStore, prefix, holder string, n int, ttl time.Duration) []leasecore.Grant {
	t.Helper()
	gs := make([]leasecore.Grant, n)
	for i := range gs {
		g, err := s.Acquire(context.Background(), fmt.Sprintf("%s-%d", prefix, i), holder, ttl)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	return gs
}

// renewAllCalls runs s.RenewAll(gs), checks the gRPC calls it made (rc
// counts the calls of s's client; "" skips the check) and that every grant
// is renewed with its token and a Start within the call, except those of
// lostAt, which must be lost with leasecore.ErrLost and the reason given.
func renewAllCalls(t *testing.T, s *fenceetcd.LeaseStore, rc *rpcCounter, gs []leasecore.Grant, wantCalls string, lostAt map[int]string) []leasecore.Grant {
	t.Helper()
	rc.take()
	before := time.Now()
	renewed, lost, err := s.RenewAll(context.Background(), gs)
	after := time.Now()
	if err != nil {
		t.Fatalf("RenewAll: %v", err)
	}
	if got := rc.take(); wantCalls != "" && got != wantCalls {
		t.Errorf("RenewAll of %d grants: calls %q, want %q", len(gs), got, wantCalls)
	}
	if len(renewed) != len(gs) || len(lost) != len(gs) {
		t.Fatalf("RenewAll: %d renewed, %d lost for %d grants", len(renewed), len(lost), len(gs))
	}
	for i, g := range gs {
		if reason, ok := lostAt[i]; ok {
			if renewed[i] != (leasecore.Grant{}) {
				t.Errorf("grant %d (%s): renewed %+v, want it lost", i, g.Name, renewed[i])
			}
			backendtest.WantHold(t, lost[i], leasecore.ErrLost, "renew", reason)
			if he := holdErr(lost[i]); he.Name != g.Name || he.Token != g.Token || he.Holder != g.Holder {
				t.Errorf("grant %d: %+v", i, he)
			}
			continue
		}
		r := renewed[i]
		if lost[i] != nil || r.Name != g.Name || r.Holder != g.Holder || r.Token != g.Token || r.TTL != g.TTL ||
			r.Start.Before(before) || r.Start.After(after) || r.Space == "" {
			t.Errorf("grant %d (%s): renewed %+v, lost %v; want it renewed with token %d, Start within [%v, %v]",
				i, g.Name, r, lost[i], g.Token, before, after)
		}
	}
	return renewed
}

// without returns gs without the grants at the given indexes.
func without(gs []leasecore.Grant, drop ...int) []leasecore.Grant {
	var out []leasecore.Grant
next:
	for i, g := range gs {
		for _, d := range drop {
			if i == d {
				continue next
			}
		}
		out = append(out, g)
	}
	return out
}

// TestRenewAllFastPathOneGetOneKeepAlive: the first RenewAll of 200 names
// reads every key (2 transactions, the first also creates the generation
// key); the next ones send one Range (the generation key) and one
// keep-alive, and reset the etcd lease's TTL all the same.
func TestRenewAllFastPathOneGetOneKeepAlive(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	const ttl = 5 * time.Second
	gs := acquireN(t, s, "shard", "holder-a", 200, ttl)
	id := f.leaseOf(t, gs[0].Name)

	renewAllCalls(t, s, rc, gs, "Txn Txn LeaseKeepAlive", nil)
	if got := f.attached(t, id); got != len(gs)+1 {
		t.Errorf("etcd lease %x carries %d keys, want the %d names and the generation key", id, got, len(gs))
	}
	for round := range 3 {
		time.Sleep(1100 * time.Millisecond) // let the TTL run down, to see it reset
		renewed := renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)
		if ttlResp, err := f.cli.TimeToLive(context.Background(), id); err != nil || ttlResp.TTL < 4 {
			t.Fatalf("round %d: etcd lease after RenewAll: %+v, %v; want its TTL reset", round, ttlResp, err)
		}
		for i := range renewed {
			if !renewed[i].Start.Equal(renewed[0].Start) {
				t.Fatalf("round %d: grant %d Start %v, grant 0 %v: want the one keep-alive's", round, i, renewed[i].Start, renewed[0].Start)
			}
		}
		gs = renewed
	}

	// A subset of the verified names is on the fast path too.
	renewAllCalls(t, s, rc, gs[10:20], "LeaseKeepAlive Range", nil)
}

// TestRenewAllFastAfterAcquireAll: AcquireAll's transactions rewrite the
// holder's generation key, so the store knows the names it created as
// verified: the holder's first RenewAll of them is already on the fast
// path (one Range, one keep-alive), with no write. Renewals that write
// queue behind acquires on a cluster whose writes are saturated, which is
// what lost most of a million leases on 3 members (docs/capacity.md).
// After a release through another store (which deletes the generation
// keys) the next RenewAll runs the full check again and finds the name
// gone.
func TestRenewAllFastAfterAcquireAll(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	const ttl = 5 * time.Second
	names := allNames("batch", 300) // three transactions
	gs, errs, err := s.AcquireAll(context.Background(), names, "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("%s: %v", names[i], e)
		}
	}
	id := f.leaseOf(t, gs[0].Name)
	if got := f.attached(t, id); got != len(gs)+1 {
		t.Errorf("etcd lease %x carries %d keys, want the %d names and the generation key", id, got, len(gs))
	}
	gs = renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)
	gs = renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	// A second AcquireAll of the holder keeps the first one's names
	// verified (the generation key had the revision the store saw).
	more, _, err := s.AcquireAll(context.Background(), allNames("more", 5), "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	gs = renewAllCalls(t, s, rc, append(gs, more...), "LeaseKeepAlive Range", nil)

	other := sharedStore(t, f, f.cli)
	if err := other.Release(context.Background(), gs[7]); err != nil {
		t.Fatal(err)
	}
	renewAllCalls(t, s, rc, gs, "", map[int]string{7: "no such lease (expired or released)"})
}

// TestRenewAllFastPathMissesRawDelete shows the documented limitation, and
// with it that the fast path reads no name's key: a key deleted by hand
// (a raw delete, not Release or TakeOver) is still reported renewed, until
// the holder's generation keys are deleted by hand too — then the next
// RenewAll checks every name and reports it lost.
func TestRenewAllFastPathMissesRawDelete(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 5, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)

	if resp, err := f.cli.Delete(ctx, f.layout(t).Lease(gs[2].Name)); err != nil || resp.Deleted != 1 {
		t.Fatalf("raw delete: %+v, %v", resp, err)
	}
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil) // the limitation

	prefix := f.layout(t).HolderGenPrefix("holder-a")
	if resp, err := f.cli.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil || resp.Deleted != 1 {
		t.Fatalf("delete of %s: %+v, %v; want the one generation key deleted", prefix, resp, err)
	}
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range Txn LeaseKeepAlive", map[int]string{2: "no such lease (expired or released)"})
	renewAllCalls(t, s, rc, without(gs, 2), "LeaseKeepAlive Range", nil)
}

// TestRenewAllFastReleaseThroughOtherStore: the holder releases one name
// through another store (another client): the first store's next RenewAll
// reports that name lost and the others renewed, and its fast path comes
// back for the names it still holds.
func TestRenewAllFastReleaseThroughOtherStore(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	other := sharedStore(t, f, etcdtest.Client(t))
	defer other.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 10, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	gs = renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	if err := other.Release(ctx, gs[3]); err != nil {
		t.Fatal(err)
	}
	// One Range finds the generation key gone, then the full check.
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range Txn LeaseKeepAlive", map[int]string{3: "no such lease (expired or released)"})
	rest := renewAllCalls(t, s, rc, without(gs, 3), "LeaseKeepAlive Range", nil)

	// A name the other store acquired for the holder (on its own shared
	// lease) and released again is no concern of the first store's, but
	// its release still sends the first store back to the full check.
	g, err := other.Acquire(ctx, "elsewhere", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	renewAllCalls(t, s, rc, rest, "LeaseKeepAlive Range Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, rest, "LeaseKeepAlive Range", nil)
}

// TestRenewAllFastReleaseThroughSameStore: a Release through the store that
// verified the names rewrites the generation key and keeps the others on
// the fast path; the released name's grant is lost, and a RenewAll with it
// runs the full check.
func TestRenewAllFastReleaseThroughSameStore(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 6, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)

	rc.take()
	if err := s.Release(ctx, gs[1]); err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "Txn" {
		t.Errorf("shared Release: calls %q, want one Txn", got)
	}
	renewAllCalls(t, s, rc, without(gs, 1), "LeaseKeepAlive Range", nil)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", map[int]string{1: "no such lease (expired or released)"})

	// Two releases in a row, the second of a name acquired again (a new
	// token): still the fast path for the rest.
	again, err := s.Acquire(ctx, gs[1].Name, "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	gs[1] = again
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	if err := s.Release(ctx, gs[4]); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, gs[1]); err != nil {
		t.Fatal(err)
	}
	renewAllCalls(t, s, rc, without(gs, 1, 4), "LeaseKeepAlive Range", nil)
}

// TestRenewAllFastReleaseOffTheStoresLease: a Release through the store
// that verified names, of a name on an etcd lease other than the store's
// (acquired through another store), fails its compare on the lease, reads
// the key, and releases it with a second transaction that deletes all the
// holder's generation keys: the store's next RenewAll checks every name. A
// Release through the store after another store deleted the generation
// keys rewrites the key, finds it changed, and keeps nothing verified; a
// Release of a grant already lost reads the key once, as without a
// verified name.
func TestRenewAllFastReleaseOffTheStoresLease(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	other := sharedStore(t, f, etcdtest.Client(t))
	defer other.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 6, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)

	og, err := other.Acquire(ctx, "on-other", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rc.take()
	if err := s.Release(ctx, og); err != nil {
		t.Fatal(err)
	}
	// The read between the transactions is of the key and its line of
	// waiters, in one read-only Txn.
	if got := rc.take(); got != "Txn Txn Txn" {
		t.Errorf("Release of a name on another store's lease: calls %q, want %q", got, "Txn Txn Txn")
	}
	if st, err := f.leases.Inspect(ctx, og.Name); err != nil || st.Exists {
		t.Fatalf("after the Release: %+v, %v; want the name free", st, err)
	}
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	// Another store releases a verified name (and deletes the generation
	// keys); then a Release through s finds its generation key changed.
	if err := other.Release(ctx, gs[0]); err != nil {
		t.Fatal(err)
	}
	rc.take()
	if err := s.Release(ctx, gs[1]); err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "Txn" {
		t.Errorf("Release through the store: calls %q, want one Txn", got)
	}
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", map[int]string{
		0: "no such lease (expired or released)", 1: "no such lease (expired or released)"})
	rest := renewAllCalls(t, s, rc, without(gs, 0, 1), "LeaseKeepAlive Range", nil)

	// Released twice: lost, one read to say why.
	rc.take()
	err = s.Release(ctx, gs[1])
	backendtest.WantHold(t, err, leasecore.ErrLost, "release", "no such lease (expired or released)")
	if got := rc.take(); got != "Txn Txn" {
		t.Errorf("Release of a released grant: calls %q, want %q", got, "Txn Txn")
	}
	renewAllCalls(t, s, rc, rest, "LeaseKeepAlive Range", nil)
}

// isRead reports whether a unary etcd call only reads: a Range, or a Txn
// whose operations are all ranges.
func isRead(method string, req any) bool {
	if strings.HasSuffix(method, "/Range") {
		return true
	}
	txn, ok := req.(*etcdserverpb.TxnRequest)
	if !ok || len(txn.Success)+len(txn.Failure) == 0 {
		return false
	}
	for _, op := range append(slices.Clone(txn.Success), txn.Failure...) {
		if op.GetRequestRange() == nil {
			return false
		}
	}
	return true
}

// failingReadsClient returns a client of the shared server whose reads
// (isRead) fail while the returned flag is set, with an error the client
// does not retry.
func failingReadsClient(t *testing.T) (*clientv3.Client, *atomic.Bool) {
	t.Helper()
	fail := new(atomic.Bool)
	cli := dialWith(t, etcdtest.Server(t).Endpoints(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if fail.Load() && isRead(method, req) {
				return status.Error(codes.ResourceExhausted, "injected: the read fails") // not retried by the client
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	return cli, fail
}

// TestReleaseOffTheStoresLeaseReadFails: when the read after a failed
// compare on the key's etcd lease fails, Release returns that error, not
// leasecore.ErrLost, and the name stays held: the key may still be the
// grant's, as it is here. Released again once the read works, it is
// released.
func TestReleaseOffTheStoresLeaseReadFails(t *testing.T) {
	f := newFixture(t)
	cli, failRange := failingReadsClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	other := sharedStore(t, f, etcdtest.Client(t))
	defer other.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 2, time.Minute)
	if _, _, err := s.RenewAll(ctx, gs); err != nil { // the store reads its generation key
		t.Fatal(err)
	}
	og, err := other.Acquire(ctx, "on-other", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	failRange.Store(true)
	err = s.Release(ctx, og)
	failRange.Store(false)
	if !errors.Is(err, leasecore.ErrUnavailable) || errors.Is(err, leasecore.ErrLost) {
		t.Fatalf("Release with the read failing: %v; want ErrUnavailable, not ErrLost", err)
	}
	if st, err := f.leases.Inspect(ctx, og.Name); err != nil || !st.Exists || st.Token != og.Token {
		t.Fatalf("after the failed Release: %+v, %v; want the name still held with token %d", st, err, og.Token)
	}
	if err := s.Release(ctx, og); err != nil {
		t.Fatal(err)
	}
	if st, err := f.leases.Inspect(ctx, og.Name); err != nil || st.Exists {
		t.Fatalf("after the Release: %+v, %v; want the name free", st, err)
	}
}

// TestRenewAllFastTakeOver: an operator's TakeOver of one name (through
// another store) makes the holder's next RenewAll report it lost, and the
// other names renewed.
func TestRenewAllFastTakeOver(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 8, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	sharedOp := sharedStore(t, f, etcdtest.Client(t))
	defer sharedOp.Close()
	for _, op := range []*fenceetcd.LeaseStore{f.leases, sharedOp} {
		taken, prev, err := op.TakeOver(ctx, gs[2].Name, "operator", time.Minute)
		if err != nil || prev.Holder != "holder-a" || prev.Token != gs[2].Token {
			t.Fatalf("TakeOver (shared %v): %+v, %+v, %v", op.Shared(), taken, prev, err)
		}
		renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range Txn LeaseKeepAlive", map[int]string{
			2: fmt.Sprintf(`token %d was superseded by token %d (holder "operator")`, gs[2].Token, taken.Token)})
		if st, err := f.leases.Inspect(ctx, gs[2].Name); err != nil || st.Holder != "operator" || st.Token != taken.Token {
			t.Fatalf("after the holder's RenewAll: %+v, %v", st, err)
		}
		if err := op.Release(ctx, taken); err != nil {
			t.Fatal(err)
		}
		// The holder acquires it back; one full check, then the fast
		// path again.
		if gs[2], err = s.Acquire(ctx, gs[2].Name, "holder-a", time.Minute); err != nil {
			t.Fatal(err)
		}
		renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
		renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)
	}
}

// TestRenewAllFastExpiry: when the shared etcd lease expires every name is
// lost, and the generation key went with the lease; when it goes between
// the fast path's read of the generation key and its keep-alive, every name
// is lost as "expired", and the next acquire grants a new lease.
func TestRenewAllFastExpiry(t *testing.T) {
	t.Run("expired", func(t *testing.T) {
		f := newFixture(t)
		cli, rc := countingClient(t)
		s := sharedStore(t, f, cli)
		defer s.Close()
		gs := acquireN(t, s, "shard", "holder-a", 4, 2*time.Second)
		renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
		renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)
		waitGone(t, f, gs[0].Name)
		if snap := f.snapshot(t); snap != "0 keys\n" {
			t.Fatalf("after expiry:\n%s\nwant no key (the generation key goes with the lease)", snap)
		}
		gone := map[int]string{}
		for i := range gs {
			gone[i] = "no such lease (expired or released)"
		}
		renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range Txn", gone)
		renewAllCalls(t, s, rc, gs, "Txn", gone)
	})

	// The fast path sends the keep-alive, then reads the generation key:
	// here the server handles the keep-alive only after the read, and the
	// lease is revoked in between (the test holds the keep-alive back in
	// the client until the read is answered and the lease revoked).
	t.Run("between the read and the keep-alive", func(t *testing.T) {
		f := newFixture(t)
		var revokeAfterGenRead, holdKeepAlive atomic.Bool
		var id atomic.Int64
		var rc rpcCounter
		revoked := make(chan struct{})
		held := make(chan error, 1)
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   etcdtest.Server(t).Endpoints(),
			Logger:      zap.NewNop(),
			DialTimeout: 30 * time.Second,
			DialOptions: []grpc.DialOption{
				grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
					cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					rc.record(method)
					err := invoker(ctx, method, req, reply, cc, opts...)
					k, ok := req.(interface{ GetKey() []byte })
					if err == nil && ok && strings.Contains(string(k.GetKey()), "/holdergen/") &&
						strings.HasSuffix(method, "/Range") && revokeAfterGenRead.CompareAndSwap(true, false) {
						if _, err := f.cli.Revoke(ctx, clientv3.LeaseID(id.Load())); err != nil {
							return fmt.Errorf("test revoke: %w", err)
						}
						close(revoked)
					}
					return err
				}),
				grpc.WithChainStreamInterceptor(rc.streams, func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
					method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
					st, err := streamer(ctx, desc, cc, method, opts...)
					if err != nil {
						return nil, err
					}
					return heldStream{st, &holdKeepAlive, revoked, held}, nil
				}),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		s := sharedStore(t, f, cli)
		defer s.Close()
		gs := acquireN(t, s, "shard", "holder-a", 4, time.Minute)
		id.Store(int64(f.leaseOf(t, gs[0].Name)))
		renewAllCalls(t, s, &rc, gs, "Txn LeaseKeepAlive", nil)
		revokeAfterGenRead.Store(true)
		holdKeepAlive.Store(true)
		expired := map[int]string{}
		for i := range gs {
			expired[i] = "expired"
		}
		renewAllCalls(t, s, &rc, gs, "LeaseKeepAlive Range", expired)
		if revokeAfterGenRead.Load() {
			t.Fatal("the fast path did not read the generation key")
		}
		if err := <-held; err != nil {
			t.Fatalf("the held keep-alive: %v", err)
		}
		// The store forgot the lease: the next acquire grants another.
		rc.take()
		g, err := s.Acquire(context.Background(), "after", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if got := rc.take(); got != "LeaseGrant Txn" {
			t.Errorf("acquire after the lease was found gone: calls %q, want %q", got, "LeaseGrant Txn")
		}
		renewAllCalls(t, s, &rc, []leasecore.Grant{g}, "Txn LeaseKeepAlive", nil)
		renewAllCalls(t, s, &rc, []leasecore.Grant{g}, "LeaseKeepAlive Range", nil)
	})
}

// TestRenewAllFastNewGrant: a grant the last full check did not see (its
// name acquired since, or released and acquired again with a new token)
// takes the full path, with correct results, and the fast path comes back
// after it. Grants of two TTLs always take the full path.
func TestRenewAllFastNewGrant(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	other := sharedStore(t, f, etcdtest.Client(t))
	defer other.Close()
	ctx := context.Background()
	gs := acquireN(t, s, "shard", "holder-a", 5, time.Minute)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	// Acquired since: the full check (no Range first), then fast.
	g, err := s.Acquire(ctx, "new", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	gs = append(gs, g)
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	// A stale grant of a verified name: released through another store
	// and acquired again; the old grant is lost, the new one renewed.
	old := gs[0]
	if err := other.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	if gs[0], err = s.Acquire(ctx, old.Name, "holder-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	renewAllCalls(t, s, rc, append([]leasecore.Grant{old}, gs[1:]...), "LeaseKeepAlive Range Txn LeaseKeepAlive",
		map[int]string{0: fmt.Sprintf(`token %d was superseded by token %d (holder "holder-a")`, old.Token, gs[0].Token)})
	renewAllCalls(t, s, rc, gs, "Txn LeaseKeepAlive", nil)
	renewAllCalls(t, s, rc, gs, "LeaseKeepAlive Range", nil)

	// A name of the holder on another store's lease (verified nowhere
	// here): full check, each time.
	og, err := other.Acquire(ctx, "on-other", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		renewAllCalls(t, s, rc, append(gs, og), "Txn LeaseKeepAlive LeaseKeepAlive", nil)
	}

	// Two TTLs: the full check each time, both leases kept alive.
	long := acquireN(t, s, "long", "holder-a", 2, 2*time.Minute)
	for range 2 {
		renewAllCalls(t, s, rc, append(gs, long...), "Txn LeaseKeepAlive LeaseKeepAlive", nil)
	}
	renewAllCalls(t, s, rc, long, "LeaseKeepAlive Range", nil)
}

// TestRenewAllFastConcurrent: RenewAll, Release, Acquire and another
// store's release run at once on one store (run with -race); afterwards a
// RenewAll reports exactly the names that are still the holder's.
func TestRenewAllFastConcurrent(t *testing.T) {
	f := newFixture(t)
	s := sharedStore(t, f, f.cli)
	defer s.Close()
	other := sharedStore(t, f, etcdtest.Client(t))
	defer other.Close()
	ctx := context.Background()
	const n = 40
	gs := acquireN(t, s, "shard", "holder-a", n, time.Minute)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, err := s.RenewAll(ctx, gs); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	released := make([]bool, n)
	for i := range n / 2 {
		store := s
		if i%3 == 0 {
			store = other
		}
		if err := store.Release(ctx, gs[2*i]); err != nil {
			t.Fatal(err)
		}
		released[2*i] = true
		if _, err := s.Acquire(ctx, fmt.Sprintf("extra-%d", i), "holder-a", time.Minute); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	for range 2 { // the same answers twice, whichever path each takes
		renewed, lost, err := s.RenewAll(ctx, gs)
		if err != nil {
			t.Fatal(err)
		}
		for i := range gs {
			switch {
			case released[i] && (lost[i] == nil || !errors.Is(lost[i], leasecore.ErrLost)):
				t.Fatalf("released grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
			case !released[i] && (lost[i] != nil || renewed[i].Token != gs[i].Token):
				t.Fatalf("held grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
			}
		}
		var held []leasecore.Grant
		for i, g := range gs {
			if !released[i] {
				held = append(held, g)
			}
		}
		gs, released = held, make([]bool, len(held))
	}
}

// heldStream, once hold is set, sends the next message only after release
// is closed (in a goroutine: SendMsg returns at once), and reports the
// send's error on sent.
type heldStream struct {
	grpc.ClientStream
	hold    *atomic.Bool
	release <-chan struct{}
	sent    chan<- error
}

func (s heldStream) SendMsg(m any) error {
	if !s.hold.CompareAndSwap(true, false) {
		return s.ClientStream.SendMsg(m)
	}
	go func() {
		<-s.release
		s.sent <- s.ClientStream.SendMsg(m)
	}()
	return nil
}
