package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/leasecore"
)

// wantArgError fails unless err wraps leasecore.ErrInvalidArgument and
// names field.
func wantArgError(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ae *leasecore.ArgError
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != field {
		t.Errorf("%s: err = %v, want a *leasecore.ArgError for field %q", what, err, field)
	}
}

// TestLeaseStoreList: List reports every held lease in name order — names
// with a "/" unescaped — with Inspect's fields and the lessor's remaining
// time, shared leases included; released leases have no key and are not
// listed; the limit is honoured and a bad one refused.
func TestLeaseStoreList(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if got, err := f.leases.List(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("List of no leases = %v, %v", got, err)
	}
	shared, err := fenceetcd.NewLeaseStore(f.cli, fenceetcd.WithPrefix(f.prefix), fenceetcd.WithSharedLeases())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.Close() })
	tokens := map[string]leasecore.Token{}
	for _, a := range []struct {
		store        *fenceetcd.LeaseStore
		name, holder string
	}{
		{f.leases, "b-held", "holder-b"}, {f.leases, "a/slash", "holder-a"},
		{shared, "c-shared", "holder-c"}, {shared, "d-shared", "holder-c"},
	} {
		g, err := a.store.Acquire(ctx, a.name, a.holder, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tokens[a.name] = g.Token
	}
	rel, err := f.leases.Acquire(ctx, "e-released", "holder-e", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.leases.Release(ctx, rel); err != nil {
		t.Fatal(err)
	}
	got, err := f.leases.List(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range got {
		names = append(names, st.Name)
		if !st.Exists || !st.Held || st.Token != tokens[st.Name] || st.Remaining < 25*time.Second || st.Remaining > 30*time.Second {
			t.Errorf("listed %+v, want held with token %d and about 30s left", st, tokens[st.Name])
		}
	}
	if strings.Join(names, ",") != "a/slash,b-held,c-shared,d-shared" {
		t.Errorf("List names = %v, want a/slash,b-held,c-shared,d-shared", names)
	}
	if two, err := f.leases.List(ctx, 2); err != nil || len(two) != 2 || two[1].Name != "b-held" {
		t.Errorf("List(2) = %+v, %v", two, err)
	}
	for _, limit := range []int{0, fenceetcd.MaxList + 1} {
		_, err := f.leases.List(ctx, limit)
		wantArgError(t, fmt.Sprintf("List(%d)", limit), err, "limit")
	}
}

// TestTakeOver: TakeOver ends the current holding period at once with a
// new, larger token and reports the state it ended: the old holder's Renew
// and Release fail with ErrLost, the operator's grant releases normally
// and the next acquire gets a larger token still. A free lease is simply
// acquired. No token is below the cluster's TokenCeiling. Bad input
// changes nothing.
func TestTakeOver(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a, err := f.leases.Acquire(ctx, "job", "holder-a", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	op, prev, err := f.leases.TakeOver(ctx, "job", "operator", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if op.Token <= a.Token || op.Holder != "operator" || op.TTL != 10*time.Second {
		t.Errorf("take-over grant %+v, want a token above %d for operator", op, a.Token)
	}
	if !prev.Exists || !prev.Held || prev.Holder != "holder-a" || prev.Token != a.Token || prev.Remaining < 25*time.Second {
		t.Errorf("ended state %+v, want holder-a's holding period with token %d", prev, a.Token)
	}
	if _, err := f.leases.Renew(ctx, a); !errors.Is(err, leasecore.ErrLost) {
		t.Errorf("the old holder's renew after the take-over: %v, want ErrLost", err)
	}
	if err := f.leases.Release(ctx, a); !errors.Is(err, leasecore.ErrLost) {
		t.Errorf("the old holder's release after the take-over: %v, want ErrLost", err)
	}
	if st, err := f.leases.Inspect(ctx, "job"); err != nil || st.Holder != "operator" || st.Token != op.Token {
		t.Errorf("after the take-over Inspect = %+v, %v", st, err)
	}
	ceiling, err := f.leases.TokenCeiling(ctx)
	if err != nil || ceiling < op.Token {
		t.Errorf("TokenCeiling = %d, %v; want at least the take-over's token %d", ceiling, err, op.Token)
	}
	if err := f.leases.Release(ctx, op); err != nil {
		t.Fatalf("release of the take-over's grant: %v", err)
	}
	next, err := f.leases.Acquire(ctx, "job", "holder-b", 30*time.Second)
	if err != nil || next.Token <= op.Token {
		t.Fatalf("acquire after the take-over: %+v, %v; want a token above %d", next, err, op.Token)
	}
	if err := f.leases.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
	free, prev, err := f.leases.TakeOver(ctx, "job", "operator", 10*time.Second)
	if err != nil || free.Token <= next.Token || prev.Exists {
		t.Errorf("take-over of a free lease: %+v, ended %+v, %v", free, prev, err)
	}
	if err := f.leases.Release(ctx, free); err != nil {
		t.Fatal(err)
	}

	before := f.snapshot(t)
	for _, tc := range []struct {
		name, holder, field string
		ttl                 time.Duration
	}{
		{"", "operator", "name", time.Second},
		{"job", "", "holder", time.Second},
		{"job", "operator", "ttl", 1500 * time.Millisecond},
		{"job", "operator", "ttl", 0},
	} {
		_, _, err := f.leases.TakeOver(ctx, tc.name, tc.holder, tc.ttl)
		wantArgError(t, fmt.Sprintf("TakeOver(%q, %q, %v)", tc.name, tc.holder, tc.ttl), err, tc.field)
	}
	if after := f.snapshot(t); after != before {
		t.Errorf("a refused take-over changed the keys:\nbefore %s\nafter %s", before, after)
	}
}

// TestTakeOverRacingAcquirers: acquirers that retry all the time (a
// waiting campaign does, woken by the delete) may take the lease between
// TakeOver's delete and its acquire. Whatever happens, the holding period
// TakeOver read is over, a take-over that succeeded got a token above it,
// and one that lost says ErrHeld and names the winner.
func TestTakeOverRacingAcquirers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for round := range 5 {
		a, err := f.leases.Acquire(ctx, "job", "holder-a", 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var won leasecore.Grant
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if g, err := f.leases.Acquire(ctx, "job", "racer", 30*time.Second); err == nil {
					won = g
					return
				}
			}
		})
		op, prev, err := f.leases.TakeOver(ctx, "job", "operator", 10*time.Second)
		close(stop)
		wg.Wait()
		if prev.Token != a.Token {
			t.Errorf("round %d: ended token %d, want holder-a's %d", round, prev.Token, a.Token)
		}
		switch {
		case err == nil:
			if op.Token <= a.Token {
				t.Errorf("round %d: take-over token %d not above %d", round, op.Token, a.Token)
			}
			if err := f.leases.Release(ctx, op); err != nil {
				t.Fatal(err)
			}
			if won.Token != 0 {
				if err := f.leases.Release(ctx, won); err != nil {
					t.Fatal(err)
				}
			}
		case errors.Is(err, leasecore.ErrHeld):
			if won.Token <= a.Token || !strings.Contains(err.Error(), "racer") {
				t.Errorf("round %d: lost to %+v with %v; want the racer named, with a token above %d", round, won, err, a.Token)
			}
			t.Logf("round %d: the racer took the lease between the delete and the acquire: %v", round, err)
			if err := f.leases.Release(ctx, won); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("round %d: %v", round, err)
		}
		if _, err := f.leases.Renew(ctx, a); !errors.Is(err, leasecore.ErrLost) {
			t.Errorf("round %d: holder-a's renew after the take-over: %v, want ErrLost", round, err)
		}
	}
}

// TestFloorsAndRejectedAttempts: Floors lists every scope's floor in scope
// order within its limit; RejectedAttempts returns only the rejected
// entries — stale holders' real fenced commits after a newer token
// passed — reading past more than a page of accepted entries (LogAll)
// between them; floors stay at or below TokenCeiling unless a token came
// from elsewhere.
func TestFloorsAndRejectedAttempts(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fe := f.newFence(t, logAll)
	if got, err := fe.Floors(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("Floors of no scopes = %v, %v", got, err)
	}
	start := time.Now()
	commit(t, fe, leasecore.Claim{Scope: "reports", Writer: "holder-x", Token: 5}, f.putOwn("r=1"))
	commit(t, fe, leasecore.Claim{Scope: "in/voices", Writer: "holder-a", Token: 1}, f.putOwn("i=1"))
	if res, _ := commit(t, fe, leasecore.Claim{Scope: "in/voices", Writer: "holder-b", Token: 2}, f.putOwn("i=2")); !res.Accepted {
		t.Fatal("holder-b rejected")
	}
	stale := leasecore.Claim{Scope: "in/voices", Writer: "holder-a", Token: 1}
	if res, _ := commit(t, fe, stale, f.putOwn("i=stale")); res.Accepted || res.Floor != 2 {
		t.Fatalf("the stale commit: %+v, want rejected by floor 2", res)
	}
	// More than a page of accepted entries, then one more rejection.
	const accepted = 1005
	for i := range accepted {
		commit(t, fe, leasecore.Claim{Scope: "in/voices", Writer: "holder-b", Token: 2}, f.putOwn(fmt.Sprintf("n=%d", i)))
	}
	if res, _ := commit(t, fe, leasecore.Claim{Scope: "in/voices", Writer: "holder-c", Token: 1}, f.putOwn("i=stale2")); res.Accepted {
		t.Fatal("the second stale commit was accepted")
	}
	if got := f.ownKeys(t); strings.Contains(got, "stale") {
		t.Errorf("a stale holder's key was written: %s", got)
	}

	floors, err := fe.Floors(ctx, 10)
	if err != nil || fmt.Sprint(floors) != "[{in/voices 2} {reports 5}]" {
		t.Errorf("Floors = %v, %v; want [{in/voices 2} {reports 5}]", floors, err)
	}
	if one, err := fe.Floors(ctx, 1); err != nil || fmt.Sprint(one) != "[{in/voices 2}]" {
		t.Errorf("Floors(1) = %v, %v", one, err)
	}
	rej, err := fe.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "in/voices", Since: start.Add(-time.Minute), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rej) != 2 || rej[0].Writer != "holder-a" || rej[0].Token != 1 || rej[0].Floor != 2 || rej[0].Accepted ||
		rej[1].Writer != "holder-c" || rej[1].Floor != 2 {
		t.Errorf("RejectedAttempts = %+v, want holder-a's and holder-c's token 1, rejected by floor 2", rej)
	}
	if first, err := fe.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "in/voices", Limit: 1}); err != nil || len(first) != 1 || first[0].Writer != "holder-a" {
		t.Errorf("RejectedAttempts limit 1 = %+v, %v", first, err)
	}
	if later, err := fe.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "in/voices", Since: time.Now().Add(time.Hour), Limit: 10}); err != nil || len(later) != 0 {
		t.Errorf("RejectedAttempts an hour ahead = %+v, %v", later, err)
	}
	_, err = fe.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "in/voices", Limit: 0})
	wantArgError(t, "RejectedAttempts limit 0", err, "limit")
	_, err = fe.Floors(ctx, 0)
	wantArgError(t, "Floors(0)", err, "limit")

	ceiling, err := f.leases.TokenCeiling(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := fe.Advance(ctx, leasecore.Claim{Scope: "mixed-up", Writer: "w", Token: ceiling + 1_000_000}); err != nil || !res.Accepted {
		t.Fatalf("advance above the ceiling: %+v, %v", res, err)
	}
	if c2, err := f.leases.TokenCeiling(ctx); err != nil || c2 >= ceiling+1_000_000 {
		t.Errorf("TokenCeiling after the advance = %d, %v; want it below the made-up floor", c2, err)
	}
}
