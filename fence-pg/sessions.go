package fencepg

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// WithSharedLeases makes NewLeaseStore and NewLeaseStoreDB share one
// renewal among all names of one holder (and one TTL) instead of giving
// each name an expiry of its own — the idea, and the name, of
// fenceetcd.WithSharedLeases, which hangs them on one etcd lease. On
// PostgreSQL the names hang on one row of table holder_session
// (leasefence.holder_session in the default schema): a holder session,
// with its holder, TTL, session id and expiry. A holder then
// renews all its names with one UPDATE of one row — Renew of any one name,
// or RenewAll of all of them — where without the mode RenewAll updates a
// row per name. The price: names of one holder live and die together —
// renewing one renews all, and when the holder stops renewing they all
// expire at once. Tokens stay per name, +1 per grant, never reused: the
// mode changes who decides expiry, not the tokens. See LeaseStore for the
// details. The other stores ignore it.
//
// Every process that acquires, renews or releases names of one holder must
// use the same mode: a grant of one mode is refused by the other's Renew
// and Release (leasecore.ErrLost, with a Reason naming the mode), so a
// holder whose stores disagree loses its names at the first renewal.
// Different holders may use different modes on the same names without two
// of them ever holding a name at once: a name on a session reads as held
// (expires_at 'infinity') to a store without the mode, until it is
// released. But a name whose session expired without a release stays held
// for stores without the mode until a store with it acquires the name, or
// an operator's TakeOver; to leave the mode, stop its holders and let their
// sessions expire, then
//
//	UPDATE <schema>.lease SET session_id = NULL, acquire_id = NULL, expires_at = '-infinity'
//	 WHERE session_id IS NOT NULL;
//
// The runtime role needs SELECT, INSERT and UPDATE on holder_session too
// (Preflight names the grant; see LeaseDDL).
func WithSharedLeases() Option {
	return func(c *config) { c.sharedLeases = true }
}

// Shared reports whether the store was made WithSharedLeases.
func (s *LeaseStore) Shared() bool { return s.sessions }

// sessionStatements are the holder-session statements in the store's
// schema (internal/pgsql/session.go).
type sessionStatements struct {
	acquire, acquireAll, undo, renew, release, renewAll, renewGeneration, takeOver string
}

func newSessionStatements(in func(string) string) sessionStatements {
	return sessionStatements{
		acquire: in(pgsql.AcquireSession), acquireAll: in(pgsql.AcquireAllNewSession), undo: in(pgsql.UndoAcquireSession), renew: in(pgsql.RenewSession),
		release: in(pgsql.ReleaseSession), renewAll: in(pgsql.RenewAllSession),
		renewGeneration: in(pgsql.RenewSessionsGeneration), takeOver: in(pgsql.TakeOverSession),
	}
}

// undoTimeout bounds one attempt to undo an acquire whose outcome is
// unknown, besides the ctx it runs under. The first attempt runs right
// after the acquire failed, under the acquire's ctx while it lasts (so the
// acquire returns no later than its ctx allows); a server that does not
// answer, and an acquire whose ctx had ended already (often why it
// failed), leave the undo to later attempts (see undoQueue).
const undoTimeout = 2 * time.Second

// undoGrace is how long an acquire whose outcome is unknown is tried again
// to be undone, before the holder's renewals through this store, when the
// first attempt failed or found nothing to undo. An acquire whose context
// ended may still run in the server (pgx closes the connection, and the
// server notices only when it next writes to it): one queued behind a lock
// can commit after the first undo. Statements of the lease database hold
// locks for one statement only, so a minute is far longer than such a
// wait; an acquire that commits later still leaves the name attached to
// the holder's session, held until the holder stops renewing it.
const undoGrace = time.Minute

// acquireSession is Acquire with holder sessions (see LeaseStore). When the
// outcome is unknown (the connection broke or ctx ended after the request
// was sent), the grant, if it happened, is one the caller never gets, and
// the holder's renewals of its other names would keep it held for ever:
// it is undone at once, by its acquire id, under ctx while ctx lasts, and
// again later if that fails or ctx had ended (undoQueue). Such a failed
// acquire returns no later than its ctx allows.
func (s *LeaseStore) acquireSession(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	s.undos.retry(ctx, s, holder)
	id := rand.Int64() // names this acquire's attachment; 63 random bits, see UndoAcquireSession
	g, err := pgstore.AcquireSession(ctx, s.db, s.sess.acquire, pkg, name, holder, ttl, MinTTL, id)
	if pgstore.OutcomeUnknown(err) {
		u := pendingUndo{name: name, holder: holder, id: id, until: time.Now().Add(undoGrace)}
		// Under ctx, which is often why the acquire failed: then the undo
		// waits for the holder's next call through the store.
		if done := ctx.Err() == nil && s.undone(ctx, u); !done {
			s.undos.add(u)
		}
	}
	return g, err
}

