package fencepg_test

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestConformanceSerializableDefault runs the suite on a cluster whose
// default_transaction_isolation is serializable, as a cluster, database or
// role may be configured: the lease and fence statements are written for
// Read Committed, so the library must set the level it needs where it
// begins a transaction, and retry the serialization failures that a
// single statement of its own can get at a stricter level. One driver:
// isolation is the server's behaviour, not the driver's. With fencepg's
// default attempt log, so that the statements users get by default run at
// serializable too: Resource.Write's fast path (a SKIP LOCKED floor read)
// and RunTx's read-only check. (The suite's writers each have a Resource
// of their own, so Resource.Write's statements shared by overlapping
// writes are tested in writebatch_test.go, at Read Committed.)
func TestConformanceSerializableDefault(t *testing.T) {
	cluster := pgtemp.StartTB(t, pgtemp.WithSetting("default_transaction_isolation", "serializable"))
	for _, db := range []string{"lease_ser", "res_ser"} {
		if err := cluster.CreateDatabase(t.Context(), db); err != nil {
			t.Fatal(err)
		}
	}
	conformance.Run(t, pgconformance.New(pgconformance.Config{
		Driver:            pgconformance.DriverPgx,
		LeaseDSN:          cluster.DSN("lease_ser"),
		ResourceDSN:       cluster.DSN("res_ser"),
		HolderArgs:        []string{"-test.run=^$"},
		Cluster:           cluster,
		DefaultAttemptLog: true,
	}))
}
