// Package fenceetcd provides an etcd v3 lease service that issues fencing
// tokens (LeaseStore) and an etcd resource that checks them (Resource),
// implementing the interfaces of package leasecore.
//
// # Tokens are revisions
//
// A lease name is one key, <prefix>/lease/<name>, attached to an etcd lease
// and holding the holder's id. Acquire creates the key only if it does not
// exist, in one transaction, and the token is the key's create revision:
// etcd's revision is one cluster-wide counter that every write advances,
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
// Grant.Start is read before the first request
// of an acquire or renew, and Grant.TTL is the TTL asked for, never the
// larger one the server may have granted: the local deadline can only be
// early.
//
// # What etcd does not keep
//
// When a lease is released or expires its key is deleted: etcd keeps no
// record of who held it or with which token. LeaseStore.Inspect then
// reports the lease as not existing, exactly like a name never acquired.
//
// # Resource
//
// A Resource keeps a floor key per scope, the largest token it accepted,
// encoded so that byte order is numeric order, and compares it with the
// token in the same transaction that writes the part: one atomic request,
// with no window between the check and the write (I3).
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

// Option configures NewLeaseStore, NewResource and etcdcontrol.New. Make
// one with WithPrefix.
type Option func(*etcdkv.Options)

// WithPrefix sets the prefix of every key the store writes (default
// "/leasefence"). It must begin with "/" and not end with "/"; otherwise
// the constructor returns a *leasecore.ArgError for field "prefix". A lease
// store and a resource with the same prefix share nothing but the prefix:
// their keys differ in the segment after it.
func WithPrefix(prefix string) Option {
	return func(o *etcdkv.Options) { o.Prefix = prefix }
}

// layout applies opts and validates the result.
func layout(op string, opts []Option) (etcdkv.Layout, error) {
	o := etcdkv.NewOptions()
	for _, f := range opts {
		f(&o)
	}
	return etcdkv.NewLayout(op, o)
}

// checkWholeSeconds rejects a TTL that is not a whole number of seconds.
func checkWholeSeconds(op string, ttl time.Duration) error {
	if ttl%time.Second != 0 {
		return &leasecore.ArgError{Op: op, Field: "ttl", Value: ttl.String(),
			Reason: "must be a whole number of seconds: etcd lease TTLs are whole seconds"}
	}
	return nil
}
