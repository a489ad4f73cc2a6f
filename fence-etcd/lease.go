package fenceetcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// LeaseStore is a lease service on etcd: one key per lease name, attached
// to an etcd lease, whose mod revision is the fencing token
// (leasecore.Lease, I1 and I2). It also implements leasecore.LeaseInspector,
// backendkit.BatchRenewer, backendkit.Waiter (WaitFree watches the lease's
// key and returns when its holding period ends: a release, a hand-over or
// the lessor's revoke at expiry) and backendkit.QueuedAcquirer
// (AcquireQueued waits in line, and a Release hands the lease to the first
// waiter in the same transaction: a waiting leasecore.Campaign leads one
// write after the previous leader's release). It is safe for concurrent
// use.
//
// Call Close when done with the store, and before closing its client (see
// NewLeaseStore).
//
// # Shared leases
//
// With WithSharedLeases the store keeps, per holder and TTL, one etcd lease
// that all of that holder's names are attached to, like the locks of one
// etcd concurrency.Session:
//
//   - Acquire grants the shared lease only when there is none yet or it may
//     have expired, and otherwise sends the one transaction that creates
//     the name's key attached to it. When more than a third of the TTL has
//     passed since the shared lease was last refreshed, it first refreshes
//     it with one keep-alive (so at most once per TTL/3 per holder, not per
//     acquire). A put that finds the shared lease gone grants a new one and
//     tries once more.
//   - Renew of one name keeps the shared lease alive, and with it EVERY name
//     of that holder and TTL: they live and die together. A holder that no
//     longer wants a name must Release it; stopping to renew only that name
//     does not let it expire while the holder renews others.
//   - RenewAll of names the store has checked before costs one Get of the
//     holder's generation key and one keep-alive, however many the names;
//     a full check (a read of every name's key) runs when a name of the
//     holder was taken over, or released through another store, or a name
//     was acquired since (see RenewAll). Delete lease keys only through
//     Release or TakeOver: a key deleted by other means (etcdctl, a raw
//     client) goes unnoticed by RenewAll until its next full check. The
//     store sends its keep-alives on one stream (to the leader when the
//     client has several endpoints) and reads the generation keys of
//     concurrent RenewAll calls in one transaction, so a process keeping
//     many holders alive should renew them all through one store.
//   - Release deletes the name's key only (and changes the holder's
//     generation keys, see RenewAll); the shared lease stays for the
//     holder's other names and its next acquires.
//   - Close revokes every shared lease, which deletes all their names at
//     once.
//
// Grant.Start in shared mode is the shared lease's refresh start — the local
// time read before the Grant or the last successful keep-alive of that etcd
// lease — not the time of the Acquire request; see Acquire.
type LeaseStore struct {
	kv      clientv3.KV
	leases  clientv3.Lease
	ka      *keepAliver      // the store's keep-alive stream
	gens    genReader        // RenewAll's fast path: the generation-key reads
	watcher clientv3.Watcher // WaitFree
	layout  etcdkv.Layout
	shared  bool // WithSharedLeases

	mu       sync.Mutex
	closed   bool                       // Close was called
	closing  chan struct{}              // closed by Close: ends the waits in progress
	pool     map[sharedKey]*sharedLease // shared mode: the etcd lease of each (holder, ttl)
	cleanups cleanups                   // best-effort clean-ups still running (see cleanUp)
	// heads is, per lease key, who waited first in line when the store's
	// AcquireQueued got the lease handed over (see knownHead).
	heads map[string]knownHead
	// lastRev is the largest revision of a successful shared-mode acquire
	// (see unputIfOurs).
	lastRev atomic.Int64
}

var (
	_ leasecore.Lease           = (*LeaseStore)(nil)
	_ leasecore.LeaseInspector  = (*LeaseStore)(nil)
	_ backendkit.BatchRenewer   = (*LeaseStore)(nil)
	_ backendkit.Waiter         = (*LeaseStore)(nil)
	_ backendkit.QueuedAcquirer = (*LeaseStore)(nil)
)

