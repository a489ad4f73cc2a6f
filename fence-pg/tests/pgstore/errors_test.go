package pgstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
)

// TestMapError classifies the error values both drivers return. The
// real-server paths (a blocked statement cancelled, a terminated session, a
// refused connection, a missing table) are tested in package fencepg.
func TestMapError(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(live)
	cancel2()

	pgErr := func(code string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m"} }
	pqErr := func(code string) error { return &pq.Error{Code: pqerror.Code(code), Message: "m"} }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: wrapped as it is
	}{
		{"pgx 08006", live, pgErr("08006"), leasecore.ErrUnavailable},
		{"pq 08001", live, pqErr("08001"), leasecore.ErrUnavailable},
		{"pgx admin shutdown", live, pgErr("57P01"), leasecore.ErrUnavailable},
		{"pq crash shutdown", live, pqErr("57P02"), leasecore.ErrUnavailable},
		{"pgx cannot connect now", live, pgErr("57P03"), leasecore.ErrUnavailable},
		{"pq too many connections", live, pqErr("53300"), leasecore.ErrUnavailable},
		{"pgx disk full", live, pgErr("53100"), leasecore.ErrUnavailable},
		{"pq serialization failure", live, pqErr("40001"), leasecore.ErrUnavailable},
		{"pgx deadlock", live, pgErr("40P01"), leasecore.ErrUnavailable},
		{"pgx lock timeout", live, pgErr("55P03"), leasecore.ErrUnavailable},
		{"pq idle in transaction timeout", live, pqErr("25P03"), leasecore.ErrUnavailable},
		{"pgx undefined table", live, pgErr("42P01"), leasecore.ErrSchema},
		{"pq undefined column", live, pqErr("42703"), leasecore.ErrSchema},
		{"pgx query canceled, ctx live", live, pgErr("57014"), context.Canceled},
		{"pq query canceled, ctx cancelled", cancelled, pqErr("57014"), context.Canceled},
		{"pgx query canceled, deadline", expired, pgErr("57014"), context.DeadlineExceeded},
		{"pq unique violation", live, pqErr("23505"), nil},
		{"wrapped pgx error", live, fmt.Errorf("x: %w", pgErr("42P01")), leasecore.ErrSchema},
		{"context error kept", live, fmt.Errorf("timeout: %w", context.DeadlineExceeded), context.DeadlineExceeded},
		{"driver error after ctx ended", cancelled, driver.ErrBadConn, context.Canceled},
		{"EOF", live, io.EOF, leasecore.ErrUnavailable},
		{"unexpected EOF", live, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), leasecore.ErrUnavailable},
		{"bad conn", live, driver.ErrBadConn, leasecore.ErrUnavailable},
		{"net error", live, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, leasecore.ErrUnavailable},
		{"other", live, errors.New("boom"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pgstore.MapError(tc.ctx, "fencepg", "acquire", tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the driver's error %v", got, tc.err)
			}
			if !strings.HasPrefix(got.Error(), "fencepg: acquire: ") {
				t.Errorf("message %q lacks the prefix", got)
			}
			if tc.want != nil && !errors.Is(got, tc.want) {
				t.Errorf("%v does not wrap %v", got, tc.want)
			}
			for _, s := range []error{leasecore.ErrUnavailable, leasecore.ErrSchema, leasecore.ErrConfig, context.Canceled, context.DeadlineExceeded} {
				if s != tc.want && !errors.Is(tc.err, s) && errors.Is(got, s) {
					t.Errorf("%v wraps %v too", got, s)
				}
			}
			if tc.want == leasecore.ErrSchema && !strings.Contains(got.Error(), "run Migrate") {
				t.Errorf("%v does not say to run Migrate", got)
			}
		})
	}
	if pgstore.MapError(live, "fencepg", "acquire", nil) != nil {
		t.Error("pgstore.MapError(nil) != nil")
	}
}

