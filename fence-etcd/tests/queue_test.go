package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The waiting line (AcquireQueued): a Release hands the lease to the first
// waiter in its own transaction.

// queued is one AcquireQueued call running in the background.
type queued struct {
	done chan struct{}
	g    leasecore.Grant
	err  error
}

func acquireQueued(ctx context.Context, s *fenceetcd.LeaseStore, name, holder string, ttl time.Duration) *queued {
	q := &queued{done: make(chan struct{})}
	go func() {
		defer close(q.done)
		q.g, q.err = s.AcquireQueued(ctx, name, holder, ttl)
	}()
	return q
}

// joinLine starts holder's AcquireQueued of name through s, as
// acquireQueued, and returns once the line holds it alone.
func (f *fixture) joinLine(ctx context.Context, t *testing.T, s *fenceetcd.LeaseStore, name, holder string, ttl time.Duration) *queued {
	t.Helper()
	q := acquireQueued(ctx, s, name, holder, ttl)
	f.waitLine(t, name, holder)
	return q
}

// result waits for the call's result.
func (q *queued) result(t *testing.T) (leasecore.Grant, error) {
	t.Helper()
	select {
	case <-q.done:
		return q.g, q.err
	case <-time.After(20 * time.Second):
		t.Fatal("AcquireQueued did not return within 20s")
		return leasecore.Grant{}, nil
	}
}

// pending fails the test when the call has returned.
func (q *queued) pending(t *testing.T, what string) {
	t.Helper()
	select {
	case <-q.done:
		t.Fatalf("%s: AcquireQueued returned %+v, %v; want it waiting", what, q.g, q.err)
	default:
	}
}

// handedOver waits for the call's grant and fails the test unless it is
// holder's, with a token above after.
func (q *queued) handedOver(t *testing.T, holder string, after leasecore.Token) leasecore.Grant {
	t.Helper()
	g, err := q.result(t)
	if err != nil || g.Holder != holder || g.Token <= after {
		t.Fatalf("AcquireQueued: %+v, %v; want %s's grant with a token above %d", g, err, holder, after)
	}
	return g
}

// cancelled ends the call's context with cancel and fails the test unless
// the call returns context.Canceled.
func (q *queued) cancelled(t *testing.T, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	if _, err := q.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireQueued after cancel: %v; want context.Canceled", err)
	}
}

