package conformance_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// memHarness runs the suite against the in-memory reference backend. It is
// also the smallest example of a harness.
type memHarness struct {
	leases *memfence.Leases
	res    *memfence.Resource
	lock   *memWriteLock // the part store's write lock (memgap_test.go)
	ctl    *memControls
	user   *memUserData
	// holders serves the state to holder processes (memholder_test.go).
	holders memHolders
	// markerChecksToken breaks the marker-first control (suite_test.go).
	markerChecksToken bool
	// dropRenewAfterWrite doctors the holder processes (suite_test.go).
	dropRenewAfterWrite bool
	// outbox holds the fenced outbox's entries (memoutbox_test.go);
	// outboxOutsideFence and relayMutant break it (suite_outbox_test.go).
	outbox             *memOutboxStore
	outboxOutsideFence bool
	relayMutant        relayMutant
}

func newMemHarness(context.Context) (conformance.Harness, error) {
	return &memHarness{leases: memfence.NewLeases(nil), res: memfence.NewResource(), lock: &memWriteLock{}, ctl: newMemControls(),
		user: newMemUserData(), outbox: &memOutboxStore{}}, nil
}

func (h *memHarness) Traits() conformance.Traits {
	return conformance.Traits{
		Name:       "memfence",
		MinTTL:     memfence.MinTTL,
		TokenStep:  1,
		AttemptLog: leasecore.LogAll, // memfence logs every check
		Absent: map[conformance.Ability]string{
			conformance.AbilityLongTransaction: "an in-memory map has no transactions and one clock",
			conformance.AbilityCrashRestart:    "in-memory state does not survive a crash",
			conformance.AbilityDelayedNetwork:  "an in-memory map has no network to delay",
			conformance.AbilityReplicas:        "an in-memory map has no replicas",
			conformance.AbilityScopeMoves:      "an in-memory map has no second server to move a scope to",
			conformance.AbilityCheckFirst: "memfence's holder processes reach it over RPC, one call per write: " +
				"no transaction stays open across a holder's freeze, check first or not",
		},
	}
}

func (h *memHarness) OpenLease(context.Context) (leasecore.Lease, error) { return h.leases, nil }

func (h *memHarness) OpenResource(context.Context) (conformance.Resource, error) {
	return memPartStore{Resource: h.res, lock: h.lock}, nil
}

func (h *memHarness) Close() error { h.holders.close(); return nil }

func (h *memHarness) FencedResourceWithGap(_ context.Context, gap conformance.Gap) (conformance.Resource, error) {
	return memPartStore{Resource: h.res, lock: h.lock, gap: gap}, nil
}

func (h *memHarness) LockWaits(context.Context) ([]string, error) {
	if n := h.lock.waiting.Load() + h.user.waiting.Load(); n > 0 {
		return []string{fmt.Sprintf("%d write(s) waiting for the resource mutex", n)}, nil
	}
	return nil, nil
}

func (h *memHarness) UnfencedResource(context.Context) (conformance.Resource, error) {
	return h.ctl.resource(func(ctx context.Context, w leasecore.Write) (bool, error) { return true, nil }), nil
}

func (h *memHarness) CheckThenWriteResource(_ context.Context, gap conformance.Gap) (conformance.Resource, error) {
	c := h.ctl
	return c.resource(func(ctx context.Context, w leasecore.Write) (bool, error) {
		c.mu.Lock()
		floor := c.floors[w.Scope] // step 1: read the floor
		c.mu.Unlock()
		if w.Token < floor {
			return false, nil
		}
		if err := gap(ctx, w); err != nil { // the decision goes stale here
			return false, err
		}
		c.mu.Lock()
		c.floors[w.Scope] = w.Token // step 2: write the floor, unconditionally
		c.mu.Unlock()
		return true, nil
	}), nil
}

func (h *memHarness) RowFencedResource(context.Context) (conformance.Resource, error) {
	c := h.ctl
	return c.resource(func(ctx context.Context, w leasecore.Write) (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		old, ok := c.parts[[2]string{w.Scope, w.Part}]
		return !ok || old.Token <= w.Token, nil
	}), nil
}

