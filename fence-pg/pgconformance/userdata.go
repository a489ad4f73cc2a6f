package pgconformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The suite's own user tables, in the application's schema (public), as a
// user's job would have them: a run's header and its line, both written in
// the fenced transaction. They are the suite's, not the library's: the
// library's tables stay in their own schema.
var userTables = []string{"conformance_job_run", "conformance_job_line"}

const userSchema = `
CREATE TABLE IF NOT EXISTS public.conformance_job_run (
  scope text, part text, content text NOT NULL, writer text NOT NULL, token bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (scope, part));
CREATE TABLE IF NOT EXISTS public.conformance_job_line (
  scope text, part text, content text NOT NULL, writer text NOT NULL, token bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (scope, part));
TRUNCATE public.conformance_job_run, public.conformance_job_line`

// upsertUserRow writes one user table's row: $1 scope, $2 part, $3
// content, $4 writer, $5 token. The table name is one of userTables.
func upsertUserRow(table string) string {
	return `INSERT INTO public.` + table + ` (scope, part, content, writer, token)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::bigint)
ON CONFLICT (scope, part) DO UPDATE SET content = EXCLUDED.content, writer = EXCLUDED.writer,
  token = EXCLUDED.token, written_at = clock_timestamp()`
}

func readUserRow(table string) string {
	return `SELECT content, writer, token, written_at FROM public.` + table + ` WHERE scope = $1 AND part = $2`
}

// migrateUser creates (or empties) the user tables.
func migrateUser(ctx context.Context, db dbx.DB) error {
	if _, err := db.Exec(ctx, userSchema); err != nil {
		return pgstore.MapError(ctx, pkg, "user tables", err)
	}
	return nil
}

// UserDataResource implements conformance.UserDataResources: the suite's
// rows written through a fence as a user writes them — fencepg.Fence's
// RunTx on pgx, fencepg.FenceDB's on database/sql — with every check
// logged.
func (h *harness) UserDataResource(ctx context.Context, gap conformance.Gap) (conformance.UserResource, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return newUserResource(c, gap, h.cfg.logOption())
}

// MarkerFirstResource implements conformance.UserDataResources: the
// marker through the fenced part store, then the rows in a second
// transaction with no fence.
func (h *harness) MarkerFirstResource(ctx context.Context) (conformance.MarkerFirst, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return newMarkerFirst(c, h.cfg.logOption())
}

// userRows reads the user tables; the readers of both user resources.
type userRows struct{ db dbx.DB }

// Rows implements conformance.UserResource.
func (u userRows) Rows(ctx context.Context, scope, part string) ([]conformance.UserRow, error) {
	const op = "user rows"
	for _, err := range []error{backendkit.CheckName(op, "scope", scope), backendkit.CheckName(op, "part", part),
		backendkit.CheckContext(op, ctx)} {
		if err != nil {
			return nil, err
		}
	}
	out := make([]conformance.UserRow, len(userTables))
	for i, table := range userTables {
		out[i].Table = table
		p := leasecore.StoredPart{Scope: scope, Part: part}
		var token int64
		err := u.db.QueryRow(ctx, readUserRow(table), scope, part).Scan(&p.Content, &p.Writer, &token, &p.WrittenAt)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, pgstore.MapError(ctx, pkg, op, err)
		default:
			p.Token = leasecore.Token(token)
			out[i].Found, out[i].Row = true, p
		}
	}
	return out, nil
}

// ReadPart implements backendkit.ResourceReader: the first user table.
func (u userRows) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	rows, err := u.Rows(ctx, scope, part)
	if err != nil {
		return leasecore.StoredPart{}, false, err
	}
	return rows[0].Row, rows[0].Found, nil
}

// userResource is conformance.UserResource on fencepg.Fence or FenceDB.
type userResource struct {
	userRows
	fence pgopen.Fence
	gap   conformance.Gap
}

func newUserResource(c pgopen.Pool, gap conformance.Gap, log fencepg.Option) (*userResource, error) {
	fence, err := c.Fence(log)
	if err != nil {
		return nil, err
	}
	return &userResource{userRows: userRows{dbOf(c)}, fence: fence, gap: gap}, nil
}

// Write implements leasecore.FencedResource: one fenced transaction that
// writes the row of every user table, with conformance.InTransaction after
// the first, then (F6u) waits in gap before the commit.
func (r *userResource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	c := backendkit.ClaimOf(w)
	if r.fence.Pgx != nil {
		return r.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error { return writeUserRows(ctx, pgxExec(ctx, tx), w, r.gap) })
	}
	return r.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error { return writeUserRows(ctx, sqlExec(ctx, tx), w, r.gap) })
}

// execer runs one statement in a transaction.
type execer func(query string, args ...any) error

func pgxExec(ctx context.Context, tx pgx.Tx) execer {
	return func(q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err }
}

