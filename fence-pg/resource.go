package fencepg

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
)

// Resource is a fenced resource on the resource database: report parts
// grouped in scopes, a floor per scope (the largest token accepted), and a
// log of every write attempt (leasecore.FencedResource, I3). It also
// implements leasecore.ResourceReader. It never sees the lease database.
// It is safe for concurrent use.
type Resource struct {
	db   dbx.DB
	read pgstore.Reader
	gap  func(context.Context, leasecore.Write) error
}

var (
	_ leasecore.FencedResource = (*Resource)(nil)
	_ leasecore.BatchWriter    = (*Resource)(nil)
	_ leasecore.ResourceReader = (*Resource)(nil)
)

// ResourceOption configures NewResource and NewResourceDB.
type ResourceOption func(*Resource)

// WithCommitGap is a TEST HOOK; production code never sets it. With it,
// Write runs BEGIN; the fence statement; gap(ctx, w); COMMIT, so the write
// holds the scope's floor row lock while gap runs and a test can show a
// second writer of the scope waiting for it (SPEC F6b). If gap returns an
// error, the write is rolled back and Write returns that error (wrapped).
// Without it, Write runs the fence statement alone in autocommit.
func WithCommitGap(gap func(ctx context.Context, w leasecore.Write) error) ResourceOption {
	return func(r *Resource) { r.gap = gap }
}

// NewResource returns a fenced resource on a pgx pool connected to the
// resource database. A nil pool returns a *leasecore.ArgError. The caller
// keeps ownership of the pool and closes it.
func NewResource(pool *pgxpool.Pool, opts ...ResourceOption) (*Resource, error) {
	if pool == nil {
		return nil, &leasecore.ArgError{Op: "new resource", Field: "pool", Reason: "must not be nil"}
	}
	return newResource(dbx.FromPool(pool), opts), nil
}

// NewResourceDB is NewResource for a database/sql pool (lib/pq, or pgx's
// stdlib driver). A nil db returns a *leasecore.ArgError.
func NewResourceDB(db *sql.DB, opts ...ResourceOption) (*Resource, error) {
	if db == nil {
		return nil, &leasecore.ArgError{Op: "new resource", Field: "db", Reason: "must not be nil"}
	}
	return newResource(dbx.FromSQL(db), opts), nil
}

func newResource(db dbx.DB, opts []ResourceOption) *Resource {
	r := &Resource{db: db, read: pgstore.Reader{DB: db, Pkg: pkg}}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Write implements leasecore.FencedResource with one statement (see
// FencedWrite in internal/pgsql): it advances the scope's floor to w.Token
// unless the floor is higher, stores the content only if the floor then
// equals w.Token, and logs the attempt in write_attempt — all committed
// together. It accepts w.Token >= floor (an equal token is the same holding
// period writing again) and rejects anything lower, whichever part it
// targets; a rejection is a Result, not an error. Concurrent writers of one
// scope queue on the floor row and each compares with the floor the
// previous one committed.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := leasecore.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	return r.run(ctx, op, w, func(q dbx.Querier) (int64, error) {
		var floor int64
		err := q.QueryRow(ctx, pgsql.FencedWrite, pgstore.WriteArgs(w)...).Scan(&floor)
		return floor, err
	})
}

// WriteBatch implements leasecore.BatchWriter with one statement (see
// FencedWriteBatch in internal/pgsql): one floor comparison for the whole
// batch, every part stored or none, one commit, one write_attempt row per
// part. Writing summary and detail this way costs one round trip and one
// commit instead of two.
func (r *Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	const op = "write batch"
	if err := leasecore.CheckBatch(ctx, b); err != nil {
		return leasecore.Result{}, err
	}
	type jsonPart struct {
		Part    string `json:"part"`
		Content string `json:"content"`
	}
	in := make([]jsonPart, len(b.Parts))
	for i, p := range b.Parts {
		in[i] = jsonPart{p.Part, p.Content}
	}
	parts, err := json.Marshal(in)
	if err != nil {
		return leasecore.Result{}, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	// The commit gap sees the batch as a write of its first part.
	w := leasecore.Write{Scope: b.Scope, Part: b.Parts[0].Part, Writer: b.Writer, Token: b.Token}
	return r.run(ctx, op, w, func(q dbx.Querier) (int64, error) {
		var floor int64
		err := q.QueryRow(ctx, pgsql.FencedWriteBatch, b.Scope, b.Writer, int64(b.Token), string(parts)).Scan(&floor)
		return floor, err
	})
}

// run executes a fence statement that returns the floor it left: alone in
// autocommit, or, with the commit-gap test hook, inside a transaction that
// stays open while the hook runs.
func (r *Resource) run(ctx context.Context, op string, w leasecore.Write, stmt func(dbx.Querier) (int64, error)) (res leasecore.Result, err error) {
	// The statement stored the parts exactly when the floor it left equals
	// our token.
	result := func(floor int64) leasecore.Result {
		return leasecore.Result{Accepted: leasecore.Token(floor) == w.Token, Floor: leasecore.Token(floor)}
	}
	if r.gap == nil {
		floor, err := stmt(r.db)
		if err != nil {
			return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
		}
		return result(floor), nil
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			// Not ctx: it may be why we are rolling back.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	floor, err := stmt(tx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if err = r.gap(ctx, w); err != nil {
		return leasecore.Result{}, fmt.Errorf("%s: %s: commit gap: %w", pkg, op, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	return result(floor), nil
}

// Floor implements leasecore.ResourceReader: the scope's floor, 0 when the
// scope never accepted a write.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements leasecore.ResourceReader: the part's current content;
// ok is false when it was never written.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements leasecore.ResourceReader: every write attempt of the
// scope, accepted or rejected, oldest first.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}
