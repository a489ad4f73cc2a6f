package fencepg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// LeaseStore is a lease service on the lease database: one row per lease
// name in table lease, and a token that grows by exactly 1 on every acquire
// (leasecore.Lease, I1 and I2). It also implements leasecore.LeaseInspector,
// backendkit.BatchRenewer and backendkit.Waiter: Release notifies the lease's
// name with pg_notify in the same statement, and WaitFree LISTENs on a
// connection of its own, so a waiting leasecore.Campaign is woken when the
// release commits and otherwise when the holding period's remaining time by
// the database clock has passed (see WaitFree: with lib/pq, or behind a
// transaction pooler, waiting falls back to polling or to that remaining
// time). It is safe for concurrent use.
//
// # Shared leases: holder sessions
//
// With WithSharedLeases the store hangs all names of one holder and TTL
// on one row of table holder_session (holder, TTL, session id, expiry),
// like the locks of one Chubby session or the keys of one etcd lease, and
// each name's row points at its session instead of carrying an expiry of
// its own. A name is held while its session is unexpired by the database
// clock and still the one it was acquired on:
//
//   - Acquire, one statement: takes the name when it is absent, released,
//     expired, or on a session that is over, with token + 1 (1 for a new
//     name), and in the same commit refreshes the holder's session to
//     now() + TTL, or starts a new one, with a new session id, when it had
//     expired: names of an expired session never come back to life, not
//     even when the holder acquires again. Acquiring refreshes the session,
//     so it also renews the holder's other names of that TTL. The holder's
//     own live name is refused with ErrHeld, as without the mode.
//     Grant.Start is read before the request, as without the mode: the
//     session's new expiry is set by the same statement, so it is never
//     earlier than Start + TTL, and no backdating is needed (etcd's
//     shared mode, which does not refresh on every acquire, dates Start
//     back to its last refresh).
//   - Renew and RenewAll: one UPDATE of the session row, only while it is
//     unexpired and every grant renewed still hangs on it with its token.
//     Renewing one name renews all the names on the session; RenewAll of a
//     holder's names with one TTL updates one row whatever their number.
//     The lease rows are read, not written.
//   - Release ends that name only: its row leaves the session and reads
//     released; the session and its other names live on.
//   - A session that expires ends all its names at once. Renew and RenewAll
//     then fail for each with a *leasecore.HoldError wrapping ErrLost whose
//     Reason says that the holder session expired (or was replaced by a
//     newer one) and that every name on it ended with it: the cause a
//     leasecore.Session's Err and a leasecore.SessionSet's LostName carry.
//   - Inspect, List, WaitFree and TakeOver report such names by their
//     session's expiry, in stores of either mode.
//   - An acquire whose outcome is unknown — the connection broke or ctx
//     ended after the request was sent, or database/sql sent it again on a
//     new connection and found the first execution's hold (lib/pq) — is
//     undone: the caller got an error and no grant, and the holder's
//     renewals of its other names would otherwise keep that name held for
//     ever. The undo ends the hold only if the name still hangs on a
//     session by that very acquire (a random acquire id); it is tried at
//     once, under the acquire's ctx while ctx lasts, and again before the
//     holder's next calls through the store, under their ctx, for a minute,
//     if it could not be done (see undoGrace). An acquire whose ctx has
//     ended therefore returns at once: its undo waits for the holder's next
//     Acquire, Renew or RenewAll through the store — the call whose renewal
//     would otherwise keep the name held.
//
// Tokens are as without the mode: per name, +1 per grant in the same
// durable commit, never reused, across session losses and server crashes
// alike.
type LeaseStore struct {
	db     dbx.DB
	schema string
	stmt   struct{ acquire, acquireAll, renew, release, renewAll, inspect string }

	// Holder sessions (WithSharedLeases).
	sessions     bool
	sess         sessionStatements
	undos        undoQueue
	verified     verifiedSessions // what RenewAll's fast path relies on
	fastRenewals renewBatcher     // RenewAll's fast renewals, gathered

	// For WaitFree, which needs a connection of its own: exactly one is set.
	pool  *pgxpool.Pool
	sqlDB *sql.DB
	// noListen is set once WaitFree found a database/sql driver that cannot
	// wait for notifications (lib/pq): it fails at once from then on.
	noListen atomic.Bool
	// noNotify: WithoutNotifications (behind a transaction pooler).
	noNotify bool
}

var (
	_ leasecore.Lease          = (*LeaseStore)(nil)
	_ leasecore.LeaseInspector = (*LeaseStore)(nil)
	_ backendkit.BatchRenewer  = (*LeaseStore)(nil)
	_ backendkit.Waiter        = (*LeaseStore)(nil)
)

