package backendkit_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// FenceLogger: a stale write at WARN with its token and the floor that
// beat it, a token from another lease service at ERROR, an acceptance only
// at debug level.
func TestFenceLogger(t *testing.T) {
	var buf bytes.Buffer
	log := backendkit.FenceLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	c := leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: 3, Space: "postgres:a"}
	log(leasecore.FenceEvent{Op: "run tx", Claim: c, Result: leasecore.Result{Accepted: true, Floor: 3}})
	log(leasecore.FenceEvent{Op: "run tx", Claim: c, Result: leasecore.Result{Floor: 5}})
	spaceErr := backendkit.TokenSpaceMismatch("run tx", c, 900, "etcd:b")
	log(leasecore.FenceEvent{Op: "run tx", Claim: c, Result: leasecore.Result{Floor: 900}, Err: spaceErr})
	recs := testcheck.LogRecords(t, &buf)
	if len(recs) != 2 {
		t.Fatalf("records %v, want 2 (the acceptance is debug)", recs)
	}
	stale := testcheck.FindRecord(t, recs, "stale write rejected")
	if stale["level"] != "WARN" || stale["scope"] != "invoices" || stale["writer"] != "holder-a" ||
		stale["token"] != float64(3) || stale["floor"] != float64(5) || stale["op"] != "run tx" || stale["err"] != nil {
		t.Errorf("stale record %v", stale)
	}
	mix := testcheck.FindRecord(t, recs, "write rejected: token from another lease service")
	if mix["level"] != "ERROR" || mix["floor"] != float64(900) || mix["space"] != "postgres:a" ||
		!strings.Contains(fmt.Sprint(mix["err"]), "etcd:b") {
		t.Errorf("token-space record %v", mix)
	}
	if backendkit.FenceLogger(nil) != nil {
		t.Error("FenceLogger(nil) is not nil")
	}
}
