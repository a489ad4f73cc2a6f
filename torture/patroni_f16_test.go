package torture

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestF16OnPatroni runs the conformance suite's failover case, F16, on
// clusters that Patroni manages (pgconformance.Config.Patroni), with pgx
// (lib/pq's side of a failover, reconnecting through the moved proxy, is
// F16's on the standby pair in fence-pg/tests): with Patroni's synchronous_mode on, the leader's host killed
// loses no grant, no floor, no token; with it off and the replicas held
// back, Patroni promotes a replica within maximum_lag_on_failover that
// lacks acknowledged grants, and the case's negative control must see a
// token handed out twice. Every check of the case must pass; a skip
// (Patroni or etcd missing) fails here, since make test installs them.
func TestF16OnPatroni(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Patroni clusters")
	}
	// The harness's own databases: F16 opens its clients on the Patroni
	// cluster, but the harness migrates these first, and takes the
	// PostgreSQL binaries to run Patroni's members from this cluster.
	cluster := pgtemp.StartTB(t)
	for _, driver := range []string{pgconformance.DriverPgx} {
		t.Run(driver, func(t *testing.T) {
			lease, res := "lease_f16_"+driver, "res_f16_"+driver
			for _, db := range []string{lease, res} {
				if err := cluster.CreateDatabase(t.Context(), db); err != nil {
					t.Fatal(err)
				}
			}
			sum, err := conformance.Report(t.Context(), t.Output(), pgconformance.New(pgconformance.Config{
				Driver: driver, LeaseDSN: cluster.DSN(lease), ResourceDSN: cluster.DSN(res),
				Cluster: cluster, Patroni: true,
			}), conformance.ReportOptions{Cases: []string{"F16"}})
			if err != nil {
				t.Fatal(err)
			}
			if sum.Failed > 0 || sum.Skipped > 0 || sum.Passed == 0 {
				t.Fatalf("F16 on Patroni: passed=%d failed=%d skipped=%d (%v); every check must pass and none may skip",
					sum.Passed, sum.Failed, sum.Skipped, sum.Cases)
			}
		})
	}
}
