package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// Moving a scope to another etcd cluster: Fence.Seal at the old cluster
// with the reads of the scope's keys in its transaction, Fence.Install at
// the new one with the puts in its transaction (leasecore.ScopeSeal).

// destCluster is the label the old cluster records for the new one.
const destCluster = "etcd-b"

// moveSide is one cluster of a move: a prefix on it, a client and a fence.
type moveSide struct {
	*fixture
	fence *fenceetcd.Fence
}

// moveSides returns the old side on the shared server and the new side on
// a cluster of its own, started for the test (stopped when it ends).
func moveSides(t *testing.T, srv *etcdtemp.Server) (old, to moveSide) {
	t.Helper()
	o := newFixture(t)
	n := &fixture{cli: etcdtest.Dial(t, srv.Endpoints()), prefix: etcdtest.Prefix()}
	var err error
	if n.res, err = fenceetcd.NewResource(n.cli, fenceetcd.WithPrefix(n.prefix), logAll); err != nil {
		t.Fatal(err)
	}
	return moveSide{o, o.newFence(t)}, moveSide{n, n.newFence(t)}
}

// moveOwn moves the scope's own keys (the fixture's "/own/" keys) from old
// to to: Seal with a Get of the keys, Install with their puts. withFloor
// false is the naive move: a Get and plain puts, no seal, no install.
func moveOwn(t *testing.T, old, to moveSide, scope string, withFloor bool) (leasecore.ScopeSeal, leasecore.Result) {
	t.Helper()
	ctx := context.Background()
	read := clientv3.OpGet(old.prefix+"/own/", clientv3.WithPrefix())
	var (
		seal leasecore.ScopeSeal
		kvs  []string
	)
	if withFloor {
		s, resp, err := old.fence.Seal(ctx, scope, destCluster, read)
		if err != nil {
			t.Fatalf("seal %s: %v", scope, err)
		}
		if len(resp.Responses) != 1 {
			t.Fatalf("seal %s: %d responses, want the read's", scope, len(resp.Responses))
		}
		seal = s
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			kvs = append(kvs, strings.TrimPrefix(string(kv.Key), old.prefix+"/own/")+"="+string(kv.Value))
		}
	} else if own := old.ownKeys(t); own != "" {
		kvs = strings.Fields(own)
	}
	puts := to.putOwn(kvs...).Then
	if !withFloor {
		if _, err := to.cli.Txn(ctx).Then(puts...).Commit(); err != nil {
			t.Fatal(err)
		}
		return seal, leasecore.Result{Accepted: true}
	}
	res, resp, err := to.fence.Install(ctx, seal, puts...)
	if err != nil {
		t.Fatalf("install %+v: %v", seal, err)
	}
	if res.Accepted != (resp != nil) || (resp != nil && len(resp.Responses) != len(puts)) {
		t.Fatalf("install %+v: %+v with response %v: want the puts' responses exactly when accepted", seal, res, resp)
	}
	return seal, res
}

// wantScopeMoved checks a rejection by a sealed scope: the sealed floor, and
// a *leasecore.ScopeMovedError naming the destination and the floor at the
// seal.
func wantScopeMoved(t *testing.T, what string, res leasecore.Result, err error, token, sealFloor leasecore.Token) {
	t.Helper()
	if res.Accepted || res.Floor != leasecore.SealedFloor {
		t.Errorf("%s: %+v, want rejected by the sealed floor %d", what, res, leasecore.SealedFloor)
	}
	var me *leasecore.ScopeMovedError
	if !errors.Is(err, leasecore.ErrScopeMoved) || !errors.As(err, &me) {
		t.Errorf("%s: err = %v, want a *ScopeMovedError", what, err)
		return
	}
	if me.To != destCluster || me.Floor != sealFloor || me.Token != token {
		t.Errorf("%s: %+v, want to %q, floor %d at the seal, token %d", what, me, destCluster, sealFloor, token)
	}
	for _, other := range []error{leasecore.ErrUnavailable, leasecore.ErrTokenSpace, leasecore.ErrInvalidArgument} {
		if errors.Is(err, other) {
			t.Errorf("%s: %v wraps %v too", what, err, other)
		}
	}
}

// TestMoveScope runs the moves between the shared server and a second
// cluster, each subtest under prefixes of its own.
func TestMoveScope(t *testing.T) {
	srv := etcdtemp.StartTB(t)
	t.Run("carries the floor", func(t *testing.T) { moveCarriesFloor(t, srv) })
	t.Run("idempotent", func(t *testing.T) { moveIdempotent(t, srv) })
	t.Run("token space", func(t *testing.T) { moveTokenSpace(t, srv) })
	t.Run("never fenced", func(t *testing.T) { moveNeverFenced(t, srv) })
	t.Run("concurrent advances", func(t *testing.T) { moveConcurrentAdvances(t, srv) })
	t.Run("pending record", func(t *testing.T) { movePendingRecord(t, srv) })
	t.Run("bad input", func(t *testing.T) { moveBadInput(t, srv) })
}

