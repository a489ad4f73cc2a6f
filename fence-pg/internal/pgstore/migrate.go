package pgstore

import (
	"context"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
)

// Migrate applies schema, a script of idempotent statements (CREATE ... IF
// NOT EXISTS), in one transaction that first takes pgsql.MigrateLock, so
// that two processes migrating at once run one after the other and the
// second finds everything in place. DDL is transactional in PostgreSQL: a
// failed migration leaves nothing half-applied.
func Migrate(ctx context.Context, db dbx.DB, pkg, schema string) (err error) {
	const op = "migrate"
	if err := leasecore.CheckContext(op, ctx); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			// Not ctx: it may be the reason we are rolling back.
			_ = tx.Rollback(context.WithoutCancel(ctx))
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