// line returns the holders waiting in name's line, first first.
func (f *fixture) line(t *testing.T, name string) []string {
	t.Helper()
	resp, err := f.cli.Get(context.Background(), f.layout(t).QueuePrefix(name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out
}

// waitLine waits until name's line is want.
func (f *fixture) waitLine(t *testing.T, name string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := f.line(t, name)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("line of %q: %q; want %q", name, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaseStore returns a lease store under the fixture's prefix on cli (on
// a client of its own when cli is nil), with shared leases or not, closed
// when the test ends.
func (f *fixture) leaseStore(t *testing.T, cli *clientv3.Client, shared bool) *fenceetcd.LeaseStore {
	t.Helper()
	if cli == nil {
		cli = etcdtest.Client(t)
	}
	opts := []fenceetcd.Option{fenceetcd.WithPrefix(f.prefix)}
	if shared {
		opts = append(opts, fenceetcd.WithSharedLeases())
	}
	s, err := fenceetcd.NewLeaseStore(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wantHeld fails the test unless lease name's key holds holder with token
// as its mod revision.
func (f *fixture) wantHeld(t *testing.T, name, holder string, token leasecore.Token) {
	t.Helper()
	if v, rev, ok := f.get(t, f.layout(t).Lease(name)); !ok || v != holder || leasecore.Token(rev) != token {
		t.Fatalf("the key of %q: %q, mod revision %d, present %v; want %s's, token %d", name, v, rev, ok, holder, token)
	}
}

// releaseFrees releases g through s and fails the test unless that frees
// the lease: nobody in line, the key gone.
func (f *fixture) releaseFrees(t *testing.T, s *fenceetcd.LeaseStore, g leasecore.Grant) {
	t.Helper()
	f.waitLine(t, g.Name)
	if err := s.Release(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	waitGone(t, f, g.Name)
}

// forBothModes runs run without and with shared leases; store makes a
// lease store of the mode on cli (nil: a client of its own), closed at the
// end.
func forBothModes(t *testing.T, run func(t *testing.T, f *fixture, shared bool, store func(cli *clientv3.Client) *fenceetcd.LeaseStore)) {
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-acquire", true: "shared"}[shared], func(t *testing.T) {
			f := newFixture(t)
			run(t, f, shared, func(cli *clientv3.Client) *fenceetcd.LeaseStore { return f.leaseStore(t, cli, shared) })
		})
	}
}

// TestAcquireQueuedHandOver: the waiters get the lease in the order they
// joined the line, each from the previous holder's Release, with a token
// larger than the previous one that is the key's mod revision; the
// previous holder has lost it. The first Release, whose store does not know
// the line, reads it after a failed compare; the second, through the store
// that got the lease handed over with the line behind it, sends one
// transaction.
func TestAcquireQueuedHandOver(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		const name = "report-job"
		cliA, rc := countingClient(t)
		a := f.leaseStore(t, cliA, false)
		ga, err := a.Acquire(ctx, name, "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		cliB, rcB := countingClient(t)
		b, c := store(cliB), store(nil)
		qb := acquireQueued(ctx, b, name, "holder-b", time.Minute)
		f.waitLine(t, name, "holder-b")
		qc := acquireQueued(ctx, c, name, "holder-c", time.Minute)
		f.waitLine(t, name, "holder-b", "holder-c")
		qb.pending(t, "while holder-a holds")

		rc.take()
		before := time.Now()
		if err := a.Release(ctx, ga); err != nil {
			t.Fatal(err)
		}
		// The release's compare fails on the line; one read; the hand-over.
		if got := rc.take(); got != "Txn Txn Txn LeaseRevoke" {
			t.Errorf("Release with a line unknown to the store: calls %q, want %q", got, "Txn Txn Txn LeaseRevoke")
		}
		gb := qb.handedOver(t, "holder-b", ga.Token)
		if gb.TTL != time.Minute {
			t.Fatalf("handed-over grant's TTL %v, want the waiter's %v", gb.TTL, time.Minute)
		}
		f.wantHeld(t, name, "holder-b", gb.Token)
		if gb.Start.After(before) || before.Sub(gb.Start) > time.Minute/3+5*time.Second {
			t.Fatalf("handed-over grant's Start %v: want before the release (%v), within TTL/3 of it", gb.Start, before)
		}
		if st, err := f.leases.Inspect(ctx, name); err != nil || st.Holder != "holder-b" || st.Token != gb.Token {
			t.Fatalf("Inspect: %+v, %v; want holder-b with token %d", st, err, gb.Token)
		}
		f.waitLine(t, name, "holder-c")
		qc.pending(t, "while holder-b holds")
		superseded := fmt.Sprintf("token %d was superseded by token %d (holder %q)", ga.Token, gb.Token, "holder-b")
		_, err = a.Renew(ctx, ga)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", superseded)
		err = a.Release(ctx, ga)
		backendtest.WantHold(t, err, leasecore.ErrLost, "release", superseded)
		if gb, err = b.Renew(ctx, gb); err != nil {
			t.Fatalf("Renew of the handed-over grant: %v", err)
		}

		rcB.take()
		if err := b.Release(ctx, gb); err != nil {
			t.Fatal(err)
		}
		want := "Txn" // the hand-over to the waiter b saw behind it
		if !shared {
			want += " LeaseRevoke"
		}
		if got := rcB.take(); got != want {
			t.Errorf("Release through the store that got the lease handed over: calls %q, want %q", got, want)
		}
		gc := qc.handedOver(t, "holder-c", gb.Token)
		f.releaseFrees(t, c, gc)
	})
}

// TestReleaseAfterRenewHandsOverInOneWrite: a holder that renewed since
// somebody joined the line knows who waits first (Renew reads the line
// with the key), so its Release hands the lease over in one transaction.
func TestReleaseAfterRenewHandsOverInOneWrite(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		cli, rc := countingClient(t)
		a := store(cli)
		ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		q := f.joinLine(ctx, t, store(nil), "job", "holder-b", time.Minute)
		if ga, err = a.Renew(ctx, ga); err != nil {
			t.Fatal(err)
		}
		rc.take()
		if err := a.Release(ctx, ga); err != nil {
			t.Fatal(err)
		}
		want := "Txn"
		if !shared {
			want += " LeaseRevoke"
		}
		if got := rc.take(); got != want {
			t.Errorf("Release after a Renew that saw the line: calls %q, want %q", got, want)
		}
		q.handedOver(t, "holder-b", ga.Token)
	})
}

// TestAcquireQueuedFree: a free lease is acquired at once, with nobody in
// line afterwards.
func TestAcquireQueuedFree(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		s := store(nil)
		g, err := s.AcquireQueued(ctx, "free", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		f.wantHeld(t, "free", "holder-a", g.Token)
		f.releaseFrees(t, s, g)
	})
}

