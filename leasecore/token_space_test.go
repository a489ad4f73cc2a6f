package leasecore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// spacedLease is a Lease whose grants name a token space, as fencepg's and
// fenceetcd's do (memfence's do not).
type spacedLease struct {
	leasecore.Lease
	space string
}

func (l spacedLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	g.Space = l.space
	return g, err
}

func (l spacedLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	g, err := l.Lease.Renew(ctx, g)
	g.Space = l.space
	return g, err
}

// TestClaimsCarryTheSpace: every way to build a claim from a grant or a
// write carries the token space along.
func TestClaimsCarryTheSpace(t *testing.T) {
	g := leasecore.Grant{Name: "report-job", Holder: "holder-a", Token: 7, TTL: time.Second, Space: "etcd:1"}
	want := leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: 7, Space: "etcd:1"}
	if got := g.Claim("invoices"); got != want {
		t.Errorf("Grant.Claim = %+v, want %+v", got, want)
	}
	w := leasecore.Write{Scope: "invoices", Part: "p", Writer: "holder-a", Token: 7, Space: "etcd:1"}
	if got := backendkit.ClaimOf(w); got != want {
		t.Errorf("backendkit.ClaimOf = %+v, want %+v", got, want)
	}

	f := newFixture(false)
	lease := spacedLease{Lease: f.leases, space: "test:one"}
	s, err := leasecore.NewSession(context.Background(), lease, "report-job", "holder-a", f.options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if got := s.Claim("invoices"); got != (leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: s.Token(), Space: "test:one"}) {
		t.Errorf("Session.Claim = %+v", got)
	}

	set, err := leasecore.NewSessionSet(memfenceBatch{f.leases, lease}, "holder-b", f.options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close(context.Background())
	if _, err := set.Acquire(context.Background(), "shard-1"); err != nil {
		t.Fatal(err)
	}
	if g, ok := set.Grant("shard-1"); !ok || g.Space != "test:one" || g.Claim("s").Space != "test:one" {
		t.Errorf("SessionSet.Grant = %+v, %v; want the space", g, ok)
	}
	if _, ok := set.Grant("shard-2"); ok {
		t.Error("SessionSet.Grant of a name not held: ok")
	}

	// Campaign's and Run's functions get the grant, space included.
	f2 := newFixture(false)
	spaced := spacedLease{Lease: f2.leases, space: "test:two"}
	check := func(ctx context.Context, g leasecore.Grant) error {
		if g.Space != "test:two" || g.Name != "report-job" || g.Claim("s").Space != "test:two" {
			return fmt.Errorf("wrong grant %+v", g)
		}
		return nil
	}
	if err := leasecore.Campaign(context.Background(), spaced, "report-job", "holder-a",
		check, leasecore.WithSessionOptions(leasecore.WithClock(f2.local), leasecore.WithTTL(testTTL))); err != nil {
		t.Errorf("Campaign: %v", err)
	}
	if err := leasecore.Run(context.Background(), spaced, "report-job", "holder-a",
		check, leasecore.WithClock(f2.local), leasecore.WithTTL(testTTL)); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// memfenceBatch is a BatchRenewer whose Acquire names a space.
type memfenceBatch struct {
	backendkit.BatchRenewer
	spacedLease
}
