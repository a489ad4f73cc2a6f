package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Acquire validates its input (backendkit.CheckAcquire with minTTL), runs
// stmt (pgsql.Acquire, in the store's schema) on q and returns the grant,
// named by the schema's token space, or a *leasecore.HoldError
// wrapping leasecore.ErrHeld when the statement returned no row. q is a
// pool in production; the conformance harness passes an open transaction
// to show why that is wrong (F2).
func Acquire(ctx context.Context, q dbx.Querier, stmt, pkg, name, holder string, ttl, minTTL time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, minTTL); err != nil {
		return leasecore.Grant{}, err
	}
	// Read before sending: the server starts the TTL only when it runs the
	// statement, so Start + TTL is never later than the server's expiry.
	start := time.Now()
	var (
		token int64
		space string
	)
	err := RetrySerialization(ctx, func() error {
		return q.QueryRow(ctx, stmt, name, holder, ttl.Microseconds()).Scan(&token, &space)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return leasecore.Grant{}, &leasecore.HoldError{Op: "acquire", Name: name, Holder: holder, Err: leasecore.ErrHeld}
	case err != nil:
		return leasecore.Grant{}, MapError(ctx, pkg, "acquire", err)
	}
	return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(token), TTL: ttl, Start: start,
		Space: pgsql.TokenSpacePrefix + space}, nil
}
