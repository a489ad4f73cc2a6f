package pgstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
)

// MapError is the one place where driver and server errors become
// fence-pg errors. pkg and op name the caller ("fencepg", "acquire"); the
// result reads "<pkg>: <op>: ..." and always wraps err, so the driver's
// error stays reachable with errors.As.
//
// Server errors are classified by SQLSTATE through
// interface{ SQLState() string }, which both *pgconn.PgError (pgx) and
// *pq.Error (lib/pq) implement (PostgreSQL documentation, Appendix A,
// "PostgreSQL Error Codes"). The SQLSTATE wins over everything else: a
// *pgconn.ConnectError that carries the server's refusal of the session
// (an unknown database, a failed login) is a configuration error, not a
// connection that may come back.
//
// When ctx has ended, an error that the end explains (the driver's context
// error, a connection it closed or marked bad for ctx, a statement it
// cancelled for ctx: SQLSTATE 57014) is reported as ctx's end, and so is
// any transient condition below that would otherwise wrap
// leasecore.ErrUnavailable: the error wraps ctx.Err() and context.Cause(ctx)
// (a session's context ends with leasecore.ErrLocalDeadline or
// leasecore.ErrLost), and never leasecore.ErrUnavailable, so that a caller
// that retries on ErrUnavailable does not take a lease that ended for a
// database that faltered. Its message reads "<pkg>: <op>: context canceled
// (the context ended: <cause>)" ("context deadline exceeded" for a
// deadline) whichever driver noticed, followed by the
// driver's message only when that says more than the context's end (an
// error of the caller's own function, say). The server's definite answers
// (a missing table, a missing grant, a constraint) keep their mapping.
//
//   - 57014 query_canceled, ctx live: when the server says "canceling
//     statement due to statement timeout", the server's statement_timeout
//     ended it: wraps leasecore.ErrUnavailable (the statement waited or ran
//     longer than the role's, database's or server's statement_timeout; it
//     may pass, or the setting is too low). Otherwise (pg_cancel_backend,
//     or a server whose lc_messages is not English, so the message cannot
//     be told apart) it wraps context.Canceled.
//   - class 08 (connection exception), 57P01/57P02/57P03 (admin or crash
//     shutdown, cannot connect now), class 53 (insufficient resources),
//     40001/40P01 (serialization failure, deadlock): wraps
//     leasecore.ErrUnavailable — the condition may pass.
//   - 55P03 lock_not_available (lock_timeout fired: another transaction
//     holds the scope's floor, e.g. a holder frozen inside its fenced
//     transaction) and 25P03 idle_in_transaction_session_timeout (the
//     server ended this session's transaction): wraps
//     leasecore.ErrUnavailable — retry; nothing of the transaction stays.
//   - 42P01 undefined_table, 42703 undefined_column, 42883
//     undefined_function (fence_reject, token_space): wraps
//     leasecore.ErrSchema — Migrate has not been run.
//   - 3D000 invalid_catalog_name (the database does not exist), 28000
//     invalid_authorization_specification (unknown role, a role without
//     LOGIN, no pg_hba.conf entry), 28P01 invalid_password, 42501
//     insufficient_privilege (the message gives the GRANT the library's
//     documentation lists for the object the server names), 42P05
//     duplicate_prepared_statement and 26000 invalid_sql_statement_name
//     (prepared statements lost or shared between clients: pgx's default
//     exec mode behind PgBouncer in transaction mode): wraps
//     leasecore.ErrConfig — retrying will not help until the
//     configuration is fixed; the message says what to change.
//
// Without a SQLSTATE, ctx live: a failure to connect (*pgconn.ConnectError,
// also when it is pgx's own connect timeout, which wraps
// context.DeadlineExceeded) wraps leasecore.ErrUnavailable; other context
// errors (of a context of the caller's function, not ctx) are kept; other
// connection-level failures (net.Error, io.EOF, io.ErrUnexpectedEOF,
// driver.ErrBadConn) wrap leasecore.ErrUnavailable. Everything else is
// wrapped as it is.
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
	hasState := errors.As(err, &coded)
	if ctx.Err() != nil && (!hasState || transientState(coded.SQLState())) {
		return contextEnded(ctx, prefix, err)
	}
	if hasState {
		return mapSQLState(prefix, op, coded.SQLState(), serverMessage(err), err)
	}
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &connectErr):
		// No connection was made while ctx is live: a refused or unreachable
		// server, or pgx's own connect timeout (connect_timeout in the DSN),
		// which pgx reports as a context deadline of its own — a server
		// frozen mid-failover, not the caller's context ending.
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", prefix, err)
	case IsConnectionError(err):
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// ContextEnded is MapError's error for an operation whose ctx has ended
// before it sent anything: "<pkg>: <op>: context canceled (the context
// ended: <cause>)", wrapping ctx.Err() and context.Cause(ctx). ctx must
// have ended.
func ContextEnded(ctx context.Context, pkg, op string) error {
	return contextEnded(ctx, pkg+": "+op, ctx.Err())
}

