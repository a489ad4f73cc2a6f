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

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// sharedStore returns a lease store with shared leases on cli under f's
// prefix.
func sharedStore(t *testing.T, f *fixture, cli *clientv3.Client) *fenceetcd.LeaseStore {
	t.Helper()
	s, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(f.prefix), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Shared() {
		t.Fatal("WithSharedLeases: Shared() is false")
	}
	return s
}

// leaseOf returns the etcd lease a name's key is attached to; 0 when the
// key does not exist.
func (f *fixture) leaseOf(t *testing.T, name string) clientv3.LeaseID {
	t.Helper()
	resp, err := f.cli.Get(context.Background(), f.layout(t).Lease(name))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// attached returns the number of keys attached to etcd lease id, or -1
// when the lease does not exist.
func (f *fixture) attached(t *testing.T, id clientv3.LeaseID) int {
	t.Helper()
	resp, err := f.cli.TimeToLive(context.Background(), id, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if resp.TTL == -1 {
		return -1
	}
	return len(resp.Keys)
}

// etcdLeases returns the set of etcd leases that exist.
func (f *fixture) etcdLeases(t *testing.T) map[clientv3.LeaseID]bool {
	t.Helper()
	resp, err := f.cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		m[l.ID] = true
	}
	return m
}

// TestSharedLeasesOneEtcdLease: many names of one holder hang on one etcd
// lease, each with its own key and its own, strictly increasing token;
// releasing some leaves the lease and the others alone; another holder gets
// a lease of its own.
func TestSharedLeasesOneEtcdLease(t *testing.T) {
	f := newFixture(t)
	s := sharedStore(t, f, f.cli)
	ctx := context.Background()
	before := f.etcdLeases(t)

	const n = 10
	var gs []leasecore.Grant
	for i := range n {
		g, err := s.Acquire(ctx, fmt.Sprintf("shard-%d", i), "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, rev, _ := f.get(t, f.layout(t).Lease(g.Name)); leasecore.Token(rev) != g.Token {
			t.Fatalf("%s: token %d, mod revision %d", g.Name, g.Token, rev)
		}
		if i > 0 && g.Token <= gs[i-1].Token {
			t.Fatalf("token %d after %d: not strictly increasing", g.Token, gs[i-1].Token)
		}
		gs = append(gs, g)
	}
	id := f.leaseOf(t, "shard-0")
	for _, g := range gs {
		if got := f.leaseOf(t, g.Name); got != id {
			t.Fatalf("%s is on etcd lease %x, shard-0 on %x", g.Name, got, id)
		}
	}
	var added []clientv3.LeaseID
	for l := range f.etcdLeases(t) {
		if !before[l] {
			added = append(added, l)
		}
	}
	if len(added) != 1 || added[0] != id {
		t.Fatalf("%d names granted etcd leases %x, want exactly the one %x", n, added, id)
	}
	if got := f.attached(t, id); got != n {
		t.Fatalf("etcd lease %x carries %d keys, want %d", id, got, n)
	}

	// The holder itself is refused a name it holds.
	if _, err := s.Acquire(ctx, "shard-0", "holder-a", time.Minute); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("acquire of a held name: %v", err)
	}

	// Release does not revoke: the other names stay held.
	for _, g := range gs[:3] {
		if err := s.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.attached(t, id); got != n-3 {
		t.Fatalf("after 3 releases etcd lease %x carries %d keys, want %d", id, got, n-3)
	}
	for _, g := range gs[3:] {
		st, err := s.Inspect(ctx, g.Name)
		if err != nil || !st.Held || st.Token != g.Token || st.Holder != "holder-a" {
			t.Fatalf("%s after the other names' release: %+v, %v", g.Name, st, err)
		}
	}
	_, err := s.Renew(ctx, gs[0])
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease (expired or released)")
	backendtest.WantHold(t, s.Release(ctx, gs[0]), leasecore.ErrLost, "release", "no such lease (expired or released)")

	// A released name is acquired again on the same lease, with a larger
	// token.
	again, err := s.Acquire(ctx, gs[0].Name, "holder-a", time.Minute)
	if err != nil || again.Token <= gs[n-1].Token || f.leaseOf(t, again.Name) != id {
		t.Fatalf("re-acquire: %+v, %v (lease %x, want %x)", again, err, f.leaseOf(t, again.Name), id)
	}

	// Another holder, or another TTL, is another etcd lease.
	gb, err := s.Acquire(ctx, "b-0", "holder-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ga2, err := s.Acquire(ctx, "a-2m", "holder-a", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if b, a2 := f.leaseOf(t, gb.Name), f.leaseOf(t, ga2.Name); b == id || a2 == id || a2 == b {
		t.Fatalf("holder-b's lease %x, holder-a's 2-minute lease %x, holder-a's 1-minute lease %x: want three", b, a2, id)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLeaseStart: a grant's Start is the shared lease's refresh
// start, not the time of the acquire: a second acquire soon after the first
// reports the first's Start; once a third of the TTL has passed, an acquire
// refreshes the lease first (one keep-alive) and Start moves; a Renew is a
// refresh too.
func TestSharedLeaseStart(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	ctx := context.Background()
	const ttl = 3 * time.Second // a refresh is due after 1s
	acquire := func(name, wantCalls string) leasecore.Grant {
		t.Helper()
		rc.take()
		g, err := s.Acquire(ctx, name, "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if got := rc.take(); got != wantCalls {
			t.Fatalf("acquire %s: calls %q, want %q", name, got, wantCalls)
		}
		return g
	}

	b1 := time.Now()
	g1 := acquire("n1", "LeaseGrant Txn")
	if g1.Start.Before(b1) || g1.Start.After(time.Now()) {
		t.Fatalf("first Start %v not within the call (from %v)", g1.Start, b1)
	}
	time.Sleep(300 * time.Millisecond)
	b2 := time.Now()
	g2 := acquire("n2", "Txn")
	if !g2.Start.Equal(g1.Start) || !g2.Start.Before(b2) {
		t.Fatalf("second Start %v, want the shared lease's refresh start %v, before the call (%v)", g2.Start, g1.Start, b2)
	}

	time.Sleep(time.Until(g1.Start.Add(ttl/3 + 100*time.Millisecond)))
	b3 := time.Now()
	g3 := acquire("n3", "LeaseKeepAlive Txn") // refreshed first
	if g3.Start.Before(b3) || g3.Start.After(time.Now()) {
		t.Fatalf("Start after a refresh %v, want within the call (from %v)", g3.Start, b3)
	}
	g4 := acquire("n4", "Txn")
	if !g4.Start.Equal(g3.Start) {
		t.Fatalf("Start %v, want the refresh start %v", g4.Start, g3.Start)
	}

	time.Sleep(200 * time.Millisecond)
	rc.take()
	r1, err := s.Renew(ctx, g1)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "Txn LeaseKeepAlive" {
		t.Fatalf("renew: calls %q", got)
	}
	if !r1.Start.After(g4.Start) || r1.Token != g1.Token {
		t.Fatalf("renewed %+v, want a Start after %v", r1, g4.Start)
	}
	g5 := acquire("n5", "Txn")
	if !g5.Start.Equal(r1.Start) {
		t.Fatalf("Start %v after a renew, want the renew's start %v", g5.Start, r1.Start)
	}
	id := f.leaseOf(t, "n1")
	for _, n := range []string{"n2", "n3", "n4", "n5"} {
		if f.leaseOf(t, n) != id {
			t.Fatalf("%s is not on n1's etcd lease %x", n, id)
		}
	}

	// Safety: the key lives at least until Start + TTL by the local clock.
	// Stop renewing and watch n5, whose Start is the last refresh.
	waitGone(t, f, "n5")
	if gone := time.Now(); gone.Before(g5.Start.Add(ttl)) {
		t.Fatalf("n5 expired at %v, before its Start + TTL %v", gone, g5.Start.Add(ttl))
	}
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		if f.leaseOf(t, n) != 0 {
			t.Fatalf("%s outlived its shared lease", n)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLeaseExpired: after the shared lease expired, unrenewed, the
// next acquire grants a new one and works; when the lease is revoked behind
// the store's back, the put fails, and the acquire grants a new lease and
// tries once more.
func TestSharedLeaseExpired(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	ctx := context.Background()

	g1, err := s.Acquire(ctx, "n1", "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old := f.leaseOf(t, "n1")
	waitGone(t, f, "n1")
	rc.take()
	g2, err := s.Acquire(ctx, "n2", "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "LeaseGrant Txn" {
		t.Fatalf("acquire after expiry: calls %q, want a new lease", got)
	}
	if l := f.leaseOf(t, "n2"); l == old || l == 0 {
		t.Fatalf("n2 on etcd lease %x; the expired one was %x", l, old)
	}
	g1b, err := s.Acquire(ctx, "n1", "holder-a", time.Second)
	if err != nil || g1b.Token <= g2.Token || g2.Token <= g1.Token {
		t.Fatalf("re-acquire n1: %+v, %v (tokens %d, %d)", g1b, err, g1.Token, g2.Token)
	}

	// Revoked behind the store's back (a refresh is not due: the TTL is a
	// minute): the put finds no lease, a new one is granted, the put is
	// sent again.
	g3, err := s.Acquire(ctx, "n3", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	revoked := f.leaseOf(t, "n3")
	if _, err := f.cli.Revoke(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	rc.take()
	g4, err := s.Acquire(ctx, "n4", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "Txn LeaseGrant Txn" {
		t.Fatalf("acquire on a revoked shared lease: calls %q", got)
	}
	if l := f.leaseOf(t, "n4"); l == revoked || l == 0 || g4.Token <= g3.Token {
		t.Fatalf("n4 on etcd lease %x (revoked: %x), token %d", l, revoked, g4.Token)
	}
	_, err = s.Renew(ctx, g3)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease (expired or released)")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedRenewKeepsAllNames: renewing one name keeps every name of the
// holder alive — they live and die together — and once renewal stops they
// expire together.
func TestSharedRenewKeepsAllNames(t *testing.T) {
	f := newFixture(t)
	s := sharedStore(t, f, f.cli)
	ctx := context.Background()
	g1, err := s.Acquire(ctx, "n1", "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.Acquire(ctx, "n2", "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		if g1, err = s.Renew(ctx, g1); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Inspect(ctx, "n2")
	if err != nil || !st.Held || st.Token != g2.Token {
		t.Fatalf("n2, never renewed itself, after 3s of n1's renewals: %+v, %v", st, err)
	}
	waitGone(t, f, "n1")
	if f.leaseOf(t, "n2") != 0 {
		t.Fatal("n2 outlived n1 on their shared lease")
	}
}

// TestSharedClose: Close revokes every shared lease, so all names are free
// at once; afterwards Acquire fails and changes nothing; Close without
// shared leases revokes nothing.
func TestSharedClose(t *testing.T) {
	f := newFixture(t)
	s := sharedStore(t, f, f.cli)
	ctx := context.Background()
	var ids []clientv3.LeaseID
	var gs []leasecore.Grant
	for i, h := range []string{"holder-a", "holder-a", "holder-a", "holder-b", "holder-b"} {
		g, err := s.Acquire(ctx, fmt.Sprintf("n%d", i), h, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		ids = append(ids, f.leaseOf(t, g.Name))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		if f.leaseOf(t, g.Name) != 0 || f.attached(t, ids[i]) != -1 {
			t.Fatalf("%s or its etcd lease %x survived Close", g.Name, ids[i])
		}
	}
	snap := f.snapshot(t)
	_, err := s.Acquire(ctx, "n9", "holder-a", time.Hour)
	if !errors.Is(err, fenceetcd.ErrStoreClosed) || !errors.Is(err, leasecore.ErrClosed) {
		t.Fatalf("acquire after Close: %v", err)
	}
	if got := f.snapshot(t); got != snap {
		t.Fatalf("acquire after Close changed the keys:\n%s\n->\n%s", snap, got)
	}
	_, err = s.Renew(ctx, gs[0])
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease (expired or released)")
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The names are free at once for another store.
	if _, err := f.leases.Acquire(ctx, "n0", "holder-c", time.Minute); err != nil {
		t.Fatal(err)
	}

	// Without shared leases Close revokes nothing; Acquire fails after it.
	g, err := f.leases.Acquire(ctx, "solo", "holder-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.leases.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := f.leases.Inspect(ctx, "solo"); err != nil || !st.Held {
		t.Fatalf("per-acquire lease after Close: %+v, %v", st, err)
	}
	if _, err := f.leases.Acquire(ctx, "other", "holder-a", time.Hour); !errors.Is(err, fenceetcd.ErrStoreClosed) {
		t.Fatalf("acquire after Close: %v", err)
	}
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatalf("release after Close: %v", err)
	}
}

// TestSharedConcurrent: many goroutines of one holder acquire, renew and
// release at once on one store (run with -race): one Grant in all, every
// name on the one etcd lease.
func TestSharedConcurrent(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	ctx := context.Background()
	const n = 32
	grants := make([]leasecore.Grant, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			if grants[i], errs[i] = s.Acquire(ctx, fmt.Sprintf("n%d", i), "holder-a", time.Minute); errs[i] != nil {
				return
			}
			if grants[i], errs[i] = s.Renew(ctx, grants[i]); errs[i] != nil || i%2 == 0 {
				return
			}
			errs[i] = s.Release(ctx, grants[i])
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
	}
	grantsSent := 0
	for _, c := range strings.Fields(rc.take()) {
		if c == "LeaseGrant" {
			grantsSent++
		}
	}
	if grantsSent != 1 {
		t.Fatalf("%d concurrent acquires of one holder sent %d Grants, want 1", n, grantsSent)
	}
	id := f.leaseOf(t, "n0")
	if got := f.attached(t, id); got != n/2 {
		t.Fatalf("etcd lease %x carries %d keys, want %d", id, got, n/2)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLeasesAcrossStores: two stores (two processes) of different
// holders compete for names as before: tokens increase, a held name is
// refused, Close of one frees its names for the other at once.
func TestSharedLeasesAcrossStores(t *testing.T) {
	f := newFixture(t)
	a, b := sharedStore(t, f, f.cli), sharedStore(t, f, etcdtest.Client(t))
	ctx := context.Background()
	ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "job", "holder-b", time.Minute); !errors.Is(err, leasecore.ErrHeld) {
		t.Fatalf("acquire of a name another store holds: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	gb, err := b.Acquire(ctx, "job", "holder-b", time.Minute)
	if err != nil || gb.Token <= ga.Token {
		t.Fatalf("acquire after the other store's Close: %+v, %v", gb, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