// undone runs one undo of u (see undo) and reports whether it ended a hold.
func (s *LeaseStore) undone(ctx context.Context, u pendingUndo) bool {
	done, _ := s.undo(ctx, u)
	return done
}

// undo runs one undo of u, bounded by ctx and undoTimeout, and reports
// whether it ended a hold.
func (s *LeaseStore) undo(ctx context.Context, u pendingUndo) (bool, error) {
	uctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	n, err := s.db.Exec(uctx, s.sess.undo, u.name, u.holder, u.id)
	return n > 0, err
}

// pendingUndo is an acquire whose outcome is unknown and that was not
// found undone yet.
type pendingUndo struct {
	name, holder string
	id           int64
	until        time.Time // tried until then
}

// undoQueue holds the pending undos of a store. Its retries run in the
// holder's next Acquire, Renew or RenewAll through the store, not in a
// goroutine of their own: a LeaseStore has no Close to stop one, and the
// holder's next renewal is the moment that matters, the one that would
// keep such a name alive.
type undoQueue struct {
	n       atomic.Int32 // len(pending), read without the lock on every renewal
	mu      sync.Mutex
	pending []pendingUndo
}

func (q *undoQueue) add(u pendingUndo) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, u)
	q.n.Store(int32(len(q.pending)))
}

// retry tries again the pending undos of holder, dropping each that ended
// a hold or whose grace has passed. It runs under the caller's ctx (a
// renewal's attempt timeout bounds it too), so a slow undo cannot make the
// renewal after it late; one not done stays pending.
func (q *undoQueue) retry(ctx context.Context, s *LeaseStore, holder string) {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	var mine, rest []pendingUndo
	for _, u := range q.pending {
		if u.holder == holder {
			mine = append(mine, u)
		} else {
			rest = append(rest, u)
		}
	}
	q.pending = rest
	q.n.Store(int32(len(rest)))
	q.mu.Unlock()
	for _, u := range mine {
		if done, _ := s.undo(ctx, u); !done && time.Now().Before(u.until) {
			q.add(u)
		}
	}
}

// sessionRow is a lease row and its holder session as sessionDiagnosis (or
// RenewAllSession) found them when a renewal or release changed nothing.
type sessionRow struct {
	exists             bool
	holder             string
	token              int64
	released, attached bool
	heldPlain          bool  // held without a session
	sessionFound, live bool  // its session still carries its session id; unexpired
	sessionTTLus       int64 // that session's TTL
}

// dest is what Scan fills, in sessionDiagnosis's column order.
func (r *sessionRow) dest() []any {
	return []any{&r.exists, &r.holder, &r.token, &r.released, &r.attached, &r.heldPlain,
		&r.sessionFound, &r.live, &r.sessionTTLus}
}

// lostReason says why g could not be renewed (op "renew") or released in
// holder-session mode, checking the row's fields in the order the
// statements' WHERE does. A lost session names the session and says that
// every name on it ended: this is what a Session's Err and a SessionSet's
// LostName carry.
func (r sessionRow) lostReason(op string, g leasecore.Grant) string {
	switch {
	case !r.exists:
		return "no such lease"
	case leasecore.Token(r.token) > g.Token:
		return fmt.Sprintf("token %d was superseded by token %d (holder %q)", g.Token, r.token, r.holder)
	case leasecore.Token(r.token) < g.Token:
		return fmt.Sprintf("token %d was never issued (the latest is token %d)", g.Token, r.token)
	case r.holder != g.Holder:
		return fmt.Sprintf("holder %q does not hold it (held by %q with token %d)", g.Holder, r.holder, r.token)
	case r.released:
		return "released"
	case !r.attached && r.heldPlain:
		return "held without a holder session: a store without WithSharedLeases acquired it " +
			"(every store that acquires, renews or releases one holder's names must use the same mode)"
	case !r.attached:
		return "expired"
	case !r.sessionFound:
		return fmt.Sprintf("its holder session is gone (holder %q): it expired and the holder started a new one, "+
			"or it was deleted; every name on it ended with it", g.Holder)
	case !r.live:
		return fmt.Sprintf("its holder session expired (holder %q, ttl %v): every name on it ended with it",
			g.Holder, time.Duration(r.sessionTTLus)*time.Microsecond)
	case r.sessionTTLus != g.TTL.Microseconds():
		return fmt.Sprintf("it hangs on holder %q's session of ttl %v, not on the one of the grant's ttl %v",
			g.Holder, time.Duration(r.sessionTTLus)*time.Microsecond, g.TTL)
	}
	if op == "renew" {
		// The renewal judges the lease row by this same snapshot; only the
		// session row's latest version can have refused it: another
		// holder's acquire ended the expired session, or the holder's own
		// acquire replaced it, after this statement's snapshot.
		return fmt.Sprintf("its holder session expired or was ended while this renewal ran (holder %q): every name on it ended with it",
			g.Holder)
	}
	return "changed concurrently (released, taken over, or its session ended, while this statement ran)"
}

