package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

// newFence returns the fence of the fixture's resource pool's driver,
// with opts.
func (f *fixture) newFence(t *testing.T, opts ...fencepg.Option) pgopen.Fence {
	t.Helper()
	fence, err := f.resPool.Fence(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return fence
}

// fencedWrite writes one row-less transaction under claim c through the
// fence's full transaction path (RunTx): a real fenced write.
func fencedWrite(ctx context.Context, fence pgopen.Fence, c leasecore.Claim) (leasecore.Result, error) {
	if fence.Pgx != nil {
		return fence.Pgx.RunTx(ctx, c, func(pgx.Tx) error { return nil })
	}
	return fence.SQL.RunTx(ctx, c, func(*sql.Tx) error { return nil })
}

// wantArgError fails unless err wraps leasecore.ErrInvalidArgument and
// names field.
func wantArgError(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ae *leasecore.ArgError
	if !errors.Is(err, leasecore.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != field {
		t.Errorf("%s: err = %v, want a *leasecore.ArgError for field %q", what, err, field)
	}
}

// TestLeaseStoreList: List reports every lease row in name order with
// Inspect's fields — held with the remaining time by the database clock,
// released, expired — and honours its limit; a bad limit is refused
// before anything is sent.
func TestLeaseStoreList(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		if got, err := f.leases.List(ctx, 10); err != nil || len(got) != 0 {
			t.Fatalf("List of no leases = %v, %v; want none", got, err)
		}
		held, err := f.leases.Acquire(ctx, "b-held", "holder-b", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := f.leases.Acquire(ctx, "a-released", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.leases.Release(ctx, rel); err != nil {
			t.Fatal(err)
		}
		if _, err := f.leases.Acquire(ctx, "c-expired", "holder-c", 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)

		got, err := f.leases.List(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, st := range got {
			names = append(names, st.Name)
			want, err := f.leases.Inspect(ctx, st.Name)
			if err != nil {
				t.Fatal(err)
			}
			// Remaining is read at two moments: compare it apart.
			if st.Remaining > want.Remaining+time.Second || want.Remaining > st.Remaining {
				t.Errorf("%s: List remaining %v, Inspect later %v", st.Name, st.Remaining, want.Remaining)
			}
			st.Remaining, want.Remaining = 0, 0
			if st != want {
				t.Errorf("List entry %+v, Inspect %+v", st, want)
			}
		}
		if strings.Join(names, ",") != "a-released,b-held,c-expired" {
			t.Errorf("List names = %v, want a-released,b-held,c-expired (name order)", names)
		}
		if len(got) == 3 {
			if b := got[1]; !b.Held || b.Holder != "holder-b" || b.Token != held.Token || b.Remaining <= 50*time.Second {
				t.Errorf("held lease listed as %+v, want held by holder-b with token %d and about 1m left", b, held.Token)
			}
			if a := got[0]; a.Held || !a.Released || a.Remaining != 0 {
				t.Errorf("released lease listed as %+v", a)
			}
			if c := got[2]; c.Held || c.Released || c.Remaining != 0 {
				t.Errorf("expired lease listed as %+v", c)
			}
		}
		if two, err := f.leases.List(ctx, 2); err != nil || len(two) != 2 || two[1].Name != "b-held" {
			t.Errorf("List(2) = %+v, %v; want the first two names", two, err)
		}
		for _, limit := range []int{0, -1, fencepg.MaxList + 1} {
			_, err := f.leases.List(ctx, limit)
			wantArgError(t, fmt.Sprintf("List(%d)", limit), err, "limit")
		}
	})
}

// TestTakeOver: TakeOver ends the current holding period at once with a
// token one above it, reports the state it ended, and never deletes the
// row: the old holder's Renew and Release fail with ErrLost, the operator's
// grant releases normally and the next acquire gets a larger token still.
// On a released lease it reports the release; on a new name it issues
// token 1. Concurrent take-overs each end exactly the holding period
// before them (the locking read in the statement). Bad input changes
// nothing.
func TestTakeOver(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		a, err := f.leases.Acquire(ctx, "job", "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		op, prev, err := f.leases.TakeOver(ctx, "job", "operator", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if op.Token != a.Token+1 || op.Holder != "operator" || op.Name != "job" || op.TTL != 10*time.Second {
			t.Errorf("take-over grant %+v, want token %d for operator", op, a.Token+1)
		}
		if !prev.Exists || !prev.Held || prev.Released || prev.Holder != "holder-a" || prev.Token != a.Token ||
			prev.Remaining <= 50*time.Second || prev.Remaining > time.Minute {
			t.Errorf("ended state %+v, want holder-a's held holding period with token %d and about 1m left", prev, a.Token)
		}
		if _, err := f.leases.Renew(ctx, a); !errors.Is(err, leasecore.ErrLost) {
			t.Errorf("the old holder's renew after the take-over: %v, want ErrLost", err)
		}
		if err := f.leases.Release(ctx, a); !errors.Is(err, leasecore.ErrLost) {
			t.Errorf("the old holder's release after the take-over: %v, want ErrLost", err)
		}
		if st, err := f.leases.Inspect(ctx, "job"); err != nil || !st.Held || st.Holder != "operator" || st.Token != op.Token {
			t.Errorf("after the take-over Inspect = %+v, %v; want held by operator with token %d", st, err, op.Token)
		}
		if err := f.leases.Release(ctx, op); err != nil {
			t.Fatalf("release of the take-over's grant: %v", err)
		}
		next, err := f.leases.Acquire(ctx, "job", "holder-b", time.Minute)
		if err != nil || next.Token != op.Token+1 {
			t.Fatalf("acquire after the take-over: %+v, %v; want token %d", next, err, op.Token+1)
		}
		if err := f.leases.Release(ctx, next); err != nil {
			t.Fatal(err)
		}

		// A released lease: nothing was held.
		op2, prev, err := f.leases.TakeOver(ctx, "job", "operator", 10*time.Second)
		if err != nil || op2.Token != next.Token+1 || !prev.Exists || prev.Held || !prev.Released || prev.Token != next.Token {
			t.Errorf("take-over of a released lease: %+v, ended %+v, %v", op2, prev, err)
		}
		// A new name: token 1, nothing ended.
		op3, prev, err := f.leases.TakeOver(ctx, "new-name", "operator", 10*time.Second)
		if err != nil || op3.Token != 1 || prev.Exists || prev.Held {
			t.Errorf("take-over of a new name: %+v, ended %+v, %v", op3, prev, err)
		}

		// Concurrent take-overs: tokens are consecutive, and each ended
		// state is the holding period just before it.
		const n = 8
		base, err := f.leases.Inspect(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		type pair struct{ got, ended leasecore.Token }
		var (
			mu    sync.Mutex
			pairs []pair
			wg    sync.WaitGroup
		)
		for i := range n {
			wg.Go(func() {
				g, prev, err := f.leases.TakeOver(ctx, "job", fmt.Sprintf("operator-%d", i), 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				pairs = append(pairs, pair{g.Token, prev.Token})
				mu.Unlock()
			})
		}
		wg.Wait()
		sort.Slice(pairs, func(i, j int) bool { return pairs[i].got < pairs[j].got })
		for i, p := range pairs {
			if want := base.Token + leasecore.Token(i) + 1; p.got != want || p.ended != want-1 {
				t.Errorf("concurrent take-over %d: token %d ending %d, want token %d ending %d", i, p.got, p.ended, want, want-1)
			}
		}

		before := f.snapshot(t)
		for _, tc := range []struct {
			name, holder, field string
			ttl                 time.Duration
		}{
			{"", "operator", "name", time.Second},
			{"job", "", "holder", time.Second},
			{"job", " operator", "holder", time.Second},
			{"job", "operator", "ttl", time.Millisecond},
			{"job\x00", "operator", "name", time.Second},
		} {
			_, _, err := f.leases.TakeOver(ctx, tc.name, tc.holder, tc.ttl)
			wantArgError(t, fmt.Sprintf("TakeOver(%q, %q, %v)", tc.name, tc.holder, tc.ttl), err, tc.field)
		}
		if after := f.snapshot(t); after != before {
			t.Errorf("a refused take-over changed the tables:\nbefore %s\nafter %s", before, after)
		}
	})
}

// TestFloorsAndRejectedAttempts: Floors lists every scope's floor in scope
// order within its limit; RejectedAttempts returns only the rejected
// entries of a scope's log — here a stale holder's real fenced write after
// a newer token passed — even when accepted entries (LogAll) lie between
// them, within Since and Limit.
func TestFloorsAndRejectedAttempts(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		fence := f.newFence(t, fencepg.WithAttemptLog(leasecore.LogAll))
		if got, err := fence.Floors(ctx, 10); err != nil || len(got) != 0 {
			t.Fatalf("Floors of no scopes = %v, %v", got, err)
		}
		start := time.Now()
		for _, c := range []leasecore.Claim{
			{Scope: "invoices", Writer: "holder-a", Token: 1},
			{Scope: "reports", Writer: "holder-x", Token: 5},
			{Scope: "invoices", Writer: "holder-b", Token: 2},
		} {
			if res, err := fencedWrite(ctx, fence, c); err != nil || !res.Accepted {
				t.Fatalf("write %+v: %+v, %v", c, res, err)
			}
		}
		stale := leasecore.Claim{Scope: "invoices", Writer: "holder-a", Token: 1}
		if res, err := fencedWrite(ctx, fence, stale); err != nil || res.Accepted || res.Floor != 2 {
			t.Fatalf("the stale write: %+v, %v; want rejected by floor 2", res, err)
		}
		if res, err := fencedWrite(ctx, fence, leasecore.Claim{Scope: "invoices", Writer: "holder-b", Token: 2}); err != nil || !res.Accepted {
			t.Fatalf("holder-b again: %+v, %v", res, err)
		}

		floors, err := fence.Floors(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(floors) != "[{invoices 2} {reports 5}]" {
			t.Errorf("Floors = %v, want [{invoices 2} {reports 5}]", floors)
		}
		if one, err := fence.Floors(ctx, 1); err != nil || fmt.Sprint(one) != "[{invoices 2}]" {
			t.Errorf("Floors(1) = %v, %v", one, err)
		}

		all, err := fence.Attempts(ctx, leasecore.AttemptQuery{Scope: "invoices", Limit: 100})
		if err != nil || len(all) != 4 {
			t.Fatalf("Attempts = %+v, %v; want 4 entries (LogAll)", all, err)
		}
		rej, err := fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "invoices", Since: start.Add(-time.Minute), Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(rej) != 1 || rej[0].Accepted || rej[0].Writer != "holder-a" || rej[0].Token != 1 || rej[0].Floor != 2 || rej[0].Scope != "invoices" {
			t.Errorf("RejectedAttempts = %+v, want holder-a's token 1 rejected by floor 2", rej)
		}
		if later, err := fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "invoices", Since: time.Now().Add(time.Hour), Limit: 100}); err != nil || len(later) != 0 {
			t.Errorf("RejectedAttempts since an hour ahead = %+v, %v; want none", later, err)
		}
		if none, err := fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "reports", Limit: 1}); err != nil || len(none) != 0 {
			t.Errorf("RejectedAttempts of a scope without rejections = %+v, %v", none, err)
		}
		_, err = fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "invoices", Limit: 0})
		wantArgError(t, "RejectedAttempts with limit 0", err, "limit")
		_, err = fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: "", Limit: 1})
		wantArgError(t, "RejectedAttempts without a scope", err, "scope")
		_, err = fence.Floors(ctx, 0)
		wantArgError(t, "Floors(0)", err, "limit")
	})
}

