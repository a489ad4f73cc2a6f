// Package fenceetcd provides an etcd v3 lease service that issues fencing
// tokens (LeaseStore), a fence that checks them inside the caller's own
// etcd transactions (Fence), and the part store built on it (Resource),
// implementing the interfaces of package leasecore.
//
// # Tokens are revisions
//
// A lease name is one key, <prefix>/lease/<name>, attached to an etcd lease
// and holding the holder's id. Acquire creates the key only if it does not
// exist, in one transaction, and the token is that transaction's revision;
// a Release that hands the lease to a caller waiting in line
// (LeaseStore.AcquireQueued) puts the key to it, and its token is the
// revision of that put. The key is put at nothing else, so the token of
// the holding period in force is always the key's mod revision. etcd's
// revision is one cluster-wide counter that every write advances,
// that is persisted with the write in the raft log, and that never goes
// back, also after a crash and restart. So tokens of one name are strictly
// increasing and never reused (I2), though not consecutive: every write to
// the cluster, whatever its key, advances the counter.
//
// # Expiry is the lessor's
//
// etcd lease TTLs are whole seconds, and the server raises a TTL below its
// own minimum (1.5 election timeouts, rounded up to a second). The leader's
// lessor decides expiry: it revokes an expired lease, which deletes its key
// in the same step, and refuses to keep an expired lease alive, so a renew
// after expiry always fails. When a leader takes office — after a restart
// too — its lessor gives every lease its full TTL again (plus an election
// timeout; etcd's lease checkpointing, off by default, changes that), so
// unlike a database clock, downtime does not count against a TTL: after
// recovery a held lease runs for up to its whole TTL again.
// Grant.Start is read before the request that started or last restarted the
// TTL of the etcd lease the key is attached to — the Grant or keep-alive of
// an acquire or renew; with shared leases possibly an earlier one, see
// LeaseStore — and Grant.TTL is the TTL asked for, never the larger one the
// server may have granted: the local deadline can only be early.
//
// # Shared leases
//
// By default every Acquire grants an etcd lease of its own: Grant, then the
// transaction (2 requests); Release deletes the key and revokes the lease
// (2 requests). With WithSharedLeases the store keeps one etcd lease per
// holder and TTL and attaches all that holder's names to it, like the
// locks of one concurrency.Session: an Acquire is the one transaction (plus
// a Grant the first time, and a keep-alive at most once per TTL/3), a
// Release is one transaction, and LeaseStore.RenewAll renews any number of
// the holder's names with one keep-alive. Each name keeps its own key and
// its own token. Names of one holder then live and die together.
//
// # Round trips
//
// Uncontended, counted as gRPC calls; a keep-alive is one request and one
// answer on the store's keep-alive stream, which the store opens on first
// use and keeps open while used (etcd has no unary keep-alive; clientv3's
// KeepAliveOnce opens a stream per call, which costs the server about as
// much as the renewal). TestRoundTrips checks them:
//
//	                     per-acquire leases          shared leases
//	Acquire              Grant + Txn                 Txn (+ Grant for a holder's first, or
//	                                                 + keep-alive once per TTL/3)
//	refused Acquire      Grant + Txn + Revoke        Txn
//	Release              Txn + Revoke                Txn
//	Release, hand-over   Txn + Revoke                Txn
//	  (store knew the line: it renewed, or got the lease handed over)
//	Release, hand-over   Txn + Txn + Txn + Revoke    Txn + Txn + Txn
//	  (line unknown)     (the failed delete, a read of the key and the line, the hand-over)
//	AcquireQueued        Grant + Txn (+ keep-alive   Txn, as Acquire's (+ keep-alive
//	                     per TTL/3 while waiting)    once per TTL/3 while waiting)
//	Renew                Txn (a read of the key and  Txn + keep-alive
//	                     the line) + keep-alive
//	RenewAll, n names    ceil(n/128) Txn             ceil(n/128) Txn
//	                     + n keep-alives             + 1 keep-alive per holder and TTL
//	Close                nothing                     1 Revoke per holder and TTL
//
// The fence (Fence, and Resource built on it), with the default attempt
// log; the "first" rows are the first write of a scope or of a new token
// without Fence.Advance:
//
//	Fence.Advance                    Txn
//	Fence.Commit, floor == token     Txn
//	Fence.Commit, first              Txn + Range (the floor) + Txn (advance) + Txn
//	Fence.Commit, rejected           Txn + Range (the floor that beat the token)
//	                                 + Put (its log record; none with LogNone)
//	                                 + Txn (the floor's token space; claims with a Space only)
//	                                 (a scope that moved away: + Txn, its seal record, instead)
//	Resource.Write, WriteBatch       as Fence.Commit
//	Fence.Seal                       Txn + Txn (a sealed scope: Txn)
//	Fence.Install                    Txn
//	Fence.Attempts, PruneAttempts    Range, DeleteRange
//
// For comparison, etcd's concurrency.Mutex on one concurrency.Session
// costs a Txn to Lock and a DeleteRange to Unlock, after a Grant and a
// keep-alive stream per session.
//
// # Token spaces
//
// A Grant's Space is "etcd:<cluster id in hex>": tokens are revisions of
// the whole cluster, so all prefixes and stores of one cluster share one
// token space. A Fence stores the space of the claim that raised a floor
// and reports a rejection by a floor from another space as a
// *leasecore.TokenSpaceError (see Fence).
//
// # Waiting in line
//
// LeaseStore.AcquireQueued, which leasecore.Campaign uses, waits for a
// held lease in a line of keys, <prefix>/queue/<name>/..., each attached to
// the etcd lease its waiter's hold will be attached to and kept alive while
// it waits. A Release hands the lease to the first in line in its one
// transaction: it puts the lease key with that waiter's holder and etcd
// lease and deletes the entry, and the waiter's token is that put's
// revision. So a hand-over costs one write, where a delete, a wake-up and
// the next acquire cost two or three: docs/performance.md measures it
// against etcd's concurrency.Election. A lease that expires, or is taken
// over, is deleted as before, and every waiter tries to create it.
//
// # What etcd does not keep
//
// When a lease is released or expires its key is deleted: etcd keeps no
// record of who held it or with which token. LeaseStore.Inspect then
// reports the lease as not existing, exactly like a name never acquired.
//
// # The fence and the part store
//
// A Fence keeps a floor key per scope, the largest token it let through,
// encoded so that byte order is numeric order. Its Guard is a compare the
// caller puts into its own Txn, like concurrency.Mutex.IsOwner; its Commit
// runs the caller's own transaction (its keys, its compares) nested under
// that compare, in one atomic request, with no window between the check and
// the write (I3), and reports accepted or rejected with the floor; Advance
// raises the floor right after an acquire, cutting off a stale holder
// before the new one writes anything. Resource, the part store of the
// lease-fencing article (SOURCES.md), is one user of the fence: a write is
// a Commit whose transaction puts the part. Which attempts are logged is
// the caller's choice (WithAttemptLog); reads of the log are bounded by
// time and count, and old entries can be pruned (Fence.Attempts,
// Fence.PruneAttempts).
//
// # Errors
//
// Errors wrap leasecore's sentinels: leasecore.ErrInvalidArgument (bad
// input, nothing sent; also a request etcd refuses as too large),
// leasecore.ErrHeld and leasecore.ErrLost (through a *leasecore.HoldError),
// leasecore.ErrUnavailable (no leader, connection lost, server overloaded:
// the operation may or may not have taken effect), and the context's error.
// Messages of errors from etcd start with "fenceetcd: <op>: ".
//
// The client's defaults wait for a connection rather than fail while the
// server is unreachable: pass a context with a deadline.
//
// # Deadlines
//
// Every method that takes a context returns when the context ends, within
// the time the client needs to notice (TestDeadlineEtcd measures each one
// against a server stopped with SIGSTOP, before the call or between two of
// its requests, and requires 50 ms), with an error wrapping the context's
// error — or with the outcome it had already reached: a refused Acquire
// stays a refusal, a Release whose best-effort revoke hangs returns nil.
// Every request a method waits for is sent under its context, and nothing
// retries past it; the store's keep-alive stream, which Renew, RenewAll and
// shared-mode Acquire share, is opened in the background, and each caller
// waits for it only until its own context ends. Best-effort clean-up after a
// failure (the revoke of an acquire's etcd lease, the delete of a key whose
// transaction's answer was lost, the release of the names a failed
// AcquireAll granted) runs under the context while it lasts and otherwise
// in the background, for at most 2 seconds, tracked by the LeaseStore:
// Close waits for it, and a later Acquire or AcquireAll of the same name
// through the store waits for its clean-up first (see Acquire). Outbox.Relay
// deletes a delivered entry under the context too: an entry whose delete the
// context left no time for is delivered again. LeaseStore.Close takes no
// context and is bounded by 2 seconds.
//
// Keep-alives go out one at a time on that shared stream, and a send
// blocks once gRPC's flow-control window toward a server that stopped
// reading is full: the keep-alives queued behind it wait for their turn
// under their own contexts, and a caller whose context ends during its send
// breaks the stream (its other calls are sent again on a new one). What
// remains past a deadline is scheduling: measured against a stopped server
// on the 2-CPU machine with two CPU burners and other work beside it,
// 1,000 concurrent fast-path RenewAll calls on one store returned within
// 12 ms of their deadline, 10,000 within 240 ms, 40,000 within 1.6 s
// (before, 10,000 returned only when the server resumed).
//
// This package depends on etcd's client only, never on its server.
package fenceetcd