// NewLeaseStore returns a lease store on a pgx pool connected to the lease
// database. Of the options only WithSchema, WithoutNotifications and
// WithSharedLeases apply.
// A nil pool or an invalid option returns a *leasecore.ArgError. The caller
// keeps ownership of the pool and closes it.
func NewLeaseStore(pool *pgxpool.Pool, opts ...Option) (*LeaseStore, error) {
	if pool == nil {
		return nil, &leasecore.ArgError{Op: "new lease store", Field: "pool", Reason: "must not be nil"}
	}
	s, err := newLeaseStore(dbx.FromPool(pool), opts)
	if err != nil {
		return nil, err
	}
	s.pool = pool
	return s, nil
}

// NewLeaseStoreDB is NewLeaseStore for a database/sql pool (lib/pq, or pgx's
// stdlib driver). A nil db returns a *leasecore.ArgError.
func NewLeaseStoreDB(db *sql.DB, opts ...Option) (*LeaseStore, error) {
	if db == nil {
		return nil, &leasecore.ArgError{Op: "new lease store", Field: "db", Reason: "must not be nil"}
	}
	s, err := newLeaseStore(dbx.FromSQL(db), opts)
	if err != nil {
		return nil, err
	}
	s.sqlDB = db
	return s, nil
}

func newLeaseStore(db dbx.DB, opts []Option) (*LeaseStore, error) {
	cfg, err := newConfig("new lease store", opts)
	if err != nil {
		return nil, err
	}
	s := &LeaseStore{db: db, schema: cfg.schema, noNotify: cfg.noNotify, sessions: cfg.sharedLeases}
	in := func(stmt string) string { return pgsql.InSchema(stmt, cfg.schema) }
	s.stmt.acquire, s.stmt.renew, s.stmt.release = in(pgsql.Acquire), in(pgsql.Renew), in(pgsql.Release)
	s.stmt.renewAll, s.stmt.inspect = in(pgsql.RenewAll), in(pgsql.Inspect)
	s.stmt.acquireAll = in(pgsql.AcquireAllNew)
	if s.sessions {
		s.sess = newSessionStatements(in)
	}
	return s, nil
}

// Acquire implements leasecore.Lease: one INSERT ... ON CONFLICT DO UPDATE
// on the lease table, in autocommit, that takes the lease when it is
// absent, expired or released and returns token + 1 (1 for a new name).
// While the lease is held, by anyone, it returns a *leasecore.HoldError
// wrapping leasecore.ErrHeld and changes nothing. Grant.Start is read just
// before the request is sent. Grant.Space is the lease schema's token space,
// "postgres:<uuid>", returned by the same statement (see LeaseDDL).
//
// With shared leases (WithSharedLeases) it attaches the name to the
// holder's session of ttl instead, refreshing or starting that session in
// the same statement (see LeaseStore); a refusal's HoldError names the
// current holder and token.
func (s *LeaseStore) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if s.sessions {
		return s.acquireSession(ctx, name, holder, ttl)
	}
	return pgstore.Acquire(ctx, s.db, s.stmt.acquire, pkg, name, holder, ttl, MinTTL)
}

// Renew implements leasecore.Lease: one statement that sets the expiry to
// the database's now() + g.TTL only while g's holding period (name, holder,
// token) is unexpired. Otherwise it returns a *leasecore.HoldError wrapping
// leasecore.ErrLost whose Reason says what did not match, and changes
// nothing; a renew after expiry fails even when nobody took over. The
// returned grant has the same token and space and a new Start.
//
// With holder sessions it extends g's session instead, and with it every
// name on that session (see LeaseStore).
func (s *LeaseStore) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if err := backendkit.CheckGrant(ctx, "renew", g, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	if s.sessions {
		return s.renewSession(ctx, g)
	}
	// Read before sending: the server extends from when it runs the
	// statement, so Start + TTL is never later than the new expiry.
	start := time.Now()
	if err := s.endOrExtend(ctx, "renew", g, s.stmt.renew, g.TTL.Microseconds()); err != nil {
		return leasecore.Grant{}, err
	}
	g.Start = start
	return g, nil
}

// Release implements leasecore.Lease: one statement that sets the expiry to
// -infinity only while g's holding period is unexpired, so the next Acquire
// succeeds at once with token + 1. Released twice, after expiry or after a
// take-over it returns a *leasecore.HoldError wrapping leasecore.ErrLost and
// changes nothing.
//
// With holder sessions it takes the name off its session, which lives on
// for the holder's other names.
func (s *LeaseStore) Release(ctx context.Context, g leasecore.Grant) error {
	if err := backendkit.CheckGrant(ctx, "release", g, MinTTL); err != nil {
		return err
	}
	if s.sessions {
		return s.sessionChange(ctx, "release", g, s.sess.release)
	}
	return s.endOrExtend(ctx, "release", g, s.stmt.release)
}

