package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// ErrResent is wrapped by the error of a holder-session acquire that found
// the name held by its own first execution: database/sql sent the
// statement again after the first answer was lost (lib/pq reports a broken
// connection after sending as driver.ErrBadConn, and database/sql retries
// on a new connection), so the caller would never learn of the grant. The
// caller undoes it (pgsql.UndoAcquireSession) and reports the acquire as
// failed. It wraps leasecore.ErrUnavailable: the connection broke, and
// acquiring again is the remedy.
var ErrResent = fmt.Errorf("the acquire's answer was lost and the driver sent it again, which found the name "+
	"held by the first attempt (that hold is being undone): %w", leasecore.ErrUnavailable)

// AcquireSession is Acquire for holder-session mode: it validates its input
// (backendkit.CheckAcquire with minTTL), runs stmt (pgsql.AcquireSession in
// the store's schema) on q with acquireID and returns the grant, a
// *leasecore.HoldError wrapping leasecore.ErrHeld when the name is held,
// or an error wrapping ErrResent (see there). q is a pool in production;
// the conformance harness passes an open transaction to show why that is
// wrong (F2).
//
// Start is read before the request: the statement starts or extends the
// holder's session to now() + ttl when it grants, so the name's expiry,
// the session's, is never earlier than Start + TTL.
func AcquireSession(ctx context.Context, q dbx.Querier, stmt, pkg, name, holder string, ttl, minTTL time.Duration,
	acquireID int64) (leasecore.Grant, error) {
	const op = "acquire"
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, minTTL); err != nil {
		return leasecore.Grant{}, err
	}
	start := time.Now()
	var (
		state, heldBy, space string
		token                int64
	)
	err := RetryConflicts(ctx, func() error {
		return q.QueryRow(ctx, stmt, name, holder, ttl.Microseconds(), acquireID).Scan(&state, &token, &heldBy, &space)
	})
	if err != nil {
		return leasecore.Grant{}, MapError(ctx, pkg, op, err)
	}
	switch state {
	case "granted":
		return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(token), TTL: ttl, Start: start,
			Space: pgsql.TokenSpacePrefix + space}, nil
	case "held":
		return leasecore.Grant{}, &leasecore.HoldError{Op: op, Name: name, Holder: holder,
			Reason: fmt.Sprintf("held by %q with token %d", heldBy, token), Err: leasecore.ErrHeld}
	case "mine":
		return leasecore.Grant{}, fmt.Errorf("%s: %s %q: %w", pkg, op, name, ErrResent)
	}
	return leasecore.Grant{}, fmt.Errorf("%s: %s: unexpected state %q from the acquire statement", pkg, op, state)
}

// OutcomeUnknown reports whether a statement that failed with err (already
// mapped by MapError) may still have taken effect, or may yet: the
// connection broke or the context ended after it was sent (see the
// package doc of fencepg), or it is ErrResent. A conflict that outlasted
// the retries (RetryConflicts) did nothing: the server aborted the
// statement's transaction.
func OutcomeUnknown(err error) bool {
	if err == nil || isConflict(err) {
		return false
	}
	return errors.Is(err, leasecore.ErrUnavailable) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded)
}