func (h *memHarness) IdempotentPublisher(context.Context) (conformance.Resource, error) {
	c := h.ctl
	return c.resource(func(ctx context.Context, w leasecore.Write) (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.parts[[2]string{w.Scope, w.Part}]
		return !ok, nil
	}), nil
}

// AmbiguousLease implements conformance.AmbiguousOutcomes: the in-memory
// service carries the call out in full, and the client throws its answer
// away, as a connection lost on the way back does.
func (h *memHarness) AmbiguousLease(context.Context) (leasecore.Lease, func(), error) {
	l := &lossyLease{Lease: h.leases}
	return l, l.loseNextAnswer, nil
}

// lossyLease is a lease client that loses the answer of its next call once
// armed. A client whose Lease implements answerLoser is told which grant's
// answer it lost (the ghost mutant keeps it).
type lossyLease struct {
	leasecore.Lease
	armed atomic.Bool
}

// answerLoser is told of an acquire that took effect and whose answer
// lossyLease threw away.
type answerLoser interface{ answerLost(g leasecore.Grant) }

func (l *lossyLease) loseNextAnswer() { l.armed.Store(true) }

// lost reports whether this call's answer is to be lost, and disarms.
func (l *lossyLease) lost() bool { return l.armed.Swap(false) }

func errAnswerLost(op string) error {
	return fmt.Errorf("memfence (test client): %s: the connection was lost before the answer arrived: %w", op, leasecore.ErrUnavailable)
}

func (l *lossyLease) Acquire(ctx context.Context, name, holder string, ttl time.Duration) (leasecore.Grant, error) {
	g, err := l.Lease.Acquire(ctx, name, holder, ttl)
	if !l.lost() {
		return g, err
	}
	if al, ok := l.Lease.(answerLoser); ok && err == nil {
		al.answerLost(g)
	}
	return leasecore.Grant{}, errAnswerLost("acquire")
}

func (l *lossyLease) Renew(ctx context.Context, g leasecore.Grant) (leasecore.Grant, error) {
	r, err := l.Lease.Renew(ctx, g)
	if l.lost() {
		return leasecore.Grant{}, errAnswerLost("renew")
	}
	return r, err
}

func (l *lossyLease) Release(ctx context.Context, g leasecore.Grant) error {
	err := l.Lease.Release(ctx, g)
	if l.lost() {
		return errAnswerLost("release")
	}
	return err
}

// memControls holds the state of the in-memory negative controls. Each
// control decides with its own (flawed) rule, then stores the part.
type memControls struct {
	mu     sync.Mutex
	floors map[string]leasecore.Token
	parts  map[[2]string]leasecore.StoredPart
}

func newMemControls() *memControls {
	return &memControls{floors: map[string]leasecore.Token{}, parts: map[[2]string]leasecore.StoredPart{}}
}

type memControl struct {
	*memControls
	decide func(ctx context.Context, w leasecore.Write) (bool, error)
}

func (c *memControls) resource(decide func(context.Context, leasecore.Write) (bool, error)) *memControl {
	return &memControl{c, decide}
}

func (c *memControl) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	ok, err := c.decide(ctx, w)
	if err != nil || !ok {
		return leasecore.Result{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts[[2]string{w.Scope, w.Part}] = leasecore.StoredPart{Scope: w.Scope, Part: w.Part, Content: w.Content,
		Writer: w.Writer, Token: w.Token, WrittenAt: time.Now()}
	return leasecore.Result{Accepted: true, Floor: c.floors[w.Scope]}, nil
}

func (c *memControl) Floor(_ context.Context, scope string) (leasecore.Token, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.floors[scope], nil
}

func (c *memControl) ReadPart(_ context.Context, scope, part string) (leasecore.StoredPart, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.parts[[2]string{scope, part}]
	return p, ok, nil
}

func (c *memControl) Attempts(context.Context, string) ([]leasecore.Attempt, error) { return nil, nil }

func TestConformance(t *testing.T) {
	t.Parallel() // the paused-holder cases wait; TestReportFormat runs the suite beside it
	conformance.Run(t, newMemHarness)
}
