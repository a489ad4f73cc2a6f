package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// newFence returns a fence on the fixture's client and prefix.
func (f *fixture) newFence(t *testing.T, opts ...fenceetcd.Option) *fenceetcd.Fence {
	t.Helper()
	fe, err := fenceetcd.NewFence(f.cli, append([]fenceetcd.Option{fenceetcd.WithPrefix(f.prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return fe
}

// ownKeys returns the caller's own keys under the fixture's prefix ("/own/"),
// key=value, in key order.
func (f *fixture) ownKeys(t *testing.T) string {
	t.Helper()
	resp, err := f.cli.Get(context.Background(), f.prefix+"/own/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, strings.TrimPrefix(string(kv.Key), f.prefix+"/own/")+"="+string(kv.Value))
	}
	return strings.Join(out, " ")
}

// putOwn is the caller's transaction that puts its own keys, each
// "name=value".
func (f *fixture) putOwn(kvs ...string) fenceetcd.Txn {
	var t fenceetcd.Txn
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		t.Then = append(t.Then, clientv3.OpPut(f.prefix+"/own/"+k, v))
	}
	return t
}

func commit(t *testing.T, fe *fenceetcd.Fence, c leasecore.Claim, txn fenceetcd.Txn) (leasecore.Result, *clientv3.TxnResponse) {
	t.Helper()
	res, resp, err := fe.Commit(context.Background(), c, txn)
	if err != nil {
		t.Fatalf("commit %+v: %v", c, err)
	}
	if res.Accepted != (resp != nil) {
		t.Fatalf("commit %+v: result %+v with response %v: want a response exactly when accepted", c, res, resp)
	}
	return res, resp
}

// TestFenceCommit: the first Commit of a scope advances the floor and
// applies the caller's keys; the same token again is accepted; a lower one
// is rejected with the floor that beat it and applies nothing; a Guard
// holds exactly for the floor's token.
func TestFenceCommit(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t, logAll)
	ctx := context.Background()
	a := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 5}
	b := leasecore.Claim{Scope: "nightly", Writer: "holder-b", Token: 9}

	res, resp := commit(t, fe, a, f.putOwn("invoice/1=A", "run=A"))
	backendtest.WantResult(t, "first commit of a scope", res, true, 5)
	if !resp.Succeeded || len(resp.Responses) != 2 || resp.Header == nil || resp.Header.Revision == 0 {
		t.Fatalf("the caller's response: %+v", resp)
	}
	backendtest.WantFloor(t, f.res, "nightly", 5)
	res, _ = commit(t, fe, a, f.putOwn("invoice/2=A"))
	backendtest.WantResult(t, "same token again", res, true, 5)
	res, _ = commit(t, fe, b, f.putOwn("run=B"))
	backendtest.WantResult(t, "larger token", res, true, 9)

	snap := f.snapshot(t)
	res, _ = commit(t, fe, a, f.putOwn("invoice/3=A", "run=A again"))
	backendtest.WantResult(t, "smaller token", res, false, 9)
	if got := f.ownKeys(t); got != "invoice/1=A invoice/2=A run=B" {
		t.Fatalf("the caller's keys: %s", got)
	}
	if got := f.snapshot(t); strings.Count(got, "/attempt/") != strings.Count(snap, "/attempt/")+1 ||
		stripAttempts(got) != stripAttempts(snap) {
		t.Fatalf("a rejection changed more than the log:\n%s\n->\n%s", snap, got)
	}

	// The guard in the caller's own Txn: it holds for the floor's token only.
	for _, tc := range []struct {
		c    leasecore.Claim
		want bool
	}{{b, true}, {a, false}, {leasecore.Claim{Scope: "nightly", Writer: "holder-c", Token: 10}, false},
		{leasecore.Claim{Scope: "never-written", Writer: "holder-c", Token: 1}, false}} {
		r, err := f.cli.Txn(ctx).If(fe.Guard(tc.c)).Commit()
		if err != nil || r.Succeeded != tc.want {
			t.Errorf("Guard(%+v): succeeded %v, %v; want %v", tc.c, r.Succeeded, err, tc.want)
		}
	}

	want := "/holder-a/5/true/5 /holder-a/5/true/5 /holder-b/9/true/9 /holder-a/5/false/9"
	if got := attemptsString(t, f.res, "nightly"); got != want {
		t.Fatalf("attempts:\n got %s\nwant %s", got, want)
	}
}

// TestFenceCallerCompares: the caller's own compares decide between its
// branches whatever the fence decides: a failing caller compare under an
// accepting fence runs the caller's Else, and the response says so.
func TestFenceCallerCompares(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	c := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 3}
	version := f.prefix + "/own/version"
	// Create the row only if it does not exist; otherwise read it.
	create := fenceetcd.Txn{
		If:   []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(version), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(version, "v1")},
		Else: []clientv3.Op{clientv3.OpGet(version)},
	}
	res, resp := commit(t, fe, c, create)
	backendtest.WantResult(t, "create", res, true, 3)
	if !resp.Succeeded || resp.Responses[0].GetResponsePut() == nil {
		t.Fatalf("create: the caller's Then did not run: %+v", resp)
	}
	create.Then = []clientv3.Op{clientv3.OpPut(version, "v2")}
	res, resp = commit(t, fe, c, create)
	backendtest.WantResult(t, "create again", res, true, 3)
	if resp.Succeeded {
		t.Fatalf("create again: the caller's compare held: %+v", resp)
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) != 1 || string(kvs[0].Value) != "v1" {
		t.Fatalf("create again: the caller's Else read %v", kvs)
	}
	if got := f.ownKeys(t); got != "version=v1" {
		t.Fatalf("the caller's keys: %s", got)
	}
	// A rejected claim runs neither branch.
	res, resp = commit(t, fe, leasecore.Claim{Scope: "nightly", Writer: "holder-x", Token: 2},
		fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(version, "x")}, Else: []clientv3.Op{clientv3.OpPut(version, "y")}})
	backendtest.WantResult(t, "stale claim", res, false, 3)
	if resp != nil || f.ownKeys(t) != "version=v1" {
		t.Fatalf("stale claim: response %v, keys %s", resp, f.ownKeys(t))
	}
}

