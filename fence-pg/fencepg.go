// Package fencepg provides a PostgreSQL lease service that issues fencing
// tokens (LeaseStore), the fence that checks them inside the caller's own
// transaction (Fence), and the article's part store built on that fence
// (Resource), implementing the interfaces of package leasecore.
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
// from a stale instant (SPEC F2).
//
// Expiry is decided by the database clock only. Grant.Start is the local
// monotonic time read before the request was sent; compare it only with the
// same process's clock (see leasecore.Grant.LocalDeadline).
//
// By default each lease name has its own expiry, and RenewAll updates one
// row per name. With WithHolderSessions a holder's names of one TTL hang on
// one session row instead, which one UPDATE renews (see LeaseStore).
//
// Errors wrap leasecore's sentinels: leasecore.ErrInvalidArgument (bad input,
// nothing sent), leasecore.ErrHeld and leasecore.ErrLost (through a
// *leasecore.HoldError), leasecore.ErrUnavailable (connection lost, server
// shutting down: the operation may or may not have taken effect),
// leasecore.ErrSchema (run Migrate), leasecore.ErrConfig (a deployment
// that retrying will not fix: unknown database or role, authentication,
// a missing grant, pgx's default exec mode behind a transaction pooler,
// fsync off), and the context's error. Messages of
// errors from the database start with "fencepg: <op>: ".
//
// After an error wrapping leasecore.ErrUnavailable or a context error the
// outcome is unknown: the statement may have committed before the
// connection broke, or may still commit. pgx, on a cancelled context, closes
// the connection; the server notices only when it next talks to the client,
// so a statement waiting for a lock can still run and commit after Write or
// Acquire returned the context's error. A token check stays correct either
// way, because it compares when the statement runs. Note also that lib/pq
// reports some failures after a statement was sent (a FATAL server error,
// EOF) as driver.ErrBadConn, and database/sql then sends the statement again
// on a new connection: an Acquire whose first execution committed returns
// ErrHeld. pgx's native pool does not retry.
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