// renewSession is Renew with holder sessions: one UPDATE of the grant's
// session row (RenewSession), which renews every name on it.
func (s *LeaseStore) renewSession(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	s.undos.retry(ctx, s, g.Holder)
	start := time.Now() // before the request, as without the mode
	if err := s.sessionChange(ctx, "renew", g, s.sess.renew); err != nil {
		return leasecore.Grant{}, err
	}
	g.Start = start
	return g, nil
}

// sessionChange runs RenewSession or ReleaseSession for g: no row back
// means done; a row says why not.
func (s *LeaseStore) sessionChange(ctx context.Context, op string, g leasecore.Grant, query string) error {
	var r sessionRow
	err := pgstore.RetryConflicts(ctx, func() error {
		return s.db.QueryRow(ctx, query, g.Name, g.Holder, int64(g.Token), g.TTL.Microseconds()).Scan(r.dest()...)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return pgstore.MapError(ctx, pkg, op, err)
	}
	return &leasecore.HoldError{Op: op, Name: g.Name, Holder: g.Holder, Token: g.Token,
		Reason: r.lostReason(op, g), Err: leasecore.ErrLost}
}

// renewAllSession is RenewAll with holder sessions. Its common case is one
// UPDATE of one row and no lease row read (RenewSessionsGeneration, shared
// with the fast renewals of other holders running at the same moment; see
// renewBatcher): when
// every grant is one the store found on the holder's session of their TTL
// at a generation (see verifiedSessions) and the session row still shows
// that session and generation. Otherwise, or when that UPDATE finds the
// row changed, one UPDATE that extends each session the grants hang on
// after checking every grant's lease row (RenewAllSession) — one row for a
// holder whose names share one TTL, whatever their number — which also
// tells the store the generation for the next time.
func (s *LeaseStore) renewAllSession(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	const op = "renew all"
	if err := backendkit.CheckRenewAll(ctx, gs, MinTTL); err != nil {
		return nil, nil, err
	}
	s.undos.retry(ctx, s, gs[0].Holder)
	if v, ok := s.verified.covering(gs); ok {
		start := time.Now() // before the request, as in Renew
		extended, err := s.fastRenewals.renew(ctx, s, fastRenewal{holder: gs[0].Holder, ttlUs: gs[0].TTL.Microseconds(),
			sessionID: v.sessionID, generation: v.generation})
		if err != nil {
			return nil, nil, pgstore.MapError(ctx, pkg, op, err)
		}
		if extended {
			renewed := make([]leasecore.Grant, len(gs))
			for i, g := range gs {
				g.Start = start
				renewed[i] = g
			}
			return renewed, make([]error, len(gs)), nil
		}
		// A name left the session, or the session ended or was replaced:
		// the full check says which grants are still held.
		s.verified.forget(gs[0].Holder, gs[0].TTL, v)
	}
	return s.renewAllSessionChecked(ctx, gs)
}

// renewAllSessionChecked is renewAllSession's full check (RenewAllSession).
func (s *LeaseStore) renewAllSessionChecked(ctx context.Context, gs []leasecore.Grant) ([]leasecore.Grant, []error, error) {
	const op = "renew all"
	arg, index, err := renewAllInput(gs)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", pkg, op, err)
	}
	start := time.Now() // before the request, as in Renew
	var (
		lost []error
		seen []sessionSeen
	)
	err = pgstore.RetryConflicts(ctx, func() error {
		lost, seen = make([]error, len(gs)), nil
		rows, err := s.db.Query(ctx, s.sess.renewAll, gs[0].Holder, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				name string
				r    sessionRow
				v    sessionSeen
			)
			if err := rows.Scan(append(append([]any{&name}, r.dest()...), &v.ttlUs, &v.sessionID, &v.generation)...); err != nil {
				return err
			}
			if name == "" { // a session the statement extended
				seen = append(seen, v)
				continue
			}
			i := index[name]
			lost[i] = &leasecore.HoldError{Op: "renew", Name: name, Holder: gs[i].Holder, Token: gs[i].Token,
				Reason: r.lostReason("renew", gs[i]), Err: leasecore.ErrLost}
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
	s.verified.note(gs[0].Holder, renewed, seen, start)
	return renewed, lost, nil
}

// renewAllInput is RenewAll's JSON argument, shared by both modes, and the
// index of each grant by name.
func renewAllInput(gs []leasecore.Grant) (string, map[string]int, error) {
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
	return string(arg), index, err
}
