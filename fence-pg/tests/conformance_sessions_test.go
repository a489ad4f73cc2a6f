package fencepg_test

import (
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestConformanceSharedLeases runs the conformance suite with holder
// sessions (fencepg.WithSharedLeases, pgconformance.Config.SharedLeases):
// every lease store — the holder processes' of F4, F5 and F12 and F16's
// replicated deployments' included — hangs all names of one holder and TTL
// on one session row. On its own cluster, which F8 crashes.
//
//   - pgx: the whole suite (conformance.Run), F1-F16, the user-data cases,
//     X1 and X2.
//   - lib/pq: the cases where the driver makes a difference (about a
//     minute less than the whole suite again): X2, whose lost acquire
//     answer lib/pq meets differently — database/sql sends the acquire
//     again on a new connection, and the store must find and undo the
//     first execution's hold (pgstore.ErrResent) instead of undoing after
//     a broken connection; X1; F1-F4 and F8, the lease's path through
//     the driver, a holder process and a crash. conformance.Run cannot
//     select cases, so this runs conformance.Report and fails on any
//     failed check.
func TestConformanceSharedLeases(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	config := func(t *testing.T, driver string) pgconformance.Config {
		leaseDB, resDB := "lease_sess_"+driver, "res_sess_"+driver
		for _, db := range []string{leaseDB, resDB} {
			if err := cluster.CreateDatabase(t.Context(), db); err != nil {
				t.Fatal(err)
			}
		}
		return pgconformance.Config{
			Driver:       driver,
			LeaseDSN:     cluster.DSN(leaseDB),
			ResourceDSN:  cluster.DSN(resDB),
			HolderArgs:   []string{"-test.run=^$"}, // TestMain turns the binary into the holder
			Cluster:      cluster,                  // F8 crashes it; this test owns it
			SharedLeases: true,
		}
	}
	t.Run(pgconformance.DriverPgx, func(t *testing.T) {
		conformance.Run(t, pgconformance.New(config(t, pgconformance.DriverPgx)))
	})
	t.Run(pgconformance.DriverLibpq, func(t *testing.T) {
		sum, err := conformance.Report(t.Context(), lineLog{t}, pgconformance.New(config(t, pgconformance.DriverLibpq)),
			conformance.ReportOptions{Cases: []string{"X2", "X1", "F1", "F2", "F3", "F4", "F8"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range sum.Cases {
			t.Logf("%s: passed=%d failed=%d skipped=%q in %v", c.ID, c.Passed, c.Failed, c.Skipped, c.Elapsed.Round(time.Millisecond))
			if c.Skipped != "" || c.Passed == 0 {
				t.Errorf("%s did not run: %s", c.ID, c.Skipped)
			}
		}
		if sum.Failed > 0 {
			t.Fatalf("%d checks failed with holder sessions on lib/pq", sum.Failed)
		}
	})
}

// TestConformanceSharedLeasesSerializable runs the cases where
// concurrent statements meet (F3's 16 racing acquirers, F11's campaigners,
// X2) and F1, F2 with holder sessions on a cluster whose
// default_transaction_isolation is serializable, as
// TestConformanceSerializableDefault does without the mode: the
// holder-session statements lock a lease row and session rows that other
// transactions may have changed after the statement's snapshot, which
// Serializable reports as a serialization failure where Read Committed
// re-checks the row; the store must run the statement again
// (pgstore.RetryConflicts) and reach the same verdicts.
func TestConformanceSharedLeasesSerializable(t *testing.T) {
	cluster := pgtemp.StartTB(t, pgtemp.WithSetting("default_transaction_isolation", "serializable"))
	for _, db := range []string{"lease_sess_ser", "res_sess_ser"} {
		if err := cluster.CreateDatabase(t.Context(), db); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := conformance.Report(t.Context(), lineLog{t}, pgconformance.New(pgconformance.Config{
		Driver:       pgconformance.DriverPgx,
		LeaseDSN:     cluster.DSN("lease_sess_ser"),
		ResourceDSN:  cluster.DSN("res_sess_ser"),
		HolderArgs:   []string{"-test.run=^$"},
		SharedLeases: true,
	}), conformance.ReportOptions{Cases: []string{"F1", "F2", "F3", "F11", "X2"}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed > 0 || sum.Passed == 0 {
		t.Fatalf("holder sessions at serializable: passed=%d failed=%d", sum.Passed, sum.Failed)
	}
}

// lineLog writes the suite's report to the test log, a line at a time.
type lineLog struct{ t *testing.T }

func (l lineLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