import (
	"time"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// MinTTL is the shortest lease TTL the store accepts: etcd lease TTLs are
// whole seconds. A server whose own minimum is larger raises the TTL it
// grants; the grant still reports the TTL asked for (see Acquire).
const MinTTL = time.Second

// pkg prefixes the messages of errors from etcd.
const pkg = "fenceetcd"

// Option configures NewLeaseStore, NewFence, NewResource, NewOutbox and
// etcdcontrol.New. Make one with WithPrefix, WithSharedLeases,
// WithAttemptLog, WithFenceObserver or WithLogger; each says which
// constructors read it, and the others ignore it.
type Option func(*config)

// config is what the options set. It is etcdkv's settings under a name of
// this package's own, so that the godoc of Option names nothing a user
// cannot see, while etcdcontrol.New, which cannot see config, still gets
// the same settings (see etcdkv.RegisterOptions).
type config etcdkv.Options

func init() { etcdkv.RegisterOptions(options) }

// WithPrefix sets the prefix of every key the store writes (default
// "/leasefence"). It must begin with "/" and not end with "/"; otherwise
// the constructor returns a *leasecore.ArgError for field "prefix". A lease
// store and a resource with the same prefix share nothing but the prefix:
// their keys differ in the segment after it.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.Prefix = prefix }
}

