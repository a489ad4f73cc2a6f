package fencepg_test

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestConformance runs the leasefence conformance suite against fencepg on
// one throwaway cluster of its own (F8 crashes it), once per driver, each
// driver on its own pair of databases.
func TestConformance(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	for _, driver := range []string{pgconformance.DriverPgx, pgconformance.DriverLibpq} {
		leaseDB, resDB := "lease_"+driver, "res_"+driver
		for _, db := range []string{leaseDB, resDB} {
			if err := cluster.CreateDatabase(t.Context(), db); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(driver, func(t *testing.T) {
			conformance.Run(t, pgconformance.New(pgconformance.Config{
				Driver:      driver,
				LeaseDSN:    cluster.DSN(leaseDB),
				ResourceDSN: cluster.DSN(resDB),
				HolderArgs:  []string{"-test.run=^$"}, // TestMain turns the binary into the holder
				Cluster:     cluster,                  // F8 crashes it; this test owns it
			}))
		})
	}
}
