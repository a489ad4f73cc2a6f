package pgconformance_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgbouncertest"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// TestPgxDefaultModeBehindPgBouncer reproduces a deployment that fails in
// a way retrying cannot fix: pgx's default exec mode (cache_statement: a
// named prepared statement per SQL text and connection, "stmtcache_...")
// behind PgBouncer in pool_mode=transaction. Acquires and renews run on
// several connections of one pgxpool; the pooler lends all of them the
// same few server connections, where a statement one client prepared
// collides with another's prepare of the same text (42P05) or is missing
// where the client expects it (26000). The library must not pass that off
// as a transient failure: the error wraps leasecore.ErrConfig and names
// the setting that fixes it, default_query_exec_mode.
func TestPgxDefaultModeBehindPgBouncer(t *testing.T) {
	cluster := pgtest.Cluster(t)
	bouncer := pgbouncertest.StartTB(t, cluster, pgbouncertest.WithPoolSize(2))
	ctx := context.Background()
	const db = "pgxdefault"
	if err := cluster.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	// Migrate directly: DDL is not what this test is about.
	direct := pgtest.Open(t, "pgx", cluster.DSN(db), 1)
	ls, err := direct.LeaseStore()
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	const conns = 4
	cfg, err := pgxpool.ParseConfig(bouncer.DSN(db)) // pgx's defaults: cache_statement
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	leases, err := fencepg.NewLeaseStore(pool, fencepg.WithoutNotifications())
	if err != nil {
		t.Fatal(err)
	}

	// Round i runs on pool connection i mod conns: the others are held.
	var failure error
	ops := 0
	for i := 0; i < 8*conns && failure == nil; i++ {
		held := holdAllBut(t, ctx, pool, conns, i%conns)
		name := fmt.Sprintf("job-%d", i)
		g, err := leases.Acquire(ctx, name, "holder-a", time.Minute)
		ops++
		if err == nil {
			_, err = leases.Renew(ctx, g)
			ops++
		}
		for _, c := range held {
			c.Release()
		}
		failure = err
	}
	if failure == nil {
		t.Fatalf("%d acquires and renews on %d connections of a pgxpool in pgx's default exec mode behind %s in transaction mode all succeeded: "+
			"no prepared statement collided", ops, conns, bouncer.Version())
	}
	t.Logf("after %d operations: %v", ops, failure)
	if !errors.Is(failure, leasecore.ErrConfig) {
		t.Errorf("the failure does not wrap leasecore.ErrConfig: %v", failure)
	}
	if errors.Is(failure, leasecore.ErrUnavailable) {
		t.Errorf("the failure wraps leasecore.ErrUnavailable, which invites retrying what cannot succeed: %v", failure)
	}
	if !strings.Contains(failure.Error(), "default_query_exec_mode") {
		t.Errorf("the failure does not name default_query_exec_mode, the setting that fixes it: %v", failure)
	}
}

// holdAllBut acquires every connection of pool (of size n) and releases
// the i-th, so that the next statement runs on it; the caller releases
// the rest.
func holdAllBut(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n, i int) []*pgxpool.Conn {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	free := conns[i]
	free.Release()
	return append(conns[:i:i], conns[i+1:]...)
}
