package pgconformance_test

import (
	"testing"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgbouncertest"
)

// poolerConfigs are the client configurations tested behind PgBouncer in
// pool_mode=transaction, one per driver. Each sends a statement with
// parameters as one round trip (Parse, Bind, Execute, Sync) on the unnamed
// statement, so no statement outlives the server connection the pooler
// lent for it:
//
//   - pgx with default_query_exec_mode=exec. pgx's default
//     (cache_statement) prepares named statements once per connection and
//     reuses them; a transaction pooler lends each transaction another
//     server connection, where the name is missing or taken (SQLSTATE
//     26000, 42P05). describe_exec takes two round trips and breaks too.
//   - lib/pq with binary_parameters=yes. Without it lib/pq parses the
//     unnamed statement, waits (Sync), then binds it: the pooler may lend
//     the bind another server connection, where the unnamed statement is
//     missing (26000) or another client's.
var poolerConfigs = []struct {
	driver string
	params []string // added to the DSN
}{
	{pgconformance.DriverPgx, []string{"default_query_exec_mode=exec"}},
	{pgconformance.DriverLibpq, []string{"binary_parameters=yes"}},
}

// TestConformanceBehindPgBouncer runs the whole conformance suite with every
// connection — the harness's, the lease and resource clients', the holder
// processes' (F4, F5) — going through PgBouncer in pool_mode=transaction in
// front of a throwaway cluster of its own, which F8 crashes and restarts
// behind the pooler. Lease stores are made with WithoutNotifications (F11's
// campaigners poll).
func TestConformanceBehindPgBouncer(t *testing.T) {
	cluster := pgtemp.StartTB(t)
	bouncer := pgbouncertest.StartTB(t, cluster)
	pooler := bouncer.Version() + ", pool_mode=transaction"
	t.Logf("pooler: %s on 127.0.0.1:%d, every connection through it, holder processes' too", pooler, bouncer.Port())
	t.Logf("not available behind it: LISTEN/NOTIFY (a LISTEN does not stay with a client of a transaction pooler); " +
		"the lease stores are made WithoutNotifications, so WaitFree returns errors.ErrUnsupported and Campaign polls (F11, F12, F13)")
	for _, pc := range poolerConfigs {
		leaseDB, resDB := "lease_"+pc.driver, "res_"+pc.driver
		for _, db := range []string{leaseDB, resDB} {
			if err := cluster.CreateDatabase(t.Context(), db); err != nil {
				t.Fatal(err)
			}
		}
		t.Run(pc.driver, func(t *testing.T) {
			conformance.Run(t, pgconformance.New(pgconformance.Config{
				Driver:      pc.driver,
				LeaseDSN:    bouncer.DSN(leaseDB, pc.params...),
				ResourceDSN: bouncer.DSN(resDB, pc.params...),
				HolderArgs:  []string{"-test.run=^$"}, // TestMain turns the binary into the holder
				Cluster:     cluster,                  // F8 crashes it behind the pooler
				Pooler:      pooler,
			}))
		})
	}
}
