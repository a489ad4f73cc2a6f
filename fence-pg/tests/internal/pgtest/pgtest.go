// Package pgtest gives fence-pg's tests a real PostgreSQL server: one
// throwaway pgtemp cluster per test binary, started on first use, a fresh
// database per call, and pools of either driver that close themselves.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgtemp"
)

var (
	once     sync.Once
	cluster  *pgtemp.Cluster
	startErr error
	dbSeq    atomic.Int64
)

// Main runs the tests, stops the cluster if one was started, then fails
// the binary if a goroutine was left behind (a pool not closed, a
// transaction not ended). Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop cluster:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Cluster returns the test binary's cluster, starting it on first use. A
// cluster that cannot start fails the test: a missing PostgreSQL is a
// broken test environment, not a reason to skip.
func Cluster(tb testing.TB) *pgtemp.Cluster {
	tb.Helper()
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, startErr = pgtemp.Start(ctx)
	})
	if startErr != nil {
		tb.Fatal(startErr)
	}
	return cluster
}

// CreateDB creates a new empty database and returns its DSN. Names are
// unique within the test binary.
func CreateDB(tb testing.TB, prefix string) string {
	tb.Helper()
	c := Cluster(tb)
	name := fmt.Sprintf("%s_%d", prefix, dbSeq.Add(1))
	if err := c.CreateDatabase(context.Background(), name); err != nil {
		tb.Fatal(err)
	}
	return c.DSN(name)
}

// Open opens a pool with driver (pgopen.Pgx or pgopen.Libpq) and closes it
// when the test ends.
func Open(tb testing.TB, driver, dsn string, maxConns int) pgopen.Pool {
	tb.Helper()
	p, err := pgopen.Open(context.Background(), driver, dsn, maxConns)
	if err != nil {
		tb.Fatalf("open %s pool: %v", driver, err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("close %s pool: %v", driver, err)
		}
	})
	return p
}

// ForEachDriver runs f as a subtest per driver.
func ForEachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	t.Helper()
	for _, d := range pgopen.Drivers {
		t.Run(d, func(t *testing.T) { f(t, d) })
	}
}

// DB returns the pool as fence-pg's internal dbx.DB, for statements the
// tests run beside the stores. pgopen.Pool has no such method: pgopen is
// importable from outside fence-pg, where dbx is not.
func DB(p pgopen.Pool) dbx.DB {
	if p.Pgx != nil {
		return dbx.FromPool(p.Pgx)
	}
	return dbx.FromSQL(p.SQL)
}
