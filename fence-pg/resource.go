package fencepg

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasefence/leasefence/fence-pg/internal/commitgap"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Resource is a fenced resource on the resource database: report parts
// grouped in scopes, written under the scope fence of Fence
// (leasecore.FencedResource, I3) — the part store is one user of the same
// check that callers run on their own rows. It also implements
// backendkit.BatchWriter and backendkit.ResourceReader. It never sees the
// lease database. It is safe for concurrent use.
type Resource struct {
	fence *fenceCore
	read  pgstore.Reader
	batch writeBatcher // Write's fast paths, gathered when concurrent
}

var (
	_ leasecore.FencedResource  = (*Resource)(nil)
	_ backendkit.BatchWriter    = (*Resource)(nil)
	_ backendkit.ResourceReader = (*Resource)(nil)
)

// NewResource returns a fenced resource on a pgx pool connected to the
// resource database. Options: WithSchema, WithFenceObserver, WithLogger
// and WithAttemptLog (the default logs rejected writes only: an accepted
// write's part row already says who wrote it with which token). A nil pool or an invalid option returns a
// *leasecore.ArgError. The caller keeps ownership of the pool and closes
// it.
func NewResource(pool *pgxpool.Pool, opts ...Option) (*Resource, error) {
	f, err := NewFence(pool, opts...)
	if err != nil {
		return nil, renameOp(err, "new resource")
	}
	return &Resource{fence: &f.fenceCore, read: f.read}, nil
}

// NewResourceDB is NewResource for a database/sql pool (lib/pq, or pgx's
// stdlib driver). A nil db returns a *leasecore.ArgError.
func NewResourceDB(db *sql.DB, opts ...Option) (*Resource, error) {
	f, err := NewFenceDB(db, opts...)
	if err != nil {
		return nil, renameOp(err, "new resource")
	}
	return &Resource{fence: &f.fenceCore, read: f.read}, nil
}

// renameOp makes a constructor's argument error name the constructor the
// caller called.
func renameOp(err error, op string) error {
	if ae := (*leasecore.ArgError)(nil); errors.As(err, &ae) {
		ae.Op = op
	}
	return err
}

// Write implements leasecore.FencedResource on Fence's check: when the
// scope's floor already equals w.Token (this holding period wrote before,
// or advanced the floor) one statement share-locks the floor row and
// stores the part; otherwise one more statement raises the floor, stores
// the part only when it accepts and logs the attempt as WithAttemptLog
// says — each in autocommit, the check and its writes committed together.
// It accepts w.Token >= floor (an equal token is the same holding period
// writing again) and rejects anything lower, whichever part it targets; a
// rejection is a Result, not an error (but for a floor from another token
// space, see Fence). Concurrent writers of one scope queue on the floor row
// and each compares with the floor the previous one committed. Unlike
// Fence.SendBatch's advance, the raise of the floor is never a request of
// its own: it is the same statement as the part's write, so the two
// commit together or not at all — a rejected write, or one that fails with
// an error, leaves the floor as it was (but for an outcome that is
// unknown: the statement may then have committed, raise and part alike).
//
// Concurrent writes through one Resource share statements: while two of
// its first statements run, the writes that arrive wait and then go
// together in one statement and one durable commit, each checked against
// its own scope's floor and stored or not on its own (a write not stored
// there goes on alone to the second statement). A lone write is never
// held back, and a scope whose floor is being raised by another
// transaction holds up only its own writers. A write whose ctx ends while
// it waits returns ctx's error; as with any statement cancelled in flight,
// its part may have been stored. With WithAttemptLog(leasecore.LogAll)
// every write runs the full statement alone.
func (r *Resource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	const op = "write"
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	c := backendkit.ClaimOf(w)
	shared := query(ctx, r.fence.stmt.writeShared, c.Scope, int64(c.Token), c.Writer, w.Part, w.Content)
	if commitgap.From(ctx) == nil {
		// In autocommit (not in the commit-gap test hook's transaction),
		// concurrent writes share statements (writeBatcher).
		single := shared
		shared = func(q dbx.Querier) (int64, bool, error) { return r.batch.write(ctx, r, q, w, single) }
	}
	return r.run(ctx, op, c, w, shared,
		query(ctx, r.fence.stmt.write, append(r.fence.args(c, true), w.Part, w.Content)...))
}

