package pgcontrol

import (
	"context"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// CheckFirst is the fenced transaction as it was before fencepg decided at
// commit: the fence's check is the transaction's FIRST statement, and the
// lock it takes on the scope's floor row (share, or update when it raises
// the floor) is held until the transaction ends. A holder frozen inside
// such a transaction after its check makes every newer holder's Advance
// or check of the scope wait for it, and when it wakes its rows commit
// although its lease expired and a newer token was issued meanwhile: the
// check passed before the newer holder could advance (F18's negative
// control). fencepg.Fence.RunTx compares last instead, in the round trip
// of its COMMIT.
type CheckFirst struct{ c *Controls }

// CheckFirst returns the check-first transaction on the Controls' pool.
func (c *Controls) CheckFirst() *CheckFirst { return &CheckFirst{c} }

// Run begins a Read Committed transaction, runs the check for claim first,
// and, when it accepts, runs fn with a function that executes a statement
// in the transaction, then commits. A rejection rolls back and returns the
// floor that beat the token. Accepted checks are logged in the
// transaction, as with leasecore.LogAll.
func (k *CheckFirst) Run(ctx context.Context, claim leasecore.Claim, fn func(exec func(query string, args ...any) error) error) (res leasecore.Result, err error) {
	const op = "check-first run"
	if err := backendkit.CheckClaim(ctx, op, claim); err != nil {
		return leasecore.Result{}, err
	}
	tx, err := k.c.db.Begin(ctx)
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	defer func() {
		if err != nil || !res.Accepted {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	var floor int64
	// $1..$6 as every fence statement takes them: log the accepted check,
	// not the rejected one (it would be rolled back).
	if err := tx.QueryRow(ctx, pgsql.FenceCheck, claim.Scope, int64(claim.Token), claim.Writer, true, false, claim.Space).Scan(&floor); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if leasecore.Token(floor) != claim.Token {
		return leasecore.Result{Floor: leasecore.Token(floor)}, nil
	}
	exec := func(query string, args ...any) error { _, err := tx.Exec(ctx, query, args...); return err }
	if err := fn(exec); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op+": commit", err)
	}
	return leasecore.Result{Accepted: true, Floor: claim.Token}, nil
}