// NewLeaseStore returns a lease store on cli, with keys under the prefix
// set by WithPrefix, sharing one etcd lease per holder with
// WithSharedLeases. A nil cli or an invalid prefix returns a
// *leasecore.ArgError. The caller keeps ownership of cli and closes it —
// after calling the store's Close, which needs the client: Close waits for
// the store's clean-ups still running in the background (the best-effort
// revoke or delete after a failed call) and, with shared leases, revokes
// the holders' shared etcd leases. With the client closed first these
// requests fail, and the keys and etcd leases they would have removed stay
// until their TTL runs out.
func NewLeaseStore(cli *clientv3.Client, opts ...Option) (*LeaseStore, error) {
	const op = "new lease store"
	if cli == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "client", Reason: "must not be nil"}
	}
	o, l, err := options(op, opts)
	if err != nil {
		return nil, err
	}
	s := &LeaseStore{kv: cli.KV, leases: cli.Lease, ka: newKeepAliver(cli), gens: genReader{kv: cli.KV}, watcher: cli.Watcher, layout: l, shared: o.SharedLeases,
		closing: make(chan struct{})}
	if ownKV(cli) {
		// Reads on a connection of the store's own reach the same keys
		// only when cli.KV is the client's own KV, not a wrapper (such as
		// namespace.NewKV) that rewrites them.
		s.gens.leader, s.gens.reopen = s.ka.leaderKV, s.ka.openLeaderKV
	}
	if s.shared {
		s.pool = make(map[sharedKey]*sharedLease)
	}
	return s, nil
}

// Shared reports whether the store was made WithSharedLeases.
func (s *LeaseStore) Shared() bool { return s.shared }

// Acquire implements leasecore.Lease in two requests: Grant an etcd lease
// of ttl, then one transaction
//
//	If(CreateRevision(key) == 0).Then(Put(key, holder, WithLease(id)))
//
// that creates the lease's key only if it does not exist. The token is the
// transaction's revision, which is the key's create and mod revision (a
// Release that hands the lease over puts the key again: the token is
// always the key's mod revision, see AcquireQueued). While the key
// exists — held by anyone, the same holder included — it returns a
// *leasecore.HoldError wrapping leasecore.ErrHeld that names the current
// holder, and revokes the etcd lease it just granted (best effort; it would
// expire on its own). ttl must be a whole number of seconds.
//
// The holder named in a refusal is read by a separate Get after the
// transaction, not by an Else branch in it: etcd pays for the operations of
// a branch it does not run (the request carries them, through its log), so
// the Else would slow down every successful acquire — measured at a few
// percent of an acquire+release — to save a read on the refusal path. The
// refusal itself is decided by the transaction; the Get only describes it,
// in the HoldError's Reason, and may find the name released again by then.
//
// Grant.TTL is ttl even when the server granted more (it raises a TTL below
// its minimum): the holder's local deadline then falls even earlier before
// the real expiry, which is the safe direction. Grant.Space is the
// cluster's token space, "etcd:<cluster id in hex>", from the transaction's
// response header: tokens are revisions of the whole cluster.
//
// In shared mode (WithSharedLeases) the transaction puts the key with the
// holder's shared etcd lease instead, granted or refreshed only when needed
// (see LeaseStore), and a refused acquire leaves the shared lease alone.
// Grant.Start is then the shared lease's refresh start, which may be up to
// TTL/3 before the call: the key lives exactly as long as the shared lease,
// which expires TTL after its last refresh, possibly before (this call) +
// TTL, and Start + TTL must never be later than the real expiry (see
// WithSharedLeases for a caller that replaces Start). An error after the
// transaction was sent, when it may have been applied, deletes the key
// again if it carries this holder and the shared lease (best effort), so no
// name is held without the holder knowing — and kept alive by its other
// names' renewals.
//
// Clean-up never makes Acquire late. The revoke of a refused or failed
// acquire's etcd lease, and the delete of a key whose transaction's answer
// was lost, run under ctx while ctx lasts (the usual case: the round trips
// of the table in the package doc); when ctx has ended — often the reason
// the acquire failed — they continue in a goroutine of the store, bounded
// by 2 seconds, that Close waits for, and Acquire returns at once. Until
// such a delete has run, a later Acquire or AcquireAll of the same name
// through this store waits for it (bounded by its own ctx), so it cannot
// delete the key of that later acquire. A clean-up the server does not
// answer in time is dropped: the etcd lease expires after its TTL (in
// shared mode, when the holder stops renewing its names).
//
// After Close, Acquire returns an error wrapping ErrStoreClosed.
func (s *LeaseStore) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	const op = "acquire"
	if err := backendkit.CheckAcquire(ctx, name, holder, ttl, MinTTL); err != nil {
		return leasecore.Grant{}, err
	}
	if err := checkWholeSeconds(op, ttl); err != nil {
		return leasecore.Grant{}, err
	}
	if s.isClosed() {
		return leasecore.Grant{}, fmt.Errorf("%s: %s: %w", pkg, op, ErrStoreClosed)
	}
	if s.shared {
		return s.acquireShared(ctx, name, holder, ttl)
	}
	key := s.layout.Lease(name)

	// Read the clock before the first request: the lessor starts the TTL
	// when it grants the lease, after our Grant request arrived, so Start
	// + TTL is never later than the server's expiry (as long as the clocks
	// run at the same rate). The later transaction does not restart it.
	start := time.Now()
	lg, err := s.leases.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	resp, err := s.putIfAbsent(ctx, key, holder, lg.ID)
	if err != nil || !resp.Succeeded {
		// Not ours, or unknown: revoking deletes the key too if the put
		// did happen before an error, so no holder exists that nobody
		// knows about.
		s.revoke(ctx, lg.ID)
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The new lease expired before the put ran: the request took
		// longer than ttl. Nothing holds the name because of us.
		return leasecore.Grant{}, fmt.Errorf("%s: %s: the granted lease expired before its key was written (ttl %v): %w: %w",
			pkg, op, ttl, leasecore.ErrUnavailable, err)
	case err != nil:
		return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, op, err)
	case !resp.Succeeded:
		return leasecore.Grant{}, &leasecore.HoldError{Op: op, Name: name, Holder: holder,
			Reason: s.heldReason(ctx, key), Err: leasecore.ErrHeld}
	}
	return leasecore.Grant{Name: name, Holder: holder, Token: leasecore.Token(resp.Header.Revision), TTL: ttl, Start: start,
		Space: tokenSpace(resp.Header)}, nil
}

