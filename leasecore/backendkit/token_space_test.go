package backendkit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

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
		if err := backendkit.TokenSpaceMismatch("check", tc.c, tc.floor, tc.floorSpace); err != nil {
			t.Errorf("%s: %v, want nil (an ordinary rejection)", tc.what, err)
		}
	}
	err := backendkit.TokenSpaceMismatch("run tx", c, 16, "etcd:8e9e05c52164694d")
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
	wantArg(t, "empty", backendkit.CheckSpace("check", ""), "")
	wantArg(t, "postgres", backendkit.CheckSpace("check", "postgres:6f1c3e2a-0b7d-4c55-9a43-2f0f4b8f6d11"), "")
	wantArg(t, "etcd", backendkit.CheckSpace("check", "etcd:8e9e05c52164694d"), "")
	wantArg(t, "NUL", backendkit.CheckSpace("check", "etcd:\x00"), "space")
	wantArg(t, "too long", backendkit.CheckSpace("check", strings.Repeat("s", backendkit.MaxNameLen+1)), "space")
	wantArg(t, "padded", backendkit.CheckSpace("check", " etcd:1"), "space")

	bad := strings.Repeat("s", backendkit.MaxNameLen+1)
	wantArg(t, "claim", backendkit.CheckClaim(ctx, "check", leasecore.Claim{Scope: "s", Writer: "w", Token: 1, Space: bad}), "space")
	wantArg(t, "write", backendkit.CheckWrite(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1, Space: "a\x00"}), "space")
	wantArg(t, "batch", backendkit.CheckBatch(ctx, leasecore.Batch{Scope: "s", Writer: "w", Token: 1, Space: bad,
		Parts: []leasecore.PartContent{{Part: "p"}}}), "space")
	wantArg(t, "grant", backendkit.CheckGrant(ctx, "renew", leasecore.Grant{Name: "n", Holder: "h", Token: 1,
		TTL: time.Second, Space: bad}, 0), "space")
}