// WriteBatch implements backendkit.BatchWriter like Write: one floor
// comparison for the whole batch, every part stored or none, one commit, and (as WithAttemptLog
// says) one write_attempt row per part. Writing summary and detail this way
// costs one round trip and one commit instead of two.
func (r *Resource) WriteBatch(ctx context.Context, b leasecore.Batch) (leasecore.Result, error) {
	const op = "write batch"
	if err := backendkit.CheckBatch(ctx, b); err != nil {
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
	c := leasecore.Claim{Scope: b.Scope, Writer: b.Writer, Token: b.Token, Space: b.Space}
	// The commit gap sees the batch as a write of its first part.
	w := leasecore.Write{Scope: b.Scope, Part: b.Parts[0].Part, Writer: b.Writer, Token: b.Token, Space: b.Space}
	return r.run(ctx, op, c, w,
		query(ctx, r.fence.stmt.writeBatchShared, c.Scope, int64(c.Token), c.Writer, string(parts)),
		query(ctx, r.fence.stmt.writeBatch, append(r.fence.args(c, true), string(parts))...))
}

// statement runs one write statement on q and returns the floor it
// returned; found is false when it returned no row.
type statement func(q dbx.Querier) (floor int64, found bool, err error)

func query(ctx context.Context, stmt string, args ...any) statement {
	return func(q dbx.Querier) (int64, bool, error) {
		var floor int64
		err := q.QueryRow(ctx, stmt, args...).Scan(&floor)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, false, nil
		}
		return floor, err == nil, err
	}
}

// run executes a write: the fast path shared (the floor equals the token:
// the parts stored under a share lock of the floor row, one statement),
// and when it finds no equal floor — or the log is leasecore.LogAll, whose
// accepted entry only the full statement writes — the full statement,
// which raises the floor, stores the parts when accepted and logs the
// attempt. Each runs alone in autocommit, or, with the commit-gap test
// hook, inside one transaction that stays open while the hook runs.
func (r *Resource) run(ctx context.Context, op string, c leasecore.Claim, w leasecore.Write, shared, full statement) (res leasecore.Result, err error) {
	exec := func(q dbx.Querier) (int64, error) {
		if !r.fence.logAll() {
			if floor, found, err := shared(q); err != nil || found {
				return floor, err
			}
		}
		floor, _, err := full(q)
		return floor, err
	}
	// The statements stored the parts exactly when the floor they left
	// equals our token. A rejection by a floor from another token space,
	// or by a sealed scope, comes with its diagnosis (Fence.diagnose), read
	// after the commit.
	result := func(floor int64) (leasecore.Result, error) {
		res := leasecore.Result{Accepted: leasecore.Token(floor) == c.Token, Floor: leasecore.Token(floor)}
		if !res.Accepted || r.fence.cfg.observe != nil {
			return r.finish(ctx, op, c, res)
		}
		return res, nil
	}
	gap := commitgap.From(ctx)
	if gap == nil {
		var floor int64
		err := pgstore.RetrySerialization(ctx, func() (err error) {
			floor, err = exec(r.fence.db)
			return err
		})
		if err != nil {
			return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
		}
		return result(floor)
	}
	tx, err := r.fence.db.Begin(ctx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			// Under ctx, as commit.go's rollback says.
			_ = tx.Rollback(ctx)
		}
	}()
	floor, err := exec(tx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if err = gap(ctx, w); err != nil {
		return leasecore.Result{}, fmt.Errorf("%s: %s: commit gap: %w", pkg, op, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	return result(floor)
}

// finish completes a write's outcome off the accepted path's fast lane
// (kept small enough for run's closure to be inlined): a rejection's
// diagnosis, and the report to the fence's observers.
func (r *Resource) finish(ctx context.Context, op string, c leasecore.Claim, res leasecore.Result) (leasecore.Result, error) {
	var err error
	if !res.Accepted {
		err = r.fence.diagnose(ctx, op, c, res.Floor)
	}
	r.fence.report(op, c, res, err)
	return res, err
}

// Floor implements backendkit.ResourceReader: the scope's floor, 0 when the
// scope never accepted a write.
func (r *Resource) Floor(ctx context.Context, scope string) (leasecore.Token, error) {
	return r.read.Floor(ctx, scope)
}

// ReadPart implements backendkit.ResourceReader: the part's current content;
// ok is false when it was never written.
func (r *Resource) ReadPart(ctx context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	return r.read.ReadPart(ctx, scope, part)
}

// Attempts implements backendkit.ResourceReader: every write attempt of the
// scope, accepted or rejected, oldest first.
func (r *Resource) Attempts(ctx context.Context, scope string) ([]leasecore.Attempt, error) {
	return r.read.Attempts(ctx, scope)
}
