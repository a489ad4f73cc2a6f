package fencepg

import (
	"context"
	"fmt"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
)

// ErrNotDurable is why Preflight refuses a server that runs with fsync
// off. It wraps leasecore.ErrConfig.
//
// The library's guarantees rest on the database keeping what it
// acknowledged: a lease token, once granted, is never granted again (I2),
// and a scope's floor never goes back (I3). With fsync off PostgreSQL does
// not force its writes to disk, and an operating system crash or a power
// failure can lose committed transactions or corrupt the cluster
// (PostgreSQL documentation, "fsync"): the next acquire would hand out a
// token a holder already has, and a fence whose floor went back would
// accept a paused holder's stale write. Checked by Preflight only: the
// stores do not read the setting on every operation.
var ErrNotDurable = fmt.Errorf("server not crash-safe (fsync = off): %w", leasecore.ErrConfig)

// Preflight checks, once at start-up, that the store can work on its
// database, so that a misconfigured deployment fails there and not at its
// first acquire. It runs a few reads of the server's settings and system
// catalogs (and CheckSchema's) and returns the first problem:
//
//   - the server cannot be reached (leasecore.ErrUnavailable), or refuses
//     the pool's DSN: an unknown database or role, a failed login
//     (leasecore.ErrConfig, the message says what to check);
//   - the server runs with fsync off: ErrNotDurable, which wraps
//     leasecore.ErrConfig;
//   - the pool's role lacks a privilege the store needs: USAGE on the
//     schema, SELECT, INSERT and UPDATE on lease (and on holder_session,
//     with WithSharedLeases): leasecore.ErrConfig, the message lists
//     each missing GRANT for this role;
//   - the lease table is missing, out of date or foreign: CheckSchema's
//     leasecore.ErrSchema (run Migrate).
//
// None of these heals by retrying except ErrUnavailable. Run it after
// Migrate when the process migrates itself (Migrate runs as the tables'
// owner; Preflight checks the role the pool logs in as).
func (s *LeaseStore) Preflight(ctx context.Context) error {
	tables := pgstore.LeaseTables
	if s.sessions {
		tables = pgstore.SessionLeaseTables
	}
	return pgstore.Preflight(ctx, s.db, pkg, ErrNotDurable, s.schema, tables, s.columns(), pgsql.LeaseFunctions)
}

// Preflight is LeaseStore.Preflight for the fence's database: the same
// connection and fsync checks; USAGE on the schema, SELECT, INSERT and
// UPDATE on fence_floor, SELECT and INSERT on write_attempt, EXECUTE on
// fence_reject (DELETE on write_attempt, which only PruneAttempts needs,
// is not required); then CheckSchema.
func (f *fenceCore) Preflight(ctx context.Context) error {
	return pgstore.Preflight(ctx, f.db, pkg, ErrNotDurable, f.cfg.schema, pgstore.FenceTables, pgsql.FenceColumns, pgsql.ResourceFunctions)
}

// Preflight is Fence.Preflight, and also requires SELECT, INSERT and
// UPDATE on report_part, the part store's table.
func (r *Resource) Preflight(ctx context.Context) error {
	return pgstore.Preflight(ctx, r.fence.db, pkg, ErrNotDurable, r.fence.cfg.schema, pgstore.ResourceTables, pgsql.ResourceColumns, pgsql.ResourceFunctions)
}
