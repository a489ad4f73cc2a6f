package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// clusterSpace is the token space of the cluster cli talks to, from the
// header of a plain read: "etcd:<cluster id in hex>".
func clusterSpace(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/no-such-key")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.ClusterId == 0 {
		t.Fatal("the response header carries no cluster ID")
	}
	return "etcd:" + strconv.FormatUint(resp.Header.ClusterId, 16)
}

// otherCluster starts an etcd server of its own — another cluster, another
// cluster ID, revisions from 1 — and returns a lease store on it.
func otherCluster(t *testing.T) (*fenceetcd.LeaseStore, *clientv3.Client) {
	t.Helper()
	srv := etcdtemp.StartTB(t)
	cli := etcdtest.Dial(t, srv.Endpoints())
	leases, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(etcdtest.Prefix()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leases.Close() })
	return leases, cli
}

// acquireTimes acquires and releases name n times and returns the grants,
// tokens increasing.
func acquireTimes(t *testing.T, leases *fenceetcd.LeaseStore, name, holder string, n int) []leasecore.Grant {
	t.Helper()
	ctx := context.Background()
	var gs []leasecore.Grant
	for range n {
		g, err := leases.Acquire(ctx, name, holder, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := leases.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	return gs
}

// TestTokenSpaceOfGrants: every grant names the cluster's token space,
// "etcd:<cluster id in hex>" as the response headers carry it — Acquire
// (per-acquire and shared leases), Renew, RenewAll — and stores with other
// prefixes on the same cluster share it (one revision counter), while
// another cluster has its own.
func TestTokenSpaceOfGrants(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	space := clusterSpace(t, f.cli)
	shared, err := fenceetcd.NewLeaseStore(f.cli, fenceetcd.WithPrefix(etcdtest.Prefix()), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	for _, s := range []struct {
		what  string
		store *fenceetcd.LeaseStore
	}{{"per-acquire leases", f.leases}, {"shared leases, another prefix", shared}} {
		g, err := s.store.Acquire(ctx, "report-job", "holder-a", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if g.Space != space {
			t.Errorf("%s: Acquire: Space = %q, want %q", s.what, g.Space, space)
		}
		g.Space = "" // renewals fill it in from their own answers
		if r, err := s.store.Renew(ctx, g); err != nil || r.Space != space {
			t.Errorf("%s: Renew: %+v, %v; want space %q", s.what, r, err, space)
		}
		if rs, lost, err := s.store.RenewAll(ctx, []leasecore.Grant{g}); err != nil || lost[0] != nil || rs[0].Space != space {
			t.Errorf("%s: RenewAll: %+v, %v, %v; want space %q", s.what, rs, lost, err, space)
		}
	}
	other, otherCli := otherCluster(t)
	g, err := other.Acquire(ctx, "report-job", "holder-a", 10*time.Second)
	if err != nil || g.Space != clusterSpace(t, otherCli) || g.Space == space {
		t.Errorf("another cluster: %+v, %v; want a space of its own, not %q", g, err, space)
	}
}

// wantTokenSpaceError checks a rejection by a floor from another token
// space: a rejected Result and an error that is ErrTokenSpace (and
// ErrConfig) naming the claim's token and space, the floor and its space,
// and the rule.
func wantTokenSpaceError(t *testing.T, what string, res leasecore.Result, err error, c leasecore.Claim,
	floor leasecore.Token, floorSpace string) {
	t.Helper()
	if res.Accepted || res.Floor != floor {
		t.Errorf("%s: %+v, want rejected by floor %d", what, res, floor)
	}
	var tse *leasecore.TokenSpaceError
	if !errors.Is(err, leasecore.ErrTokenSpace) || !errors.Is(err, leasecore.ErrConfig) || !errors.As(err, &tse) {
		t.Errorf("%s: err = %v, want a *TokenSpaceError (ErrTokenSpace, ErrConfig)", what, err)
		return
	}
	if tse.Token != c.Token || tse.Space != c.Space || tse.Floor != floor || tse.FloorSpace != floorSpace || tse.Scope != c.Scope {
		t.Errorf("%s: %+v, want token %d of %q below floor %d of %q", what, tse, c.Token, c.Space, floor, floorSpace)
	}
	for _, w := range []string{c.Space, floorSpace, fmt.Sprintf("token %d", c.Token), fmt.Sprintf("floor %d", floor),
		"a scope is fenced by exactly one lease service"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: message %q lacks %q", what, err, w)
		}
	}
}

// TestTokenSpaceRejections: a scope fenced with tokens of lease service A
// (the shared server's cluster) and then written with tokens of lease
// service B (a cluster of its own, revisions from 1 again): Advance,
// Commit (flat and nested) and the part store's Write and WriteBatch reject
// B's claim with a *leasecore.TokenSpaceError naming both spaces and
// write nothing of B's. A stale token of A's own space, and B's claim
// without its space, are ordinary rejections (no error).
func TestTokenSpaceRejections(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	ctx := context.Background()
	as := acquireTimes(t, f.leases, "report-job", "holder-a", 3)
	otherLeases, _ := otherCluster(t)
	bs := acquireTimes(t, otherLeases, "report-job", "holder-b", 1)
	a, b := as[2].Claim("nightly"), bs[0].Claim("nightly")
	if a.Space == b.Space || b.Token >= a.Token || as[1].Token >= a.Token {
		t.Fatalf("lease services: A %+v, B %+v; want two spaces, B's token below A's", as, bs)
	}

	if res, err := fe.Advance(ctx, a); err != nil || !res.Accepted {
		t.Fatalf("A's advance: %+v, %v", res, err)
	}
	if res, _, err := fe.Commit(ctx, a, f.putOwn("run=A")); err != nil || !res.Accepted {
		t.Fatalf("A's commit: %+v, %v", res, err)
	}
	aw := leasecore.Write{Scope: "report", Part: "summary", Content: "A's", Writer: a.Writer, Token: a.Token, Space: a.Space}
	if res, err := f.res.Write(ctx, aw); err != nil || !res.Accepted {
		t.Fatalf("A's part: %+v, %v", res, err)
	}
	before := f.snapshot(t)

	res, err := fe.Advance(ctx, b)
	wantTokenSpaceError(t, "Advance", res, err, b, a.Token, a.Space)
	res, resp, err := fe.Commit(ctx, b, f.putOwn("run=B"))
	wantTokenSpaceError(t, "Commit", res, err, b, a.Token, a.Space)
	if resp != nil {
		t.Errorf("Commit: a response for a rejection: %v", resp)
	}
	nested := f.putOwn("run=B")
	nested.If = []clientv3.Cmp{clientv3.Compare(clientv3.Version(f.prefix+"/own/run"), ">", 0)}
	res, _, err = fe.Commit(ctx, b, nested)
	wantTokenSpaceError(t, "Commit, nested", res, err, b, a.Token, a.Space)
	bw := leasecore.Write{Scope: "report", Part: "summary", Content: "B's", Writer: b.Writer, Token: b.Token, Space: b.Space}
	res, err = f.res.Write(ctx, bw)
	wantTokenSpaceError(t, "Resource.Write", res, err, backendkit.ClaimOf(bw), a.Token, a.Space)
	res, err = f.res.WriteBatch(ctx, leasecore.Batch{Scope: "report", Writer: b.Writer, Token: b.Token, Space: b.Space,
		Parts: []leasecore.PartContent{{Part: "summary", Content: "B's"}, {Part: "detail", Content: "B's"}}})
	wantTokenSpaceError(t, "Resource.WriteBatch", res, err, backendkit.ClaimOf(bw), a.Token, a.Space)
	t.Logf("B's write: %v", err)

	for _, c := range []leasecore.Claim{as[1].Claim("nightly"), {Scope: "nightly", Writer: b.Writer, Token: b.Token}} {
		if res, err := fe.Advance(ctx, c); err != nil || res.Accepted || res.Floor != a.Token {
			t.Errorf("Advance %+v: %+v, %v; want an ordinary rejection by floor %d (no error)", c, res, err, a.Token)
		}
		if res, _, err := fe.Commit(ctx, c, f.putOwn("run=stale")); err != nil || res.Accepted {
			t.Errorf("Commit %+v: %+v, %v; want an ordinary rejection (no error)", c, res, err)
		}
		w := leasecore.Write{Scope: "report", Part: "summary", Content: "stale", Writer: c.Writer, Token: c.Token, Space: c.Space}
		if res, err := f.res.Write(ctx, w); err != nil || res.Accepted {
			t.Errorf("Write %+v: %+v, %v; want an ordinary rejection (no error)", w, res, err)
		}
	}

	// Only rejections' log records were added: no data, no floor moved.
	after := f.snapshot(t)
	if got := f.ownKeys(t); got != "run=A" {
		t.Errorf("own keys = %q, want A's", got)
	}
	if p, _, err := f.res.ReadPart(ctx, "report", "summary"); err != nil || p.Content != "A's" {
		t.Errorf("part = %+v, %v; want A's", p, err)
	}
	if withoutAttempts(before) != withoutAttempts(after) {
		t.Errorf("rejections changed keys other than attempt logs:\n%s\n->\n%s", before, after)
	}
}

// withoutAttempts drops the attempt-log lines of a snapshot.
func withoutAttempts(snapshot string) string {
	var keep []string
	for _, l := range strings.Split(snapshot, "\n")[1:] {
		if !strings.Contains(l, "/attempt/") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestTokenSpaceFloorBeforeUpgrade: a floor written as earlier versions
// wrote it (the floor key only, no floorspace key) rejects a claim from
// another space as an ordinary stale one; once a claim with a space
// raised the floor the diagnosis is there; and after a claim without a
// space raised it again, the floorspace key (bound to the earlier token)
// no longer speaks for the floor: ordinary rejections again.
func TestTokenSpaceFloorBeforeUpgrade(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	ctx := context.Background()
	otherLeases, _ := otherCluster(t)
	b := acquireTimes(t, otherLeases, "report-job", "holder-b", 1)[0].Claim("nightly")
	as := acquireTimes(t, f.leases, "report-job", "holder-a", 2)
	old := as[0].Token
	if old <= b.Token {
		t.Fatalf("A's token %d is not above B's %d", old, b.Token)
	}
	// The old format: a 20-digit token, nothing else.
	if _, err := f.cli.Put(ctx, f.prefix+"/floor/nightly", fmt.Sprintf("%020d", old)); err != nil {
		t.Fatal(err)
	}
	if res, err := fe.Advance(ctx, b); err != nil || res.Accepted || res.Floor != old {
		t.Errorf("B below an old-format floor: %+v, %v; want an ordinary rejection by %d", res, err, old)
	}

	a := as[1].Claim("nightly")
	if res, err := fe.Advance(ctx, a); err != nil || !res.Accepted {
		t.Fatalf("A's advance: %+v, %v", res, err)
	}
	res, err := fe.Advance(ctx, b)
	wantTokenSpaceError(t, "B after A raised the floor", res, err, b, a.Token, a.Space)

	noSpace := leasecore.Claim{Scope: "nightly", Writer: "holder-c", Token: a.Token + 1000}
	if res, err := fe.Advance(ctx, noSpace); err != nil || !res.Accepted {
		t.Fatalf("advance without a space: %+v, %v", res, err)
	}
	if res, err := fe.Advance(ctx, b); err != nil || res.Accepted || res.Floor != noSpace.Token {
		t.Errorf("B below a floor raised without a space: %+v, %v; want an ordinary rejection", res, err)
	}
}

// TestTokenSpaceBadInput: a space that is too long or holds a NUL is bad
// input (an *ArgError for field "space", nothing sent), and a caller's
// transaction may not write a floor's token space.
func TestTokenSpaceBadInput(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	ctx := context.Background()
	before := f.snapshot(t)
	for _, space := range []string{strings.Repeat("s", backendkit.MaxNameLen+1), "etcd:\x00"} {
		c := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 1, Space: space}
		_, err := fe.Advance(ctx, c)
		wantSpaceArg(t, "Advance", err)
		_, _, err = fe.Commit(ctx, c, f.putOwn("run=x"))
		wantSpaceArg(t, "Commit", err)
		_, err = f.res.Write(ctx, leasecore.Write{Scope: "s", Part: "p", Writer: "w", Token: 1, Space: space})
		wantSpaceArg(t, "Write", err)
		_, err = f.leases.Renew(ctx, leasecore.Grant{Name: "n", Holder: "h", Token: 1, TTL: 10 * time.Second, Space: space})
		wantSpaceArg(t, "Renew", err)
	}
	c := leasecore.Claim{Scope: "nightly", Writer: "holder-a", Token: 1}
	_, _, err := fe.Commit(ctx, c, fenceetcd.Txn{Then: []clientv3.Op{clientv3.OpPut(f.prefix+"/floorspace/nightly", "x")}})
	var ae *leasecore.ArgError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "writes a key of the fence") {
		t.Errorf("a transaction writing a floor's token space: %v, want refused", err)
	}
	if after := f.snapshot(t); after != before {
		t.Errorf("bad input changed the store:\n%s\n->\n%s", before, after)
	}
}

func wantSpaceArg(t *testing.T, what string, err error) {
	t.Helper()
	var ae *leasecore.ArgError
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != "space" {
		t.Errorf("%s: %v, want an *ArgError for field space", what, err)
	}
}