func sqlExec(ctx context.Context, tx *sql.Tx) execer {
	return func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err }
}

// writeUserRows writes w's row in every user table, calling
// conformance.InTransaction after the first (its statement: the first
// row read back) and gap, when not nil, after the last.
func writeUserRows(ctx context.Context, exec execer, w leasecore.Write, gap conformance.Gap) error {
	args := []any{w.Scope, w.Part, w.Content, w.Writer, int64(w.Token)}
	for i, table := range userTables {
		if err := exec(upsertUserRow(table), args...); err != nil {
			return err
		}
		if i == 0 {
			stmt := func(context.Context) error {
				return exec(`SELECT FROM public.`+table+` WHERE scope = $1 AND part = $2`, w.Scope, w.Part)
			}
			if err := conformance.InTransaction(ctx, w, stmt); err != nil {
				return err
			}
		}
	}
	if gap == nil {
		return nil
	}
	return gap(ctx, w)
}

// Advance implements conformance.Advancer with fencepg.Fence.Advance.
func (r *userResource) Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error) {
	return r.fence.Advance(ctx, c)
}

// Floor implements backendkit.ResourceReader: the fence's floor.
func (r *userResource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.fence.Floor(ctx, scope)
}

// Attempts implements backendkit.ResourceReader: the fence's whole log.
func (r *userResource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.fence.Attempts(ctx, leasecore.AttemptQuery{Scope: scope, Limit: backendkit.MaxAttemptsRead})
}

// markerFirst is the negative control: Prepare is the part store's fenced
// write of a marker; Write upserts the user rows in a transaction of its
// own, with no fence.
type markerFirst struct {
	userRows
	parts *fencepg.Resource
}

var _ conformance.Preparer = (*markerFirst)(nil)

func newMarkerFirst(c pgopen.Pool, log fencepg.Option) (*markerFirst, error) {
	parts, err := c.Resource(log)
	if err != nil {
		return nil, err
	}
	return &markerFirst{userRows: userRows{dbOf(c)}, parts: parts}, nil
}

// Prepare writes the marker: the fenced part store's own write.
func (m *markerFirst) Prepare(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	return m.parts.Write(ctx, w)
}

// Write upserts the rows without any check: whoever writes last wins.
func (m *markerFirst) Write(ctx context.Context, w leasecore.Write) (res leasecore.Result, err error) {
	const op = "marker-first rows"
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	for _, table := range userTables {
		if _, err = tx.Exec(ctx, upsertUserRow(table), w.Scope, w.Part, w.Content, w.Writer, int64(w.Token)); err != nil {
			return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
		}
	}
	if err = tx.Commit(ctx); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	return leasecore.Result{Accepted: true}, nil
}

// Floor implements backendkit.ResourceReader: the part store's floor, where
// the markers went.
func (m *markerFirst) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return m.parts.Floor(ctx, scope)
}

// Attempts implements backendkit.ResourceReader: the part store's log.
func (m *markerFirst) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return m.parts.Attempts(ctx, scope)
}

// holderUserResource opens the resource of a user-data holder kind on c.
func holderUserResource(c pgopen.Pool, kind conformance.ResourceKind, log fencepg.Option) (leasecore.FencedResource, error) {
	switch kind {
	case conformance.KindUserData:
		return newUserResource(c, nil, log)
	case conformance.KindMarkerFirst:
		return newMarkerFirst(c, log)
	case conformance.KindCheckFirst:
		return newCheckFirst(c, log)
	}
	return nil, fmt.Errorf("%s: unknown resource kind %q: %w", pkg, kind, leasecore.ErrInvalidArgument)
}

// CheckFirstResource implements conformance.CheckFirstControl: the user
// tables written by pgcontrol.CheckFirst.
func (h *harness) CheckFirstResource(ctx context.Context) (conformance.UserResource, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return newCheckFirst(c, h.cfg.logOption())
}

// checkFirst is F18's negative control: the user rows in one transaction
// whose first statement is the fence's check, holding the floor row until
// the commit (pgcontrol.CheckFirst). It reads and advances like the fenced
// user resource.
type checkFirst struct {
	*userResource
	ctl *pgcontrol.CheckFirst
}

func newCheckFirst(c pgopen.Pool, log fencepg.Option) (*checkFirst, error) {
	u, err := newUserResource(c, nil, log)
	if err != nil {
		return nil, err
	}
	controls, err := c.Controls()
	if err != nil {
		return nil, err
	}
	return &checkFirst{userResource: u, ctl: controls.CheckFirst()}, nil
}

// Write implements leasecore.FencedResource with the check first.
func (r *checkFirst) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	return r.ctl.Run(ctx, backendkit.ClaimOf(w), func(exec func(query string, args ...any) error) error {
		return writeUserRows(ctx, exec, w, nil)
	})
}
