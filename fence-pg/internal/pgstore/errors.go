package pgstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/leasefence/leasefence/leasecore"
)

// MapError is the one place where driver and server errors become
// fence-pg errors. pkg and op name the caller ("fencepg", "acquire"); the
// result reads "<pkg>: <op>: ..." and always wraps err, so the driver's
// error stays reachable with errors.As.
//
// Server errors are classified by SQLSTATE through
// interface{ SQLState() string }, which both *pgconn.PgError (pgx) and
// *pq.Error (lib/pq) implement:
//
//   - 57014 query_canceled: the driver cancelled the statement because ctx
//     ended (or statement_timeout fired): wraps ctx.Err(), or
//     context.Canceled when ctx is still live, so callers keep matching
//     context errors whichever driver they use.
//   - class 08 (connection exception), 57P01/57P02/57P03 (admin or crash
//     shutdown, cannot connect now), class 53 (insufficient resources),
//     40001/40P01 (serialization failure, deadlock): wraps
//     leasecore.ErrUnavailable — the condition may pass.
//   - 55P03 lock_not_available (lock_timeout fired: another transaction
//     holds the scope's floor, e.g. a holder frozen inside its fenced
//     transaction) and 25P03 idle_in_transaction_session_timeout (the
//     server ended this session's transaction): wraps
//     leasecore.ErrUnavailable — retry; nothing of the transaction stays.
//   - 42P01 undefined_table, 42703 undefined_column: wraps
//     leasecore.ErrSchema — Migrate has not been run.
//
// Without a SQLSTATE: context errors are kept; an error while ctx is done
// is attributed to ctx; connection-level failures (net.Error, io.EOF,
// io.ErrUnexpectedEOF, driver.ErrBadConn, *pgconn.ConnectError) wrap
// leasecore.ErrUnavailable. Everything else is wrapped as it is.
//
// For ErrUnavailable and for context errors the operation may or may not
// have taken effect: the statement may have committed before the
// connection broke.
func MapError(ctx context.Context, pkg, op string, err error) error {
	if err == nil {
		return nil
	}
	prefix := pkg + ": " + op
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		switch code := coded.SQLState(); {
		case code == "57014":
			cause := ctx.Err()
			if cause == nil {
				cause = context.Canceled
			}
			return fmt.Errorf("%s: %w: %w", prefix, cause, err)
		case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"),
			code == "57P01", code == "57P02", code == "57P03",
			code == "40001", code == "40P01":
			return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
		case code == "55P03":
			return fmt.Errorf("%s: %w (lock timeout: another transaction holds the lock, e.g. a holder frozen inside its fenced transaction): %w",
				prefix, leasecore.ErrUnavailable, err)
		case code == "25P03":
			return fmt.Errorf("%s: %w (the server ended this transaction: idle in transaction for too long): %w",
				prefix, leasecore.ErrUnavailable, err)
		case code == "42P01", code == "42703":
			return fmt.Errorf("%s: %w (run Migrate): %w", prefix, leasecore.ErrSchema, err)
		}
		return fmt.Errorf("%s: %w", prefix, err)
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", prefix, err)
	case ctx.Err() != nil:
		// The driver noticed ctx in its own way (lib/pq can report a broken
		// connection); what the caller needs to match is the context.
		return fmt.Errorf("%s: %w: %w", prefix, ctx.Err(), err)
	case isConnectionError(err):
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

func isConnectionError(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn)
}
