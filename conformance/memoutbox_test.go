package conformance_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/rpc"
	"slices"
	"sync"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// The in-memory harness's fenced outbox (conformance.OutboxResources), the
// reference for F9b: the report row goes into the user tables of
// memUserData and the entry into memOutboxStore, both under memUserData's
// mutex and its fence check, so they are stored together or not at all. The
// relay is the loop every backend has: read pending entries in order,
// deliver, mark after the acknowledgement. Relay processes run the same
// loop in the holder process, reaching the store over net/rpc.

// memOutboxStore holds the entries. Its own mutex; a write takes it inside
// memUserData's (never the other way round).
type memOutboxStore struct {
	mu      sync.Mutex
	seq     int64
	entries []memOutboxEntry
}

type memOutboxEntry struct {
	e         leasecore.OutboxEntry
	delivered bool
}

func (s *memOutboxStore) add(w leasecore.Write, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.entries = append(s.entries, memOutboxEntry{e: leasecore.OutboxEntry{ID: newEntryID(), Seq: s.seq, Scope: w.Scope,
		Writer: w.Writer, Token: w.Token, Topic: w.Part, Payload: []byte(w.Content), At: at}})
}

// pending returns at most limit undelivered entries after seq after.
func (s *memOutboxStore) pending(after int64, limit int) []leasecore.OutboxEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []leasecore.OutboxEntry
	for _, me := range s.entries {
		if !me.delivered && me.e.Seq > after && len(out) < limit {
			e := me.e
			e.Payload = slices.Clone(e.Payload)
			out = append(out, e)
		}
	}
	return out
}

func (s *memOutboxStore) mark(seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.entries {
		if s.entries[i].e.Seq == seq {
			s.entries[i].delivered = true
		}
	}
}

func newEntryID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// relayMutant breaks the relay for the suite's own tests (suite_outbox_test.go).
type relayMutant string

const (
	relayHonest    relayMutant = ""
	relayMarkFirst relayMutant = "mark before the downstream acknowledged"
	relayFreshIDs  relayMutant = "a fresh identity on every delivery"
)

// relaySource is where a relay reads and marks entries: the store itself,
// or the store over RPC in a relay process.
type relaySource interface {
	pending(after int64, limit int) ([]leasecore.OutboxEntry, error)
	mark(seq int64) error
}

type storeSource struct{ s *memOutboxStore }

func (s storeSource) pending(after int64, limit int) ([]leasecore.OutboxEntry, error) {
	return s.s.pending(after, limit), nil
}
func (s storeSource) mark(seq int64) error { s.s.mark(seq); return nil }

// memRelay is the relay loop: pages of pending entries in seq order, each
// delivered and then marked; the first error of deliver stops it.
func memRelay(ctx context.Context, src relaySource, deliver func(context.Context, leasecore.OutboxEntry) error, m relayMutant) (int, error) {
	if err := backendkit.CheckRelay(ctx, "relay", deliver); err != nil {
		return 0, err
	}
	n := 0
	for after := int64(0); ; {
		page, err := src.pending(after, 16)
		if err != nil || len(page) == 0 {
			return n, err
		}
		for _, e := range page {
			if err := backendkit.CheckContext("relay", ctx); err != nil {
				return n, err
			}
			if m == relayMarkFirst {
				if err := src.mark(e.Seq); err != nil {
					return n, err
				}
			}
			if m == relayFreshIDs {
				e.ID = newEntryID()
			}
			if err := deliver(ctx, e); err != nil {
				return n, fmt.Errorf("memfence relay: deliver entry %s: %w", e.ID, err)
			}
			if m != relayMarkFirst {
				if err := src.mark(e.Seq); err != nil {
					return n, err
				}
			}
			n++
			after = e.Seq
		}
	}
}

// memOutbox is conformance.Outbox on the in-memory state.
type memOutbox struct {
	*memUser
	store  *memOutboxStore
	fenced bool
	// outside is the broken outbox of the suite's own tests: the report
	// row under the fence, the entry added whatever the fence decided.
	outside bool
	mutant  relayMutant
}

var _ conformance.Outbox = (*memOutbox)(nil)

func (o *memOutbox) Write(ctx context.Context, w leasecore.Write) (leasecore.Result, error) {
	if err := backendkit.CheckWrite(ctx, w); err != nil {
		return leasecore.Result{}, err
	}
	o.lock()
	defer o.mu.Unlock()
	if !o.fenced {
		// The negative control: no check, the floor untouched.
		now := time.Now()
		o.memUserData.store(w, now)
		o.store.add(w, now)
		return leasecore.Result{Accepted: true, Floor: o.floors[w.Scope]}, nil
	}
	res, err := o.check(backendkit.ClaimOf(w), w.Part, func(now time.Time) {
		o.memUserData.store(w, now)
		o.store.add(w, now)
	})
	if err == nil && o.outside && !res.Accepted {
		o.store.add(w, time.Now()) // outside the fenced operation: in whatever the fence said
	}
	return res, err
}

func (o *memOutbox) Pending(ctx context.Context, scope string) ([]leasecore.OutboxEntry, error) {
	if err := checkScope(ctx, scope); err != nil {
		return nil, err
	}
	var out []leasecore.OutboxEntry
	for _, e := range o.store.pending(0, 1<<30) {
		if e.Scope == scope {
			out = append(out, e)
		}
	}
	return out, nil
}

func (o *memOutbox) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	return memRelay(ctx, storeSource{o.store}, deliver, o.mutant)
}

// FencedOutbox implements conformance.OutboxResources.
func (h *memHarness) FencedOutbox(context.Context) (conformance.Outbox, error) {
	return &memOutbox{memUser: &memUser{memUserData: h.user}, store: h.outbox, fenced: true,
		outside: h.outboxOutsideFence, mutant: h.relayMutant}, nil
}

// UnfencedOutbox implements conformance.OutboxResources.
func (h *memHarness) UnfencedOutbox(context.Context) (conformance.Outbox, error) {
	return &memOutbox{memUser: &memUser{memUserData: h.user}, store: h.outbox, mutant: h.relayMutant}, nil
}

// The relay process's side: the store over RPC.

type (
	OutboxPendingArgs struct {
		After int64
		Limit int
	}
	OutboxPage struct{ Entries []leasecore.OutboxEntry }
)

func (s *memService) OutboxPending(a OutboxPendingArgs, r *OutboxPage) error {
	r.Entries = s.h.outbox.pending(a.After, a.Limit)
	return nil
}

func (s *memService) OutboxMark(seq int64, _ *struct{}) error {
	s.h.outbox.mark(seq)
	return nil
}

type rpcSource struct{ cl *rpc.Client }

func (r rpcSource) pending(after int64, limit int) ([]leasecore.OutboxEntry, error) {
	var p OutboxPage
	if err := r.cl.Call("Mem.OutboxPending", OutboxPendingArgs{after, limit}, &p); err != nil {
		return nil, fmt.Errorf("%w: %v", leasecore.ErrUnavailable, err)
	}
	return p.Entries, nil
}

func (r rpcSource) mark(seq int64) error {
	if err := r.cl.Call("Mem.OutboxMark", seq, &struct{}{}); err != nil {
		return fmt.Errorf("%w: %v", leasecore.ErrUnavailable, err)
	}
	return nil
}

// rpcOutbox is a relay process's resource of KindOutbox: writes go to the
// fenced outbox in the test process, the relay loop runs here.
type rpcOutbox struct {
	rpcResource
	mutant relayMutant
}

func (r rpcOutbox) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	return memRelay(ctx, rpcSource{r.cl}, deliver, r.mutant)
}
