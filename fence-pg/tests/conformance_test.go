package fencepg_test

import (
	"strings"
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestConformance runs the leasefence conformance suite against fencepg on
// one throwaway cluster of its own (F8 crashes it), once per driver, each
// driver on its own pair of databases, every check logged (LogAll, as the
// lab runs it); then once more with pgx and fencepg's default attempt log,
// the statements users get by default (pgconformance.Config.DefaultAttemptLog).
func TestConformance(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	for _, run := range []struct {
		name       string
		driver     string
		defaultLog bool
	}{
		{pgconformance.DriverPgx, pgconformance.DriverPgx, false},
		{pgconformance.DriverLibpq, pgconformance.DriverLibpq, false},
		{"pgx-default-attempt-log", pgconformance.DriverPgx, true},
	} {
		suffix := strings.ReplaceAll(run.name, "-", "_") // a database name without quoting
		leaseDB, resDB := "lease_"+suffix, "res_"+suffix
		for _, db := range []string{leaseDB, resDB} {
			if err := cluster.CreateDatabase(t.Context(), db); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(run.name, func(t *testing.T) {
			conformance.Run(t, pgconformance.New(pgconformance.Config{
				Driver:            run.driver,
				LeaseDSN:          cluster.DSN(leaseDB),
				ResourceDSN:       cluster.DSN(resDB),
				HolderArgs:        []string{"-test.run=^$"}, // TestMain turns the binary into the holder
				Cluster:           cluster,                  // F8 crashes it; this test owns it
				DefaultAttemptLog: run.defaultLog,
			}))
		})
	}
}
