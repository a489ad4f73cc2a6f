package fencepg_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestMain doubles as the holder process of F4 and F5: the conformance
// harness re-executes this test binary with pgconformance.HolderEnv set.
func TestMain(m *testing.M) {
	if pgconformance.IsHolderProcess() {
		os.Exit(pgconformance.HolderMain())
	}
	pgtest.Main(m)
}

// fixture is a fresh, migrated pair of databases and the stores on them,
// all on one driver.
type fixture struct {
	driver              string
	leaseDSN, resDSN    string
	leasePool, resPool  pgopen.Pool
	leases              *fencepg.LeaseStore
	res                 *fencepg.Resource
	controls            *pgcontrol.Controls
	leaseDB, resourceDB dbx.DB
}

// databases holds one pair of databases per driver, created on first use
// and emptied by every newFixture: creating databases costs about half a
// second each.
var databases sync.Map // driver -> [2]string{leaseDSN, resDSN}

// newFixture returns migrated, empty databases for driver and the stores
// on them.
func newFixture(t *testing.T, driver string) *fixture {
	t.Helper()
	dsns, ok := databases.Load(driver)
	if !ok {
		dsns, _ = databases.LoadOrStore(driver,
			[2]string{pgtest.CreateDB(t, "lease_"+driver), pgtest.CreateDB(t, "res_"+driver)})
	}
	f := &fixture{driver: driver, leaseDSN: dsns.([2]string)[0], resDSN: dsns.([2]string)[1]}
	f.leasePool = pgtest.Open(t, driver, f.leaseDSN, 4)
	f.resPool = pgtest.Open(t, driver, f.resDSN, 4)
	f.leaseDB, f.resourceDB = pgtest.DB(f.leasePool), pgtest.DB(f.resPool)
	var err error
	if f.leases, err = f.leasePool.LeaseStore(); err != nil {
		t.Fatal(err)
	}
	if f.res, err = f.resPool.Resource(fencepg.WithAttemptLog(leasecore.LogAll)); err != nil {
		t.Fatal(err)
	}
	if f.controls, err = f.resPool.Controls(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.leases.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.controls.Migrate(ctx); err != nil { // fencepg's resource tables too
		t.Fatal(err)
	}
	if _, err := f.leaseDB.Exec(ctx, pgsql.TruncateLease); err != nil {
		t.Fatal(err)
	}
	if _, err := f.resourceDB.Exec(ctx, pgsql.TruncateResource); err != nil {
		t.Fatal(err)
	}
	return f
}

// tables names every table and the database it lives in.
func (f *fixture) tables() []struct {
	db    dbx.DB
	table string
} {
	return []struct {
		db    dbx.DB
		table string
	}{
		{f.leaseDB, "lease"}, {f.resourceDB, "fence_floor"}, {f.resourceDB, "report_part"},
		{f.resourceDB, "write_attempt"}, {f.resourceDB, "published"},
	}
}

// snapshot returns every row of every table as text, for "nothing
// changed" checks.
func (f *fixture) snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, tb := range f.tables() {
		var n int64
		var rows string
		q := fmt.Sprintf(`SELECT count(*), coalesce(string_agg(t::text, E'\n' ORDER BY t::text), '') FROM leasefence.%s t`, tb.table)
		if err := tb.db.QueryRow(context.Background(), q).Scan(&n, &rows); err != nil {
			t.Fatalf("snapshot %s: %v", tb.table, err)
		}
		fmt.Fprintf(&b, "%s (%d rows)\n%s\n", tb.table, n, rows)
	}
	return b.String()
}

// leaseRow returns lease name's row as text ("" when absent).
func (f *fixture) leaseRow(t *testing.T, name string) string {
	t.Helper()
	var row string
	err := f.leaseDB.QueryRow(context.Background(),
		`SELECT coalesce((SELECT l::text FROM leasefence.lease l WHERE name = $1), '')`, name).Scan(&row)
	if err != nil {
		t.Fatal(err)
	}
	return row
}

// waitLockWaiter polls pg_stat_activity until a fence statement of the
// resource database waits for a lock, and returns the description.
func (f *fixture) waitLockWaiter(t *testing.T) string {
	t.Helper()
	return f.waitLockWaiterOn(t, pgsql.LockWaits)
}

// rowLockWaits is pgsql.LockWaits for any statement that writes the job's
// header table (job_run): a writer waiting for another's row lock there.
const rowLockWaits = `SELECT wait_event_type, wait_event FROM pg_stat_activity
 WHERE datname = current_database() AND wait_event_type = 'Lock'
   AND pid <> pg_backend_pid() AND query ILIKE '%job_run%'
 ORDER BY pid`

// waitLockWaiterOn polls pg_stat_activity with waits, a query of
// waiters' wait_event_type and wait_event, until it returns a row.
func (f *fixture) waitLockWaiterOn(t *testing.T, waits string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rows, err := f.resourceDB.Query(context.Background(), waits)
		if err != nil {
			t.Fatal(err)
		}
		var typ, event string
		found := rows.Next()
		if found {
			err = rows.Scan(&typ, &event)
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
		if err != nil {
			t.Fatal(err)
		}
		if found {
			return typ + "/" + event
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no writer started waiting for a lock within 10s")
	return ""
}
