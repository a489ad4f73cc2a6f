package fencepg

import (
	"context"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// MaxList is the largest limit of LeaseStore.List and Fence.Floors: one
// read returns at most this many rows.
const MaxList = 10000

// List returns the state of at most limit leases, in name order, each as
// Inspect reports it: held and the remaining time by the database clock
// at the moment of the one SELECT. For operators and dashboards (the
// leasefence command's list); nothing should decide to write from it.
// limit must be 1 to MaxList; bad input returns a *leasecore.ArgError
// before anything is sent.
func (s *LeaseStore) List(ctx context.Context, limit int) ([]leasecore.LeaseState, error) {
	const op = "list"
	if err := checkLimit(op, limit); err != nil {
		return nil, err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	var out []leasecore.LeaseState
	err := pgstore.RetrySerialization(ctx, func() error {
		out = out[:0]
		rows, err := s.db.Query(ctx, pgsql.InSchema(pgsql.ListLeases, s.schema), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			st := leasecore.LeaseState{Exists: true}
			var token, remaining int64
			if err := rows.Scan(&st.Name, &st.Holder, &token, &st.Held, &st.Released, &remaining); err != nil {
				return err
			}
			st.Token, st.Remaining = leasecore.Token(token), time.Duration(remaining)*time.Microsecond
			out = append(out, st)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, pgstore.MapError(ctx, pkg, op, err)
	}
	return out, nil
}

// TakeOver gives lease name to holder for ttl whatever its state, with a
// new token larger than every token issued for name before (token + 1; 1
// for a name never acquired), and returns the grant and the state the
// lease had just before: an unexpired holding period it ended, or an
// expired, released or absent one. The grant names the schema's token
// space as Acquire's does (advance with Grant.Claim, so the floors record
// it). It is one statement in autocommit, committed durably like Acquire;
// the row is updated, never deleted.
//
// It is an operator's tool (the leasefence command's break), not a way to
// acquire: it ends the previous holder's holding period by the database
// clock at once — its Renew and Release then fail with leasecore.ErrLost —
// but that holder may not notice before its local deadline and may still
// write. Only the fence stops it: advance every scope the lease protects
// to the returned token (Fence.Advance), then Release the grant, so the
// next holder gets a larger token still. I1 holds throughout (the old
// holding period is over when the new one starts); what TakeOver gives up
// is waiting for the TTL.
//
// A name on a holder session (WithSharedLeases) is taken off it: that
// name's holding period ends, the session and its other names go on.
// A store with holder sessions gives the name to holder's session of ttl
// (refreshed or started, as by Acquire), so the grant renews and releases
// through that store; a store without the mode gives it an expiry of its
// own. The state reported is read by the previous holding period's own
// rule, in either mode.
//
// Bad input (name, holder, ttl as for Acquire) returns a
// *leasecore.ArgError before anything is sent.
func (s *LeaseStore) TakeOver(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, leasecore.LeaseState, error) {
	const op = "take over"
	if err := checkTakeOver(ctx, op, name, holder, ttl, MinTTL); err != nil {
		return leasecore.Grant{}, leasecore.LeaseState{}, err
	}
	// Read before sending, as in Acquire: Start + TTL is never later than
	// the server's expiry.
	start := time.Now()
	prev := leasecore.LeaseState{Name: name}
	var token, prevToken, remaining int64
	var space string
	stmt, retry := pgsql.TakeOver, pgstore.RetrySerialization
	if s.sessions {
		stmt, retry = pgsql.TakeOverSession, pgstore.RetryConflicts
	}
	err := retry(ctx, func() error {
		return s.db.QueryRow(ctx, pgsql.InSchema(stmt, s.schema), name, holder, ttl.Microseconds()).Scan(
			&token, &prev.Exists, &prev.Holder, &prevToken, &prev.Held, &prev.Released, &remaining, &space)
	})
	if err != nil {
		return leasecore.Grant{}, leasecore.LeaseState{}, pgstore.MapError(ctx, pkg, op, err)
	}
	prev.Token, prev.Remaining = leasecore.Token(prevToken), time.Duration(remaining)*time.Microsecond
	return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(token), TTL: ttl, Start: start,
		Space: pgsql.TokenSpacePrefix + space}, prev, nil
}

// Floors returns at most limit floors of the fence's database, in scope
// order, with one SELECT: every scope that ever accepted a check. For
// operators and audits (the leasefence command's floors); Floor reads one
// scope. limit must be 1 to MaxList; bad input returns a
// *leasecore.ArgError before anything is sent.
func (f *fenceCore) Floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error) {
	const op = "floors"
	if err := checkLimit(op, limit); err != nil {
		return nil, err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	rows, err := f.db.Query(ctx, pgsql.InSchema(pgsql.ListFloors, f.cfg.schema), limit)
	if err != nil {
		return nil, pgstore.MapError(ctx, pkg, op, err)
	}
	defer rows.Close()
	var out []leasecore.ScopeFloor
	for rows.Next() {
		var sf leasecore.ScopeFloor
		var floor int64
		if err := rows.Scan(&sf.Scope, &floor); err != nil {
			return nil, pgstore.MapError(ctx, pkg, op, err)
		}
		sf.Floor = leasecore.Token(floor)
		out = append(out, sf)
	}
	if err := rows.Err(); err != nil {
		return nil, pgstore.MapError(ctx, pkg, op, err)
	}
	return out, nil
}

// RejectedAttempts is Attempts for rejected entries only — the audit of
// stale writes the fence turned away: at most q.Limit of them, logged at
// or after q.Since by the database clock, oldest first. The filter runs in
// the server, so accepted entries (leasecore.LogAll) do not use up the
// limit.
func (f *fenceCore) RejectedAttempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error) {
	return f.read.RejectedAttemptsSince(ctx, q)
}

// checkLimit validates the limit of a List or Floors read.
func checkLimit(op string, limit int) error {
	if limit < 1 || limit > MaxList {
		return &leasecore.ArgError{Op: op, Field: "limit", Value: fmt.Sprint(limit),
			Reason: fmt.Sprintf("must be 1 to %d", MaxList)}
	}
	return nil
}

// checkTakeOver validates TakeOver's input as CheckAcquire does Acquire's,
// under op's name.
func checkTakeOver(ctx context.Context, op, name, holder string, ttl, minTTL time.Duration) error {
	if err := backendkit.CheckName(op, "name", name); err != nil {
		return err
	}
	if err := backendkit.CheckName(op, "holder", holder); err != nil {
		return err
	}
	if err := backendkit.CheckTTL(op, ttl, minTTL); err != nil {
		return err
	}
	return backendkit.CheckContext(op, ctx)
}