// tokenSpace is the token space of the revisions a response's header
// comes from: "etcd:" and the cluster's ID in hex, as etcd prints member
// and cluster IDs. A token is a revision, and the revision is one
// counter for the whole cluster, so every prefix and every store on one
// cluster share one token space, and another cluster (another ID) has
// another. Every response of etcd's v3 API carries the cluster ID in its
// header (etcdserverpb.ResponseHeader); "" when it does not (a zero ID).
//
// A cluster made again with the same initial configuration (member names,
// peer URLs and --initial-cluster-token) gets the same ID while its
// revisions start again at 1: etcd derives the ID from that configuration.
// Its tokens are then not told apart from the old cluster's; a distinct
// --initial-cluster-token per cluster, which etcd recommends anyway, avoids
// it.
func tokenSpace(h *etcdserverpb.ResponseHeader) string {
	if h.GetClusterId() == 0 {
		return ""
	}
	return "etcd:" + strconv.FormatUint(h.GetClusterId(), 16)
}

// putIfAbsent is Acquire's transaction: it creates key with value holder,
// attached to etcd lease id, only if key does not exist.
func (s *LeaseStore) putIfAbsent(ctx context.Context, key, holder string, id clientv3.LeaseID) (*clientv3.TxnResponse, error) {
	return s.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, holder, clientv3.WithLease(id))).
		Commit()
}

// heldReason describes the holder of key after an acquire was refused, by
// reading the key. The refusal stands whatever the read finds: the key
// existed when the transaction ran.
func (s *LeaseStore) heldReason(ctx context.Context, key string) string {
	resp, err := s.kv.Get(ctx, key)
	switch {
	case err != nil:
		return fmt.Sprintf("held (the holder could not be read: %v)", err)
	case len(resp.Kvs) == 0:
		return "held when tried (released or expired since)"
	}
	return heldBy(resp.Kvs[0])
}

// heldBy names who holds a lease key, and with which token.
func heldBy(kv *mvccpb.KeyValue) string {
	return fmt.Sprintf("held by %q with token %d", kv.Value, kv.ModRevision)
}