// WithSharedLeases makes NewLeaseStore attach all names of one holder (and
// one TTL) to one etcd lease, as etcd's concurrency.Session does for its
// locks, instead of granting an etcd lease per Acquire. An acquire then
// costs one request, a release one request, and a holder renews all its
// names with one keep-alive. The price: names of one holder live and die
// together — renewing one renews all, and when the holder stops renewing
// they all expire at once. See LeaseStore for the details and the rule for
// Grant.Start. NewResource and etcdcontrol.New ignore it.
//
// Every process that acquires or releases names of one holder must use the
// same mode: a store without this option revokes the etcd lease of a name
// it releases, which in shared mode would end all of that holder's names.
//
// Grant.Start of a shared-mode Acquire may be up to TTL/3 before the call
// (the shared lease's last refresh), and the key expires TTL after that.
// leasecore.Session keeps the earlier of its own clock reading before the
// call and Grant.Start, so its local deadline follows the backdated start.
// A caller that replaces Grant.Start with its own reading instead gets a
// local deadline up to TTL/3 later than it should be, possibly after the
// key's real expiry; use Grant.Start as returned, or a margin of at least
// TTL/3.
//
// RenewAll of names the store has checked before usually costs one Get of
// the holder's generation key and one keep-alive (see RenewAll). Delete
// lease keys only through Release or TakeOver: a key deleted by hand is
// reported renewed by RenewAll until the holder's next full check.
func WithSharedLeases() Option {
	return func(c *config) { c.SharedLeases = true }
}

// WithAttemptLog sets which fence checks NewFence and NewResource record
// in the scope's attempt log (default leasecore.LogRejected: an accepted
// write's own data already says who wrote it under which token). An
// invalid mode makes the constructor return a *leasecore.ArgError for
// field "attempt log". NewLeaseStore ignores it (a lease store logs
// nothing), and so does etcdcontrol.New: the negative controls log every
// attempt, their log is their evidence.
//
// With leasecore.LogAll an accepted check's record is one more Put in the
// check's own transaction; a rejection's record is a Put after the
// rejection is known, in every mode but leasecore.LogNone (see
// Fence.Commit).
func WithAttemptLog(mode leasecore.AttemptLog) Option {
	return func(c *config) { c.AttemptLog = mode }
}

// options applies opts and validates the result.
func options(op string, opts []Option) (etcdkv.Options, etcdkv.Layout, error) {
	c := config(etcdkv.NewOptions())
	for _, f := range opts {
		f(&c)
	}
	l, err := etcdkv.NewLayout(op, etcdkv.Options(c))
	return etcdkv.Options(c), l, err
}

// checkWholeSeconds rejects a TTL that is not a whole number of seconds.
func checkWholeSeconds(op string, ttl time.Duration) error {
	if ttl%time.Second != 0 {
		return &leasecore.ArgError{Op: op, Field: "ttl", Value: ttl.String(),
			Reason: "must be a whole number of seconds: etcd lease TTLs are whole seconds"}
	}
	return nil
}
