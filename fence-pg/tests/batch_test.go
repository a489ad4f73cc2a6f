package fencepg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance/backendtest"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

func TestWriteBatch(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		batch := func(writer string, token leasecore.Token, parts ...string) leasecore.Result {
			t.Helper()
			b := leasecore.Batch{Scope: "daily-report", Writer: writer, Token: token}
			for _, p := range parts {
				b.Parts = append(b.Parts, leasecore.PartContent{Part: p, Content: p + " by " + writer})
			}
			res, err := f.res.WriteBatch(ctx, b)
			if err != nil {
				t.Fatalf("batch by %s: %v", writer, err)
			}
			return res
		}
		backendtest.WantResult(t, "first batch (new scope)", batch("holder-b", 2, "summary", "detail"), true, 2)
		backendtest.WantPart(t, f.res, "daily-report", "summary", "summary by holder-b", "holder-b", 2)
		backendtest.WantPart(t, f.res, "daily-report", "detail", "detail by holder-b", "holder-b", 2)
		// All or none: a stale batch stores no part, not even a new one.
		backendtest.WantResult(t, "stale batch", batch("holder-a", 1, "summary", "extra"), false, 2)
		backendtest.WantPart(t, f.res, "daily-report", "summary", "summary by holder-b", "holder-b", 2)
		backendtest.WantPart(t, f.res, "daily-report", "extra", "", "", 0)
		backendtest.WantResult(t, "equal token again", batch("holder-b", 2, "detail"), true, 2)
		log, err := f.res.Attempts(ctx, "daily-report")
		if err != nil {
			t.Fatal(err)
		}
		if len(log) != 5 || log[2].Accepted || log[3].Accepted || log[3].Part != "extra" {
			t.Fatalf("attempts: %+v, want one per part, the stale ones rejected", log)
		}
		// Bad input writes nothing.
		before := f.snapshot(t)
		_, err = f.res.WriteBatch(ctx, leasecore.Batch{Scope: "daily-report", Writer: "holder-b", Token: 3,
			Parts: []leasecore.PartContent{{Part: "summary"}, {Part: "summary"}}})
		if !errors.Is(err, leasecore.ErrInvalidArgument) || !strings.Contains(err.Error(), "parts[1].part") {
			t.Fatalf("duplicate part: %v", err)
		}
		if after := f.snapshot(t); after != before {
			t.Fatalf("a rejected batch changed the tables:\n%s\n---\n%s", before, after)
		}
	})
}

func TestRenewAll(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		var gs []leasecore.Grant
		for _, name := range []string{"shard-1", "shard-2", "shard-3", "shard-4"} {
			g, err := f.leases.Acquire(ctx, name, "holder-a", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			gs = append(gs, g)
		}
		if err := f.leases.Release(ctx, gs[1]); err != nil {
			t.Fatal(err)
		}
		taken, err := f.leases.Acquire(ctx, "shard-2", "holder-b", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		short := gs[3]
		short.TTL = 30 * time.Millisecond // each grant keeps its own TTL
		gs[3] = short
		renewed, lost, err := f.leases.RenewAll(ctx, gs)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{0, 2, 3} {
			if lost[i] != nil || renewed[i].Token != gs[i].Token || renewed[i].Start.IsZero() {
				t.Errorf("grant %d: renewed %+v lost %v", i, renewed[i], lost[i])
			}
		}
		if !errors.Is(lost[1], leasecore.ErrLost) || !strings.Contains(lost[1].Error(), "superseded by token 2") {
			t.Errorf("taken-over shard: %v", lost[1])
		}
		if st, _ := f.leases.Inspect(ctx, "shard-2"); st.Holder != "holder-b" || st.Token != taken.Token || !st.Held {
			t.Errorf("RenewAll touched holder-b's lease: %+v", st)
		}
		time.Sleep(60 * time.Millisecond)
		if st, _ := f.leases.Inspect(ctx, "shard-4"); st.Held {
			t.Errorf("shard-4 renewed with the wrong TTL: %+v", st)
		}
		if st, _ := f.leases.Inspect(ctx, "shard-1"); !st.Held || st.Remaining < 50*time.Second {
			t.Errorf("shard-1 not renewed for a minute: %+v", st)
		}
	})
}