// TestFenceAdvanceCutsOff: the real sequence with a lease. Holder A writes,
// loses the lease (released here, as an expiry would), holder B acquires
// and calls Advance, and writes nothing yet. A's next Commit — with keys
// B never wrote — is rejected and none of it is stored; B's Guard holds.
func TestFenceAdvanceCutsOff(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	ctx := context.Background()

	ga, err := f.leases.Acquire(ctx, "nightly", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a := leasecore.Claim{Scope: "nightly", Writer: ga.Holder, Token: ga.Token}
	if res, err := fe.Advance(ctx, a); err != nil || !res.Accepted {
		t.Fatalf("A's advance: %+v, %v", res, err)
	}
	res, _ := commit(t, fe, a, f.putOwn("run=A", "invoice/1=A"))
	backendtest.WantResult(t, "A's first commit", res, true, ga.Token)
	if err := f.leases.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}

	gb, err := f.leases.Acquire(ctx, "nightly", "holder-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b := leasecore.Claim{Scope: "nightly", Writer: gb.Holder, Token: gb.Token}
	res, err = fe.Advance(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.WantResult(t, "B's advance", res, true, gb.Token)
	if got := f.ownKeys(t); got != "invoice/1=A run=A" {
		t.Fatalf("advance wrote data: %s", got)
	}

	// A wakes up and writes: rejected, also for keys B has not written.
	res, _ = commit(t, fe, a, f.putOwn("run=A stale", "invoice/2=A stale"))
	backendtest.WantResult(t, "A's commit after B's advance", res, false, gb.Token)
	if got := f.ownKeys(t); got != "invoice/1=A run=A" {
		t.Fatalf("A's stale commit stored something: %s", got)
	}
	// A's advance is rejected too, and leaves the floor alone.
	res, err = fe.Advance(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	backendtest.WantResult(t, "A's advance after B's", res, false, gb.Token)
	backendtest.WantFloor(t, f.res, "nightly", gb.Token)

	r, err := f.cli.Txn(ctx).If(fe.Guard(b)).Then(clientv3.OpPut(f.prefix+"/own/run", "B")).Commit()
	if err != nil || !r.Succeeded {
		t.Fatalf("B's guarded Txn: %+v, %v", r, err)
	}
	if r, err := f.cli.Txn(ctx).If(fe.Guard(a)).Then(clientv3.OpPut(f.prefix+"/own/run", "A")).Commit(); err != nil || r.Succeeded {
		t.Fatalf("A's guarded Txn: %+v, %v", r, err)
	}
	if got := f.ownKeys(t); got != "invoice/1=A run=B" {
		t.Fatalf("keys: %s", got)
	}
	// Default log: the two rejections, each with the floor that beat it.
	want := fmt.Sprintf("/holder-a/%d/false/%d /holder-a/%d/false/%d", ga.Token, gb.Token, ga.Token, gb.Token)
	if got := attemptsString(t, f.res, "nightly"); got != want {
		t.Fatalf("attempts:\n got %s\nwant %s", got, want)
	}
}

// TestFenceCommitAdvanceStays: a Commit or Resource.Write that must first
// advance the floor (its token's first write) does so in a request of its
// own, which stays applied when what follows fails. Between the advance
// and the guarded write, either a newer token advances the floor — the
// write is rejected — or the caller's context ends — the write returns the
// context's error. Either way the floor was raised to the claim's token
// and nothing of the write was applied.
func TestFenceCommitAdvanceStays(t *testing.T) {
	f := newFixture(t)
	plain := f.newFence(t)
	a := leasecore.Claim{Writer: "holder-a", Token: 5}
	b := leasecore.Claim{Writer: "holder-b", Token: 9}

	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, cli *clientv3.Client, c leasecore.Claim) (leasecore.Result, error)
		wrote func(t *testing.T, scope string) bool
	}{
		{"Fence.Commit", func(ctx context.Context, cli *clientv3.Client, c leasecore.Claim) (leasecore.Result, error) {
			fe, err := fenceetcd.NewFence(cli, fenceetcd.WithPrefix(f.prefix))
			if err != nil {
				return leasecore.Result{}, err
			}
			res, _, err := fe.Commit(ctx, c, f.putOwn(c.Scope+"=A"))
			return res, err
		}, func(t *testing.T, scope string) bool {
			return strings.Contains(f.ownKeys(t), scope+"=")
		}},
		{"Resource.Write", func(ctx context.Context, cli *clientv3.Client, c leasecore.Claim) (leasecore.Result, error) {
			res, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(f.prefix))
			if err != nil {
				return leasecore.Result{}, err
			}
			return res.Write(ctx, leasecore.Write{Scope: c.Scope, Part: "p", Writer: c.Writer, Token: c.Token, Content: "A"})
		}, func(t *testing.T, scope string) bool {
			_, ok, err := f.res.ReadPart(context.Background(), scope, "p")
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}},
	} {
		for _, between := range []string{"newer token", "ctx ends"} {
			t.Run(tc.name+"/"+between, func(t *testing.T) {
				scope := strings.NewReplacer(".", "-", " ", "-").Replace(tc.name + "-" + between)
				a, b := a, b
				a.Scope, b.Scope = scope, scope
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var floorBetween leasecore.Token
				// The second Txn is the advance: the first, guarded, found
				// no floor.
				cli := etcdtest.Client(t)
				cli.KV = &hookKV{KV: cli.KV, at: 2, hook: func() {
					var err error
					if floorBetween, err = plain.Floor(context.Background(), scope); err != nil {
						t.Error(err)
					}
					if between == "ctx ends" {
						cancel()
						return
					}
					if res, err := plain.Advance(context.Background(), b); err != nil || !res.Accepted {
						t.Errorf("B's advance: %+v, %v", res, err)
					}
				}}
				res, err := tc.write(ctx, cli, a)
				if between == "ctx ends" {
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("write: %+v, %v; want the context's error", res, err)
					}
				} else {
					if err != nil {
						t.Fatal(err)
					}
					backendtest.WantResult(t, "write after B's advance", res, false, b.Token)
				}
				if floorBetween != a.Token {
					t.Fatalf("floor between the advance and the write: %d, want %d", floorBetween, a.Token)
				}
				if tc.wrote(t, scope) {
					t.Fatal("the write was applied")
				}
				want := a.Token
				if between == "newer token" {
					want = b.Token
				}
				backendtest.WantFloor(t, f.res, scope, want)
			})
		}
	}
}