// TestMapErrorConfig: the configuration errors and the server's timeouts,
// as each driver reports them, get their sentinel and a message that says
// what to change. The real server's errors are tested in package fencepg
// (config_test.go).
func TestMapErrorConfig(t *testing.T) {
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel()
	pgErr := func(code, msg string) error { return &pgconn.PgError{Severity: "ERROR", Code: code, Message: msg} }
	pqErr := func(code, msg string) error { return &pq.Error{Code: pqerror.Code(code), Message: msg} }
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		op    string
		err   error
		want  error
		words []string
	}{
		{"pgx unknown database", live, "acquire", pgErr("3D000", `database "x" does not exist`), leasecore.ErrConfig,
			[]string{"database does not exist", "DSN"}},
		{"pq unknown role", live, "acquire", pqErr("28000", `role "x" does not exist`), leasecore.ErrConfig,
			[]string{"user name in the DSN", "LOGIN", "pg_hba.conf"}},
		{"pgx wrong password", live, "acquire", pgErr("28P01", `password authentication failed for user "x"`), leasecore.ErrConfig,
			[]string{"password in the DSN"}},
		{"pgx no usage on schema", live, "acquire", pgErr("42501", "permission denied for schema leasefence"), leasecore.ErrConfig,
			[]string{"GRANT USAGE ON SCHEMA leasefence TO this role"}},
		{"pq lease table", live, "acquire", pqErr("42501", "permission denied for table lease"), leasecore.ErrConfig,
			[]string{"GRANT SELECT, INSERT, UPDATE ON leasefence.lease TO this role", "WithSchema"}},
		{"pgx relation (PostgreSQL 10)", live, "write", pgErr("42501", "permission denied for relation write_attempt"), leasecore.ErrConfig,
			[]string{"GRANT SELECT, INSERT, DELETE ON leasefence.write_attempt TO this role"}},
		{"pgx fence_reject", live, "send batch", pgErr("42501", "permission denied for function fence_reject"), leasecore.ErrConfig,
			[]string{"GRANT EXECUTE ON FUNCTION leasefence.fence_reject TO this role"}},
		{"pq the caller's table", live, "run tx", pqErr("42501", "permission denied for table job_run"), leasecore.ErrConfig,
			[]string{"privileges it needs on table job_run"}},
		{"pgx database", live, "acquire", pgErr("42501", "permission denied for database lease"), leasecore.ErrConfig,
			[]string{"GRANT CONNECT ON DATABASE lease TO this role"}},
		{"pgx migrate", live, "migrate", pgErr("42501", "permission denied for schema leasefence"), leasecore.ErrConfig,
			[]string{"run it as their owner", "LeaseDDL"}},
		{"pgx other 42501", live, "acquire", pgErr("42501", "must be owner of table lease"), leasecore.ErrConfig,
			[]string{"permission denied"}},
		{"pgx duplicate prepared statement", live, "acquire", pgErr("42P05", `prepared statement "stmtcache_1" already exists`),
			leasecore.ErrConfig, []string{"default_query_exec_mode=exec", "PgBouncer in transaction mode", "DefaultQueryExecMode"}},
		{"pgx prepared statement gone", live, "renew", pgErr("26000", `prepared statement "stmtcache_1" does not exist`),
			leasecore.ErrConfig, []string{"default_query_exec_mode=exec", "simple_protocol"}},
		{"pgx statement timeout", live, "acquire", pgErr("57014", "canceling statement due to statement timeout"),
			leasecore.ErrUnavailable, []string{"statement_timeout"}},
		{"pq statement timeout", live, "acquire", pqErr("57014", "canceling statement due to statement timeout"),
			leasecore.ErrUnavailable, []string{"statement_timeout"}},
		{"statement timeout after ctx ended", expired, "acquire", pgErr("57014", "canceling statement due to statement timeout"),
			context.DeadlineExceeded, nil},
		{"pg_cancel_backend", live, "acquire", pqErr("57014", "canceling statement due to user request"), context.Canceled, nil},
		{"pq lock timeout", live, "write", pqErr("55P03", "canceling statement due to lock timeout"), leasecore.ErrUnavailable,
			[]string{"lock_timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pgstore.MapError(tc.ctx, "fencepg", tc.op, tc.err)
			if !errors.Is(got, tc.err) || !errors.Is(got, tc.want) {
				t.Fatalf("%v: want it to wrap %v and the driver's error", got, tc.want)
			}
			for _, s := range []error{leasecore.ErrUnavailable, leasecore.ErrSchema, leasecore.ErrConfig, context.Canceled, context.DeadlineExceeded} {
				if s != tc.want && errors.Is(got, s) {
					t.Errorf("%v wraps %v too", got, s)
				}
			}
			for _, w := range append(tc.words, "fencepg: "+tc.op+": ") {
				if !strings.Contains(got.Error(), w) {
					t.Errorf("message %q lacks %q", got, w)
				}
			}
		})
	}
}

