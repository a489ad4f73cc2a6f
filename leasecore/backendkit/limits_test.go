package backendkit_test

import (
	"testing"

	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/validate"
)

// TestLimitsAreLeasecores: the limits backendkit states are the ones
// leasecore's own checks (Session, SessionSet, Observe) enforce.
func TestLimitsAreLeasecores(t *testing.T) {
	if backendkit.MaxNameLen != validate.MaxNameLen {
		t.Errorf("MaxNameLen = %d, leasecore checks %d", backendkit.MaxNameLen, validate.MaxNameLen)
	}
	if backendkit.MaxTTL != validate.MaxTTL {
		t.Errorf("MaxTTL = %v, leasecore checks %v", backendkit.MaxTTL, validate.MaxTTL)
	}
	if backendkit.MaxAcquireAll != validate.MaxAcquireAll {
		t.Errorf("MaxAcquireAll = %d, leasecore checks %d", backendkit.MaxAcquireAll, validate.MaxAcquireAll)
	}
}
