package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// RuntimeGrants are the table privileges a runtime role needs on each of
// the library's tables, as LeaseDDL and ResourceDDL document them (and
// TestRuntimeRole runs every operation with): MapError's hint for a 42501
// and Preflight's check both read them.
var RuntimeGrants = map[string]string{
	"lease":          "SELECT, INSERT, UPDATE",
	"holder_session": "SELECT, INSERT, UPDATE", // with fencepg.WithSharedLeases only
	"fence_floor":    "SELECT, INSERT, UPDATE",
	"report_part":    "SELECT, INSERT, UPDATE",
	"write_attempt":  "SELECT, INSERT, DELETE",         // DELETE for PruneAttempts only
	"outbox":         "SELECT, INSERT, UPDATE, DELETE", // DELETE for Outbox.PruneDelivered only
}

// Preflight's table lists: the tables each store uses, with the privileges
// it cannot run without. DELETE on write_attempt is left out: only
// PruneAttempts needs it, and a deployment that never prunes need not
// grant it (PruneAttempts then fails with the grant in its message).
var (
	LeaseTables = []TablePrivileges{{"lease", "SELECT, INSERT, UPDATE"}}
	// SessionLeaseTables: a lease store with holder sessions also
	// renews, starts and ends session rows.
	SessionLeaseTables = []TablePrivileges{{"lease", "SELECT, INSERT, UPDATE"}, {"holder_session", "SELECT, INSERT, UPDATE"}}
	FenceTables        = []TablePrivileges{{"fence_floor", "SELECT, INSERT, UPDATE"}, {"write_attempt", "SELECT, INSERT"}}
	ResourceTables     = []TablePrivileges{{"fence_floor", "SELECT, INSERT, UPDATE"}, {"write_attempt", "SELECT, INSERT"},
		{"report_part", "SELECT, INSERT, UPDATE"}}
	// OutboxTables: Outbox.Add share-locks the floor row (FOR SHARE needs
	// UPDATE); DELETE on outbox only for PruneDelivered.
	OutboxTables = []TablePrivileges{{"fence_floor", "SELECT, UPDATE"}, {"outbox", "SELECT, INSERT, UPDATE"}}
)

// TablePrivileges is one table and the privileges a store needs on it,
// comma-separated as in a GRANT.
type TablePrivileges struct{ Table, Privileges string }

// PreflightServer reads, in one round trip on one connection: the session's
// role (quoted for a GRANT), the server's fsync, whether the schema exists
// and this role may use it, and which of the functions named in the
// comma-separated list $2 (those there) it may not execute, comma-separated.
// It reads pg_catalog only, which every role may read, so a missing
// privilege is reported here rather than as a failed statement.
const PreflightServer = `SELECT quote_ident(current_user)::text, current_setting('fsync')::text,
  n.oid IS NOT NULL, coalesce(has_schema_privilege(n.oid, 'USAGE'), false),
  coalesce((SELECT string_agg(DISTINCT p.proname::text, ',') FROM pg_proc p
    WHERE p.pronamespace = n.oid AND p.proname = ANY (string_to_array($2::text, ','))
      AND NOT has_function_privilege(p.oid, 'EXECUTE')), '')
FROM (SELECT 1) AS one LEFT JOIN pg_namespace n ON n.nspname = $1::text`

// PreflightTables reads, for each table of the comma-separated list $2 in
// schema $1, whether it exists and which of SELECT, INSERT, UPDATE and
// DELETE this role has on it (directly, through PUBLIC or a role it
// inherits from). Asked by oid, has_table_privilege needs no USAGE on the
// schema.
const PreflightTables = `SELECT t.name::text, c.oid IS NOT NULL,
  coalesce(has_table_privilege(c.oid, 'SELECT'), false), coalesce(has_table_privilege(c.oid, 'INSERT'), false),
  coalesce(has_table_privilege(c.oid, 'UPDATE'), false), coalesce(has_table_privilege(c.oid, 'DELETE'), false)
FROM unnest(string_to_array($2::text, ',')) WITH ORDINALITY AS t(name, ord)
LEFT JOIN pg_namespace n ON n.nspname = $1::text
LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.name
ORDER BY t.ord`

// Preflight checks, before a store's first real operation, what would
// otherwise fail later or, worse, not fail at all:
//
//  1. the server can be reached with the pool's DSN (an unknown database
//     or role, a failed login: MapError's leasecore.ErrConfig);
//  2. the server is crash-safe: fsync on, else an error wrapping
//     notDurable (fencepg.ErrNotDurable, which wraps leasecore.ErrConfig);
//  3. the pool's role has USAGE on schema and the privileges tables lists,
//     and EXECUTE on the functions funcs: else leasecore.ErrConfig, with
//     every missing GRANT spelled for this role;
//  4. the tables are the library's and up to date: CheckSchema with want
//     and funcs (leasecore.ErrSchema).
//
// A missing schema or table is left to CheckSchema, which says to run
// Migrate.
func Preflight(ctx context.Context, db dbx.DB, pkg string, notDurable error, schema string, tables []TablePrivileges,
	want []pgsql.Column, funcs []string) error {
	const op = "preflight"
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return err
	}
	var role, fsync string
	var schemaExists, usage bool
	var noExecute string
	if err := db.QueryRow(ctx, PreflightServer, schema, strings.Join(funcs, ",")).Scan(
		&role, &fsync, &schemaExists, &usage, &noExecute); err != nil {
		return MapError(ctx, pkg, op, err)
	}
	if fsync != "on" {
		return fmt.Errorf("%s: %s: %w: in an operating system crash or power failure the server could lose a token "+
			"it acknowledged and hand it out again (two holders with one token), or a fence's floor could go back "+
			"(a stale holder's write accepted); turn fsync on (ALTER SYSTEM SET fsync = on; SELECT pg_reload_conf())",
			pkg, op, notDurable)
	}
	if !schemaExists {
		return CheckSchema(ctx, db, pkg, schema, want, funcs)
	}
	var grants []string
	if !usage {
		grants = append(grants, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", schema, role))
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.Table
	}
	rows, err := db.Query(ctx, PreflightTables, schema, strings.Join(names, ","))
	if err != nil {
		return MapError(ctx, pkg, op, err)
	}
	defer rows.Close()
	for i := 0; rows.Next(); i++ {
		var name string
		var exists, sel, ins, upd, del bool
		if err := rows.Scan(&name, &exists, &sel, &ins, &upd, &del); err != nil {
			return MapError(ctx, pkg, op, err)
		}
		if !exists {
			continue // CheckSchema says to run Migrate
		}
		have := map[string]bool{"SELECT": sel, "INSERT": ins, "UPDATE": upd, "DELETE": del}
		var missing []string
		for _, p := range strings.Split(tables[i].Privileges, ", ") {
			if !have[p] {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			grants = append(grants, fmt.Sprintf("GRANT %s ON %s.%s TO %s", strings.Join(missing, ", "), schema, name, role))
		}
	}
	if err := rows.Err(); err != nil {
		return MapError(ctx, pkg, op, err)
	}
	rows.Close()
	for _, fn := range funcs {
		if slices.Contains(strings.Split(noExecute, ","), fn) {
			grants = append(grants, fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s.%s TO %s", schema, fn, role))
		}
	}
	if len(grants) > 0 {
		return fmt.Errorf("%s: %s: %w: role %s lacks privileges the store needs: %s", pkg, op, leasecore.ErrConfig, role,
			strings.Join(grants, "; "))
	}
	return CheckSchema(ctx, db, pkg, schema, want, funcs)
}
