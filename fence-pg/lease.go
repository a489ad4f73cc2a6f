package fencepg

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
)

// LeaseStore is a lease service on the lease database: one row per lease
// name in table lease, and a token that grows by exactly 1 on every acquire
// (leasecore.Lease, I1 and I2). It also implements leasecore.LeaseInspector,
// leasecore.BatchRenewer and leasecore.Waiter: Release notifies the lease's
// name with pg_notify in the same statement, and WaitFree LISTENs on a
// connection of its own, so a waiting leasecore.Campaign is woken when the
// release commits and otherwise when the holding period's remaining time by
// the database clock has passed (see WaitFree: with lib/pq, or behind a
// transaction pooler, waiting falls back to polling or to that remaining
// time). It is safe for concurrent use.
type LeaseStore struct {
	db     dbx.DB
	schema string
	stmt   struct{ acquire, renew, release, renewAll, inspect string }

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
	_ leasecore.BatchRenewer   = (*LeaseStore)(nil)
	_ leasecore.Waiter         = (*LeaseStore)(nil)
)

// NewLeaseStore returns a lease store on a pgx pool connected to the lease
// database. Of the options only WithSchema and WithoutNotifications apply.
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
	s := &LeaseStore{db: db, schema: cfg.schema, noNotify: cfg.noNotify}
	in := func(stmt string) string { return pgsql.InSchema(stmt, cfg.schema) }
	s.stmt.acquire, s.stmt.renew, s.stmt.release = in(pgsql.Acquire), in(pgsql.Renew), in(pgsql.Release)
	s.stmt.renewAll, s.stmt.inspect = in(pgsql.RenewAll), in(pgsql.Inspect)
	return s, nil
}

// Acquire implements leasecore.Lease: one INSERT ... ON CONFLICT DO UPDATE
// (see the statement in internal/pgsql) that takes the lease when it is
// absent, expired or released and returns token + 1 (1 for a new name).
// While the lease is held, by anyone, it returns a *leasecore.HoldError
// wrapping leasecore.ErrHeld and changes nothing. Grant.Start is read just
// before the request is sent. Grant.Space is the lease schema's token space,
// "postgres:<uuid>", returned by the same statement (see LeaseDDL).
func (s *LeaseStore) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	return pgstore.Acquire(ctx, s.db, s.stmt.acquire, pkg, name, holder, ttl, MinTTL)
}

// Renew implements leasecore.Lease: one statement that sets the expiry to
// the database's now() + g.TTL only while g's holding period (name, holder,
// token) is unexpired. Otherwise it returns a *leasecore.HoldError wrapping
// leasecore.ErrLost whose Reason says what did not match, and changes
// nothing; a renew after expiry fails even when nobody took over. The
// returned grant has the same token and space and a new Start.
func (s *LeaseStore) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if err := leasecore.CheckGrant(ctx, "renew", g, MinTTL); err != nil {
		return leasecore.Grant{}, err
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
func (s *LeaseStore) Release(ctx context.Context, g leasecore.Grant) error {
	if err := leasecore.CheckGrant(ctx, "release", g, MinTTL); err != nil {
		return err
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
			&before.exists, &before.holder, &token, &before.released, &before.held)
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
	case !r.held:
		return "expired"
	}
	// The row matched when the statement started, but a concurrent
	// statement changed it before the update could lock it.
	return "changed concurrently (released, or expired and taken over, while this statement ran)"
}

// RenewAll implements leasecore.BatchRenewer with one statement (RenewAll
// in internal/pgsql) for all of one holder's leases: a holder that owns
// many names (shard ownership) renews them with one round trip per
// interval instead of one per name. Each lease is judged by Renew's rule
// and keeps its own token; the statement returns only the leases it did
// not renew, with their rows as they were, so lost[i] says why.
func (s *LeaseStore) RenewAll(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	const op = "renew all"
	if err := leasecore.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	type jsonGrant struct {
		Name  string `json:"name"`
		Token int64  `json:"token"`
		TTLus int64  `json:"ttl_us"`
	}
	in := make([]jsonGrant, len(gs))
	index := make(map[string]int, len(gs))
	for i, g := range gs {
		in[i] = jsonGrant{g.Name, int64(g.Token), g.TTL.Microseconds()}
		index[g.Name] = i
	}
	arg, err := json.Marshal(in)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	start := time.Now() // before the request, as in Renew
	var lost []error
	err = pgstore.RetrySerialization(ctx, func() error {
		lost = make([]error, len(gs))
		rows, err := s.db.Query(ctx, s.stmt.renewAll, gs[0].Holder, string(arg))
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
			if err := rows.Scan(&name, &before.exists, &before.holder, &token, &before.released, &before.held); err != nil {
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
// Remaining are computed by the database clock at the moment of the read.
func (s *LeaseStore) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	const op = "inspect"
	if err := leasecore.CheckInspect(ctx, name); err != nil {
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
