// Package fencepg provides a PostgreSQL lease service that issues fencing
// tokens (LeaseStore), the fence that checks them inside the caller's own
// transaction (Fence), and the part store of the lease-fencing article
// (SOURCES.md) built on that fence (Resource), implementing the interfaces
// of package leasecore.
//
// The lease service and the fence may live in two different databases,
// each with its own pool: LeaseStore on the lease database, Fence on the
// database of the data it protects (the caller's tables and the fence's
// floor must share a transaction). The fence never reads the lease table;
// it decides from the largest token it has accepted per scope (its floor).
//
// The library's tables live in a schema of their own, DefaultSchema
// ("leasefence") unless WithSchema names another, so they never collide
// with the application's. Migrate creates them; LeaseDDL and ResourceDDL
// give the same DDL to a migration tool, with the grants a runtime role
// needs; Preflight, at start-up, checks the connection, the durability
// the tokens need (fsync), the runtime role's grants and the tables
// (CheckSchema: missing, foreign or out of date).
//
// Every lease operation is one statement in autocommit mode, sent in one
// request. The stores take a pool — a *pgxpool.Pool (pgx/v5) or a *sql.DB
// (lib/pq or pgx's stdlib driver) — and never a transaction: inside a
// caller's transaction now() is the transaction's start time, so an acquire
// there would still see an expired lease as held, and a renew would extend
// from a stale instant (conformance case F2).
//
// What takes the caller's transaction comes in two types, one per driver,
// with the same methods for the same acts: Fence and Outbox (from
// NewFence and NewOutbox) take a pgx.Tx, FenceDB and OutboxDB (from
// NewFenceDB and NewOutboxDB) a *sql.Tx. LeaseStore and Resource take no
// transaction: each is one type, from a constructor per pool.
//
// Expiry is decided by the database clock only. Grant.Start is the local
// monotonic time read before the request was sent; compare it only with the
// same process's clock (see leasecore.Grant.LocalDeadline).
//
// By default each lease name has its own expiry, and RenewAll updates one
// row per name. With WithSharedLeases a holder's names of one TTL hang on
// one session row instead, which one UPDATE renews (see LeaseStore).
//
// Errors wrap leasecore's sentinels: leasecore.ErrInvalidArgument (bad input,
// nothing sent), leasecore.ErrHeld and leasecore.ErrLost (through a
// *leasecore.HoldError), leasecore.ErrUnavailable (connection lost, server
// shutting down, no connection made — a refused connection, or the DSN's
// connect_timeout against a server that does not answer, which pgx reports
// as a deadline of its own while the caller's context is live: the
// operation may or may not have taken effect),
// leasecore.ErrSchema (run Migrate), leasecore.ErrConfig (a deployment
// that retrying will not fix: unknown database or role, authentication,
// a missing grant, pgx's default exec mode behind a transaction pooler,
// fsync off), and the context's error. Messages of
// errors from the database start with "fencepg: <op>: ".
//
// When the context has ended, an error the end explains (the driver's
// own words for it, a connection it closed or marked bad, a statement it
// cancelled, a transient server condition) is reported the same way on
// every driver: "fencepg: <op>: context canceled (the context ended:
// <cause>)", wrapping the context's error and context.Cause (a session's
// context ends with leasecore.ErrLocalDeadline or leasecore.ErrLost), and
// never leasecore.ErrUnavailable: a caller that retries on ErrUnavailable
// does not take a lease that ended for a database that faltered.
//
// After an error wrapping leasecore.ErrUnavailable or a context error the
// outcome is unknown: the statement may have committed before the
// connection broke, or may still commit. The fenced transactions (RunTx,
// Commit) say which: "nothing of the transaction was committed" when the
// COMMIT was never sent, "the COMMIT was sent and its answer never came"
// when the outcome is unknown. pgx, on a cancelled context, closes
// the connection; the server notices only when it next talks to the client,
// so a statement waiting for a lock can still run and commit after Write or
// Acquire returned the context's error. A token check stays correct either
// way, because it compares when the statement runs. Note also that lib/pq
// reports some failures after a statement was sent (a FATAL server error,
// EOF) as driver.ErrBadConn, and database/sql then sends the statement again
// on a new connection: an Acquire whose first execution committed returns
// ErrHeld. pgx's native pool does not retry.
//
// # Deadlines
//
// On a *pgxpool.Pool, and on a *sql.DB with pgx's database/sql driver
// (github.com/jackc/pgx/v5/stdlib, sql.Open("pgx", dsn)), every method that
// takes a context returns when the context ends, within the time the
// process needs to notice (TestDeadlinePg measures each one against a
// server that stops answering — a proxy that holds every byte, before the
// call or between two of its statements — and requires 50 ms), with an
// error wrapping the context's error, or with the outcome it had already
// reached (a rejection comes back as the Result, with the context's error
// for its log record). pgx's default context watcher closes the socket
// for it (a pgconn.CancelRequestContextWatcherHandler configured on the
// pool waits up to its DeadlineDelay first). Every statement of a call,
// clean-up included, runs under the call's context: the rollback of a
// fenced transaction that failed (when the context has ended, pgx closes
// the connection instead, and the server rolls the transaction back when
// it sees it close), the log record of a rejection, the UNLISTEN after
// WaitFree (a connection whose wait ended with the context is closed
// instead), the mark of a delivered outbox entry (an entry not marked is
// delivered again), and the undo of a holder-session acquire whose outcome
// is unknown (when the context has ended, it waits for the holder's next
// call through the store; see LeaseStore). A database/sql transaction is
// bound to the context given to BeginTx, which bounds its COMMIT and
// ROLLBACK: FenceDB.RunTx passes its own; with FenceDB.Commit, begin the
// transaction with the same context (or one that ends no later).
//
// lib/pq cannot honour a deadline against a server that stops answering (a
// stopped process, a hung host, a network path that still acknowledges
// TCP). When a context ends it sends the server a cancel request on a new
// connection (watchCancel in its conn_go18.go) and returns only once the
// server answers on the statement's own connection; BEGIN, COMMIT and
// ROLLBACK, which database/sql sends without a context, are not cancelled
// at all. So every call on a lib/pq pool — FenceDB's RunTx and Commit,
// Migrate and every statement of the stores — waits until the server answers again or
// the kernel gives up on the TCP connection, whatever its context
// (TestDeadlineLibpq: a call with a 300 ms deadline returned after 1 s,
// when the held server answered again). No lib/pq setting changes that:
// connect_timeout bounds only connecting. Where deadlines matter, use pgx's
// database/sql driver with the same *sql.DB code, or a *pgxpool.Pool.
//
// Call Migrate on each store once before use; it is idempotent and safe to
// run from several processes at once.
package fencepg

import "time"

// MinTTL is the shortest lease TTL the stores accept.
//
// PostgreSQL stores expiry with microsecond resolution, but a TTL means
// something only when it is much longer than one round trip to the server:
// the server starts the TTL when the statement runs, the holder's local
// deadline starts before the request was sent, and the margin between them
// must cover the round trip, scheduling delays and the renew interval. On a
// loopback connection a round trip takes a fraction of a millisecond, across
// a network one or more; below 10 ms the round trip, not the TTL, would
// decide how long a holder can work.
const MinTTL = 10 * time.Millisecond

// pkg prefixes the messages of errors from the database.
const pkg = "fencepg"