// TestAcquireQueuedLeavesOnCancel: a waiter whose context ends returns the
// context's error and leaves the line; the holder's Release then frees the
// lease instead of handing it over.
func TestAcquireQueuedLeavesOnCancel(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		a, b := store(nil), store(nil)
		ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		qctx, cancel := context.WithCancel(ctx)
		q := acquireQueued(qctx, b, "job", "holder-b", time.Minute)
		f.waitLine(t, "job", "holder-b")
		q.cancelled(t, cancel)
		f.releaseFrees(t, a, ga)
	})
}

// TestAcquireQueuedEndsOnClose: Close of the waiter's store ends its wait
// with ErrStoreClosed, and the waiter leaves the line, so the holder's
// Release frees the lease instead of handing it to a store that is gone.
// A WaitFree through that store ends the same way.
func TestAcquireQueuedEndsOnClose(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		a, b := store(nil), store(nil)
		ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		q := f.joinLine(ctx, t, b, "job", "holder-b", time.Minute)
		free := waitAsync(ctx, b, "job")
		time.Sleep(100 * time.Millisecond) // let WaitFree reach its watch
		q.pending(t, "before Close")
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := q.result(t); !errors.Is(err, fenceetcd.ErrStoreClosed) {
			t.Fatalf("AcquireQueued after Close: %v; want ErrStoreClosed", err)
		}
		select {
		case err := <-free:
			if !errors.Is(err, fenceetcd.ErrStoreClosed) {
				t.Fatalf("WaitFree after Close: %v; want ErrStoreClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WaitFree did not return within 10s of Close")
		}
		f.releaseFrees(t, a, ga)
	})
}

// TestAcquireQueuedAfterExpiry: a holder that stops renewing loses the
// lease at expiry, and the waiter, woken by the lessor's delete, gets it
// with a larger token.
func TestAcquireQueuedAfterExpiry(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		a, b := store(nil), store(nil)
		ga, err := a.Acquire(ctx, "job", "holder-a", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		q := f.joinLine(ctx, t, b, "job", "holder-b", time.Minute)
		gb := q.handedOver(t, "holder-b", ga.Token)
		_, err = a.Renew(ctx, ga)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew",
			fmt.Sprintf("token %d was superseded by token %d (holder %q)", ga.Token, gb.Token, "holder-b"))
		f.waitLine(t, "job")
	})
}