// hookKV runs hook once, right after the at-th Txn through it was
// answered: between two requests of one fenced write.
type hookKV struct {
	clientv3.KV
	at   int
	n    int
	hook func()
}

func (k *hookKV) Txn(ctx context.Context) clientv3.Txn { return &hookTxn{Txn: k.KV.Txn(ctx), k: k} }

// hookTxn is a Txn of a hookKV; If, Then and Else return it, so that a
// chained Commit is its own.
type hookTxn struct {
	clientv3.Txn
	k *hookKV
}

func (t *hookTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *hookTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *hookTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *hookTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.k.n++; t.k.n == t.k.at {
		t.k.hook()
	}
	return resp, err
}

// TestFenceConcurrentWriters: writers with different tokens start together
// behind a barrier, each committing its own keys several times, each on its
// own connection. In etcd's order of application (the revisions of the
// accepted commits) the tokens never decrease: no data of a lower token
// was applied after a higher one was accepted (I3). The largest token is
// always accepted, and the data left is its own.
func TestFenceConcurrentWriters(t *testing.T) {
	f := newFixture(t)
	const writers, commits = 6, 4
	fences := make([]*fenceetcd.Fence, writers)
	for i := range fences {
		var err error
		if fences[i], err = fenceetcd.NewFence(etcdtest.Client(t), fenceetcd.WithPrefix(f.prefix), logAll); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 10 {
		scope := fmt.Sprintf("race-%d", round)
		tokens := make([]leasecore.Token, writers)
		for i := range tokens {
			tokens[i] = leasecore.Token((i*7+round)%writers + 1) // a different order every round
		}
		type accepted struct {
			rev   int64
			token leasecore.Token
		}
		var mu sync.Mutex
		var got []accepted
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, writers*commits)
		for i := range writers {
			wg.Go(func() {
				<-start
				c := leasecore.Claim{Scope: scope, Writer: fmt.Sprintf("w%d", i), Token: tokens[i]}
				for n := range commits {
					v := fmt.Sprintf("token %d commit %d", c.Token, n)
					res, resp, err := fences[i].Commit(context.Background(), c, fenceetcd.Txn{Then: []clientv3.Op{
						clientv3.OpPut(f.prefix+"/own/"+scope+"/data", v),
						clientv3.OpPut(f.prefix+"/own/"+scope+"/by", c.Writer)}})
					if err != nil {
						errs <- err
						return
					}
					if res.Accepted {
						mu.Lock()
						got = append(got, accepted{resp.Header.Revision, c.Token})
						mu.Unlock()
					} else if res.Floor <= c.Token {
						errs <- fmt.Errorf("token %d rejected with floor %d", c.Token, res.Floor)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(x, y accepted) int { return int(x.rev - y.rev) })
		for i := 1; i < len(got); i++ {
			if got[i].token < got[i-1].token {
				t.Fatalf("round %d: token %d's data applied at revision %d after token %d's at %d (I3)",
					round, got[i].token, got[i].rev, got[i-1].token, got[i-1].rev)
			}
		}
		top := leasecore.Token(writers)
		if n := len(got); n == 0 || got[n-1].token != top {
			t.Fatalf("round %d: the largest token's commits were not the last accepted: %+v", round, got)
		}
		resp, err := f.cli.Get(context.Background(), f.prefix+"/own/"+scope+"/data")
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != fmt.Sprintf("token %d commit %d", top, commits-1) {
			t.Fatalf("round %d: data left: %v, %v", round, resp.Kvs, err)
		}
		backendtest.WantFloor(t, f.res, scope, top)
	}
}

// TestFenceAttemptLogModes: which checks each mode logs, for the fence and
// for the part store built on it. Default: rejections only.
func TestFenceAttemptLogModes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []fenceetcd.Option
		fence string // accepted advance, accepted commit, rejected commit, rejected advance
		part  string // accepted write, rejected write, rejected batch
	}{
		{"default", nil,
			"/old/3/false/7 /old/3/false/7",
			"summary/old/3/false/7 summary/old/3/false/7 detail/old/3/false/7"},
		{"LogRejected", []fenceetcd.Option{fenceetcd.WithAttemptLog(leasecore.LogRejected)},
			"/old/3/false/7 /old/3/false/7",
			"summary/old/3/false/7 summary/old/3/false/7 detail/old/3/false/7"},
		{"LogAll", []fenceetcd.Option{logAll},
			"/new/7/true/7 /new/7/true/7 /old/3/false/7 /old/3/false/7",
			"summary/new/7/true/7 summary/old/3/false/7 summary/old/3/false/7 detail/old/3/false/7"},
		{"LogNone", []fenceetcd.Option{fenceetcd.WithAttemptLog(leasecore.LogNone)}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			fe := f.newFence(t, tc.opts...)
			newer := leasecore.Claim{Scope: "fence", Writer: "new", Token: 7}
			older := leasecore.Claim{Scope: "fence", Writer: "old", Token: 3}
			if res, err := fe.Advance(ctx, newer); err != nil || !res.Accepted {
				t.Fatalf("advance: %+v, %v", res, err)
			}
			commit(t, fe, newer, f.putOwn("a=1"))
			commit(t, fe, older, f.putOwn("a=2"))
			if res, err := fe.Advance(ctx, older); err != nil || res.Accepted {
				t.Fatalf("stale advance: %+v, %v", res, err)
			}
			if got := attemptsString(t, f.res, "fence"); got != tc.fence {
				t.Errorf("fence log:\n got %s\nwant %s", got, tc.fence)
			}

			res, err := fenceetcd.NewResource(f.cli, append([]fenceetcd.Option{fenceetcd.WithPrefix(f.prefix)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			backendtest.WantResult(t, "write", backendtest.Write(t, res, "parts", "summary", "s", "new", 7), true, 7)
			backendtest.WantResult(t, "stale write", backendtest.Write(t, res, "parts", "summary", "s", "old", 3), false, 7)
			backendtest.WantResult(t, "stale batch", writeBatch(t, res, "parts", "old", 3, "summary", "detail"), false, 7)
			if got := attemptsString(t, res, "parts"); got != tc.part {
				t.Errorf("part store log:\n got %s\nwant %s", got, tc.part)
			}
			backendtest.WantPart(t, res, "parts", "summary", "s", "new", 7)
		})
	}
}

// TestFenceAttemptsBounded: Attempts reads from a time on, oldest first,
// at most Limit entries (a batch counts as its parts); PruneAttempts
// deletes what is older than its bound and nothing else.
func TestFenceAttemptsBounded(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fe := f.newFence(t, logAll)
	res, err := fenceetcd.NewResource(f.cli, fenceetcd.WithPrefix(f.prefix), logAll)
	if err != nil {
		t.Fatal(err)
	}
	// Eight attempts with distinct, increasing times (one writer's clock).
	var times []time.Time
	for i := range 8 {
		times = append(times, time.Now())
		c := leasecore.Claim{Scope: "log", Writer: fmt.Sprintf("w%d", i), Token: leasecore.Token(10 + i%2*-5 + i)}
		if _, _, err := fe.Commit(ctx, c, fenceetcd.Txn{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	writers := func(as []leasecore.Attempt) string {
		var out []string
		for _, a := range as {
			if a.Scope != "log" {
				t.Fatalf("attempt of scope %q", a.Scope)
			}
			out = append(out, a.Writer)
		}
		return strings.Join(out, " ")
	}
	read := func(q leasecore.AttemptQuery) string {
		t.Helper()
		q.Scope = "log"
		as, err := fe.Attempts(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(as); i++ {
			if as[i].At.Before(as[i-1].At) {
				t.Fatalf("attempts not oldest first: %+v", as)
			}
		}
		return writers(as)
	}
	for _, tc := range []struct {
		q    leasecore.AttemptQuery
		want string
	}{
		{leasecore.AttemptQuery{Limit: 100}, "w0 w1 w2 w3 w4 w5 w6 w7"},
		{leasecore.AttemptQuery{Limit: 3}, "w0 w1 w2"},
		{leasecore.AttemptQuery{Since: times[5], Limit: 100}, "w5 w6 w7"},
		{leasecore.AttemptQuery{Since: times[2], Limit: 2}, "w2 w3"},
		{leasecore.AttemptQuery{Since: time.Now(), Limit: 100}, ""},
		{leasecore.AttemptQuery{Since: time.Unix(-1, 0), Limit: 1}, "w0"},
	} {
		if got := read(tc.q); got != tc.want {
			t.Errorf("Attempts(since %v, limit %d) = %q, want %q", tc.q.Since, tc.q.Limit, got, tc.want)
		}
	}
	// Each entry carries its outcome and floor (w1 has token 6 below w0's 10).
	as, err := fe.Attempts(ctx, leasecore.AttemptQuery{Scope: "log", Limit: 2})
	if err != nil || len(as) != 2 || !as[0].Accepted || as[0].Floor != 10 || as[1].Accepted || as[1].Floor != 10 || as[0].Part != "" {
		t.Fatalf("first two entries: %+v, %v", as, err)
	}

	// A batch is one key and as many entries as parts; Limit counts entries.
	beforeBatch := time.Now()
	writeBatch(t, res, "log", "batcher", 100, "p1", "p2", "p3")
	if got := read(leasecore.AttemptQuery{Since: beforeBatch, Limit: 2}); got != "batcher batcher" {
		t.Errorf("a batch's entries under limit 2: %q", got)
	}

	// Prune everything before w4: four keys, the rest stays, floors too.
	n, err := fe.PruneAttempts(ctx, "log", times[4])
	if err != nil || n != 4 {
		t.Fatalf("prune before w4: %d, %v; want 4", n, err)
	}
	if got := read(leasecore.AttemptQuery{Limit: 100}); got != "w4 w5 w6 w7 batcher batcher batcher" {
		t.Errorf("after the prune: %q", got)
	}
	if n, err := fe.PruneAttempts(ctx, "log", times[4]); err != nil || n != 0 {
		t.Errorf("prune again: %d, %v", n, err)
	}
	backendtest.WantFloor(t, res, "log", 100)
	// The whole-log reader sees the same rest.
	if got := len(strings.Fields(attemptsString(t, res, "log"))); got != 7 {
		t.Errorf("Resource.Attempts after the prune: %d entries", got)
	}
	if n, err := fe.PruneAttempts(ctx, "log", time.Now()); err != nil || n != 5 {
		t.Errorf("prune all: %d, %v; want 5 keys", n, err)
	}
	if got := read(leasecore.AttemptQuery{Limit: 100}); got != "" {
		t.Errorf("after pruning all: %q", got)
	}
}
