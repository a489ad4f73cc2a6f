package backendkit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// TestSealedFloorAboveEveryToken: the sealed floor is one above MaxToken, so
// the comparison every fence makes (token >= floor) rejects every valid
// claim at a sealed scope, and no valid claim can carry the sealed floor.
func TestSealedFloorAboveEveryToken(t *testing.T) {
	if leasecore.SealedFloor != backendkit.MaxToken+1 {
		t.Fatalf("SealedFloor = %d, MaxToken = %d: want SealedFloor = MaxToken + 1", leasecore.SealedFloor, backendkit.MaxToken)
	}
	if uint64(leasecore.SealedFloor) != 1<<63-1 {
		t.Fatalf("SealedFloor = %d, want the largest signed 64-bit value (floors live in bigint columns)", leasecore.SealedFloor)
	}
	err := backendkit.CheckClaim(context.Background(), "check", leasecore.Claim{Scope: "s", Writer: "w", Token: leasecore.SealedFloor})
	testcheck.WantArgError(t, err, "check", "token")
	if !strings.Contains(err.Error(), "sealed scope") {
		t.Errorf("message %q does not say why the largest bigint is refused", err)
	}
}

// TestCheckSeal: scope and destination are names; a done context fails.
func TestCheckSeal(t *testing.T) {
	ctx := context.Background()
	wantArg(t, "valid", backendkit.CheckSeal(ctx, "seal", "invoices", "db2"), "")
	wantArg(t, "empty scope", backendkit.CheckSeal(ctx, "seal", "", "db2"), "scope")
	wantArg(t, "NUL in scope", backendkit.CheckSeal(ctx, "seal", "a\x00b", "db2"), "scope")
	wantArg(t, "empty destination", backendkit.CheckSeal(ctx, "seal", "invoices", ""), "to")
	wantArg(t, "destination with spaces around", backendkit.CheckSeal(ctx, "seal", "invoices", " db2"), "to")
	wantArg(t, "long destination", backendkit.CheckSeal(ctx, "seal", "invoices", strings.Repeat("d", backendkit.MaxNameLen+1)), "to")
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := backendkit.CheckSeal(done, "seal", "invoices", "db2"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestCheckScopeSeal: what an install accepts. Floor 0 carries nothing
// (a scope that never accepted a check at the old location); the sealed
// floor itself is what a sealed location reads, never what a seal carries.
func TestCheckScopeSeal(t *testing.T) {
	ctx := context.Background()
	ok := leasecore.ScopeSeal{Scope: "invoices", To: "db2", Floor: 7, Space: "postgres:x"}
	for _, tc := range []struct {
		what  string
		edit  func(*leasecore.ScopeSeal)
		field string
	}{
		{"valid", func(*leasecore.ScopeSeal) {}, ""},
		{"valid without a space", func(s *leasecore.ScopeSeal) { s.Space = "" }, ""},
		{"valid floor 0", func(s *leasecore.ScopeSeal) { s.Floor, s.Space = 0, "" }, ""},
		{"valid MaxToken", func(s *leasecore.ScopeSeal) { s.Floor = backendkit.MaxToken }, ""},
		{"empty scope", func(s *leasecore.ScopeSeal) { s.Scope = "" }, "scope"},
		{"control character in scope", func(s *leasecore.ScopeSeal) { s.Scope = "a\nb" }, "scope"},
		{"empty destination", func(s *leasecore.ScopeSeal) { s.To = "" }, "to"},
		{"sealed floor", func(s *leasecore.ScopeSeal) { s.Floor = leasecore.SealedFloor }, "floor"},
		{"floor above every bigint", func(s *leasecore.ScopeSeal) { s.Floor = leasecore.SealedFloor + 1 }, "floor"},
		{"space without a floor", func(s *leasecore.ScopeSeal) { s.Floor = 0 }, "space"},
		{"space with NUL", func(s *leasecore.ScopeSeal) { s.Space = "etcd:\x00" }, "space"},
	} {
		s := ok
		tc.edit(&s)
		wantArg(t, tc.what, backendkit.CheckScopeSeal(ctx, "install", s), tc.field)
	}
	err := backendkit.CheckScopeSeal(ctx, "install", leasecore.ScopeSeal{Scope: "s", To: "d", Floor: leasecore.SealedFloor})
	if err == nil || !strings.Contains(err.Error(), "floor") || !strings.Contains(err.Error(), "9223372036854775807") {
		t.Errorf("sealed floor: message %v does not name the field and the value", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := backendkit.CheckScopeSeal(done, "install", ok); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
