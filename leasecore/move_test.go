package leasecore_test

import (
	"errors"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
)

// TestScopeMovedError: it wraps ErrScopeMoved (and nothing that invites a
// retry), and its message names the scope, the token, the destination and
// the floor at the seal.
func TestScopeMovedError(t *testing.T) {
	err := error(&leasecore.ScopeMovedError{Op: "run tx", Scope: "invoices", Token: 4, To: "db2", Floor: 7})
	if !errors.Is(err, leasecore.ErrScopeMoved) {
		t.Errorf("errors.Is(ErrScopeMoved) = false")
	}
	for _, other := range []error{leasecore.ErrUnavailable, leasecore.ErrInvalidArgument, leasecore.ErrTokenSpace, leasecore.ErrConfig} {
		if errors.Is(err, other) {
			t.Errorf("errors.Is(%v) = true", other)
		}
	}
	want := `leasecore: scope moved to another location: run tx scope "invoices": token 4 rejected: the scope was sealed here and moved to "db2" (its floor was 7 at the seal): write there, where a token below 7 is rejected too`
	if err.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", err, want)
	}
	seal := &leasecore.ScopeMovedError{Op: "seal", Scope: "invoices", To: "db2", Floor: 7}
	if got, want := seal.Error(), `leasecore: scope moved to another location: seal scope "invoices": the scope was sealed here and moved to "db2" (its floor was 7 at the seal)`; got != want {
		t.Errorf("message without a token\n%s\nwant\n%s", got, want)
	}
	var me *leasecore.ScopeMovedError
	if !errors.As(errors.Join(errors.New("log"), err), &me) || me.To != "db2" {
		t.Errorf("errors.As through a join: %+v", me)
	}
}
