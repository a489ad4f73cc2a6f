package pgconformance

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/conformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The suite's fenced outbox (conformance.OutboxResources, F9b): the report
// row in the suite's first user table and the entry through
// fencepg.Outbox, in one fencepg.Fence.RunTx (OutboxDB and FenceDB on
// database/sql), the calls a user makes. The negative control writes both
// in a plain transaction, the entry with pgsql.OutboxAddUnfenced. Both
// relay with the outbox's Relay.

var _ conformance.OutboxResources = (*harness)(nil)

// FencedOutbox implements conformance.OutboxResources.
func (h *harness) FencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return newOutboxResource(c, true, h.cfg.logOption())
}

// UnfencedOutbox implements conformance.OutboxResources.
func (h *harness) UnfencedOutbox(ctx context.Context) (conformance.Outbox, error) {
	c, err := h.open(ctx, h.cfg.ResourceDSN, resourceConns)
	if err != nil {
		return nil, err
	}
	return newOutboxResource(c, false, h.cfg.logOption())
}

// outboxResource is conformance.Outbox on fencepg.Outbox or OutboxDB.
type outboxResource struct {
	*userResource // the fence, its floor and log, the user rows
	outbox        pgopen.Outbox
	fenced        bool
}

func newOutboxResource(c pgopen.Pool, fenced bool, log fencepg.Option) (*outboxResource, error) {
	u, err := newUserResource(c, nil, log)
	if err != nil {
		return nil, err
	}
	o, err := c.Outbox()
	if err != nil {
		return nil, err
	}
	return &outboxResource{userResource: u, outbox: o, fenced: fenced}, nil
}

// reportTable is where the report row goes: the first user table, which
// ReadPart reads.
var reportTable = userTables[0]

// Write implements leasecore.FencedResource: the report row and the entry
// (topic w.Part, payload w.Content) in one fenced transaction; for the
// negative control in one transaction with no fence.
func (r *outboxResource) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	row := []any{w.Scope, w.Part, w.Content, w.Writer, int64(w.Token)}
	c := backendkit.ClaimOf(w)
	switch {
	case !r.fenced:
		return r.writeUnfenced(ctx, w, row)
	case r.fence.Pgx != nil:
		return r.fence.Pgx.RunTx(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertUserRow(reportTable), row...); err != nil {
				return err
			}
			_, err := r.outbox.Pgx.Add(ctx, tx, c, w.Part, []byte(w.Content))
			return err
		})
	}
	return r.fence.SQL.RunTx(ctx, c, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsertUserRow(reportTable), row...); err != nil {
			return err
		}
		_, err := r.outbox.SQL.Add(ctx, tx, c, w.Part, []byte(w.Content))
		return err
	})
}

// writeUnfenced is the negative control's write: a transaction of its own,
// no check, the floor untouched.
func (r *outboxResource) writeUnfenced(ctx context.Context, w leasecore.Write, row []any) (res leasecore.Result, err error) {
	const op = "unfenced outbox"
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err = tx.Exec(ctx, upsertUserRow(reportTable), row...); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if _, err = tx.Exec(ctx, pgsql.OutboxAddUnfenced, w.Scope, int64(w.Token), w.Writer, w.Part, []byte(w.Content)); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	floor, err := r.fence.Floor(ctx, w.Scope)
	return leasecore.Result{Accepted: true, Floor: floor}, err
}

// Pending implements conformance.Outbox: fencepg.Outbox.Pending, the
// scope's entries.
func (r *outboxResource) Pending(ctx context.Context, scope string) ([]leasecore.OutboxEntry, error) {
	all, err := r.outbox.Pending(ctx, backendkit.MaxAttemptsRead)
	if err != nil {
		return nil, err
	}
	var out []leasecore.OutboxEntry
	for _, e := range all {
		if e.Scope == scope {
			out = append(out, e)
		}
	}
	return out, nil
}

// Relay implements conformance.OutboxRelay: fencepg.Outbox.Relay.
func (r *outboxResource) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	return r.outbox.Relay(ctx, deliver)
}
