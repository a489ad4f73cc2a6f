package fencepg

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// errNoListen is why WaitFree cannot wait on a lib/pq connection: lib/pq
// reads notifications only while a statement runs, and offers a listening
// connection (pq.Listener) only from a DSN, which a *sql.DB does not give.
var errNoListen = fmt.Errorf("the database/sql driver cannot wait for notifications (use pgx, or pgx's stdlib driver): %w",
	errors.ErrUnsupported)

// errNotificationsOff is why WaitFree does not wait on a store made with
// WithoutNotifications.
var errNotificationsOff = fmt.Errorf("notifications are off (WithoutNotifications: behind a transaction pooler a LISTEN "+
	"does not stay with the client's session): %w", errors.ErrUnsupported)

const (
	// waitSpread bounds the random time added to the holding period's
	// remaining time, so that waiters that read the same expiry do not all
	// acquire at the same instant.
	waitSpread = 50 * time.Millisecond
	// unlistenTimeout bounds the UNLISTEN after a wait (ctx bounds it
	// too): a connection that does not answer within it is closed instead
	// of being returned to the pool.
	unlistenTimeout = 2 * time.Second
)

// WaitFree implements backendkit.Waiter with LISTEN/NOTIFY: Release notifies
// channel leasefence_lease_free, with "<schema>.<name>" as the payload, in
// the same statement, so the notification is delivered when the release
// commits (and never for a release that does not).
//
// WaitFree takes a connection of the pool for the whole wait and, on it,
// LISTENs, then reads the lease row with a plain SELECT (no lock: a holder's
// renewal never waits for a waiter), and returns at once when the lease is
// free. Otherwise it waits for a notification naming the lease, or for the
// holding period's remaining time by the database clock plus up to 50 ms
// of jitter (expiry sends no notification), or for ctx. Before the
// connection goes back to the pool it UNLISTENs and drops notifications
// received meanwhile; a connection that cannot be cleaned up, or whose
// wait ended with ctx (the UNLISTEN would have to outlast it), is closed.
// Each waiting call therefore holds one connection of the pool: size the
// pool for the campaigns that wait plus the sessions that renew.
//
// The pgx pool (NewLeaseStore) and database/sql with pgx's stdlib driver
// (NewLeaseStoreDB) wait this way. With lib/pq WaitFree returns an error
// wrapping errors.ErrUnsupported at once (after the first call without a
// round trip), and leasecore.Campaign polls.
//
// Behind a connection pooler in transaction mode (PgBouncer with
// pool_mode=transaction) a LISTEN runs on the server connection lent for
// that one statement and does not stay with the client, so no release
// would wake the waiter: it would return only when the holding period's
// remaining time had passed. Make the store with WithoutNotifications
// there: WaitFree then returns an error wrapping errors.ErrUnsupported at
// once, without a round trip, and Campaign polls.
//
// Errors: a *leasecore.ArgError for an invalid name; ctx's error when ctx
// ends; errors.ErrUnsupported as above; leasecore.ErrUnavailable for
// connection trouble, as the other operations map them.
func (s *LeaseStore) WaitFree(ctx context.Context, name string) error {
	const op = "wait free"
	if err := backendkit.CheckName(op, "name", name); err != nil {
		return err
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return err
	}
	if s.noNotify {
		return fmt.Errorf("%s: %s: %w", pkg, op, errNotificationsOff)
	}
	if s.pool != nil {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return pgstore.MapError(ctx, pkg, op, err)
		}
		reusable, err := s.waitOn(ctx, c.Conn(), name)
		if reusable {
			c.Release()
		} else {
			// At once: a done context makes pgx close the socket without
			// waiting for the server (its Terminate goes out if the
			// socket takes it).
			closeCtx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = c.Hijack().Close(closeCtx)
		}
		return err
	}
	if s.noListen.Load() {
		return fmt.Errorf("%s: %s: %w", pkg, op, errNoListen)
	}
	conn, err := s.sqlDB.Conn(ctx)
	if err != nil {
		return pgstore.MapError(ctx, pkg, op, err)
	}
	defer conn.Close()
	var waitErr error
	rawErr := conn.Raw(func(dc any) error {
		// pgx's stdlib driver exposes its *pgx.Conn this way; nothing else
		// this package can reach waits for a notification without a
		// statement running.
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			s.noListen.Store(true)
			waitErr = fmt.Errorf("%s: %s: %w (driver connection %T)", pkg, op, errNoListen, dc)
			return nil
		}
		var reusable bool
		reusable, waitErr = s.waitOn(ctx, pc.Conn(), name)
		if !reusable {
			return driver.ErrBadConn // database/sql closes it
		}
		return nil
	})
	if waitErr == nil && rawErr != nil && !errors.Is(rawErr, driver.ErrBadConn) {
		waitErr = pgstore.MapError(ctx, pkg, op, rawErr)
	}
	return waitErr
}

// waitOn is WaitFree on one connection. reusable reports whether conn is
// clean again (not listening, no notification buffered) and may go back to
// its pool.
func (s *LeaseStore) waitOn(ctx context.Context, conn *pgx.Conn, name string) (reusable bool, err error) {
	const op = "wait free"
	// Simple protocol: no prepared statement is cached for LISTEN.
	if _, err := conn.PgConn().Exec(ctx, pgsql.Listen).ReadAll(); err != nil {
		return false, pgstore.MapError(ctx, pkg, op, err)
	}
	err = s.waitListening(ctx, conn, name)

	// Under ctx, like the wait itself: when ctx has ended (or ends now),
	// the connection is closed instead of cleaned up, so the call never
	// waits for a server that stopped answering.
	if ctx.Err() != nil {
		return false, err
	}
	uctx, cancel := context.WithTimeout(ctx, unlistenTimeout)
	defer cancel()
	if _, uerr := conn.PgConn().Exec(uctx, pgsql.Unlisten).ReadAll(); uerr != nil {
		return false, err
	}
	// Notifications received before the UNLISTEN wait in the connection's
	// buffer; with a done context WaitForNotification hands them out
	// without reading from the network.
	done, stop := context.WithCancel(context.Background())
	stop()
	for {
		if n, _ := conn.WaitForNotification(done); n == nil {
			break
		}
	}
	return true, err
}

// waitListening reads the lease on conn, which already LISTENs, and waits
// while it is held.
func (s *LeaseStore) waitListening(ctx context.Context, conn *pgx.Conn, name string) error {
	const op = "wait free"
	var (
		holder          string
		token, remainUS int64
		held, released  bool
	)
	err := conn.QueryRow(ctx, s.stmt.inspect, name).Scan(&holder, &token, &held, &released, &remainUS)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // never held
	case err != nil:
		return pgstore.MapError(ctx, pkg, op, err)
	case !held:
		return nil // released or expired
	}
	bound := time.Duration(remainUS)*time.Microsecond + rand.N(waitSpread)
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	payload := s.schema + "." + name
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %s %q: %w", pkg, op, name, ctxError(ctx))
		case wctx.Err() != nil:
			return nil // the holding period's time has passed
		case err != nil:
			return pgstore.MapError(ctx, pkg, op, err)
		case n != nil && n.Channel == pgsql.LeaseFreeChannel && n.Payload == payload:
			return nil // released
		}
		// A release of another lease: keep waiting.
	}
}

// ctxError is ctx's error, with its cause when the cause says more.
func ctxError(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%w: %w", ctx.Err(), cause)
	}
	return ctx.Err()
}