// moveCarriesFloor: B's keys move to the second cluster with B's floor. A,
// whose token was taken over before the move, is rejected there as at the
// old cluster; B commits on there; the old cluster rejects everybody, in
// every form, saying where the scope went, and its keys stay as they were.
func moveCarriesFloor(t *testing.T, srv *etcdtemp.Server) {
	old, to := moveSides(t, srv)
	ctx := context.Background()
	a := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 5}
	b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9}
	res, _ := commit(t, old.fence, a, old.putOwn("run=A", "line/1=A"))
	backendtest.WantResult(t, "A", res, true, 5)
	res, _ = commit(t, old.fence, b, old.putOwn("run=B", "line/1=B"))
	backendtest.WantResult(t, "B takes over", res, true, 9)

	seal, inst := moveOwn(t, old, to, "nightly", true)
	if want := (leasecore.ScopeSeal{Scope: "nightly", To: destCluster, Floor: 9}); seal != want {
		t.Fatalf("seal = %+v, want %+v", seal, want)
	}
	backendtest.WantResult(t, "install", inst, true, 9)
	if got, want := to.ownKeys(t), "line/1=B run=B"; got != want {
		t.Fatalf("keys at the new cluster = %q, want %q (B's, copied)", got, want)
	}
	for _, side := range []struct {
		what string
		s    moveSide
		want leasecore.Token
	}{{"old", old, leasecore.SealedFloor}, {"new", to, 9}} {
		if got, err := side.s.fence.Floor(ctx, "nightly"); err != nil || got != side.want {
			t.Errorf("floor at the %s cluster = %d, %v; want %d", side.what, got, err, side.want)
		}
	}

	// A, paused across the move, commits at the new cluster.
	res, _ = commit(t, to.fence, a, to.putOwn("run=A2"))
	backendtest.WantResult(t, "A at the new cluster", res, false, 9)
	res, _ = commit(t, to.fence, b, to.putOwn("run=B2"))
	backendtest.WantResult(t, "B at the new cluster", res, true, 9)
	if got, want := to.ownKeys(t), "line/1=B run=B2"; got != want {
		t.Fatalf("keys at the new cluster = %q, want %q", got, want)
	}

	// The old cluster: every token rejected, in every form.
	before := old.ownKeys(t)
	for _, c := range []leasecore.Claim{a, b, {Scope: "nightly", Writer: "holder-c", Token: 12}, {Scope: "nightly", Writer: "holder-z", Token: backendkit.MaxToken}} {
		res, resp, err := old.fence.Commit(ctx, c, old.putOwn("run=late"))
		wantScopeMoved(t, fmt.Sprintf("token %d committing at the old cluster", c.Token), res, err, c.Token, 9)
		if resp != nil {
			t.Errorf("token %d at the old cluster: a response for a rejection", c.Token)
		}
		res, err = old.fence.Advance(ctx, c)
		wantScopeMoved(t, fmt.Sprintf("token %d advancing at the old cluster", c.Token), res, err, c.Token, 9)
		guarded, err := old.cli.Txn(ctx).If(old.fence.Guard(c)).Then(old.putOwn("run=guarded").Then...).Commit()
		if err != nil || guarded.Succeeded {
			t.Errorf("token %d: a Txn under Guard at the old cluster: %v, %v; want the guard to fail", c.Token, guarded, err)
		}
	}
	res, err := old.res.Write(ctx, leasecore.Write{Scope: "nightly", Part: "summary", Content: "x", Writer: "holder-b", Token: 9})
	wantScopeMoved(t, "B's part at the old cluster", res, err, 9, 9)
	if got := old.ownKeys(t); got != before {
		t.Errorf("keys at the old cluster = %q, want %q: unchanged since the seal", got, before)
	}
}

