// Package pgcontrol provides NEGATIVE CONTROLS: PostgreSQL resources that
// are WRONG ON PURPOSE. Never use them to protect data.
//
// Each one is a design that looks plausible and fails; the conformance suite
// runs the same timelines against them and against fencepg.Resource, to show
// that the failure is real on this database and that the fenced resource
// does not have it:
//
//   - Unfenced ignores tokens: a stale holder overwrites the newer holder's
//     data (F5).
//   - CheckThenWrite reads the floor, decides, then writes the floor and
//     the data in separate autocommit statements: an interleaving makes it
//     accept a stale write and move the floor BACKWARDS (F6a).
//   - RowFenced compares the token with the stored row's token only: a part
//     the newer holder has not written yet has nothing to compare with, so
//     the stale holder writes it (F7).
//   - IdempotentPublisher deduplicates by business key only: it keeps the
//     first write, not the newest (F9).
//   - CheckFirst runs the fence's check as a transaction's first statement
//     and holds the floor row until the commit: a holder frozen inside it
//     makes the newer holder wait, and its stale rows commit (F18).
//
// They share fencepg's resource tables (fence_floor, report_part,
// write_attempt) and add one of their own, published. Their Floor, ReadPart
// and Attempts read those tables exactly as fencepg.Resource does, and every
// Write logs a write_attempt row. Inputs are validated exactly as in fencepg.
package pgcontrol

import (
	"context"
	"database/sql"
	_ "embed" // the schema below
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

const pkg = "pgcontrol"

//go:embed schema/controls.sql
var controlsSchema string

// Controls makes negative-control resources on one pool of the resource
// database. It is safe for concurrent use, as are the resources it returns.
type Controls struct {
	db     dbx.DB
	fenced *fencepg.Resource // only for its Migrate: the tables are shared
}

// New returns Controls on a pgx pool connected to the resource database. A
// nil pool returns a *leasecore.ArgError. The caller keeps ownership of the
// pool.
func New(pool *pgxpool.Pool) (*Controls, error) {
	if pool == nil {
		return nil, &leasecore.ArgError{Op: "new controls", Field: "pool", Reason: "must not be nil"}
	}
	fenced, err := fencepg.NewResource(pool)
	if err != nil {
		return nil, err
	}
	return &Controls{db: dbx.FromPool(pool), fenced: fenced}, nil
}

// NewDB is New for a database/sql pool. A nil db returns a
// *leasecore.ArgError.
func NewDB(db *sql.DB) (*Controls, error) {
	if db == nil {
		return nil, &leasecore.ArgError{Op: "new controls", Field: "db", Reason: "must not be nil"}
	}
	fenced, err := fencepg.NewResourceDB(db)
	if err != nil {
		return nil, err
	}
	return &Controls{db: dbx.FromSQL(db), fenced: fenced}, nil
}

// Migrate creates fencepg's resource tables and the controls' own table,
// published, if they do not exist. Like fencepg's Migrate it is idempotent
// and safe to run concurrently.
func (c *Controls) Migrate(ctx context.Context) error {
	if err := c.fenced.Migrate(ctx); err != nil {
		return err
	}
	return pgstore.Migrate(ctx, c.db, pkg, controlsSchema)
}

// Resource is one negative-control resource. It implements
// leasecore.FencedResource — WITHOUT keeping I3 — and
// backendkit.ResourceReader.
type Resource struct {
	op        string // names the control in errors, e.g. "unfenced write"
	write     func(ctx context.Context, w leasecore.Write) (leasecore.Result, error)
	read      pgstore.Reader
	published bool // ReadPart reads table published
}

var (
	_ leasecore.FencedResource  = (*Resource)(nil)
	_ backendkit.ResourceReader = (*Resource)(nil)
)

func (c *Controls) resource(op string, write func(context.Context, leasecore.Write) (leasecore.Result, error)) *Resource {
	return &Resource{op: op, write: write, read: pgstore.Reader{DB: c.db, Pkg: pkg}}
}

// Write validates w as fencepg does (bad input and a done context change
// nothing) and then writes it the control's wrong way. Result.Floor is the
// scope's fence_floor after the attempt (0 when it has none), which only
// CheckThenWrite changes; the same value is logged in write_attempt.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	res, err := r.write(ctx, w)
	return res, pgstore.MapError(ctx, pkg, r.op, err)
}

