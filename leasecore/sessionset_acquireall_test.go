package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
	"github.com/leasefence/leasefence/leasecore/internal/testcheck"
)

// batchSpy is spyLease with a backendkit.BatchAcquirer: AcquireAll acquires
// each name from the in-memory service, recording the names of every call.
type batchSpy struct {
	*spyLease
	acquireAlls atomic.Int64

	// Set before the set is used.
	beforeAll func(ctx context.Context, names []string) error // non-nil error: the call's err
	afterAll  func(ctx context.Context)
	backdate  time.Duration // dates every grant's Start this much before the call

	mu    sync.Mutex
	calls [][]string
}

var _ backendkit.BatchAcquirer = (*batchSpy)(nil)

func (b *batchSpy) AcquireAll(ctx context.Context, names []string, holder string, ttl time.Duration) ([]leasecore.Grant, []error, error) {
	b.acquireAlls.Add(1)
	b.mu.Lock()
	b.calls = append(b.calls, slices.Clone(names))
	b.mu.Unlock()
	if err := backendkit.CheckAcquireAll(ctx, names, holder, ttl, time.Millisecond); err != nil {
		return nil, nil, err
	}
	if b.beforeAll != nil {
		if err := b.beforeAll(ctx, names); err != nil {
			return nil, nil, err
		}
	}
	gs, errs := make([]leasecore.Grant, len(names)), make([]error, len(names))
	for i, n := range names {
		gs[i], errs[i] = b.Leases.Acquire(ctx, n, holder, ttl)
		if errs[i] == nil && b.backdate > 0 {
			gs[i].Start = time.Now().Add(-b.backdate)
		}
	}
	if b.afterAll != nil {
		b.afterAll(ctx)
	}
	return gs, errs, nil
}

func (b *batchSpy) allCalls() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

// newSetOn returns a set for holder-a on lease, on the fixture's local
// clock with the teaching parameters, closed when the test ends, once its
// renewal goroutine has armed its first tick.
func (f *fixture) newSetOn(t *testing.T, lease leasecore.Lease) *leasecore.SessionSet {
	t.Helper()
	set, err := leasecore.NewSessionSet(lease, "holder-a", leasecore.WithClock(f.local), leasecore.WithTTL(testTTL),
		leasecore.WithMargin(testMargin), leasecore.WithRenewInterval(testInterval))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set.Close(context.Background()) })
	f.local.WaitTimers(t, 1)
	return set
}

func shardNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("shard-%d", i)
	}
	return names
}

// Bad input is refused before anything is sent, with the field named; the
// set is unchanged.
func TestSessionSetAcquireAllBadInput(t *testing.T) {
	f := newFixture(false)
	b := &batchSpy{spyLease: f.spy}
	set := f.newSetOn(t, b)
	for _, tc := range []struct {
		name, field string
		names       []string
	}{
		{"none", "names", nil},
		{"too many", "names", shardNames(backendkit.MaxAcquireAll + 1)},
		{"empty name", "names[1]", []string{"shard-0", ""}},
		{"control character", "names[0]", []string{"shard\n0"}},
		{"repeated", "names[1]", []string{"shard-0", "shard-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens, errs, err := set.AcquireAll(context.Background(), tc.names)
			testcheck.WantArgError(t, err, "acquire all", tc.field)
			if tokens != nil || errs != nil {
				t.Errorf("tokens %v, errs %v with a call error", tokens, errs)
			}
		})
	}
	if n, m := b.acquireAlls.Load(), f.spy.acquires.Load(); n != 0 || m != 0 {
		t.Errorf("bad input sent %d AcquireAll and %d Acquire calls", n, m)
	}
	if names := set.Names(); len(names) != 0 {
		t.Errorf("the set holds %v", names)
	}
}

