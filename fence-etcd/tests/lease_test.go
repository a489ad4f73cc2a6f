package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// layout returns the key layout of f's prefix.
func (f *fixture) layout(t *testing.T) etcdkv.Layout {
	t.Helper()
	l, err := etcdkv.NewLayout("test", etcdkv.Options{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeaseLifecycle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const name, ttl = "report-job", 5 * time.Second
	key := f.layout(t).Lease(name)

	before := time.Now()
	ga, err := f.leases.Acquire(ctx, name, "holder-a", ttl)
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	holder, createRev, ok := f.get(t, key)
	if !ok || holder != "holder-a" || leasecore.Token(createRev) != ga.Token {
		t.Fatalf("lease key after acquire: %q create %d (ok=%v), want holder-a create %d", holder, createRev, ok, ga.Token)
	}
	if ga.Token == 0 || ga.Name != name || ga.Holder != "holder-a" || ga.TTL != ttl {
		t.Fatalf("first acquire: got %+v", ga)
	}
	if ga.Start.Before(before) || ga.Start.After(after) {
		t.Fatalf("Start %v not within the call (%v .. %v)", ga.Start, before, after)
	}

	// Held: nobody acquires, the holder itself neither; nothing changes.
	snap := f.snapshot(t)
	for _, h := range []string{"holder-b", "holder-a"} {
		_, err := f.leases.Acquire(ctx, name, h, ttl)
		backendtest.WantHold(t, err, leasecore.ErrHeld, "acquire", fmt.Sprintf(`held by "holder-a" with token %d`, ga.Token))
	}
	if got := f.snapshot(t); got != snap {
		t.Fatalf("refused acquires changed the keys:\n%s\n->\n%s", snap, got)
	}

	st, err := f.leases.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || !st.Held || st.Released || st.Holder != "holder-a" || st.Token != ga.Token ||
		st.Remaining < ttl-2*time.Second || st.Remaining > ttl {
		t.Fatalf("inspect held lease: got %+v", st)
	}

	renewed, err := f.leases.Renew(ctx, ga)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Token != ga.Token || renewed.TTL != ttl || !renewed.Start.After(ga.Start) {
		t.Fatalf("renew: got %+v, want token %d and a later Start than %v", renewed, ga.Token, ga.Start)
	}

	if err := f.leases.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := f.get(t, key); ok {
		t.Fatal("the lease key survived the release")
	}
	// etcd keeps no record of a released lease.
	st, err = f.leases.Inspect(ctx, name)
	if err != nil || st != (leasecore.LeaseState{Name: name}) {
		t.Fatalf("inspect released lease: got %+v, %v; want a lease that does not exist", st, err)
	}

	// Released: release twice and renew after release fail and change nothing.
	snap = f.snapshot(t)
	const gone = "no such lease (expired or released)"
	backendtest.WantHold(t, f.leases.Release(ctx, renewed), leasecore.ErrLost, "release", gone)
	_, err = f.leases.Renew(ctx, renewed)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", gone)
	if got := f.snapshot(t); got != snap {
		t.Fatalf("failed renew/release changed the keys:\n%s\n->\n%s", snap, got)
	}

	// Free at once after release, with a larger token.
	gb, err := f.leases.Acquire(ctx, name, "holder-b", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if gb.Token <= ga.Token {
		t.Fatalf("acquire after release: token %d, want more than %d", gb.Token, ga.Token)
	}

	snap = f.snapshot(t)
	superseded := fmt.Sprintf(`token %d was superseded by token %d (holder "holder-b")`, ga.Token, gb.Token)
	_, err = f.leases.Renew(ctx, ga)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", superseded)
	backendtest.WantHold(t, f.leases.Release(ctx, ga), leasecore.ErrLost, "release", superseded)
	impostor := gb
	impostor.Holder = "x"
	notHeld := fmt.Sprintf(`holder "x" does not hold it (held by "holder-b" with token %d)`, gb.Token)
	_, err = f.leases.Renew(ctx, impostor)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", notHeld)
	backendtest.WantHold(t, f.leases.Release(ctx, impostor), leasecore.ErrLost, "release", notHeld)
	future := gb
	future.Token = gb.Token + 100
	_, err = f.leases.Renew(ctx, future)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew",
		fmt.Sprintf("token %d was never issued (the current is token %d)", future.Token, gb.Token))
	if got := f.snapshot(t); got != snap {
		t.Fatalf("failed renews and releases changed the keys:\n%s\n->\n%s", snap, got)
	}

	missing := gb
	missing.Name = "no-such-lease"
	_, err = f.leases.Renew(ctx, missing)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", gone)
	backendtest.WantHold(t, f.leases.Release(ctx, missing), leasecore.ErrLost, "release", gone)
	st, err = f.leases.Inspect(ctx, missing.Name)
	if err != nil || st.Exists || st.Held || st.Token != 0 {
		t.Fatalf("inspect missing lease: got %+v, %v", st, err)
	}

	// The HoldError carries the grant it refused.
	var he *leasecore.HoldError
	_, err = f.leases.Renew(ctx, ga)
	if !errors.As(err, &he) || he.Name != name || he.Holder != "holder-a" || he.Token != ga.Token {
		t.Fatalf("HoldError fields: got %+v", he)
	}
	if err := f.leases.Release(ctx, gb); err != nil {
		t.Fatal(err)
	}
}

// waitGone waits until the lessor has revoked lease name's etcd lease, and
// its key with it.
func waitGone(t *testing.T, f *fixture, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := f.leases.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Exists {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %q still held after 10s: %+v", name, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRenewAfterExpiry: after expiry by the lessor a renew fails even
// though nobody took over; the holder must acquire again and gets a new,
// larger token.
func TestRenewAfterExpiry(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const name = "report-job"
	g, err := f.leases.Acquire(ctx, name, "holder-a", fenceetcd.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, f, name)

	snap := f.snapshot(t)
	const gone = "no such lease (expired or released)"
	_, err = f.leases.Renew(ctx, g)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", gone)
	backendtest.WantHold(t, f.leases.Release(ctx, g), leasecore.ErrLost, "release", gone)
	if got := f.snapshot(t); got != snap {
		t.Fatalf("renew/release after expiry changed the keys:\n%s\n->\n%s", snap, got)
	}

	g2, err := f.leases.Acquire(ctx, name, "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("re-acquire after expiry: token %d, want more than %d", g2.Token, g.Token)
	}
	if err := f.leases.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}

// TestRenewKeepsLeaseAlive: renewing well within the TTL keeps the lease
// for many TTLs; once renewal stops, the lessor expires it.
func TestRenewKeepsLeaseAlive(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const name = "report-job"
	g, err := f.leases.Acquire(ctx, name, "holder-a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		if g, err = f.leases.Renew(ctx, g); err != nil {
			t.Fatalf("renew while held: %v", err)
		}
	}
	st, err := f.leases.Inspect(ctx, name)
	if err != nil || !st.Held || st.Token != g.Token {
		t.Fatalf("after 3s of renewals: %+v, %v", st, err)
	}
	waitGone(t, f, name)
	_, err = f.leases.Renew(ctx, g)
	backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease (expired or released)")
}

// TestTokensArePutRevisions: every acquire — of a free, released or
// expired lease, of this name or another — issues a token larger than any
// before, and the token is the revision that put the lease key, its mod
// revision (I2).
func TestTokensArePutRevisions(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l := f.layout(t)
	var last leasecore.Token
	for i := range 6 {
		name := []string{"report-job", "other-job"}[i%3/2]
		ttl := time.Minute
		if i%2 == 1 {
			ttl = time.Second // let this one expire instead of releasing it
		}
		g, err := f.leases.Acquire(ctx, name, "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= last {
			t.Fatalf("acquire %d: token %d, not above the previous %d", i, g.Token, last)
		}
		if _, rev, _ := f.get(t, l.Lease(name)); leasecore.Token(rev) != g.Token {
			t.Fatalf("acquire %d: token %d, but the key's mod revision is %d", i, g.Token, rev)
		}
		last = g.Token
		// Unrelated writes advance the cluster's revision between acquires.
		if _, err := f.res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Content: "x", Writer: "w", Token: 1}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			waitGone(t, f, name)
		} else if err := f.leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefusedAcquireRevokesItsLease: an acquire that finds the lease held
// leaves no etcd lease behind, and a release revokes the holder's.
func TestRefusedAcquireRevokesItsLease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	g, err := f.leases.Acquire(ctx, "report-job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.cli.Get(ctx, f.layout(t).Lease("report-job"))
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("lease key: %+v, %v", resp, err)
	}
	held := clientv3.LeaseID(resp.Kvs[0].Lease)
	// Other tests' leases may expire meanwhile, so compare sets: no lease
	// may appear.
	leases := func() map[clientv3.LeaseID]bool {
		resp, err := f.cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[clientv3.LeaseID]bool{}
		for _, l := range resp.Leases {
			m[l.ID] = true
		}
		return m
	}
	before := leases()
	if !before[held] {
		t.Fatalf("lease %x of the held key is not listed", held)
	}
	for range 5 {
		if _, err := f.leases.Acquire(ctx, "report-job", "holder-b", time.Minute); !errors.Is(err, leasecore.ErrHeld) {
			t.Fatalf("acquire of a held lease: %v", err)
		}
	}
	for id := range leases() {
		if !before[id] {
			t.Fatalf("a refused acquire left etcd lease %x behind", id)
		}
	}
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if leases()[held] {
		t.Fatalf("release did not revoke etcd lease %x", held)
	}
}

// TestConcurrentAcquire: of many clients, each with its own connection,
// racing for a free lease, exactly one wins; the rest get ErrHeld.
func TestConcurrentAcquire(t *testing.T) {
	f := newFixture(t)
	const n = 8
	stores := make([]*fenceetcd.LeaseStore, n)
	for i := range stores {
		var err error
		if stores[i], err = fenceetcd.NewLeaseStore(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix)); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = stores[i].Acquire(context.Background(), "report-job", fmt.Sprintf("holder-%d", i), time.Minute)
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, leasecore.ErrHeld):
			t.Fatalf("acquire: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d winners, want 1", won)
	}
}
