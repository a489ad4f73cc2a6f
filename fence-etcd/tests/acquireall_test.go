package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

func allNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return names
}

// acquireAllChunk is the names one shared-mode AcquireAll transaction puts
// (its godoc): MaxTxnOps less the put of the holder's generation key.
const acquireAllChunk = fenceetcd.MaxTxnOps - 1

// TestAcquireAllShared: with shared leases, 300 new names cost one Grant of
// the shared lease and three transactions (acquireAllChunk names each). The names
// of one transaction share its revision as token, each key's create
// revision; tokens grow from one transaction to the next; every key hangs
// on the one shared lease; each grant is what Acquire gives (apart from
// Name and Token): the holder, TTL, token space, and the shared lease's
// refresh start as Start.
func TestAcquireAllShared(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	ctx := context.Background()
	names := allNames("shard", 300)
	before := time.Now()
	rc.take()
	gs, errs, err := s.AcquireAll(ctx, names, "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "LeaseGrant Txn Txn Txn" {
		t.Fatalf("calls %q, want one LeaseGrant and three Txn", got)
	}
	single, err := s.Acquire(ctx, "single", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	id := f.leaseOf(t, "single")
	for i, g := range gs {
		if errs[i] != nil {
			t.Fatalf("%s: %v", names[i], errs[i])
		}
		chunkFirst := gs[i/acquireAllChunk*acquireAllChunk]
		if g.Name != names[i] || g.Token != chunkFirst.Token {
			t.Fatalf("grant %d: %+v, want %s with its transaction's token %d", i, g, names[i], chunkFirst.Token)
		}
		if i >= acquireAllChunk && i%acquireAllChunk == 0 && g.Token <= gs[i-1].Token {
			t.Fatalf("transaction of %s: token %d after %d", g.Name, g.Token, gs[i-1].Token)
		}
		if g.Holder != single.Holder || g.TTL != single.TTL || g.Space != single.Space || !g.Start.Equal(single.Start) {
			t.Fatalf("%s: %+v, want as Acquire's %+v apart from Name and Token", g.Name, g, single)
		}
		if g.Start.Before(before) {
			t.Fatalf("%s: Start %v before the call (%v)", g.Name, g.Start, before)
		}
		if i%50 == 0 {
			if _, rev, _ := f.get(t, f.layout(t).Lease(g.Name)); leasecore.Token(rev) != g.Token {
				t.Fatalf("%s: token %d, mod revision %d", g.Name, g.Token, rev)
			}
			if got := f.leaseOf(t, g.Name); got != id {
				t.Fatalf("%s on etcd lease %x, want the shared %x", g.Name, got, id)
			}
		}
	}
	if single.Token <= gs[299].Token {
		t.Fatalf("single's token %d, the last batch's %d", single.Token, gs[299].Token)
	}
	if got := f.attached(t, id); got != 302 {
		t.Fatalf("the shared lease carries %d keys, want 302: the 301 names and the holder's generation key", got)
	}
	// The grants are Acquire's: RenewAll renews them all, Release ends one.
	renewed, lost, err := s.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range gs {
		if lost[i] != nil || renewed[i].Token != gs[i].Token {
			t.Fatalf("RenewAll: %s: %+v, %v", names[i], renewed[i], lost[i])
		}
	}
	if err := s.Release(ctx, gs[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireAllSharedMixed: a transaction whose compare fails (some key
// exists) leaves its names to Acquire one by one: the free ones (new, or
// released: its key was deleted) are granted with tokens above every
// earlier one of the name, the held ones — another holder's, the holder's
// own — are refused with ErrHeld and stay as they were. Another
// transaction of the same call, all of whose keys are free, still takes
// the fast path.
func TestAcquireAllSharedMixed(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	other := sharedStore(t, f, f.cli)
	ctx := context.Background()
	const ttl = time.Minute
	rel, err := s.Acquire(ctx, "released", "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	own, err := s.Acquire(ctx, "held-own", "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := other.Acquire(ctx, "held-other", "holder-b", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// The first transaction's names: four, two of them held, and 123 new
	// ones; the second's: 10 new ones.
	names := append([]string{"new-a", "held-other", "released", "held-own"}, allNames("slow", acquireAllChunk-4)...)
	names = append(names, allNames("fast", 10)...)
	rc.take()
	gs, errs, err := s.AcquireAll(ctx, names, "holder-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	calls := rc.take()
	// Txn (failed), then name by name for the first transaction's names
	// (an Acquire that is refused reads the holder), then the second
	// transaction.
	if got := strings.Count(calls, "Txn"); got != 1+acquireAllChunk+1 {
		t.Fatalf("calls %q: %d Txn, want %d", calls, got, 1+acquireAllChunk+1)
	}
	for i, n := range names {
		switch n {
		case "held-other", "held-own":
			var he *leasecore.HoldError
			if !errors.Is(errs[i], leasecore.ErrHeld) || !errors.As(errs[i], &he) || he.Name != n {
				t.Fatalf("%s: %+v, %v; want ErrHeld", n, gs[i], errs[i])
			}
		default:
			if errs[i] != nil {
				t.Fatalf("%s: %v", n, errs[i])
			}
			if _, rev, _ := f.get(t, f.layout(t).Lease(n)); leasecore.Token(rev) != gs[i].Token || gs[i].Token <= theirs.Token {
				t.Fatalf("%s: token %d, mod revision %d (earlier acquires up to %d)", n, gs[i].Token, rev, theirs.Token)
			}
		}
	}
	if gs[0].Token == gs[2].Token {
		t.Fatalf("new-a and released, acquired one by one, share token %d", gs[0].Token)
	}
	second := gs[acquireAllChunk:]
	if second[0].Token != second[len(second)-1].Token || second[0].Token <= gs[acquireAllChunk-1].Token {
		t.Fatalf("the second transaction's tokens %d..%d, after %d", second[0].Token, second[len(second)-1].Token,
			gs[acquireAllChunk-1].Token)
	}
	for n, want := range map[string]leasecore.Grant{"held-own": own, "held-other": theirs} {
		st, err := s.Inspect(ctx, n)
		if err != nil || !st.Held || st.Holder != want.Holder || st.Token != want.Token {
			t.Fatalf("%s after the refused acquire: %+v, %v", n, st, err)
		}
	}
}

// TestAcquireAllPerName: without shared leases every name needs an etcd
// lease of its own: AcquireAll is Acquire per name (a Grant and a Txn
// each), with Acquire's results.
func TestAcquireAllPerName(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(f.prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.leases.Acquire(ctx, "held", "holder-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	rc.take()
	gs, errs, err := s.AcquireAll(ctx, []string{"a", "held", "b"}, "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); !strings.HasPrefix(got, "LeaseGrant Txn LeaseGrant Txn") || strings.Count(got, "LeaseGrant") != 3 {
		t.Fatalf("calls %q, want a LeaseGrant and a Txn per name", got)
	}
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], leasecore.ErrHeld) {
		t.Fatalf("errs %v", errs)
	}
	if la, lb := f.leaseOf(t, "a"), f.leaseOf(t, "b"); la == lb || gs[0].Token >= gs[2].Token {
		t.Fatalf("a on %x with token %d, b on %x with token %d: want two etcd leases, increasing tokens", la, gs[0].Token, lb, gs[2].Token)
	}
	for _, g := range []leasecore.Grant{gs[0], gs[2]} {
		if _, err := s.Renew(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireAllBadInput: bad input — and a TTL that is not whole seconds,
// a closed store, a done context — is refused before anything is sent.
func TestAcquireAllBadInput(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%t", shared), func(t *testing.T) {
			f := newFixture(t)
			opts := []fenceetcd.Option{fenceetcd.WithPrefix(f.prefix)}
			if shared {
				opts = append(opts, fenceetcd.WithSharedLeases())
			}
			s, err := fenceetcd.NewLeaseStore(f.cli, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			before := f.snapshot(t)
			for _, tc := range []struct {
				name, field string
				names       []string
				holder      string
				ttl         time.Duration
			}{
				{"no names", "names", nil, "holder-a", time.Minute},
				{"too many", "names", allNames("n", backendkit.MaxAcquireAll+1), "holder-a", time.Minute},
				{"empty name", "names[1]", []string{"a", ""}, "holder-a", time.Minute},
				{"repeated", "names[1]", []string{"a", "a"}, "holder-a", time.Minute},
				{"empty holder", "holder", []string{"a"}, "", time.Minute},
				{"ttl below MinTTL", "ttl", []string{"a"}, "holder-a", fenceetcd.MinTTL / 2},
				{"ttl not whole seconds", "ttl", []string{"a"}, "holder-a", 1500 * time.Millisecond},
			} {
				gs, errs, err := s.AcquireAll(ctx, tc.names, tc.holder, tc.ttl)
				var ae *leasecore.ArgError
				if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != tc.field || gs != nil || errs != nil {
					t.Fatalf("%s: %v, %v, %v; want an ArgError on %q", tc.name, gs, errs, err, tc.field)
				}
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if _, _, err := s.AcquireAll(cctx, []string{"a"}, "holder-a", time.Minute); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled context: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.AcquireAll(ctx, []string{"a"}, "holder-a", time.Minute); !errors.Is(err, fenceetcd.ErrStoreClosed) {
				t.Fatalf("after Close: %v, want ErrStoreClosed", err)
			}
			if after := f.snapshot(t); after != before {
				t.Fatalf("refused calls changed the keys:\n%s\n---\n%s", before, after)
			}
		})
	}
}

// TestAcquireAllLostAnswer: the answer to a batch transaction is lost after
// etcd carried it out (etcdconformance.DialLosingAnswers): the call fails
// with ErrUnavailable and the keys it created are deleted again
// (unputIfOurs, as Acquire does), so no name is held that the holder does
// not know of, kept alive by its renewals; the holder's other name stays.
func TestAcquireAllLostAnswer(t *testing.T) {
	f := newFixture(t)
	cli, loseNextAnswer, err := etcdconformance.DialLosingAnswers(context.Background(), etcdtest.Server(t).Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s := sharedStore(t, f, cli)
	ctx := context.Background()
	keep, errs, err := s.AcquireAll(ctx, []string{"keep"}, "holder-a", time.Minute)
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	names := allNames("ghost", 5)
	loseNextAnswer()
	gs, errs, err := s.AcquireAll(ctx, names, "holder-a", time.Minute)
	if !errors.Is(err, leasecore.ErrUnavailable) || gs != nil || errs != nil {
		t.Fatalf("AcquireAll whose answer was lost: %v, %v, %v; want a call error wrapping ErrUnavailable", gs, errs, err)
	}
	for _, n := range names {
		if v, _, ok := f.get(t, f.layout(t).Lease(n)); ok {
			t.Fatalf("%s still held (by %q) after the lost answer", n, v)
		}
	}
	if _, err := s.Renew(ctx, keep[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireAllGivesBack: a call that fails after a transaction of it
// succeeded (here ctx ends right after the first one answered) gives back
// the names it granted: the caller holds none of them. Its ctx has ended,
// so the call returns at once and the releases run in the background
// (bounded by 2 s): the names are free soon after, and an acquire of one
// of them through the same store waits for its release instead of finding
// it held.
func TestAcquireAllGivesBack(t *testing.T) {
	f := newFixture(t)
	var cancelAfterTxn atomic.Pointer[context.CancelFunc]
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: etcdtest.Server(t).Endpoints(),
		Logger:    zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if strings.HasSuffix(method, "/Txn") {
				if c := cancelAfterTxn.Swap(nil); c != nil {
					(*c)()
				}
			}
			return err
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s := sharedStore(t, f, cli)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cancelAfterTxn.Store(&cancel)
	names := allNames("shard", 2*fenceetcd.MaxTxnOps)
	gs, errs, err := s.AcquireAll(ctx, names, "holder-a", time.Minute)
	if !errors.Is(err, context.Canceled) || gs != nil || errs != nil {
		t.Fatalf("AcquireAll with ctx ended after its first transaction: %v, %v; want a call error wrapping context.Canceled", gs, err)
	}
	// The acquire waits for the release of names[0] the failed call left
	// running, then finds the name free.
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	g, err := s.Acquire(actx, names[0], "holder-b", time.Minute)
	if err != nil {
		t.Fatalf("acquire of a name the failed call gave back: %v", err)
	}
	if err := s.Release(actx, g); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{names[0], names[fenceetcd.MaxTxnOps-1], names[fenceetcd.MaxTxnOps], names[len(names)-1]} {
		if v, _, ok := f.get(t, f.layout(t).Lease(n)); ok {
			t.Fatalf("%s held (by %q) after the failed call", n, v)
		}
	}
	if got := f.snapshot(t); strings.Contains(got, "shard-") {
		t.Fatalf("keys left after the failed call:\n%s", got)
	}
}

// TestAcquireAllSessionSet: a SessionSet on a store with shared leases
// acquires 100 names with one transaction and renews them.
func TestAcquireAllSessionSet(t *testing.T) {
	f := newFixture(t)
	cli, rc := countingClient(t)
	s := sharedStore(t, f, cli)
	set, err := leasecore.NewSessionSet(s, "holder-a", leasecore.WithTTL(5*time.Second), leasecore.WithRenewInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := allNames("shard", 100)
	rc.take()
	tokens, errs, err := set.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.take(); got != "LeaseGrant Txn" {
		t.Fatalf("calls %q, want one LeaseGrant and one Txn", got)
	}
	for i := range names {
		if errs[i] != nil || tokens[i] != tokens[0] || !set.Valid(names[i]) {
			t.Fatalf("%s: %d, %v", names[i], tokens[i], errs[i])
		}
	}
	if err := set.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.snapshot(t); strings.Contains(got, "shard-") {
		t.Fatalf("keys left after Close:\n%s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