// With a BatchAcquirer, one AcquireAll carries every name the set does not
// hold yet; a name it holds keeps its token, a name another holder has is
// refused with ErrHeld and stays that holder's, the others join the set
// with their own tokens and are renewed with it.
func TestSessionSetAcquireAllOneBatch(t *testing.T) {
	f := newFixture(false)
	b := &batchSpy{spyLease: f.spy}
	set := f.newSetOn(t, b)
	ctx := context.Background()

	// shard-0 is the set's already, with token 2 (it was held once before).
	g, err := f.leases.Acquire(ctx, "shard-0", "holder-x", testTTL)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if tok, err := set.Acquire(ctx, "shard-0"); err != nil || tok != 2 {
		t.Fatalf("Acquire(shard-0) = %d, %v; want token 2", tok, err)
	}
	if _, err := f.leases.Acquire(ctx, "shard-3", "holder-b", 10*testTTL); err != nil {
		t.Fatal(err)
	}
	acquiresBefore := f.spy.acquires.Load()

	names := shardNames(5)
	tokens, errs, err := set.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if calls := b.allCalls(); len(calls) != 1 || !slices.Equal(calls[0], []string{"shard-1", "shard-2", "shard-3", "shard-4"}) {
		t.Fatalf("AcquireAll calls %q, want one with shard-1..4", calls)
	}
	if n := f.spy.acquires.Load() - acquiresBefore; n != 0 {
		t.Errorf("%d Acquire calls besides the batch", n)
	}
	want := []leasecore.Token{2, 1, 1, 0, 1}
	for i, n := range names {
		switch {
		case n == "shard-3":
			var he *leasecore.HoldError
			if !errors.Is(errs[i], leasecore.ErrHeld) || !errors.As(errs[i], &he) || he.Name != "shard-3" {
				t.Errorf("shard-3: %v, want a HoldError wrapping ErrHeld", errs[i])
			}
		case errs[i] != nil:
			t.Errorf("%s: %v", n, errs[i])
		}
		if tokens[i] != want[i] {
			t.Errorf("%s: token %d, want %d", n, tokens[i], want[i])
		}
	}
	got := set.Names()
	slices.Sort(got)
	if !slices.Equal(got, []string{"shard-0", "shard-1", "shard-2", "shard-4"}) {
		t.Fatalf("the set holds %v", got)
	}
	if st, _ := f.leases.Inspect(ctx, "shard-3"); !st.Held || st.Holder != "holder-b" || st.Token != 1 {
		t.Errorf("shard-3 after the refused acquire: %+v", st)
	}
	for _, n := range got {
		g, ok := set.Grant(n)
		if !ok || !g.Start.Equal(epoch) || g.Holder != "holder-a" || g.TTL != testTTL {
			t.Errorf("%s: grant %+v, want Start at the clock reading before the call (%v)", n, g, epoch)
		}
	}

	// The next RenewAll renews the new names with the old one.
	renewed := make(chan []string, 1)
	f.spy.renewAllHook = func(_ context.Context, gs []leasecore.Grant) error {
		var ns []string
		for _, g := range gs {
			ns = append(ns, g.Name)
		}
		slices.Sort(ns)
		select {
		case renewed <- ns:
		default:
		}
		return nil
	}
	f.local.WaitTimers(t, 2) // the renew tick and the deadline
	f.local.Advance(testInterval)
	select {
	case ns := <-renewed:
		if !slices.Equal(ns, got) {
			t.Errorf("RenewAll renewed %v, want %v", ns, got)
		}
	case <-time.After(realWait):
		t.Fatal("no RenewAll")
	}

	// Everything held already: no request at all.
	tokens, errs, err = set.AcquireAll(ctx, []string{"shard-4", "shard-0"})
	if err != nil || errs[0] != nil || errs[1] != nil || tokens[0] != 1 || tokens[1] != 2 {
		t.Fatalf("AcquireAll of held names = %v, %v, %v", tokens, errs, err)
	}
	if n := b.acquireAlls.Load(); n != 1 {
		t.Errorf("%d AcquireAll calls, want still 1", n)
	}
}