// TestOperatorReadsInSchema: List, TakeOver, Floors and RejectedAttempts
// work on tables in a schema of WithSchema, and see nothing of the
// default schema's.
func TestOperatorReadsInSchema(t *testing.T) {
	f := newFixture(t, pgopen.Pgx)
	ctx := context.Background()
	opt := fencepg.WithSchema("ops_schema")
	leases, err := fencepg.NewLeaseStore(f.leasePool.Pgx, opt)
	if err != nil {
		t.Fatal(err)
	}
	fence := f.newFence(t, opt)
	if err := leases.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fence.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.leases.Acquire(ctx, "default-schema", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("in-schema-%d", time.Now().UnixNano())
	g, _, err := leases.TakeOver(ctx, name, "operator", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got, err := leases.List(ctx, fencepg.MaxList)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, st := range got {
		found = found || (st.Name == name && st.Token == g.Token)
		if st.Name == "default-schema" {
			t.Errorf("List in schema ops_schema shows the default schema's lease")
		}
	}
	if !found {
		t.Errorf("List in schema ops_schema = %+v, want %s", got, name)
	}
	scope := "scope-" + name
	if res, err := fence.Advance(ctx, leasecore.Claim{Scope: scope, Writer: "w", Token: 3}); err != nil || !res.Accepted {
		t.Fatalf("advance: %+v, %v", res, err)
	}
	if res, err := fence.Advance(ctx, leasecore.Claim{Scope: scope, Writer: "stale", Token: 2}); err != nil || res.Accepted {
		t.Fatalf("stale advance: %+v, %v", res, err)
	}
	floors, err := fence.Floors(ctx, fencepg.MaxList)
	if err != nil || !strings.Contains(fmt.Sprint(floors), "{"+scope+" 3}") {
		t.Errorf("Floors in schema = %v, %v", floors, err)
	}
	rej, err := fence.RejectedAttempts(ctx, leasecore.AttemptQuery{Scope: scope, Limit: 10})
	if err != nil || len(rej) != 1 || rej[0].Writer != "stale" {
		t.Errorf("RejectedAttempts in schema = %+v, %v", rej, err)
	}
}
