package mixed_test

import (
	"os"
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/examples/lease-fencing/internal/mixed"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

// TestMain doubles as the etcd server process and the pair's holder
// process: the test re-executes its own binary for both.
func TestMain(m *testing.M) {
	switch {
	case etcdtemp.IsServeProcess():
		os.Exit(etcdtemp.Serve())
	case mixed.IsHolderProcess():
		os.Exit(mixed.HolderMain())
	}
	os.Exit(m.Run())
}

// TestConformance runs the whole suite on an etcd lease and a PostgreSQL
// resource, each a real server started here.
func TestConformance(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	srv := etcdtemp.StartTB(t)
	if err := cluster.CreateDatabase(t.Context(), "res_mixed"); err != nil {
		t.Fatal(err)
	}
	// The PostgreSQL harness also migrates and empties a lease database,
	// which the pair does not use; give it one.
	if err := cluster.CreateDatabase(t.Context(), "lease_unused"); err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, mixed.New(mixed.Config{
		EtcdEndpoints: srv.Endpoints(),
		Resource: pgconformance.Config{
			Driver:      pgconformance.DriverPgx,
			LeaseDSN:    cluster.DSN("lease_unused"),
			ResourceDSN: cluster.DSN("res_mixed"),
		},
		HolderArgs: []string{"-test.run=^$"},
	}))
}
