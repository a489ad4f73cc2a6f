package fencepg

import (
	"context"
	_ "embed" // the schema files below
	"fmt"
	"regexp"
	"slices"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
)

// The schemas, embedded so that a binary migrates without its source tree.
// They name their tables in DefaultSchema; LeaseDDL and ResourceDDL move
// them.
var (
	//go:embed schema/lease.sql
	leaseSchema string
	//go:embed schema/resource.sql
	resourceSchema string
	//go:embed schema/guard.sql
	guardSchema string
)

// DefaultSchema is the PostgreSQL schema the library's tables live in
// unless WithSchema says otherwise: a schema of their own, so that they
// never collide with the application's tables.
const DefaultSchema = "leasefence"

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// checkSchemaName accepts a lower-case unquoted identifier of at most 63
// bytes that is not reserved for the system (pg_*).
func checkSchemaName(op, name string) error {
	bad := func(reason string) error {
		return &leasecore.ArgError{Op: op, Field: "schema", Value: fmt.Sprintf("%q", name), Reason: reason}
	}
	switch {
	case name == "":
		return &leasecore.ArgError{Op: op, Field: "schema", Reason: "must not be empty"}
	case len(name) > 63:
		return bad("is longer than 63 bytes, PostgreSQL's identifier limit")
	case !identifier.MatchString(name):
		return bad("must be a lower-case unquoted identifier: a-z, 0-9 and _, not starting with a digit")
	case len(name) >= 3 && name[:3] == "pg_":
		return bad(`must not start with "pg_" (reserved for system schemas)`)
	}
	return nil
}

// LeaseDDL returns the SQL that creates the lease table in schema, and the
// function token_space that names the schema's token space (a UUID drawn
// by the server the first time the script runs there, never changed: see
// leasecore.Grant.Space), for users who apply migrations with their own
// tool instead of Migrate. It also creates the holder_session table of
// WithSharedLeases and the function holder_session_expiry through which
// every store reads a session's expiry, and adds the lease table's columns
// of that mode to a table made before it. It is idempotent (CREATE ... IF
// NOT EXISTS; a column is added only when missing). The runtime role then
// needs (EXECUTE on the functions is PUBLIC's by default):
//
//	GRANT USAGE ON SCHEMA <schema> TO <role>;
//	GRANT SELECT, INSERT, UPDATE ON <schema>.lease TO <role>;
//	GRANT SELECT, INSERT, UPDATE ON <schema>.holder_session TO <role>; -- with WithSharedLeases only
//
// LeaseStore.Preflight checks them, and names any that is missing.
func LeaseDDL(schema string) (string, error) {
	if err := checkSchemaName("lease ddl", schema); err != nil {
		return "", err
	}
	return ddl(leaseSchema, schema), nil
}

// ResourceDDL returns the SQL that creates the fence's tables (fence_floor,
// write_attempt, the part store's report_part, Outbox's outbox) and its
// function fence_reject in schema, for users who apply migrations with
// their own tool. It is idempotent, and upgrades a fence_floor made before
// its token_space column (added only when missing). The runtime role then
// needs:
//
//	GRANT USAGE ON SCHEMA <schema> TO <role>;
//	GRANT SELECT, INSERT, UPDATE ON <schema>.fence_floor TO <role>;
//	GRANT SELECT, INSERT, DELETE ON <schema>.write_attempt TO <role>;
//	GRANT SELECT, INSERT, UPDATE ON <schema>.report_part TO <role>; -- with Resource only
//	GRANT SELECT, INSERT, UPDATE, DELETE ON <schema>.outbox TO <role>; -- with Outbox only
//
// (DELETE only for PruneAttempts and Outbox.PruneDelivered; EXECUTE on
// fence_reject is granted to PUBLIC by default.) The module's tests run
// every operation as a role with exactly these grants. Fence.Preflight,
// Resource.Preflight and Outbox.Preflight check the ones each needs (all
// but DELETE), and name any that is missing.
func ResourceDDL(schema string) (string, error) {
	if err := checkSchemaName("resource ddl", schema); err != nil {
		return "", err
	}
	return ddl(resourceScript(), schema), nil
}

// ddl is script in schema, preceded by the schema's creation and the
// token-space guard function its triggers call.
func ddl(script, schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + schema + ";\n" + pgsql.InSchema(guardSchema+"\n"+script, schema)
}

// Migrate creates the lease table, the holder_session table and their
// functions (see LeaseDDL) in the lease database if they do not exist,
// adds the lease table's columns of holder sessions to a table made before
// them, then runs CheckSchema. It is idempotent, and two processes
// running it at once serialise on an advisory lock inside its transaction.
func (s *LeaseStore) Migrate(ctx context.Context) error {
	if err := pgstore.Migrate(ctx, s.db, pkg, ddl(leaseSchema, s.schema)); err != nil {
		return err
	}
	return s.CheckSchema(ctx)
}

// CheckSchema reports, as an error wrapping leasecore.ErrSchema that names
// the table or column, whether the lease table is missing, out of date,
// foreign, or not visible to this pool's role. Preflight runs it last,
// after its connection, durability and privilege checks (a role without
// privileges sees the table as missing; Preflight names the GRANT): call
// Preflight at start-up.
//
// A store with holder sessions also wants the holder_session table; one
// without the mode only the lease table's columns of the mode and the
// function it reads sessions through (its role need not see
// holder_session).
func (s *LeaseStore) CheckSchema(ctx context.Context) error {
	return pgstore.CheckSchema(ctx, s.db, pkg, s.schema, s.columns(), pgsql.LeaseFunctions)
}

// columns are the columns CheckSchema and Preflight want for the store's
// mode.
func (s *LeaseStore) columns() []pgsql.Column {
	if s.sessions {
		return append(slices.Clip(pgsql.LeaseColumns), pgsql.SessionColumns...)
	}
	return pgsql.LeaseColumns
}

// Migrate creates the resource tables (fence_floor, report_part,
// write_attempt) and the function fence_reject if they do not exist, then
// runs CheckSchema. It is idempotent, and two processes running it at once
// serialise on an advisory lock inside its transaction.
func (r *Resource) Migrate(ctx context.Context) error {
	if err := pgstore.Migrate(ctx, r.fence.db, pkg, ddl(resourceScript(), r.fence.cfg.schema)); err != nil {
		return err
	}
	return r.CheckSchema(ctx)
}

// CheckSchema is Fence.CheckSchema, and also wants report_part, the part
// store's table.
func (r *Resource) CheckSchema(ctx context.Context) error {
	return pgstore.CheckSchema(ctx, r.fence.db, pkg, r.fence.cfg.schema, pgsql.ResourceColumns, pgsql.ResourceFunctions)
}
