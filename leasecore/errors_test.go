package leasecore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

func TestArgErrorMessage(t *testing.T) {
	e := &leasecore.ArgError{Op: "new session", Field: "lease", Reason: "must not be nil"}
	if got, want := e.Error(), "leasecore: new session: invalid lease: must not be nil"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &leasecore.ArgError{Op: "acquire", Field: "ttl", Value: "0s", Reason: "must be positive"}
	if got, want := e.Error(), "leasecore: acquire: invalid ttl 0s: must be positive"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestHoldError(t *testing.T) {
	e := &leasecore.HoldError{Op: "renew", Name: "report-job", Holder: "holder-a", Token: 1,
		Reason: "expired", Err: leasecore.ErrLost}
	if !errors.Is(e, leasecore.ErrLost) || errors.Is(e, leasecore.ErrHeld) {
		t.Errorf("HoldError wrapping ErrLost: Is(ErrLost)=%v Is(ErrHeld)=%v", errors.Is(e, leasecore.ErrLost), errors.Is(e, leasecore.ErrHeld))
	}
	msg := e.Error()
	for _, s := range []string{"renew", `"report-job"`, `"holder-a"`, "token 1", "expired", leasecore.ErrLost.Error()} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q does not contain %q", msg, s)
		}
	}
	e = &leasecore.HoldError{Op: "acquire", Name: "report-job", Holder: "holder-b", Err: leasecore.ErrHeld}
	if strings.Contains(e.Error(), "token") {
		t.Errorf("acquire message %q mentions a token though none was presented", e.Error())
	}
}

func TestGrantLocalDeadline(t *testing.T) {
	start := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	g := leasecore.Grant{TTL: 1500 * time.Millisecond, Start: start}
	if got, want := g.LocalDeadline(300*time.Millisecond), start.Add(1200*time.Millisecond); !got.Equal(want) {
		t.Errorf("LocalDeadline = %v, want %v", got, want)
	}
}

// TestDocumentedLimits: the limits leasecore's docs quote as numbers
// (SessionSet.AcquireAll, AttemptQuery.Limit) are backendkit's.
func TestDocumentedLimits(t *testing.T) {
	if backendkit.MaxAcquireAll != 1000 {
		t.Errorf("MaxAcquireAll = %d; SessionSet.AcquireAll's doc says 1000", backendkit.MaxAcquireAll)
	}
	if backendkit.MaxAttemptsRead != 10000 {
		t.Errorf("MaxAttemptsRead = %d; AttemptQuery's doc says 10000", backendkit.MaxAttemptsRead)
	}
}
