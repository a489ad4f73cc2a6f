package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// netLease wraps one campaigner's lease client (F12, F13, and the holder
// process's CAMPAIGN). It does two things:
//
//   - It stamps when each request was sent and when it returned. The server
//     acts on a request in between, so the send time of a successful
//     Acquire is a lower bound of the grant and its return an upper bound;
//     the send time of a successful Acquire or Renew (or the grant's Start,
//     when the backend dates it earlier) is a lower bound of the moment the
//     server last started the TTL. The cases compare times with these
//     bounds only, never with a guess of when the server acted.
//   - It can cut the client's network (F13): while cut, a request never
//     reaches the server. It blocks until its context ends, or the network
//     is back, and fails with an error wrapping leasecore.ErrUnavailable
//     (and the context's error), as a request on a dead connection does.
//
// Requests already past the cut when it is made go on: a renewal in flight
// may still reach the server, as on a real network.
type netLease struct {
	lease leasecore.Lease

	mu       sync.Mutex
	cut      chan struct{}                    // non-nil while cut; closed when restored
	acquires map[leasecore.Token]acquireStamp // the successful Acquires, by token
	lastOK   map[leasecore.Token]time.Time    // per token: send time of its last successful Acquire or Renew

	inspect leasecore.LeaseInspector // nil when the client has none
	waiter  backendkit.Waiter        // nil when the client has none
}

// acquireStamp brackets the server's grant of one successful Acquire.
type acquireStamp struct {
	sent, returned time.Time
}

// netWaiterLease is a netLease whose client is a backendkit.Waiter: the
// wrapper forwards WaitFree only then, so Campaign waits the way it would
// with the bare client (a Waiter, or polling). It never forwards
// backendkit.QueuedAcquirer (fence-etcd's line): the server grants a
// queued acquire at a moment the client cannot bracket (a release hands
// it over while it waits), and the cases' bounds count from an acquire's
// send. The holder processes' campaigns use the client as it is: in F12
// the frozen leader, campaigning again, is handed the lease by the new
// leader's release on a backend that queues.
type netWaiterLease struct{ *netLease }

// WaitFree implements backendkit.Waiter.
func (l netWaiterLease) WaitFree(ctx context.Context, name string) error {
	if err := l.gate(ctx, "wait free"); err != nil {
		return err
	}
	return l.waiter.WaitFree(ctx, name)
}

// wrapNet wraps lease. It returns the handle the case uses (cut, stamps)
// and the client to give Campaign: a backendkit.Waiter exactly when lease is
// one.
func wrapNet(lease leasecore.Lease) (*netLease, leasecore.Lease) {
	n := &netLease{lease: lease, acquires: map[leasecore.Token]acquireStamp{}, lastOK: map[leasecore.Token]time.Time{}}
	n.inspect, _ = lease.(leasecore.LeaseInspector)
	n.waiter, _ = lease.(backendkit.Waiter)
	if n.waiter != nil {
		return n, netWaiterLease{n}
	}
	return n, n
}

// setCut cuts the network (true) or restores it (false).
func (n *netLease) setCut(cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case cut && n.cut == nil:
		n.cut = make(chan struct{})
	case !cut && n.cut != nil:
		close(n.cut) // requests waiting at the cut fail now, as on a reset connection
		n.cut = nil
	}
}

// gate lets a request through, or holds it while the network is cut.
func (n *netLease) gate(ctx context.Context, op string) error {
	n.mu.Lock()
	cut := n.cut
	n.mu.Unlock()
	if cut == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("conformance: %s: network cut: %w: %w", op, leasecore.ErrUnavailable, context.Cause(ctx))
	case <-cut:
		return fmt.Errorf("conformance: %s: network cut, connection reset when it came back: %w", op, leasecore.ErrUnavailable)
	}
}

// acquired returns the stamps of the successful Acquire that returned
// token (zero when this client never got it).
func (n *netLease) acquired(token leasecore.Token) acquireStamp {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.acquires[token]
}

// lastHeld returns the send time of the last successful Acquire or Renew
// of token: the server's expiry of that holding period is at least one TTL
// later.
func (n *netLease) lastHeld(token leasecore.Token) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastOK[token]
}

// Acquire implements leasecore.Lease.
func (n *netLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	if err := n.gate(ctx, "acquire"); err != nil {
		return leasecore.Grant{}, err
	}
	sent := time.Now()
	g, err := n.lease.Acquire(ctx, name, holder, ttl)
	returned := time.Now()
	if err == nil {
		n.mu.Lock()
		n.acquires[g.Token] = acquireStamp{sent, returned}
		n.lastOK[g.Token] = earliest(sent, g.Start)
		n.mu.Unlock()
	}
	return g, err
}

// Renew implements leasecore.Lease.
func (n *netLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	if err := n.gate(ctx, "renew"); err != nil {
		return leasecore.Grant{}, err
	}
	sent := time.Now()
	r, err := n.lease.Renew(ctx, g)
	if err == nil {
		n.mu.Lock()
		if t := earliest(sent, r.Start); t.After(n.lastOK[g.Token]) {
			n.lastOK[g.Token] = t
		}
		n.mu.Unlock()
	}
	return r, err
}

// earliest returns the earlier of sent and the grant's Start: a backend may
// date a holding period before the call (fenceetcd's shared leases restart
// the TTL with an earlier request), and the server's expiry counts from
// that.
func earliest(sent, start time.Time) time.Time {
	if !start.IsZero() && start.Before(sent) {
		return start
	}
	return sent
}

// Release implements leasecore.Lease.
func (n *netLease) Release(ctx context.Context, g leasecore.Grant) error {
	if err := n.gate(ctx, "release"); err != nil {
		return err
	}
	return n.lease.Release(ctx, g)
}

// errNoInspector is Inspect's answer for a client that cannot inspect;
// Campaign then reports no observed holder, which is all it loses.
var errNoInspector = errors.New("conformance: the lease client is no leasecore.LeaseInspector")

// Inspect implements leasecore.LeaseInspector (Campaign reports the holder
// that refused it through it).
func (n *netLease) Inspect(ctx context.Context, name string) (leasecore.LeaseState, error) {
	if n.inspect == nil {
		return leasecore.LeaseState{}, errNoInspector
	}
	if err := n.gate(ctx, "inspect"); err != nil {
		return leasecore.LeaseState{}, err
	}
	return n.inspect.Inspect(ctx, name)
}
