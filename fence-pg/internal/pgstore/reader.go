package pgstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Reader implements backendkit.ResourceReader over the resource database's
// tables (fence_floor, report_part, write_attempt) for every resource of
// fence-pg, fenced or not. Each read is one statement; input is validated
// first, and bad input or a done context returns before anything is sent.
type Reader struct {
	DB     dbx.DB
	Pkg    string // error prefix, e.g. "fencepg"
	Schema string // the tables' schema; empty: pgsql.DefaultSchema
}

// sql returns stmt in the reader's schema.
func (r Reader) sql(stmt string) string {
	if r.Schema == "" {
		return stmt
	}
	return pgsql.InSchema(stmt, r.Schema)
}

// Floor implements backendkit.ResourceReader.
func (r Reader) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	const op = "floor"
	if err := checkRead(ctx, op, scope); err != nil {
		return 0, err
	}
	var floor int64
	if err := r.DB.QueryRow(ctx, r.sql(pgsql.ReadFloor), scope).Scan(&floor); err != nil {
		return 0, MapError(ctx, r.Pkg, op, err)
	}
	return leasecore.Token(floor), nil
}

// ReadPart implements backendkit.ResourceReader.
func (r Reader) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.readPart(ctx, scope, part, r.sql(pgsql.ReadPart), scope, part)
}

// ReadPublished reads the part stored under business key instead: the
// idempotent publisher's table.
func (r Reader) ReadPublished(ctx context.Context, scope, part, key string) (leasecore.StoredPart, bool, error) {
	return r.readPart(ctx, scope, part, r.sql(pgsql.ReadPublished), key)
}

func (r Reader) readPart(ctx context.Context, scope, part, query string, args ...any) (leasecore.StoredPart, bool, error) {
	const op = "read part"
	if err := checkRead(ctx, op, scope, part); err != nil {
		return leasecore.StoredPart{}, false, err
	}
	p := leasecore.StoredPart{Scope: scope, Part: part}
	var token int64
	err := r.DB.QueryRow(ctx, query, args...).Scan(&p.Content, &p.Writer, &token, &p.WrittenAt)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return leasecore.StoredPart{}, false, nil
	case err != nil:
		return leasecore.StoredPart{}, false, MapError(ctx, r.Pkg, op, err)
	}
	p.Token = leasecore.Token(token)
	return p, true, nil
}

// Attempts implements backendkit.ResourceReader.
func (r Reader) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	const op = "attempts"
	if err := checkRead(ctx, op, scope); err != nil {
		return nil, err
	}
	return r.attempts(ctx, op, scope, r.sql(pgsql.Attempts), scope)
}

// AttemptsSince reads at most q.Limit entries of q.Scope's log logged at or
// after q.Since, oldest first.
func (r Reader) AttemptsSince(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	const op = "attempts"
	if err := backendkit.CheckAttemptQuery(ctx, op, q); err != nil {
		return nil, err
	}
	return r.attempts(ctx, op, q.Scope, r.sql(pgsql.AttemptsSince), q.Scope, q.Since, q.Limit)
}

func (r Reader) attempts(ctx context.Context, op, scope, query string, args ...any) ([]leasecore.Attempt, error) {
	rows, err := r.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, MapError(ctx, r.Pkg, op, err)
	}
	defer rows.Close()
	var out []leasecore.Attempt
	for rows.Next() {
		a := leasecore.Attempt{Scope: scope}
		var token, floor int64
		if err := rows.Scan(&a.Part, &a.Writer, &token, &a.Accepted, &floor, &a.At); err != nil {
			return nil, MapError(ctx, r.Pkg, op, err)
		}
		a.Token, a.Floor = leasecore.Token(token), leasecore.Token(floor)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, MapError(ctx, r.Pkg, op, err)
	}
	return out, nil
}

// checkRead validates the scope and, for ReadPart, the part, then the
// context.
func checkRead(ctx context.Context, op, scope string, part ...string) error {
	if err := backendkit.CheckName(op, "scope", scope); err != nil {
		return err
	}
	for _, p := range part {
		if err := backendkit.CheckName(op, "part", p); err != nil {
			return err
		}
	}
	return backendkit.CheckContext(op, ctx)
}