// Floor implements backendkit.ResourceReader: the scope's fence_floor, 0
// when it has none.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements backendkit.ResourceReader: the part from report_part,
// or for the IdempotentPublisher from published; ok is false when absent.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	if r.published {
		return r.read.ReadPublished(ctx, scope, part, businessKey(scope, part))
	}
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements backendkit.ResourceReader: the scope's write_attempt
// rows, oldest first.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}

// Unfenced returns a resource that ignores tokens: one autocommit upsert of
// the part, always accepted, logged with the scope's unchanged floor.
// COUNTEREXAMPLE (F5): a stale holder's write overwrites the newer one's.
func (c *Controls) Unfenced() *Resource {
	return c.resource("unfenced write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		var floor int64
		err := c.db.QueryRow(ctx, pgsql.UnfencedWrite, pgstore.WriteArgs(w)...).Scan(&floor)
		return leasecore.Result{Accepted: true, Floor: leasecore.Token(floor)}, err
	})
}

// CheckThenWrite returns a resource that checks and writes in separate
// autocommit statements: it reads the floor (0 if none), rejects (and logs)
// a token below it, calls gap (nil: no pause), then sets the floor to the
// token, upserts the part and logs the attempt. COUNTEREXAMPLE (F6a): the
// decision is stale by the time it is acted on, so a writer that read the
// floor before a newer writer advanced it still writes, and sets the floor
// BACK to its own smaller token.
func (c *Controls) CheckThenWrite(gap func(ctx context.Context, w leasecore.Write) error) *Resource {
	return c.resource("check-then-write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		var floor int64
		if err := c.db.QueryRow(ctx, pgsql.ReadFloor, w.Scope).Scan(&floor); err != nil {
			return leasecore.Result{}, err
		}
		if leasecore.Token(floor) > w.Token {
			rejected := leasecore.Result{Floor: leasecore.Token(floor)}
			return rejected, c.logAttempt(ctx, w, rejected)
		}
		if gap != nil {
			if err := gap(ctx, w); err != nil {
				return leasecore.Result{}, fmt.Errorf("gap: %w", err)
			}
		}
		if _, err := c.db.Exec(ctx, pgsql.SetFloor, w.Scope, int64(w.Token)); err != nil {
			return leasecore.Result{}, err
		}
		if _, err := c.db.Exec(ctx, pgsql.UpsertPart, pgstore.WriteArgs(w)...); err != nil {
			return leasecore.Result{}, err
		}
		accepted := leasecore.Result{Accepted: true, Floor: w.Token}
		return accepted, c.logAttempt(ctx, w, accepted)
	})
}

func (c *Controls) logAttempt(ctx context.Context, w leasecore.Write, res leasecore.Result) error {
	_, err := c.db.Exec(ctx, pgsql.LogAttempt, w.Scope, w.Part, w.Writer, int64(w.Token), res.Accepted, int64(res.Floor))
	return err
}

// RowFenced returns a resource that compares the token with the stored
// part's token only (ON CONFLICT ... DO UPDATE ... WHERE p.token <=
// EXCLUDED.token), with no scope floor. COUNTEREXAMPLE (F7): a part that
// does not exist yet takes the INSERT branch with nothing to compare, so a
// stale holder writes a part the newer holder has not touched.
func (c *Controls) RowFenced() *Resource {
	return c.resource("row-fenced write", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		var res leasecore.Result
		var floor int64
		err := c.db.QueryRow(ctx, pgsql.RowFencedWrite, pgstore.WriteArgs(w)...).Scan(&res.Accepted, &floor)
		res.Floor = leasecore.Token(floor)
		return res, err
	})
}

// IdempotentPublisher returns a stand-in for an external side effect that
// only deduplicates by business key (scope, part): INSERT ... ON CONFLICT
// DO NOTHING into published, tokens ignored; accepted when a row was
// inserted. ReadPart reads published. COUNTEREXAMPLE (F9): it keeps the
// first write of a key, not the newest — a stale holder that publishes
// first wins.
func (c *Controls) IdempotentPublisher() *Resource {
	r := c.resource("publish", func(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
		var res leasecore.Result
		var floor int64
		args := append(pgstore.WriteArgs(w), businessKey(w.Scope, w.Part))
		err := c.db.QueryRow(ctx, pgsql.Publish, args...).Scan(&res.Accepted, &floor)
		res.Floor = leasecore.Token(floor)
		return res, err
	})
	r.published = true
	return r
}

// businessKey is "scope/part", each escaped so that a "/" inside a name
// cannot make two different pairs one key.
func businessKey(scope, part string) string {
	return url.PathEscape(scope) + "/" + url.PathEscape(part)
}