// moveIdempotent: the seal and the install run again, as a move rerun
// after a crash does, change nothing; a seal for another destination is
// refused with the first seal; an install is rejected, and applies nothing,
// where a newer token has been accepted since, and keeps the larger floor.
func moveIdempotent(t *testing.T, srv *etcdtemp.Server) {
	old, to := moveSides(t, srv)
	ctx := context.Background()
	b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9}
	commit(t, old.fence, b, old.putOwn("run=B"))
	first, inst := moveOwn(t, old, to, "nightly", true)
	backendtest.WantResult(t, "install", inst, true, 9)
	oldKeys := old.snapshot(t)
	again, inst := moveOwn(t, old, to, "nightly", true)
	if again != first {
		t.Errorf("second seal = %+v, want the first one's %+v", again, first)
	}
	backendtest.WantResult(t, "install again", inst, true, 9)
	if got := old.snapshot(t); got != oldKeys {
		t.Errorf("the second seal wrote at the old cluster:\n%s\nwant\n%s", got, oldKeys)
	}
	other, resp, err := old.fence.Seal(ctx, "nightly", "etcd-c")
	var me *leasecore.ScopeMovedError
	if other != first || resp != nil || !errors.As(err, &me) || me.To != destCluster || me.Floor != 9 || me.Token != 0 {
		t.Errorf("seal for etcd-c: %+v, %v, %v; want the seal for %s and a *ScopeMovedError", other, resp, err, destCluster)
	}

	c := leasecore.Claim{Scope: "nightly", Writer: "holder-c", Token: 12}
	res, _ := commit(t, to.fence, c, to.putOwn("run=C"))
	backendtest.WantResult(t, "C at the new cluster", res, true, 12)
	_, inst = moveOwn(t, old, to, "nightly", true)
	backendtest.WantResult(t, "install after C wrote", inst, false, 12)
	if got := to.ownKeys(t); got != "run=C" {
		t.Errorf("keys after the rejected install = %q, want C's", got)
	}
	if got, err := to.fence.Floor(ctx, "nightly"); err != nil || got != 12 {
		t.Errorf("floor after the rejected install = %d, %v; want 12, the larger", got, err)
	}
}

// moveTokenSpace: the seal carries the floor's token space, and the install
// stores it with the floor, so that at the new cluster a token of another
// lease service is still told apart from a stale one.
func moveTokenSpace(t *testing.T, srv *etcdtemp.Server) {
	old, to := moveSides(t, srv)
	ctx := context.Background()
	b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9, Space: "etcd:one"}
	commit(t, old.fence, b, old.putOwn("run=B"))
	seal, inst := moveOwn(t, old, to, "nightly", true)
	if seal.Space != b.Space || seal.Floor != 9 {
		t.Fatalf("seal = %+v, want floor 9 of space %q", seal, b.Space)
	}
	backendtest.WantResult(t, "install", inst, true, 9)
	stranger := leasecore.Claim{Scope: "nightly", Writer: "holder-x", Token: 3, Space: "postgres:two"}
	res, err := to.fence.Advance(ctx, stranger)
	wantTokenSpaceError(t, "a token of another service at the new cluster", res, err, stranger, 9, b.Space)
	res, err = old.fence.Advance(ctx, stranger)
	wantScopeMoved(t, "a token of another service at the old cluster", res, err, 3, 9)
}

// moveNeverFenced: a scope without a floor is sealed with floor 0;
// installing it raises nothing and is refused where the scope has a floor;
// a scope sealed at a cluster does not come back to it.
func moveNeverFenced(t *testing.T, srv *etcdtemp.Server) {
	old, to := moveSides(t, srv)
	ctx := context.Background()
	seal, inst := moveOwn(t, old, to, "fresh", true)
	if want := (leasecore.ScopeSeal{Scope: "fresh", To: destCluster}); seal != want {
		t.Fatalf("seal = %+v, want %+v", seal, want)
	}
	backendtest.WantResult(t, "install of floor 0", inst, true, 0)
	if _, _, ok := to.get(t, to.prefix+"/floor/fresh"); ok {
		t.Errorf("the install of floor 0 wrote a floor")
	}
	a := leasecore.Claim{Scope: "fresh", Writer: "holder-a", Token: 5}
	res, err := old.fence.Advance(ctx, a)
	wantScopeMoved(t, "A at the old cluster", res, err, 5, 0)
	res, _ = commit(t, to.fence, a, to.putOwn("run=A"))
	backendtest.WantResult(t, "A at the new cluster", res, true, 5)
	_, inst = moveOwn(t, old, to, "fresh", true)
	backendtest.WantResult(t, "install of floor 0 where A wrote", inst, false, 5)

	res, resp, err := old.fence.Install(ctx, leasecore.ScopeSeal{Scope: "fresh", To: "etcd-a", Floor: 5}, old.putOwn("run=back").Then...)
	wantScopeMoved(t, "install back at the cluster the scope left", res, err, 5, 0)
	if resp != nil || old.ownKeys(t) != "" {
		t.Errorf("install back: response %v, keys %q: want nothing applied", resp, old.ownKeys(t))
	}
}