// TestMapErrorContextEnded: once the operation's context has ended, what
// the end explains — the driver's context error in its own words, a
// connection it closed or marked bad, a statement it cancelled, a
// transient server condition — reads as the context's end with its cause,
// wraps the context's error, the cause and the driver's error, and never
// leasecore.ErrUnavailable: a caller that retries on ErrUnavailable must
// not take a lease that ended for a database that faltered. The server's
// definite answers keep their mapping, and an error the end does not
// explain keeps its text.
func TestMapErrorContextEnded(t *testing.T) {
	cause := fmt.Errorf("holder-a: %w", leasecore.ErrLocalDeadline)
	ended, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	plain, cancel2 := context.WithCancel(context.Background())
	cancel2()
	expired, cancel3 := context.WithDeadlineCause(context.Background(), time.Now().Add(-time.Second), cause)
	defer cancel3()

	pgErr := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	pqErr := func(code string) error { return &pq.Error{Code: pqerror.Code(code), Message: "m"} }
	const endedMsg = "fencepg: run tx: context canceled (the context ended: holder-a: leasecore: local deadline passed)"
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string // the whole message
		is   []error
	}{
		{"pgx context already done", ended, fmt.Errorf("timeout: context already done: %w", context.Canceled), endedMsg, nil},
		{"lib/pq bad connection", ended, driver.ErrBadConn, endedMsg, nil},
		{"EOF", ended, io.EOF, endedMsg, nil},
		{"lib/pq statement cancelled for ctx", ended, pqErr("57014"), endedMsg, nil},
		{"pgx connection exception", ended, pgErr("08006"), endedMsg, nil},
		{"idle in transaction timeout", ended, pqErr("25P03"), endedMsg, nil},
		{"lock timeout", ended, pgErr("55P03"), endedMsg, nil},
		{"transaction database/sql rolled back", ended, sql.ErrTxDone, endedMsg, nil},
		{"no cause", plain, driver.ErrBadConn, "fencepg: run tx: context canceled", nil},
		{"deadline with a cause", expired, driver.ErrBadConn,
			"fencepg: run tx: context deadline exceeded (the context ended: holder-a: leasecore: local deadline passed)",
			[]error{context.DeadlineExceeded}},
		{"the caller's own error", ended, errors.New("invoice 7 has no customer"), endedMsg + ": invoice 7 has no customer", nil},
		{"undefined table", ended, pgErr("42P01"), "", []error{leasecore.ErrSchema}},
		{"unique violation", ended, pqErr("23505"), "fencepg: run tx: pq: m (23505)", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pgstore.MapError(tc.ctx, "fencepg", "run tx", tc.err)
			t.Logf("%v", got)
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the driver's error", got)
			}
			if tc.want != "" && got.Error() != tc.want {
				t.Errorf("message %q, want %q", got, tc.want)
			}
			definite := tc.want == "" || !strings.Contains(tc.want, "context")
			if !definite {
				if !errors.Is(got, tc.ctx.Err()) {
					t.Errorf("%v does not wrap the context's error", got)
				}
				if tc.ctx != plain && !errors.Is(got, leasecore.ErrLocalDeadline) {
					t.Errorf("%v does not wrap the cause", got)
				}
				if errors.Is(got, leasecore.ErrUnavailable) {
					t.Errorf("%v wraps ErrUnavailable", got)
				}
			}
			for _, s := range tc.is {
				if !errors.Is(got, s) {
					t.Errorf("%v does not wrap %v", got, s)
				}
			}
		})
	}
	got := pgstore.ContextEnded(ended, "fencepg", "commit")
	if got.Error() != "fencepg: commit: context canceled (the context ended: holder-a: leasecore: local deadline passed)" ||
		!errors.Is(got, context.Canceled) || !errors.Is(got, leasecore.ErrLocalDeadline) {
		t.Errorf("ContextEnded: %v", got)
	}
}
