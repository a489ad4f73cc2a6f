package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
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

// TestTokenSpaceMismatch: the diagnosis is made only when both spaces are
// known and differ and the floor is above the token; the error wraps
// ErrTokenSpace and ErrConfig and its message names the scope, both spaces,
// the token, the floor and the rule.
func TestTokenSpaceMismatch(t *testing.T) {
	c := leasecore.Claim{Scope: "invoices", Writer: "w", Token: 4, Space: "postgres:b"}
	for _, tc := range []struct {
		what       string
		c          leasecore.Claim
		floor      leasecore.Token
		floorSpace string
	}{
		{"same space", c, 16, "postgres:b"},
		{"floor space unknown (written before the upgrade)", c, 16, ""},
		{"claim space unknown", leasecore.Claim{Scope: "invoices", Writer: "w", Token: 4}, 16, "etcd:a"},
		{"floor not above the token", c, 4, "etcd:a"},
	} {
		if err := leasecore.TokenSpaceMismatch("check", tc.c, tc.floor, tc.floorSpace); err != nil {
			t.Errorf("%s: %v, want nil (an ordinary rejection)", tc.what, err)
		}
	}
	err := leasecore.TokenSpaceMismatch("run tx", c, 16, "etcd:8e9e05c52164694d")
	if !errors.Is(err, leasecore.ErrTokenSpace) || !errors.Is(err, leasecore.ErrConfig) {
		t.Fatalf("another space: %v, want ErrTokenSpace and ErrConfig", err)
	}
	var tse *leasecore.TokenSpaceError
	if !errors.As(err, &tse) || *tse != (leasecore.TokenSpaceError{Op: "run tx", Scope: "invoices", Token: 4,
		Space: "postgres:b", Floor: 16, FloorSpace: "etcd:8e9e05c52164694d"}) {
		t.Errorf("TokenSpaceError = %+v", tse)
	}
	for _, want := range []string{"token from another lease service", "run tx", `"invoices"`, "token 4",
		`"postgres:b"`, "floor 16", `"etcd:8e9e05c52164694d"`, "a scope is fenced by exactly one lease service"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

// TestCheckSpace: a space is optional; when set it follows CheckName, and
// every input that carries one validates it under the field "space".
func TestCheckSpace(t *testing.T) {
	ctx := context.Background()
	wantArg(t, "empty", leasecore.CheckSpace("check", ""), "")
	wantArg(t, "postgres", leasecore.CheckSpace("check", "postgres:6f1c3e2a-0b7d-4c55-9a43-2f0f4b8f6d11"), "")
	wantArg(t, "etcd", leasecore.CheckSpace("check", "etcd:8e9e05c52164694d"), "")
	wantArg(t, "NUL", leasecore.CheckSpace("check", "etcd:\x00"), "space")
	wantArg(t, "too long", leasecore.CheckSpace("check", strings.Repeat("s", leasecore.MaxNameLen+1)), "space")
	wantArg(t, "padded", leasecore.CheckSpace("check", " etcd:1"), "space")

	bad := strings.Repeat("s", leasecore.MaxNameLen+1)
	wantArg(t, "claim", leasecore.CheckClaim(ctx, "check", leasecore.Claim{Scope: "s", Writer: "w", Token: 1, Space: bad}), "space")
	wantArg(t, "write", leasecore.CheckWrite(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1, Space: "a\x00"}), "space")
	wantArg(t, "batch", leasecore.CheckBatch(ctx, leasecore.Batch{Scope: "s", Writer: "w", Token: 1, Space: bad,
		Parts: []leasecore.PartContent{{Part: "p"}}}), "space")
	wantArg(t, "grant", leasecore.CheckGrant(ctx, "renew", leasecore.Grant{Name: "n", Holder: "h", Token: 1,
		TTL: time.Second, Space: bad}, 0), "space")
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
	if got := leasecore.ClaimOf(w); got != want {
		t.Errorf("ClaimOf = %+v, want %+v", got, want)
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
	leasecore.BatchRenewer
	spacedLease
}