// moveConcurrentAdvances: holders advance the floor with growing tokens,
// without pause and without bound, while the scope is sealed, and two more
// re-advance one token over and over (each a put of the floor). The seal's
// compare is on its own record, never on the floor, so no interleaving can
// make it fail: it returns in its two requests. The seal carries the floor
// as it was when the seal applied: every advance accepted before it is at
// most the seal's floor, the largest of them is the seal's floor, and
// every advance after it is rejected as moved.
func moveConcurrentAdvances(t *testing.T, srv *etcdtemp.Server) {
	old, _ := moveSides(t, srv)
	ctx := context.Background()
	if res, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "busy", Writer: "w", Token: 1}); err != nil || !res.Accepted {
		t.Fatalf("first advance: %+v, %v", res, err)
	}
	var (
		mu       sync.Mutex
		accepted []leasecore.Token
		wg       sync.WaitGroup
		next     = leasecore.Token(1)
		rounds   atomic.Int64
	)
	advance := func(w string, tok leasecore.Token) bool {
		res, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "busy", Writer: w, Token: tok})
		rounds.Add(1)
		switch {
		case res.Accepted:
			mu.Lock()
			accepted = append(accepted, tok)
			mu.Unlock()
		case res.Floor == leasecore.SealedFloor:
			if !errors.Is(err, leasecore.ErrScopeMoved) {
				t.Errorf("advance %d after the seal: %v", tok, err)
			}
			return false
		case err != nil:
			t.Errorf("advance %d: %v", tok, err)
			return false
		}
		return true
	}
	for w := range 4 {
		wg.Go(func() {
			for {
				mu.Lock()
				next++
				tok := next
				mu.Unlock()
				if !advance(fmt.Sprintf("w%d", w), tok) {
					return
				}
			}
		})
	}
	for w := range 2 {
		wg.Go(func() {
			for advance(fmt.Sprintf("same%d", w), 1) {
			}
		})
	}
	for rounds.Load() < 50 { // the advancers are under way
		time.Sleep(time.Millisecond)
	}
	seal, _, err := old.fence.Seal(ctx, "busy", destCluster)
	wg.Wait() // every advancer stops at the sealed floor
	if err != nil {
		t.Fatal(err)
	}
	largest := leasecore.Token(1)
	for _, tok := range accepted {
		largest = max(largest, tok)
	}
	if seal.Floor != largest {
		t.Errorf("seal floor %d, want %d, the largest of the %d advances accepted", seal.Floor, largest, len(accepted))
	}
	t.Logf("%d advances accepted, %d tried; the seal's floor %d", len(accepted), rounds.Load(), seal.Floor)
}

// movePendingRecord: a sealer that stopped between its two requests left
// the scope sealed and its record pending (no floor: the seal's put
// replaced it unread). Seal again completes the record from the floor's
// value just before the seal's revision, and returns that floor; so does
// a later rejection's ScopeMovedError.
func movePendingRecord(t *testing.T, srv *etcdtemp.Server) {
	old, _ := moveSides(t, srv)
	ctx := context.Background()
	if res, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "halfway", Writer: "w", Token: 7}); err != nil || !res.Accepted {
		t.Fatalf("advance: %+v, %v", res, err)
	}
	layout, err := etcdkv.NewLayout("test", etcdkv.Options{Prefix: old.prefix})
	if err != nil {
		t.Fatal(err)
	}
	pending := etcdkv.SealRecord{To: destCluster, Pending: true, At: time.Now().UTC()}
	// The seal's first request, as Seal sends it, and no second.
	if _, err = old.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(layout.Moved("halfway")), "=", 0)).
		Then(clientv3.OpPut(layout.Floor("halfway"), etcdkv.EncodeToken(leasecore.SealedFloor)),
			clientv3.OpPut(layout.Moved("halfway"), pending.Encode())).
		Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "halfway", Writer: "w", Token: 8}); !errors.Is(err, leasecore.ErrScopeMoved) {
		t.Fatalf("advance of a sealed scope: %v, want ErrScopeMoved", err)
	}
	seal, _, err := old.fence.Seal(ctx, "halfway", destCluster)
	if err != nil {
		t.Fatal(err)
	}
	if want := (leasecore.ScopeSeal{Scope: "halfway", To: destCluster, Floor: 7}); seal != want {
		t.Errorf("seal %+v, want %+v", seal, want)
	}
	resp, err := old.cli.Get(ctx, layout.Moved("halfway"))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := etcdkv.DecodeSeal(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
	if err != nil || rec.Pending || rec.Floor != 7 {
		t.Errorf("record after the second Seal: %+v, %v; want complete with floor 7", rec, err)
	}
	var moved *leasecore.ScopeMovedError
	if _, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "halfway", Writer: "w", Token: 9}); !errors.As(err, &moved) || moved.Floor != 7 {
		t.Errorf("advance after the record was completed: %v, want a ScopeMovedError with floor 7", err)
	}
}

