package fencepg

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// moveWriter is the writer an install's check names in the attempt log.
const moveWriter = "leasefence scope move"

// Seal seals scope at this database, which the scope is moving away
// from to the location the caller labels to ("db2"), inside the caller's
// open transaction tx: the transaction that then reads the scope's rows to
// copy them (see leasecore.ScopeSeal for the whole move). It raises the
// scope's floor to leasecore.SealedFloor, above every token, so that every
// later check of the scope here is rejected — by the comparison every check
// makes, with no condition of its own on the accepted path — and records,
// in the floor's row, to, the floor it had and that floor's token space. It
// returns them as the leasecore.ScopeSeal to give to Install at the new
// location.
//
// Call it first, then read the rows, in the same transaction, and commit
// it (the rows may also be deleted there once the install has committed,
// never before). The seal locks the floor row for update, as a newer
// holder's check does: it waits for every transaction that passed its
// check, so every row written under an accepted check has committed when
// it returns, and the caller's next statement sees it (Read Committed);
// every check after it waits for tx, then is rejected. One statement, one
// round trip; it commits durably (see Fence).
//
// Sealing a sealed scope changes nothing and returns the ScopeSeal of the
// first seal, so a move that crashed after its seal can run again. When
// that first seal named another destination, Seal returns that
// ScopeSeal with a *leasecore.ScopeMovedError (errors.Is
// leasecore.ErrScopeMoved): the scope left for there; roll back. A scope
// that never had a floor here is sealed too, with Floor 0.
//
// Checks of a sealed scope are rejected with Result.Floor =
// leasecore.SealedFloor and a *leasecore.ScopeMovedError naming the
// destination (read only on the rejection path). Bad input (scope and to
// are names, backendkit.CheckSeal) returns a *leasecore.ArgError before
// anything is sent. A scope is not moved back to a database it was sealed
// at: Install refuses it there (see Install).
func (f *Fence) Seal(ctx context.Context, tx Querier, scope, to string) (leasecore.ScopeSeal, error) {
	const op = "seal"
	if tx == nil {
		return leasecore.ScopeSeal{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return f.seal(ctx, op, scope, to, func(args ...any) (string, error) {
		var rec string
		err := tx.QueryRow(ctx, f.in(pgsql.SealScope), args...).Scan(&rec)
		return rec, err
	})
}

// Seal is Fence.Seal for a database/sql transaction.
func (f *FenceDB) Seal(ctx context.Context, tx *sql.Tx, scope, to string) (leasecore.ScopeSeal, error) {
	const op = "seal"
	if tx == nil {
		return leasecore.ScopeSeal{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return f.seal(ctx, op, scope, to, func(args ...any) (string, error) {
		var rec string
		err := tx.QueryRowContext(ctx, f.in(pgsql.SealScope), args...).Scan(&rec)
		return rec, err
	})
}

func (f *fenceCore) seal(ctx context.Context, op, scope, to string, stmt func(args ...any) (string, error)) (leasecore.ScopeSeal, error) {
	if err := backendkit.CheckSeal(ctx, op, scope, to); err != nil {
		return leasecore.ScopeSeal{}, err
	}
	rec, err := stmt(scope, to)
	if err != nil {
		return leasecore.ScopeSeal{}, pgstore.MapError(ctx, pkg, op, err)
	}
	s, err := decodeSeal(scope, rec)
	if err != nil {
		return leasecore.ScopeSeal{}, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	if s.To != to {
		return s, &leasecore.ScopeMovedError{Op: op, Scope: scope, To: s.To, Floor: s.Floor}
	}
	return s, nil
}

// Install installs at this database a scope sealed at its old
// location, inside the caller's open transaction tx: the transaction that
// writes the scope's rows here (see leasecore.ScopeSeal for the whole
// move). It is the fence's own check with s.Floor as the token: the
// scope's floor here becomes s.Floor, with s.Space as its token space,
// unless it is larger already, and the outcome is a Result like RunTx's.
//
//   - Accepted (the floor here was absent or at most s.Floor, and is now
//     s.Floor): write the rows and commit. A holder whose token is below
//     s.Floor is rejected here from then on, as it was at the old location;
//     the holder whose token is s.Floor writes on.
//   - Rejected (Result.Floor is the larger floor here): do not write the
//     rows, roll back. A holder with a newer token has already been
//     accepted here: the move was completed and used, and the copy would
//     overwrite newer rows. A scope sealed here (it was moved away from
//     this database before) is rejected with a *leasecore.ScopeMovedError:
//     a sealed floor never goes down, so a scope does not come back to a
//     database it left, except through the administrative reset: an
//     owner-privileged DELETE of the scope's floor row with
//     leasefence_admin.allow_token_reset set, once every writer of the
//     scope is routed away (the repository's docs/moving-scopes.md, "Not
//     supported", and docs/security.md, "The administrative path is the
//     owner's").
//
// Running it again after it committed, before any holder wrote here, is
// accepted and changes nothing: the move can be rerun until the routing is
// switched. With s.Floor 0 (the scope never accepted a check at the old
// location) nothing is raised: it is accepted when the scope has no floor
// here, and only share-locks the floor row when it has one.
//
// Unlike a fenced transaction's comparison, it is meant to run first: one
// statement, before the rows are written, in a Read Committed transaction.
// It locks the floor row until tx ends, so a holder writing the scope here
// waits for the move's transaction (the scope is sealed at its old
// location meanwhile; no holder should be routed here yet). It commits
// durably; a rejection is logged on the fence's pool (writer "leasefence
// scope move"). Bad input
// (backendkit.CheckScopeSeal: the sealed floor itself, a space without a
// floor, ...) returns a *leasecore.ArgError naming the field before
// anything is sent.
func (f *Fence) Install(ctx context.Context, tx Querier, s leasecore.ScopeSeal) (leasecore.Result, error) {
	const op = "install"
	if tx == nil {
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return f.install(ctx, op, s, func(stmt string, args []any) (int64, error) {
		var floor int64
		err := tx.QueryRow(ctx, stmt, args...).Scan(&floor)
		return floor, err
	})
}

// Install is Fence.Install for a database/sql transaction.
func (f *FenceDB) Install(ctx context.Context, tx *sql.Tx, s leasecore.ScopeSeal) (leasecore.Result, error) {
	const op = "install"
	if tx == nil {
		return leasecore.Result{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return f.install(ctx, op, s, func(stmt string, args []any) (int64, error) {
		var floor int64
		err := tx.QueryRowContext(ctx, stmt, args...).Scan(&floor)
		return floor, err
	})
}

func (f *fenceCore) install(ctx context.Context, op string, s leasecore.ScopeSeal, query func(stmt string, args []any) (int64, error)) (leasecore.Result, error) {
	if err := backendkit.CheckScopeSeal(ctx, op, s); err != nil {
		return leasecore.Result{}, err
	}
	if s.Floor > 0 {
		c := leasecore.Claim{Scope: s.Scope, Writer: moveWriter, Token: s.Floor, Space: s.Space}
		return f.check(ctx, op, c, func(args []any) (int64, error) { return query(f.stmt.check, args) })
	}
	floor, err := query(f.in(pgsql.InstallEmpty), []any{s.Scope})
	if err != nil {
		return leasecore.Result{}, pgstore.MapError(ctx, pkg, op, err)
	}
	res := leasecore.Result{Accepted: floor == 0, Floor: leasecore.Token(floor)}
	if res.Accepted {
		return res, nil
	}
	// No token to log or to compare spaces with; a sealed floor still
	// says where the scope went.
	return res, f.diagnose(ctx, op, leasecore.Claim{Scope: s.Scope, Writer: moveWriter}, res.Floor)
}

// in returns stmt in the Fence's schema.
func (f *fenceCore) in(stmt string) string { return pgsql.InSchema(stmt, f.cfg.schema) }

// diagnose is the rejection path's diagnosis of claim c rejected by floor:
// a sealed scope (movedError) or a floor from another token space
// (spaceError). An ordinary stale rejection costs what it did before: only
// a claim with a space reads anything.
func (f *fenceCore) diagnose(ctx context.Context, op string, c leasecore.Claim, floor leasecore.Token) error {
	if floor == leasecore.SealedFloor {
		return f.movedError(ctx, op, c)
	}
	return f.spaceError(ctx, op, c)
}

// movedError reads the seal's record of c.Scope (one statement on the
// fence's pool, after a rejection by the sealed floor) and returns the
// *leasecore.ScopeMovedError it describes. Like spaceError it runs under
// ctx.
func (f *fenceCore) movedError(ctx context.Context, op string, c leasecore.Claim) error {
	var (
		floor int64
		rec   string
	)
	err := f.db.QueryRow(ctx, f.stmt.floorSpace, c.Scope).Scan(&floor, &rec)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil // no floor any more: reset deliberately since
	case err != nil:
		return pgstore.MapError(ctx, pkg, op+": read the seal", err)
	case leasecore.Token(floor) != leasecore.SealedFloor:
		return nil // reset deliberately since the rejection
	}
	s, err := decodeSeal(c.Scope, rec)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	return &leasecore.ScopeMovedError{Op: op, Scope: c.Scope, Token: c.Token, To: s.To, Floor: s.Floor}
}

// sealRecord is the seal's record in a sealed floor's row (pgsql.SealScope);
// its "sealed_at" is for operators reading the row.
type sealRecord struct {
	MovedTo    *string `json:"moved_to"`
	Floor      *int64  `json:"floor"`
	TokenSpace *string `json:"token_space"`
}

// decodeSeal parses the seal's record of scope.
func decodeSeal(scope, rec string) (leasecore.ScopeSeal, error) {
	var r sealRecord
	if err := json.Unmarshal([]byte(rec), &r); err != nil || r.MovedTo == nil || r.Floor == nil ||
		*r.Floor < 0 || leasecore.Token(*r.Floor) > backendkit.MaxToken {
		return leasecore.ScopeSeal{}, fmt.Errorf("scope %q: the floor is the sealed floor %d but its row holds no seal record (%q): "+
			"it was written outside the fence: %w", scope, leasecore.SealedFloor, rec, leasecore.ErrConfig)
	}
	s := leasecore.ScopeSeal{Scope: scope, To: *r.MovedTo, Floor: leasecore.Token(*r.Floor)}
	if r.TokenSpace != nil {
		s.Space = *r.TokenSpace
	}
	return s, nil
}