// contextError is the error of an operation whose context ended: its
// message reads as the context's end, and it wraps the context's error,
// the cause of its end and the driver's error.
type contextError struct {
	msg  string
	errs []error
}

func (e *contextError) Error() string   { return e.msg }
func (e *contextError) Unwrap() []error { return e.errs }

// contextEnded returns MapError's error for err, which the operation
// prefix got after ctx ended (see MapError).
func contextEnded(ctx context.Context, prefix string, err error) error {
	ended := ctx.Err()
	msg := prefix + ": " + ended.Error()
	errs := []error{ended}
	if cause := context.Cause(ctx); cause != nil && cause != ended {
		msg += " (the context ended: " + cause.Error() + ")"
		errs = append(errs, cause)
	}
	if !explainedByContext(err) {
		msg += ": " + err.Error()
	}
	return &contextError{msg: msg, errs: append(errs, err)}
}

// explainedByContext reports whether err, received after the operation's
// context ended, says no more than that: the context's error in the
// driver's words (pgx: "timeout: context already done: context
// canceled"), a connection the driver closed or marked bad for it (lib/pq:
// "driver: bad connection"; pgx: "conn closed", an error it marks safe to
// retry because nothing was sent), a transaction database/sql rolled back
// for it (sql.ErrTxDone), or a transient server error (a statement the
// driver cancelled, a session that ended).
func explainedByContext(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return transientState(coded.SQLState())
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		IsConnectionError(err) || errors.Is(err, sql.ErrTxDone) || pgconn.SafeToRetry(err)
}

// transientState reports whether SQLSTATE code is a condition that may
// pass (mapSQLState wraps leasecore.ErrUnavailable or a context error for
// it), not a definite answer of the server about the statement or the
// deployment.
func transientState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"):
		return true
	}
	switch code {
	case "57014", "57P01", "57P02", "57P03", "40001", "40P01", "55P03", "25P03":
		return true
	}
	return false
}

// The server's messages MapError tells apart within one SQLSTATE
// (src/backend/tcop/postgres.c, ProcessInterrupts). They are English
// unless the server's lc_messages says otherwise.
const msgStatementTimeout = "canceling statement due to statement timeout"

// pgBouncerHint is the fix for prepared statements that collide or vanish.
const pgBouncerHint = "prepared statements of this connection are not the driver's own: " +
	"typically pgx's default exec mode (cache_statement) behind PgBouncer in transaction mode, " +
	"which hands each transaction another server connection; set default_query_exec_mode=exec " +
	"(or simple_protocol) in the DSN, or pgx.ConnConfig.DefaultQueryExecMode; " +
	"with lib/pq, which prepares an unnamed statement in one round trip and runs it in the next, " +
	"set binary_parameters=yes in the DSN (one round trip); " +
	"or use PgBouncer 1.21+ with max_prepared_statements, or session mode"