// moveBadInput: bad input to Seal and Install is an *ArgError naming the
// field, wrapping leasecore.ErrInvalidArgument, and nothing is written at
// either cluster.
func moveBadInput(t *testing.T, srv *etcdtemp.Server) {
	old, to := moveSides(t, srv)
	ctx := context.Background()
	commit(t, old.fence, leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9}, old.putOwn("run=B"))
	before, beforeNew := old.snapshot(t), to.snapshot(t)

	for _, tc := range []struct {
		scope, to, field string
		reads            []clientv3.Op
	}{
		{"", destCluster, "scope", nil}, {"a\x00b", destCluster, "scope", nil},
		{strings.Repeat("s", backendkit.MaxNameLen+1), destCluster, "scope", nil},
		{"nightly", "", "to", nil}, {"nightly", " etcd-b", "to", nil},
		{"nightly", destCluster, "reads[0]", []clientv3.Op{clientv3.OpPut(old.prefix+"/own/x", "y")}},
		{"nightly", destCluster, "reads[1]", []clientv3.Op{clientv3.OpGet(old.prefix + "/own/run"), clientv3.OpDelete(old.prefix+"/own/", clientv3.WithPrefix())}},
		{"nightly", destCluster, "reads[0]", []clientv3.Op{clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpGet("x")}, nil)}},
	} {
		s, resp, err := old.fence.Seal(ctx, tc.scope, tc.to, tc.reads...)
		wantArgError(t, fmt.Sprintf("seal %q for %q", tc.scope, tc.to), err, tc.field)
		if s != (leasecore.ScopeSeal{}) || resp != nil {
			t.Errorf("seal %q for %q returned %+v, %v with its error", tc.scope, tc.to, s, resp)
		}
	}
	good := leasecore.ScopeSeal{Scope: "nightly", To: destCluster, Floor: 9}
	for _, tc := range []struct {
		what   string
		edit   func(*leasecore.ScopeSeal)
		field  string
		writes []clientv3.Op
	}{
		{"no scope", func(s *leasecore.ScopeSeal) { s.Scope = "" }, "scope", nil},
		{"no destination", func(s *leasecore.ScopeSeal) { s.To = "" }, "to", nil},
		{"the sealed floor", func(s *leasecore.ScopeSeal) { s.Floor = leasecore.SealedFloor }, "floor", nil},
		{"a space without a floor", func(s *leasecore.ScopeSeal) { s.Floor, s.Space = 0, "etcd:x" }, "space", nil},
		{"a write of the floor", func(*leasecore.ScopeSeal) {}, "writes[0]",
			[]clientv3.Op{clientv3.OpPut(to.prefix+"/floor/nightly", "00000000000000000001")}},
		{"a write of the seal record", func(*leasecore.ScopeSeal) {}, "writes[1]",
			[]clientv3.Op{clientv3.OpPut(to.prefix+"/own/run", "B"), clientv3.OpDelete(to.prefix+"/moved/", clientv3.WithPrefix())}},
	} {
		s := good
		tc.edit(&s)
		res, resp, err := to.fence.Install(ctx, s, tc.writes...)
		wantArgError(t, "install with "+tc.what, err, tc.field)
		if res != (leasecore.Result{}) || resp != nil {
			t.Errorf("install with %s returned %+v, %v with its error", tc.what, res, resp)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := old.fence.Seal(done, "nightly", destCluster); !errors.Is(err, context.Canceled) {
		t.Errorf("seal with a cancelled context: %v", err)
	}
	_, err := old.fence.Advance(ctx, leasecore.Claim{Scope: "nightly", Writer: "w", Token: leasecore.SealedFloor})
	wantArgError(t, "advance to the sealed floor", err, "token")
	// A caller's own transaction may not write the seal record either.
	_, _, err = old.fence.Commit(ctx, leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9},
		fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(old.prefix+"/moved/nightly", "{}")}})
	wantArgError(t, "commit writing the seal record", err, "then[0]")

	if got := old.snapshot(t); got != before {
		t.Errorf("the old cluster changed:\n%s\nwant\n%s", got, before)
	}
	if got := to.snapshot(t); got != beforeNew {
		t.Errorf("the new cluster changed:\n%s\nwant\n%s", got, beforeNew)
	}
}