// TestAcquireQueuedRejoins: a waiter whose etcd lease is gone (as after a
// pause longer than its TTL) is out of line; it notices at its next
// keep-alive, joins the line again, and gets the lease handed over.
func TestAcquireQueuedRejoins(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.leaseStore(t, nil, false)
	b := f.leaseStore(t, nil, false)
	ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	q := f.joinLine(ctx, t, b, "job", "holder-b", 3*time.Second)
	resp, err := f.cli.Get(ctx, f.layout(t).QueuePrefix("job"), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("line: %v, %v", resp, err)
	}
	first := resp.Kvs[0]
	if _, err := f.cli.Revoke(ctx, clientv3.LeaseID(first.Lease)); err != nil {
		t.Fatal(err)
	}
	// Back in line within a keep-alive interval (TTL/3 = 1 s), on a new lease.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := f.cli.Get(ctx, f.layout(t).QueuePrefix("job"), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && resp.Kvs[0].Lease != first.Lease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("line after the waiter's etcd lease was revoked: %v; want it back on a new lease", resp.Kvs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	q.pending(t, "back in line")
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	gb := q.handedOver(t, "holder-b", ga.Token)
	if _, err := b.Renew(ctx, gb); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseWithTheKnownWaiterGone: the holder's store knew who waited
// behind it, but that waiter left: the hand-over's compare fails, a read
// finds the line empty, and the lease is freed.
func TestReleaseWithTheKnownWaiterGone(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx := context.Background()
		a, b, c := store(nil), store(nil), store(nil)
		ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		qb := f.joinLine(ctx, t, b, "job", "holder-b", time.Minute)
		cctx, cancel := context.WithCancel(ctx)
		qc := acquireQueued(cctx, c, "job", "holder-c", time.Minute)
		f.waitLine(t, "job", "holder-b", "holder-c")
		if err := a.Release(ctx, ga); err != nil {
			t.Fatal(err)
		}
		gb := qb.handedOver(t, "holder-b", ga.Token)
		qc.cancelled(t, cancel)
		f.releaseFrees(t, b, gb)
	})
}