// Renew implements leasecore.Lease in two requests: a read of the lease's
// key, which must exist with mod revision g.Token and value g.Holder (and,
// in the same request, of the first entry of the name's waiting line, so
// that the holder's Release can hand the lease over in one transaction,
// see AcquireQueued), then KeepAliveOnce of the etcd lease the key is attached to, which resets
// its TTL. Otherwise it returns a *leasecore.HoldError wrapping
// leasecore.ErrLost whose Reason says what did not match, and changes
// nothing. After expiry the key is gone (the lessor deletes it with the
// lease) and the lessor refuses to keep an expired lease alive, so a renew
// after expiry always fails, even when nobody took over. The returned grant
// has the same token and a new Start.
//
// In shared mode the etcd lease kept alive is the holder's shared lease, so
// this renews every name of g.Holder with g.TTL, not g's alone (see
// LeaseStore), and it counts as the shared lease's refresh for later
// acquires. The returned grant's Space is the cluster's, as Acquire's.
func (s *LeaseStore) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	const op = "renew"
	if err := s.checkGrant(ctx, op, g); err != nil {
		return leasecore.Grant{}, err
	}
	key := s.layout.Lease(g.Name)
	kvs, head, header, err := s.readHolding(ctx, key, g.Name)
	if err != nil {
		return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	if reason := lostReason(kvs, g); reason != "" {
		return leasecore.Grant{}, lostHold(op, g, reason)
	}
	// Who waits first in line, for this holding period's Release.
	s.rememberHead(key, g.Token, head)
	// Read before sending: the lessor extends from when it handles the
	// keep-alive, so Start + TTL is never later than the new expiry.
	id := clientv3.LeaseID(kvs[0].Lease)
	space := tokenSpace(header)
	start := time.Now()
	err = s.keepAlive(ctx, id)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// Expired (or released) between the Get and the keep-alive.
		s.sharedGone(id)
		return leasecore.Grant{}, lostHold(op, g, "expired")
	case err != nil:
		return leasecore.Grant{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	s.sharedRefreshed(g.Holder, g.TTL, id, start)
	g.Start, g.Space = start, space
	return g, nil
}

// Release implements leasecore.Lease with one transaction
//
//	If(ModRevision(key) == g.Token, Value(key) == g.Holder, line empty).Then(Delete(key, WithPrevKV))
//
// that deletes the key only while it is g's and nobody waits in its line
// (AcquireQueued), so the next Acquire succeeds at once with a larger
// token. When somebody waits, Release hands the lease over instead, in one
// transaction that holds only while the key is g's and the first entry of
// the line is still there: it puts the key with that waiter's holder and
// etcd lease (the waiter's token is its revision) and deletes the entry.
// A store that got the lease handed over knows who was next in line then,
// and one that renewed it knows who was first at the renewal (Renew reads
// the line with the key); such a store sends that transaction at once
// (should that waiter have left, a read and another try follow).
// Otherwise the first transaction's failed compare, and a read of the key
// and the line, come first. Either way it then revokes the etcd lease g's
// key was attached to (read from the transaction's previous value, not by
// a separate Get), best effort: no key is attached to it any more, and a
// lease with no key holds nothing and expires on its own (the revoke runs
// under ctx, and in the background when ctx has ended, as Acquire's
// clean-up). When a compare fails, a separate read of the key and the line
// says why (no Else branch, for the reason given on Acquire); the refusal
// was decided by the transaction. Released twice, after expiry or after a
// take-over or a hand-over it returns a *leasecore.HoldError wrapping
// leasecore.ErrLost and changes nothing; should that read fail, Release
// returns its error (not leasecore.ErrLost: the name may still be g's).
//
// In shared mode it is the transaction alone, and the delete returns no
// previous value: the shared etcd lease is not revoked, as the holder's
// other names are attached to it.
//
// The same transaction changes the holder's generation keys (see
// RenewAll). Without shared leases, and in shared mode while the store has
// not seen the generation key of its shared lease for (g.Holder, g.TTL) — no
// full RenewAll or AcquireAll of that holder and TTL has run on it — it
// deletes all of them, and the holder's next RenewAll on every store checks
// every name. Once the store has seen it, the transaction also compares the
// key's etcd lease with that shared lease and rewrites the lease's
// generation key instead: the names the store verified on the lease keep
// RenewAll's fast path, unless the generation key had changed since the
// store last saw it. When that compare fails but the key is g's (a name
// acquired through another store, or before the store replaced its shared
// lease), a read and a second transaction, which deletes all of the holder's
// generation keys, release it.
func (s *LeaseStore) Release(ctx context.Context, g leasecore.Grant) error {
	const op = "release"
	if err := s.checkGrant(ctx, op, g); err != nil {
		return err
	}
	return s.releaseOrHandOver(ctx, op, s.layout.Lease(g.Name), g)
}

// releaseDefault is Release's transaction without shared leases: it
// deletes key while it is g's (and, with lineCheck, while nobody waits in
// its line), then revokes its etcd lease. done is false when a compare
// failed.
func (s *LeaseStore) releaseDefault(ctx context.Context, op, key string, g leasecore.Grant, lineCheck bool) (done bool, err error) {
	// The holder's generation keys are those of a store in shared mode,
	// which a store in this mode must not release names of
	// (WithSharedLeases); should it, the revoke below ends the shared lease
	// and its generation key with it — unless it fails, which is why they
	// are deleted here too. A delete of a range with no key in it costs the
	// server next to nothing.
	cmps := s.holdingCmps(key, g, lineCheck)
	resp, err := s.kv.Txn(ctx).
		If(cmps...).
		Then(clientv3.OpDelete(key, clientv3.WithPrevKV()),
			clientv3.OpDelete(s.layout.HolderGenPrefix(g.Holder), clientv3.WithPrefix())).
		Commit()
	if err != nil {
		return false, etcdkv.MapError(ctx, pkg, op, err)
	}
	if !resp.Succeeded {
		return false, nil
	}
	if prev := resp.Responses[0].GetResponseDeleteRange().GetPrevKvs(); len(prev) > 0 && prev[0].Lease != 0 {
		s.revoke(ctx, clientv3.LeaseID(prev[0].Lease))
	}
	return true, nil
}

// checkGrant validates a grant passed to Renew or Release.
func (s *LeaseStore) checkGrant(ctx context.Context, op string, g leasecore.Grant) error {
	if err := backendkit.CheckGrant(ctx, op, g, MinTTL); err != nil {
		return err
	}
	return checkWholeSeconds(op, g.TTL)
}

// lostReason says why g's holding period is not the one the lease's key
// (kvs, the result of a Get) records, or "" when it is.
func lostReason(kvs []*mvccpb.KeyValue, g leasecore.Grant) string {
	if len(kvs) == 0 {
		return "no such lease (expired or released)"
	}
	kv := kvs[0]
	token, holder := leasecore.Token(kv.ModRevision), string(kv.Value)
	switch {
	case token > g.Token:
		return fmt.Sprintf("token %d was superseded by token %d (holder %q)", g.Token, token, holder)
	case token < g.Token:
		// The key has existed since before g.Token, so no acquire could
		// have issued it.
		return fmt.Sprintf("token %d was never issued (the current is token %d)", g.Token, token)
	case holder != g.Holder:
		return fmt.Sprintf("holder %q does not hold it (%s)", g.Holder, heldBy(kv))
	}
	return ""
}

func lostHold(op string, g leasecore.Grant, reason string) error {
	return &leasecore.HoldError{Op: op, Name: g.Name, Holder: g.Holder, Token: g.Token, Reason: reason, Err: leasecore.ErrLost}
}

// Inspect implements leasecore.LeaseInspector with a Get of the lease's key
// and, when it exists, a TimeToLive of its etcd lease.
//
// etcd keeps no record of a released or expired lease: its key is deleted.
// Such a lease is reported like a name never acquired, with Exists false,
// Released false and Token 0. A lease whose key exists is Held, by the
// lessor's decision: an expired lease is held until the lessor revokes it,
// and until then no Acquire succeeds either. Remaining is etcd's whole
// seconds, rounded down: the lease may run up to a second longer.
func (s *LeaseStore) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	const op = "inspect"
	if err := backendkit.CheckInspect(ctx, name); err != nil {
		return leasecore.LeaseState{}, err
	}
	free := leasecore.LeaseState{Name: name}
	resp, err := s.kv.Get(ctx, s.layout.Lease(name))
	if err != nil {
		return leasecore.LeaseState{}, etcdkv.MapError(ctx, pkg, op, err)
	}
	if len(resp.Kvs) == 0 {
		return free, nil
	}
	kv := resp.Kvs[0]
	ttl, err := s.leases.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// Revoked between the two reads, and the key with it.
		return free, nil
	case err != nil:
		return leasecore.LeaseState{}, etcdkv.MapError(ctx, pkg, op, err)
	case ttl.TTL < 0:
		// etcd answers an unknown lease with TTL -1 (not an error):
		// revoked between the two reads, and the key with it.
		return free, nil
	}
	st := leasecore.LeaseState{Name: name, Exists: true, Holder: string(kv.Value),
		Token: leasecore.Token(kv.ModRevision), Held: true}
	if ttl.TTL > 0 {
		st.Remaining = time.Duration(ttl.TTL) * time.Second
	}
	return st, nil
}
