package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

func (f *fixture) newOutbox(t *testing.T) *fenceetcd.Outbox {
	t.Helper()
	o, err := fenceetcd.NewOutbox(f.cli, fenceetcd.WithPrefix(f.prefix))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// publish commits the caller's report key and one outbox entry per payload
// under the fence, in one Txn.
func publish(t *testing.T, fe *fenceetcd.Fence, o *fenceetcd.Outbox, f *fixture, c leasecore.Claim, payloads ...string) (leasecore.Result, *clientv3.TxnResponse) {
	t.Helper()
	txn := f.putOwn("report/" + c.Scope + "=" + c.Writer)
	for _, p := range payloads {
		op, err := o.Add(c, "report-published", []byte(p))
		if err != nil {
			t.Fatal(err)
		}
		txn.Then = append(txn.Then, op)
	}
	return commit(t, fe, c, txn)
}

func pendingOf(t *testing.T, o *fenceetcd.Outbox) []string {
	t.Helper()
	es, err := o.Pending(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s/%s/%d/%s", e.Scope, e.Writer, e.Token, e.Payload))
	}
	return out
}

func wantList(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestOutboxInFencedTxn: entries are put in the Txn Commit runs and are
// applied with it; a stale holder's Commit is rejected whole, so its entry
// never exists; an entry's op put in an unguarded Txn writes nothing while
// the floor is not its token.
func TestOutboxInFencedTxn(t *testing.T) {
	f := newFixture(t)
	fe, o := f.newFence(t), f.newOutbox(t)
	ctx := context.Background()
	a := leasecore.Claim{Scope: "report", Writer: "holder-a", Token: 1}
	b := leasecore.Claim{Scope: "report", Writer: "holder-b", Token: 2}
	if r, err := fe.Advance(ctx, b); err != nil || !r.Accepted {
		t.Fatalf("B's advance: %+v %v", r, err)
	}
	res, _, err := fe.Commit(ctx, a, f.putOwn("report/report=holder-a"))
	if err != nil || res.Accepted {
		t.Fatalf("A's commit without an entry: %+v %v", res, err)
	}
	txn := f.putOwn("report/report=holder-a")
	op, err := o.Add(a, "report-published", []byte("report(A-stale)"))
	if err != nil {
		t.Fatal(err)
	}
	txn.Then = append(txn.Then, op)
	if res, _, err := fe.Commit(ctx, a, txn); err != nil || res.Accepted || res.Floor < b.Token {
		t.Fatalf("A's stale publication: %+v %v", res, err)
	}
	wantList(t, "pending after A's rejected commit", pendingOf(t, o))
	if own := f.ownKeys(t); own != "" {
		t.Fatalf("A's keys: %q", own)
	}

	res, resp := publish(t, fe, o, f, b, "report(B) 1", "report(B) 2")
	if !res.Accepted || !resp.Succeeded {
		t.Fatalf("B's publication: %+v", res)
	}
	wantList(t, "pending after B's commit", pendingOf(t, o), "report/holder-b/2/report(B) 1", "report/holder-b/2/report(B) 2")
	es, err := o.Pending(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if !uuidV4.MatchString(e.ID) || e.Seq != resp.Header.Revision || e.Topic != "report-published" || e.At.IsZero() {
			t.Fatalf("entry %+v (commit revision %d)", e, resp.Header.Revision)
		}
	}
	if es[0].ID == es[1].ID {
		t.Fatalf("two entries share ID %s", es[0].ID)
	}

	// The op guards itself: in a Txn without the fence's guard, a stale
	// claim's entry is not written.
	stale, err := o.Add(a, "t", []byte("unguarded"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := f.cli.Txn(ctx).Then(stale).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if tr.Responses[0].GetResponseTxn().Succeeded {
		t.Fatal("an unguarded Txn recorded a stale claim's entry")
	}
	wantList(t, "pending after the unguarded stale op", pendingOf(t, o), "report/holder-b/2/report(B) 1", "report/holder-b/2/report(B) 2")
}

// TestOutboxRelay: entries are delivered in revision order across scopes
// and deleted only after deliver returned nil (still pending while deliver
// runs); an error stops the relay and keeps that entry and the later ones;
// a context cancelled during a delivery stops it, and the entry it could
// not delete any more (ctx bounds the delete too) stays pending and is
// delivered again by the next relay, with the same ID.
func TestOutboxRelay(t *testing.T) {
	f := newFixture(t)
	fe, o := f.newFence(t), f.newOutbox(t)
	ctx := context.Background()
	for i, scope := range []string{"s1", "s2", "s1", "s2", "s1"} {
		publish(t, fe, o, f, leasecore.Claim{Scope: scope, Writer: "w", Token: 7}, fmt.Sprintf("p%d", i))
	}
	var got []string
	fail := errors.New("downstream unavailable")
	n, err := o.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
		if string(e.Payload) == "p3" {
			return fail
		}
		still := false
		for _, p := range pendingOf(t, o) {
			still = still || strings.HasSuffix(p, "/"+string(e.Payload))
		}
		if !still {
			t.Errorf("entry %s is no longer pending while deliver runs", e.Payload)
		}
		got = append(got, string(e.Payload))
		return nil
	})
	if n != 3 || !errors.Is(err, fail) {
		t.Fatalf("relay: n=%d err=%v", n, err)
	}
	wantList(t, "delivered", got, "p0", "p1", "p2")
	wantList(t, "pending after the failed delivery", pendingOf(t, o), "s2/w/7/p3", "s1/w/7/p4")
	cctx, cancel := context.WithCancel(ctx)
	var cancelledID string
	n, err = o.Relay(cctx, func(_ context.Context, e leasecore.OutboxEntry) error { cancelledID = e.ID; cancel(); return nil })
	if n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled relay: n=%d err=%v", n, err)
	}
	wantList(t, "pending after the cancelled relay", pendingOf(t, o), "s2/w/7/p3", "s1/w/7/p4")
	var again []string
	if n, err := o.Relay(ctx, func(_ context.Context, e leasecore.OutboxEntry) error {
		again = append(again, e.ID)
		return nil
	}); n != 2 || err != nil {
		t.Fatalf("last relay: %d %v", n, err)
	}
	if len(again) != 2 || again[0] != cancelledID {
		t.Fatalf("last relay delivered %v, want %s (the entry whose delete the cancelled relay skipped) first", again, cancelledID)
	}
	wantList(t, "pending at the end", pendingOf(t, o))
}

// TestOutboxConcurrentRelays: three relays at once while writers of two
// scopes commit entries under rising tokens: a downstream that deduplicates
// by ID accepts each entry exactly once and rejects none as stale.
func TestOutboxConcurrentRelays(t *testing.T) {
	f := newFixture(t)
	fe, o := f.newFence(t), f.newOutbox(t)
	ctx := context.Background()
	const perToken = 8
	var (
		idsMu sync.Mutex
		ids   = map[string]bool{}
	)
	var writers sync.WaitGroup
	for _, scope := range []string{"s1", "s2"} {
		writers.Go(func() {
			for token := leasecore.Token(1); token <= 3; token++ {
				c := leasecore.Claim{Scope: scope, Writer: fmt.Sprint("w", token), Token: token}
				for i := range perToken {
					op, err := o.Add(c, "t", fmt.Appendf(nil, "%s-%d-%d", scope, token, i))
					if err != nil {
						t.Error(err)
						return
					}
					if res, _, err := fe.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{op}}); err != nil || !res.Accepted {
						t.Errorf("commit: %+v %v", res, err)
						return
					}
				}
			}
		})
	}
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		highest = map[string]leasecore.Token{}
		stale   []string
	)
	deliver := func(_ context.Context, e leasecore.OutboxEntry) error {
		mu.Lock()
		defer mu.Unlock()
		idsMu.Lock()
		ids[e.ID] = true
		idsMu.Unlock()
		switch {
		case seen[e.ID] > 0:
		case e.Token < highest[e.Scope]:
			stale = append(stale, string(e.Payload))
		default:
			seen[e.ID]++
			highest[e.Scope] = e.Token
		}
		return nil
	}
	done := make(chan struct{})
	var relays sync.WaitGroup
	for range 3 {
		relays.Go(func() {
			for {
				if _, err := o.Relay(ctx, deliver); err != nil {
					t.Error(err)
					return
				}
				select {
				case <-done:
					if _, err := o.Relay(ctx, deliver); err != nil {
						t.Error(err)
					}
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
	}
	writers.Wait()
	close(done)
	relays.Wait()
	if len(stale) > 0 {
		t.Errorf("rejected as stale: %v", stale)
	}
	if len(ids) != 2*3*perToken {
		t.Fatalf("%d distinct entries delivered, want %d", len(ids), 2*3*perToken)
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("entry %s accepted %d times", id, seen[id])
		}
	}
	wantList(t, "pending at the end", pendingOf(t, o))
}

// TestOutboxBadInput: the op builder and the relay name the bad field and
// wrap leasecore.ErrInvalidArgument; nothing is written.
func TestOutboxBadInput(t *testing.T) {
	f := newFixture(t)
	o := f.newOutbox(t)
	ctx := context.Background()
	before := f.snapshot(t)
	c := leasecore.Claim{Scope: "s", Writer: "w", Token: 1}
	wantField := func(what, field string, err error) {
		t.Helper()
		var ae *leasecore.ArgError
		if !errors.As(err, &ae) || ae.Field != field || !errors.Is(err, leasecore.ErrInvalidArgument) {
			t.Errorf("%s: %v, want an ArgError for field %q", what, err, field)
		}
	}
	for _, tc := range []struct {
		what, field, topic string
		c                  leasecore.Claim
		payload            []byte
	}{
		{"empty topic", "topic", "", c, nil},
		{"payload too large", "payload", "t", c, make([]byte, backendkit.MaxPayloadLen+1)},
		{"no scope", "scope", "t", leasecore.Claim{Writer: "w", Token: 1}, nil},
		{"token 0", "token", "t", leasecore.Claim{Scope: "s", Writer: "w"}, nil},
	} {
		_, err := o.Add(tc.c, tc.topic, tc.payload)
		wantField(tc.what, tc.field, err)
	}
	_, err := o.Relay(ctx, nil)
	wantField("nil deliver", "deliver", err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := o.Relay(cancelled, func(context.Context, leasecore.OutboxEntry) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled relay: %v", err)
	}
	for _, limit := range []int{0, backendkit.MaxAttemptsRead + 1} {
		_, err := o.Pending(ctx, limit)
		wantField(fmt.Sprint("limit ", limit), "limit", err)
	}
	_, err = fenceetcd.NewOutbox(nil)
	wantField("nil client", "client", err)
	_, err = fenceetcd.NewOutbox(f.cli, fenceetcd.WithPrefix("no-slash"))
	wantField("bad prefix", "prefix", err)
	if after := f.snapshot(t); after != before {
		t.Fatalf("bad input changed the store:\n%s\n->\n%s", before, after)
	}
}

// TestOutboxLargestPayload: an entry of backendkit.MaxPayloadLen bytes, any
// bytes, fits in one Commit next to its data and comes back unchanged.
func TestOutboxLargestPayload(t *testing.T) {
	f := newFixture(t)
	fe, o := f.newFence(t), f.newOutbox(t)
	payload := make([]byte, backendkit.MaxPayloadLen)
	for i := range payload {
		payload[i] = byte(i % 251) // NUL, newlines, everything
	}
	c := leasecore.Claim{Scope: "big", Writer: "w", Token: 1}
	op, err := o.Add(c, "t", payload)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, fe, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(f.prefix+"/own/x", "data"), op}})
	es, err := o.Pending(context.Background(), 1)
	if err != nil || len(es) != 1 || string(es[0].Payload) != string(payload) {
		t.Fatalf("pending: %d entries, %v", len(es), err)
	}
}