// mapSQLState maps a server error while the operation's context is live
// (MapError handles an ended one first).
func mapSQLState(prefix, op, code, msg string, err error) error {
	switch {
	case code == "57014":
		if strings.Contains(msg, msgStatementTimeout) {
			return fmt.Errorf("%s: %w (the server's statement_timeout ended the statement: "+
				"it ran or waited for a lock longer than the statement_timeout of this role, database or server; "+
				"raise statement_timeout, or find what holds the lock): %w",
				prefix, leasecore.ErrUnavailable, err)
		}
		return fmt.Errorf("%s: %w: %w", prefix, context.Canceled, err)
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"),
		code == "57P01", code == "57P02", code == "57P03",
		code == "40001", code == "40P01":
		return fmt.Errorf("%s: %w: %w", prefix, leasecore.ErrUnavailable, err)
	case code == "55P03":
		return fmt.Errorf("%s: %w (lock_timeout: the statement waited longer than lock_timeout for a lock another transaction holds, "+
			"e.g. a holder frozen inside its fenced transaction; retry, or raise lock_timeout): %w",
			prefix, leasecore.ErrUnavailable, err)
	case code == "25P03":
		return fmt.Errorf("%s: %w (the server ended this transaction: idle in transaction for longer than idle_in_transaction_session_timeout; "+
			"nothing of the transaction was committed): %w",
			prefix, leasecore.ErrUnavailable, err)
	case code == "42P01", code == "42703", code == "42883":
		return fmt.Errorf("%s: %w (run Migrate): %w", prefix, leasecore.ErrSchema, err)
	case code == "3D000":
		return fmt.Errorf("%s: %w (the database does not exist: check the database name in the DSN, or create the database): %w",
			prefix, leasecore.ErrConfig, err)
	case code == "28000":
		return fmt.Errorf("%s: %w (the server refused this role: check the user name in the DSN, "+
			"that the role exists and has LOGIN, and that pg_hba.conf lets it connect from here): %w",
			prefix, leasecore.ErrConfig, err)
	case code == "28P01":
		return fmt.Errorf("%s: %w (authentication failed: check the password in the DSN, PGPASSWORD or .pgpass, "+
			"and the role's password on the server): %w",
			prefix, leasecore.ErrConfig, err)
	case code == "42501":
		return fmt.Errorf("%s: %w (permission denied: %s): %w", prefix, leasecore.ErrConfig, grantHint(op, msg), err)
	case code == "42P05", code == "26000":
		return fmt.Errorf("%s: %w (%s): %w", prefix, leasecore.ErrConfig, pgBouncerHint, err)
	}
	return fmt.Errorf("%s: %w", prefix, err)
}

// serverMessage returns the primary message of the server's error in err,
// from either driver, or "". lib/pq's *pq.Error is read through its Get
// method (the fields would need an import of lib/pq, which would register
// its driver in every program that uses pgx only).
func serverMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	var fields interface{ Get(k byte) string }
	if errors.As(err, &fields) {
		return fields.Get('M')
	}
	return ""
}

// grantHint says which grant a 42501 asks for, from the object the
// server's message names ("permission denied for table lease"; "relation"
// before PostgreSQL 11). The library's tables get the grants LeaseDDL and
// ResourceDDL document. The server names the object without its schema
// and MapError knows neither the store's schema nor the role: the hint
// spells the default schema and "this role"; Preflight names both.
func grantHint(op, msg string) string {
	if op == "migrate" {
		return "Migrate creates the schema and its tables: run it as their owner (a role that may create them), " +
			"or apply LeaseDDL / ResourceDDL with your migration tool"
	}
	kind, name, ok := strings.Cut(strings.TrimPrefix(msg, "permission denied for "), " ")
	if !ok || !strings.HasPrefix(msg, "permission denied for ") {
		return "grant this role the privilege the server's message names"
	}
	inSchema := "; with WithSchema, that schema instead of " + pgsql.DefaultSchema
	switch kind {
	case "database":
		return fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO this role", name)
	case "schema":
		return fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO this role", name)
	case "table", "relation":
		if privs, ok := RuntimeGrants[name]; ok {
			return fmt.Sprintf("GRANT %s ON %s.%s TO this role%s", privs, pgsql.DefaultSchema, name, inSchema)
		}
		return fmt.Sprintf("grant this role the privileges it needs on table %s (GRANT ... ON %s TO this role)", name, name)
	case "function":
		if slices.Contains(pgsql.LeaseFunctions, name) || slices.Contains(pgsql.ResourceFunctions, name) {
			return fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s.%s TO this role%s", pgsql.DefaultSchema, name, inSchema)
		}
		return fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO this role", name)
	}
	return fmt.Sprintf("grant this role what it needs on %s %s", kind, name)
}

// IsConnectionError reports whether err is a connection-level failure (a
// broken or closed connection), as MapError classifies it.
func IsConnectionError(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, driver.ErrBadConn)
}
