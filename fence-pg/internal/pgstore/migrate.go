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

// Migrate applies schema, a script of idempotent statements (CREATE ... IF
// NOT EXISTS), in one transaction that first takes pgsql.MigrateLock, so
// that two processes migrating at once run one after the other and the
// second finds everything in place. DDL is transactional in PostgreSQL: a
// failed migration leaves nothing half-applied.
func Migrate(ctx context.Context, db dbx.DB, pkg, schema string) (err error) {
	const op = "migrate"
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			// Under ctx: a rollback must not outlast the caller's
			// deadline. With ctx ended pgx closes the connection
			// instead, and the server rolls the transaction back (and
			// releases MigrateLock) when it sees it close.
			_ = tx.Rollback(ctx)
		}
	}()
	// Without arguments both drivers send the simple query protocol, which
	// accepts a script of several statements.
	for _, stmt := range []string{pgsql.MigrateLock, schema} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return MapError(ctx, pkg, op, err)
		}
	}
	return MapError(ctx, pkg, op, tx.Commit(ctx))
}

// CheckSchema compares the tables of schema with want and looks for the
// functions funcs (pgsql.LeaseFunctions, pgsql.ResourceFunctions): a
// missing table, column or function, a column of another type (an
// out-of-date schema, or a foreign table of the same name) returns an error
// wrapping leasecore.ErrSchema that names it. A role that cannot see a
// table (no privilege on it) sees it as missing.
func CheckSchema(ctx context.Context, db dbx.DB, pkg, schema string, want []pgsql.Column, funcs []string) error {
	const op = "check schema"
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return err
	}
	rows, err := db.Query(ctx, pgsql.Columns, schema)
	if err != nil {
		return MapError(ctx, pkg, op, err)
	}
	defer rows.Close()
	have := map[[2]string]string{}
	tables := map[string]bool{}
	for rows.Next() {
		var table, column, typ string
		if err := rows.Scan(&table, &column, &typ); err != nil {
			return MapError(ctx, pkg, op, err)
		}
		have[[2]string{table, column}] = typ
		tables[table] = true
	}
	if err := rows.Err(); err != nil {
		return MapError(ctx, pkg, op, err)
	}
	for _, c := range want {
		typ, ok := have[[2]string{c.Table, c.Name}]
		switch {
		case !tables[c.Table]:
			return fmt.Errorf("%s: %s: %w: table %s.%s is missing or not visible to this role (run Migrate as the owner, grant access to this role)",
				pkg, op, leasecore.ErrSchema, schema, c.Table)
		case !ok:
			return fmt.Errorf("%s: %s: %w: table %s.%s has no column %s: it is out of date or not the library's (run Migrate, or choose another schema)",
				pkg, op, leasecore.ErrSchema, schema, c.Table, c.Name)
		case typ != c.Type:
			return fmt.Errorf("%s: %s: %w: column %s.%s.%s is %s, want %s: the table is out of date or not the library's",
				pkg, op, leasecore.ErrSchema, schema, c.Table, c.Name, typ, c.Type)
		}
	}
	// The token-space guards: a schema migrated before they existed lacks
	// them, and then nothing stops a reset of the tokens.
	checked := map[string]bool{}
	for _, c := range want {
		guards, ok := pgsql.GuardTriggers[c.Table]
		if !ok || checked[c.Table] {
			continue
		}
		checked[c.Table] = true
		var have string
		if err := db.QueryRow(ctx, pgsql.Triggers, schema, c.Table).Scan(&have); err != nil {
			return MapError(ctx, pkg, op, err)
		}
		present := map[string]bool{}
		for _, name := range strings.Split(have, ",") {
			present[name] = true
		}
		for _, g := range guards {
			if !present[g] {
				return fmt.Errorf("%s: %s: %w: table %s.%s lacks its token-space guard (trigger %s): the schema is out of date (run Migrate)",
					pkg, op, leasecore.ErrSchema, schema, c.Table, g)
			}
		}
	}
	if slices.ContainsFunc(want, func(c pgsql.Column) bool { return c.Table == "holder_session" }) {
		var have string
		if err := db.QueryRow(ctx, pgsql.Triggers, schema, "lease").Scan(&have); err != nil {
			return MapError(ctx, pkg, op, err)
		}
		if !slices.Contains(strings.Split(have, ","), pgsql.SessionDetachTrigger) {
			return fmt.Errorf("%s: %s: %w: table %s.lease lacks trigger %s, which holder sessions need: the schema is out of date (run Migrate)",
				pkg, op, leasecore.ErrSchema, schema, pgsql.SessionDetachTrigger)
		}
	}
	for _, fn := range funcs {
		var ok bool
		if err := db.QueryRow(ctx, pgsql.HasFunction, schema, fn).Scan(&ok); err != nil {
			return MapError(ctx, pkg, op, err)
		}
		if !ok {
			return fmt.Errorf("%s: %s: %w: function %s.%s is missing (run Migrate)", pkg, op, leasecore.ErrSchema, schema, fn)
		}
	}
	return nil
}