// endOrExtend runs Renew's or Release's statement, which returns no row
// when it updated the lease and, in the same round trip, the row as it was
// before when it did not.
func (s *LeaseStore) endOrExtend(ctx context.Context, op string, g leasecore.Grant, query string, extra ...any) error {
	args := append([]any{g.Name, g.Holder, int64(g.Token)}, extra...)
	var (
		before leaseRow
		token  int64
	)
	err := pgstore.RetrySerialization(ctx, func() error {
		return s.db.QueryRow(ctx, query, args...).Scan(
			&before.exists, &before.holder, &token, &before.released, &before.held, &before.onSession)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil // updated
	case err != nil:
		return pgstore.MapError(ctx, pkg, op, err)
	}
	before.token = leasecore.Token(token)
	return &leasecore.HoldError{Op: op, Name: g.Name, Holder: g.Holder, Token: g.Token,
		Reason: before.lostReason(g), Err: leasecore.ErrLost}
}

// leaseRow is a lease row as a renew or release statement found it.
type leaseRow struct {
	exists         bool
	holder         string
	token          leasecore.Token
	released, held bool
	onSession      bool // it hangs on a holder session
}

// lostReason says why g's holding period could not be renewed or released,
// checking the row's fields in the order the statement's WHERE does.
func (r leaseRow) lostReason(g leasecore.Grant) string {
	switch {
	case !r.exists:
		return "no such lease"
	case r.token > g.Token:
		return fmt.Sprintf("token %d was superseded by token %d (holder %q)", g.Token, r.token, r.holder)
	case r.token < g.Token:
		return fmt.Sprintf("token %d was never issued (the latest is token %d)", g.Token, r.token)
	case r.holder != g.Holder:
		return fmt.Sprintf("holder %q does not hold it (held by %q with token %d)", g.Holder, r.holder, r.token)
	case r.released:
		return "released"
	case r.onSession:
		return "it hangs on a holder session: a store with WithSharedLeases acquired it " +
			"(every store that acquires, renews or releases one holder's names must use the same mode)"
	case !r.held:
		return "expired"
	}
	// The row matched when the statement started, but a concurrent
	// statement changed it before the update could lock it.
	return "changed concurrently (released, or expired and taken over, while this statement ran)"
}

// RenewAll implements backendkit.BatchRenewer with one statement for all
// of one holder's leases (one UPDATE of their rows): a holder that owns
// many names (shard ownership) renews them with one round trip per
// interval instead of one per name. Each lease is judged by Renew's rule
// and keeps its own token; the statement returns only the leases it did
// not renew, with their rows as they were, so lost[i] says why.
//
// With shared leases it updates the sessions the grants hang on instead:
// one row for all of a holder's names of one TTL (see LeaseStore).
func (s *LeaseStore) RenewAll(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	const op = "renew all"
	if s.sessions {
		return s.renewAllSession(ctx, gs)
	}
	if err := backendkit.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	arg, index, err := renewAllInput(gs)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	start := time.Now() // before the request, as in Renew
	var lost []error
	err = pgstore.RetrySerialization(ctx, func() error {
		lost = make([]error, len(gs))
		rows, err := s.db.Query(ctx, s.stmt.renewAll, gs[0].Holder, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				name   string
				before leaseRow
				token  int64
			)
			if err := rows.Scan(&name, &before.exists, &before.holder, &token, &before.released, &before.held,
				&before.onSession); err != nil {
				return err
			}
			before.token = leasecore.Token(token)
			i := index[name]
			lost[i] = &leasecore.HoldError{Op: "renew", Name: name, Holder: gs[i].Holder, Token: gs[i].Token,
				Reason: before.lostReason(gs[i]), Err: leasecore.ErrLost}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, nil, pgstore.MapError(ctx, pkg, op, err)
	}
	renewed := make([]leasecore.Grant, len(gs))
	for i, g := range gs {
		if lost[i] == nil {
			g.Start = start
			renewed[i] = g
		}
	}
	return renewed, lost, nil
}

// Inspect implements leasecore.LeaseInspector with one SELECT. Held and
// Remaining are computed by the database clock at the moment of the read;
// for a name on a holder session, from its session's expiry, in either
// mode.
func (s *LeaseStore) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	const op = "inspect"
	if err := backendkit.CheckInspect(ctx, name); err != nil {
		return leasecore.LeaseState{}, err
	}
	st := leasecore.LeaseState{Name: name}
	var token, remaining int64
	err := pgstore.RetrySerialization(ctx, func() error {
		return s.db.QueryRow(ctx, s.stmt.inspect, name).Scan(&st.Holder, &token, &st.Held, &st.Released, &remaining)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return st, nil
	case err != nil:
		return leasecore.LeaseState{}, pgstore.MapError(ctx, pkg, op, err)
	}
	st.Exists, st.Token, st.Remaining = true, leasecore.Token(token), time.Duration(remaining)*time.Microsecond
	return st, nil
}
