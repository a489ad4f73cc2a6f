package fenceetcd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// TestRenewAll: one call renews a holder's leases and reports, in order,
// the ones it lost — one released, one taken over by another holder —
// without touching the other holder's; in shared mode with one keep-alive,
// without it with one per name.
func TestRenewAll(t *testing.T) {
	for _, mode := range []struct {
		name   string
		opts   []fenceetcd.Option
		shared bool
	}{{"per-acquire-lease", nil, false}, {"shared-leases", []fenceetcd.Option{fenceetcd.WithSharedLeases()}, true}} {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t)
			cli, rc := countingClient(t)
			s, err := fenceetcd.NewLeaseStore(cli, append([]fenceetcd.Option{fenceetcd.WithPrefix(f.prefix)}, mode.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			const ttl = 5 * time.Second
			var gs []leasecore.Grant
			for i := range 6 {
				g, err := s.Acquire(ctx, fmt.Sprintf("shard-%d", i), "holder-a", ttl)
				if err != nil {
					t.Fatal(err)
				}
				gs = append(gs, g)
			}
			if err := s.Release(ctx, gs[1]); err != nil {
				t.Fatal(err)
			}
			if err := s.Release(ctx, gs[3]); err != nil {
				t.Fatal(err)
			}
			taken, err := f.leases.Acquire(ctx, "shard-3", "holder-b", time.Minute)
			if err != nil {
				t.Fatal(err)
			}

			time.Sleep(1500 * time.Millisecond) // let the TTLs run down, to see them reset
			rc.take()
			before := time.Now()
			renewed, lost, err := s.RenewAll(ctx, gs)
			if err != nil {
				t.Fatal(err)
			}
			calls := rc.take()
			want := "Txn LeaseKeepAlive"
			if !mode.shared {
				want = "Txn" + strings.Repeat(" LeaseKeepAlive", 4)
			}
			if calls != want {
				t.Errorf("calls %q, want %q", calls, want)
			}
			if len(renewed) != len(gs) || len(lost) != len(gs) {
				t.Fatalf("%d renewed, %d lost for %d grants", len(renewed), len(lost), len(gs))
			}
			for _, i := range []int{0, 2, 4, 5} {
				r := renewed[i]
				if lost[i] != nil || r.Name != gs[i].Name || r.Holder != "holder-a" || r.Token != gs[i].Token || r.TTL != ttl ||
					r.Start.Before(before) || r.Start.After(time.Now()) {
					t.Errorf("grant %d: renewed %+v, lost %v", i, r, lost[i])
				}
				if mode.shared && !r.Start.Equal(renewed[0].Start) {
					t.Errorf("grant %d: Start %v, want the one keep-alive's %v", i, r.Start, renewed[0].Start)
				}
				ttlResp, err := f.cli.TimeToLive(ctx, f.leaseOf(t, gs[i].Name))
				if err != nil || ttlResp.TTL < 4 {
					t.Errorf("grant %d: etcd lease after RenewAll: %+v, %v; want its TTL reset", i, ttlResp, err)
				}
			}
			wantHoldErr := func(i int, reason string) {
				t.Helper()
				if renewed[i] != (leasecore.Grant{}) {
					t.Errorf("grant %d: renewed %+v, want nothing", i, renewed[i])
				}
				backendtest.WantHold(t, lost[i], leasecore.ErrLost, "renew", reason)
				if he := holdErr(lost[i]); he.Name != gs[i].Name || he.Token != gs[i].Token || he.Holder != "holder-a" {
					t.Errorf("grant %d: %+v", i, he)
				}
			}
			wantHoldErr(1, "no such lease (expired or released)")
			wantHoldErr(3, fmt.Sprintf(`token %d was superseded by token %d (holder "holder-b")`, gs[3].Token, taken.Token))
			if st, err := f.leases.Inspect(ctx, "shard-3"); err != nil || st.Holder != "holder-b" || st.Token != taken.Token {
				t.Errorf("holder-b's lease after holder-a's RenewAll: %+v, %v", st, err)
			}
		})
	}
}

// TestRenewAllMany: more grants than one transaction may read (128) are
// read in chunks; in shared mode still one keep-alive. Grants of two TTLs
// are two shared leases: two keep-alives.
func TestRenewAllMany(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	defer s.Close()
	ctx := context.Background()
	const n = 300
	var gs []leasecore.Grant
	for i := range n {
		ttl := time.Minute
		if i%100 == 99 {
			ttl = 2 * time.Minute
		}
		g, err := s.Acquire(ctx, fmt.Sprintf("shard-%03d", i), "holder-a", ttl)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	// The last one lost, so the last chunk is checked too.
	if err := s.Release(ctx, gs[n-1]); err != nil {
		t.Fatal(err)
	}
	rc.take()
	renewed, lost, err := s.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rc.take(), "Txn Txn Txn LeaseKeepAlive LeaseKeepAlive"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
	for i := range n - 1 {
		if lost[i] != nil || renewed[i].Name != gs[i].Name || renewed[i].Token != gs[i].Token || renewed[i].TTL != gs[i].TTL {
			t.Fatalf("grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
		}
	}
	backendtest.WantHold(t, lost[n-1], leasecore.ErrLost, "renew", "no such lease (expired or released)")

	// Without shared leases: the same reads, a keep-alive per name.
	var pg []leasecore.Grant
	for i := range 130 {
		g, err := f.leases.Acquire(ctx, fmt.Sprintf("solo-%03d", i), "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		pg = append(pg, g)
	}
	renewed, lost, err = f.leases.RenewAll(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pg {
		if lost[i] != nil || renewed[i].Token != pg[i].Token {
			t.Fatalf("grant %d: renewed %+v, lost %v", i, renewed[i], lost[i])
		}
	}
}

// TestRenewAllAfterExpiry: a renewal after expiry fails for every name of
// the expired lease, even though nobody took over.
func TestRenewAllAfterExpiry(t *testing.T) {
	f := newFixture(t)
	s := sharedStore(t, f, f.cli)
	defer s.Close()
	ctx := context.Background()
	var gs []leasecore.Grant
	for i := range 3 {
		g, err := s.Acquire(ctx, fmt.Sprintf("n%d", i), "holder-a", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	waitGone(t, f, "n0")
	snap := f.snapshot(t)
	renewed, lost, err := s.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range gs {
		if renewed[i] != (leasecore.Grant{}) {
			t.Errorf("grant %d renewed after expiry: %+v", i, renewed[i])
		}
		backendtest.WantHold(t, lost[i], leasecore.ErrLost, "renew", "no such lease (expired or released)")
	}
	if got := f.snapshot(t); got != snap {
		t.Fatalf("a failed RenewAll changed the keys:\n%s\n->\n%s", snap, got)
	}
}

func holdErr(err error) *leasecore.HoldError {
	he, _ := err.(*leasecore.HoldError)
	if he == nil {
		return &leasecore.HoldError{}
	}
	return he
}