// Without a BatchAcquirer the set acquires name by name, with the same
// results, each with its own clock reading before its request.
func TestSessionSetAcquireAllFallback(t *testing.T) {
	f := newFixture(false)
	set := f.newFakeSet(t) // f.spy: no AcquireAll
	ctx := context.Background()
	if _, ok := any(f.spy).(backendkit.BatchAcquirer); ok {
		t.Fatal("the fixture's spy is a BatchAcquirer")
	}
	if _, err := f.leases.Acquire(ctx, "shard-1", "holder-b", 10*testTTL); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Acquire(ctx, "shard-2"); err != nil {
		t.Fatal(err)
	}
	before := f.spy.acquires.Load()
	var calls atomic.Int64
	f.spy.beforeAcquire = func(context.Context) {
		calls.Add(1)
		f.local.Advance(time.Millisecond) // each request starts 1 ms after the previous one
	}
	names := shardNames(4)
	tokens, errs, err := set.AcquireAll(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.spy.acquires.Load() - before; n != 3 {
		t.Errorf("%d Acquire calls, want 3 (shard-2 is held already)", n)
	}
	if !errors.Is(errs[1], leasecore.ErrHeld) || tokens[1] != 0 {
		t.Errorf("shard-1: %d, %v; want ErrHeld", tokens[1], errs[1])
	}
	for _, i := range []int{0, 2, 3} {
		if errs[i] != nil || tokens[i] != 1 {
			t.Errorf("%s: %d, %v; want token 1", names[i], tokens[i], errs[i])
		}
	}
	// shard-0 was the first request (clock at epoch then), shard-3 the
	// third (2 ms later); shard-2 keeps the grant of its own Acquire.
	for n, want := range map[string]time.Time{"shard-0": epoch, "shard-3": epoch.Add(2 * time.Millisecond), "shard-2": epoch} {
		if g, ok := set.Grant(n); !ok || !g.Start.Equal(want) {
			t.Errorf("%s: grant %+v, want Start %v", n, g, want)
		}
	}
	if set.Valid("shard-1") {
		t.Error("shard-1 is valid in the set")
	}
}

// The deadline rule of Acquire holds for each grant of a batch: the local
// deadline counts from the clock reading before the one AcquireAll; a
// batch that answers at that deadline gives every grant back
// (ErrLocalDeadline), one that answers 1 ns before it keeps them, and
// they end at the deadline unless renewed.
func TestSessionSetAcquireAllLocalDeadline(t *testing.T) {
	t.Run("answer at the deadline", func(t *testing.T) {
		f := newFixture(false)
		b := &batchSpy{spyLease: f.spy}
		set := f.newSetOn(t, b)
		b.afterAll = func(context.Context) { f.local.Advance(testWindow) }
		tokens, errs, err := set.AcquireAll(context.Background(), shardNames(3))
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs {
			if !errors.Is(e, leasecore.ErrLocalDeadline) || tokens[i] != 0 {
				t.Errorf("name %d: %d, %v; want ErrLocalDeadline", i, tokens[i], e)
			}
		}
		if len(set.Names()) != 0 {
			t.Errorf("the set holds %v", set.Names())
		}
		if n := f.spy.releases.Load(); n != 3 {
			t.Errorf("%d releases, want 3 (every grant given back)", n)
		}
		for _, n := range shardNames(3) {
			if st, _ := f.leases.Inspect(context.Background(), n); st.Held {
				t.Errorf("%s: %+v, want released", n, st)
			}
		}
	})
	t.Run("answer 1 ns before it", func(t *testing.T) {
		f := newFixture(false)
		// Every RenewAll fails: only the deadline from the acquire counts.
		f.spy.renewAllHook = func(context.Context, []leasecore.Grant) error { return leasecore.ErrUnavailable }
		b := &batchSpy{spyLease: f.spy}
		set := f.newSetOn(t, b)
		b.afterAll = func(context.Context) { f.local.Advance(testWindow - time.Nanosecond) }
		_, errs, err := set.AcquireAll(context.Background(), shardNames(2))
		if err != nil || errs[0] != nil || errs[1] != nil {
			t.Fatalf("AcquireAll: %v, %v", errs, err)
		}
		if !set.Valid("shard-0") || !set.Valid("shard-1") {
			t.Fatal("not valid 1 ns before the deadline")
		}
		f.local.Advance(time.Nanosecond)
		got := map[string]bool{}
		for range 2 {
			select {
			case l := <-set.Lost():
				if !errors.Is(l.Err, leasecore.ErrLocalDeadline) {
					t.Errorf("lost %+v, want ErrLocalDeadline", l)
				}
				got[l.Name] = true
			case <-time.After(realWait):
				t.Fatalf("lost only %v within %v", got, realWait)
			}
		}
		if !got["shard-0"] || !got["shard-1"] || set.Valid("shard-0") || set.Valid("shard-1") {
			t.Errorf("lost %v; valid %t %t", got, set.Valid("shard-0"), set.Valid("shard-1"))
		}
	})
	t.Run("backdated grants", func(t *testing.T) {
		// A backend that dates its grants back (fenceetcd's shared leases)
		// moves each name's deadline back by as much.
		f := newFixture(false)
		b := &batchSpy{spyLease: f.spy, backdate: 500 * time.Millisecond}
		set := f.newSetOn(t, b)
		if _, errs, err := set.AcquireAll(context.Background(), shardNames(2)); err != nil || errs[0] != nil || errs[1] != nil {
			t.Fatalf("AcquireAll: %v, %v", errs, err)
		}
		for _, n := range shardNames(2) {
			g, _ := set.Grant(n)
			if back := epoch.Sub(g.Start); back > 500*time.Millisecond || back < 490*time.Millisecond {
				t.Errorf("%s: Start %v, %v before the reading before the call; want about 500ms", n, g.Start, back)
			}
		}
	})
}

// A call error of AcquireAll (the backend unavailable) is AcquireAll's
// err: the set is unchanged.
func TestSessionSetAcquireAllCallError(t *testing.T) {
	f := newFixture(false)
	b := &batchSpy{spyLease: f.spy, beforeAll: func(context.Context, []string) error {
		return fmt.Errorf("test: connection refused: %w", leasecore.ErrUnavailable)
	}}
	set := f.newSetOn(t, b)
	tokens, errs, err := set.AcquireAll(context.Background(), shardNames(3))
	if !errors.Is(err, leasecore.ErrUnavailable) || tokens != nil || errs != nil {
		t.Fatalf("AcquireAll = %v, %v, %v; want the call's ErrUnavailable", tokens, errs, err)
	}
	if len(set.Names()) != 0 {
		t.Errorf("the set holds %v", set.Names())
	}
}

// A context done before the call sends nothing; one that ends during the
// fallback's requests fails the names not acquired yet with its error and
// keeps those acquired.
func TestSessionSetAcquireAllContext(t *testing.T) {
	f := newFixture(false)
	b := &batchSpy{spyLease: f.spy}
	set := f.newSetOn(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := set.AcquireAll(ctx, shardNames(2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireAll with a cancelled context: %v", err)
	}
	if n, m := b.acquireAlls.Load(), f.spy.acquires.Load(); n != 0 || m != 0 {
		t.Errorf("a cancelled context sent %d AcquireAll and %d Acquire calls", n, m)
	}

	f2 := newFixture(false)
	plain := f2.newFakeSet(t)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	f2.spy.afterAcquire = func(context.Context) { cancel() } // ends during the first request
	tokens, errs, err := plain.AcquireAll(ctx, shardNames(3))
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || tokens[0] != 1 || !plain.Valid("shard-0") {
		t.Errorf("shard-0: %d, %v; want acquired", tokens[0], errs[0])
	}
	for i := 1; i < 3; i++ {
		if !errors.Is(errs[i], context.Canceled) || tokens[i] != 0 {
			t.Errorf("name %d: %d, %v; want context.Canceled", i, tokens[i], errs[i])
		}
	}
}

// After Close AcquireAll fails with ErrClosed; a Close while the batch is
// in flight gives every grant back (ErrClosed for each name), and no
// goroutine is left.
func TestSessionSetAcquireAllClose(t *testing.T) {
	baseline := runtime.NumGoroutine()
	f := newFixture(false)
	b := &batchSpy{spyLease: f.spy}
	set, err := leasecore.NewSessionSet(b, "holder-a", leasecore.WithClock(f.local), leasecore.WithTTL(testTTL),
		leasecore.WithMargin(testMargin), leasecore.WithRenewInterval(testInterval))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, errs, err := set.AcquireAll(ctx, []string{"kept"}); err != nil || errs[0] != nil {
		t.Fatalf("AcquireAll: %v, %v", errs, err)
	}
	closed := make(chan error, 1)
	b.afterAll = func(context.Context) { closed <- set.Close(ctx) }
	tokens, errs, err := set.AcquireAll(ctx, shardNames(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, e := range errs {
		if !errors.Is(e, leasecore.ErrClosed) || tokens[i] != 0 {
			t.Errorf("name %d: %d, %v; want ErrClosed", i, tokens[i], e)
		}
	}
	for _, n := range append(shardNames(3), "kept") {
		if st, _ := f.leases.Inspect(ctx, n); st.Held {
			t.Errorf("%s after Close: %+v, want released", n, st)
		}
	}
	if _, _, err := set.AcquireAll(ctx, shardNames(1)); !errors.Is(err, leasecore.ErrClosed) {
		t.Errorf("AcquireAll after Close: %v, want ErrClosed", err)
	}
	waitGoroutines(t, baseline)
}