// TestCampaignWaitsInLine: leasecore.Campaign on fence-etcd waits in line
// (AcquireQueued): three campaigners that each lead three short terms get
// nine terms, one at a time, with tokens increasing in the order they led,
// each term handed over by the previous leader's release (no retry, no
// poll).
func TestCampaignWaitsInLine(t *testing.T) {
	forBothModes(t, func(t *testing.T, f *fixture, shared bool, store func(*clientv3.Client) *fenceetcd.LeaseStore) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		type term struct {
			holder     string
			token      leasecore.Token
			start, end time.Time
		}
		var (
			mu      sync.Mutex
			terms   []term
			active  int
			overlap bool
			retries int
		)
		var wg sync.WaitGroup
		for i := range 3 {
			s := store(nil)
			holder := fmt.Sprintf("campaigner-%d", i)
			wg.Go(func() {
				for range 3 {
					err := leasecore.Campaign(ctx, s, "leader", holder, func(ctx context.Context, g leasecore.Grant) error {
						mu.Lock()
						active++
						overlap = overlap || active > 1
						terms = append(terms, term{holder: holder, token: g.Token, start: time.Now()})
						k := len(terms) - 1
						mu.Unlock()
						time.Sleep(30 * time.Millisecond)
						mu.Lock()
						active--
						terms[k].end = time.Now()
						mu.Unlock()
						return nil
					}, leasecore.WithSessionOptions(leasecore.WithTTL(10*time.Second)),
						leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) {
							if ev.Kind == leasecore.CampaignRetry {
								mu.Lock()
								retries++
								mu.Unlock()
							}
						}))
					if err != nil {
						t.Errorf("%s: Campaign: %v", holder, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if overlap {
			t.Fatal("two lead functions ran at once")
		}
		if len(terms) != 9 || retries != 0 {
			t.Fatalf("%d terms, %d retries; want 9 terms, no retry", len(terms), retries)
		}
		for i := 1; i < len(terms); i++ {
			if terms[i].token <= terms[i-1].token || terms[i].start.Before(terms[i-1].end) {
				t.Fatalf("term %d (%s token %d from %v) after term %d (%s token %d until %v)", i, terms[i].holder, terms[i].token,
					terms[i].start, i-1, terms[i-1].holder, terms[i-1].token, terms[i-1].end)
			}
		}
		f.waitLine(t, "leader")
		waitGone(t, f, "leader")
	})
}

// TestWaitFreeSeesAHandOver: a Release that hands the lease over ends the
// holding period WaitFree waits on, though the key is put, not deleted:
// WaitFree returns at once, not at the holder's expiry, and so does
// leasecore.Observe's wait, which reports the new holder.
func TestWaitFreeSeesAHandOver(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.leaseStore(t, nil, false)
	ga, err := f.leases.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	q := f.joinLine(ctx, t, b, "job", "holder-b", time.Minute)

	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	states := make(chan leasecore.LeaseState, 4)
	observed := make(chan error, 1)
	go func() {
		observed <- leasecore.Observe(octx, f.leases, "job", func(st leasecore.LeaseState) { states <- st })
	}()
	if st := <-states; st.Holder != "holder-a" {
		t.Fatalf("Observe's first state: %+v; want holder-a", st)
	}
	waited := make(chan error, 1)
	go func() { waited <- f.leases.WaitFree(ctx, "job") }()
	time.Sleep(100 * time.Millisecond) // WaitFree reads, then watches
	released := time.Now()
	if err := f.leases.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitFree did not return within 10s of the hand-over (the TTL is a minute)")
	}
	gb, err := q.result(t)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-states:
		if st.Holder != "holder-b" || st.Token != gb.Token {
			t.Fatalf("Observe after the hand-over: %+v; want holder-b with token %d", st, gb.Token)
		}
		t.Logf("Observe reported the hand-over %v after the release", time.Since(released).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("Observe did not report the hand-over within 10s (the TTL is a minute)")
	}
	cancel()
	if err := <-observed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe: %v", err)
	}
}

// TestAcquireQueuedAcrossItsChecks: a waiter reads the key once per TTL in
// case a notification was missed, and watches again from that read; it is
// still in line, and handed the lease, after a few such checks.
func TestAcquireQueuedAcrossItsChecks(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	b := f.leaseStore(t, nil, false)
	ga, err := f.leases.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second // a check every 2-2.5 s, a keep-alive every 667 ms
	q := f.joinLine(ctx, t, b, "job", "holder-b", ttl)
	time.Sleep(2*ttl + time.Second)
	q.pending(t, "after two checks")
	f.waitLine(t, "job", "holder-b")
	if err := f.leases.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	q.handedOver(t, "holder-b", ga.Token)
}

// TestReleaseReadFailsWithAWaiter: a Release whose delete fails its compare
// on the line and whose read of the key and the line then fails returns the
// read's error, not leasecore.ErrLost, and changes nothing: the key is
// still the grant's, and the waiter still in line. Released again once the
// read works, the lease is handed over.
func TestReleaseReadFailsWithAWaiter(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli, failRead := failingReadsClient(t)
	a := f.leaseStore(t, cli, false)
	ga, err := a.Acquire(ctx, "job", "holder-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	q := f.joinLine(ctx, t, f.leases, "job", "holder-b", time.Minute)
	failRead.Store(true)
	err = a.Release(ctx, ga)
	failRead.Store(false)
	if !errors.Is(err, leasecore.ErrUnavailable) || errors.Is(err, leasecore.ErrLost) {
		t.Fatalf("Release with the read failing: %v; want ErrUnavailable, not ErrLost", err)
	}
	if st, err := f.leases.Inspect(ctx, "job"); err != nil || st.Holder != "holder-a" || st.Token != ga.Token {
		t.Fatalf("after the failed Release: %+v, %v; want holder-a still holding token %d", st, err, ga.Token)
	}
	f.waitLine(t, "job", "holder-b")
	if err := a.Release(ctx, ga); err != nil {
		t.Fatal(err)
	}
	q.handedOver(t, "holder-b", ga.Token)
}
