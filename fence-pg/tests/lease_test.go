package fencepg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
	"github.com/leasefence/leasefence/leasecore"
)

func TestLeaseLifecycle(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		const name, ttl = "report-job", 5 * time.Second

		before := time.Now()
		ga, err := f.leases.Acquire(ctx, name, "holder-a", ttl)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if ga.Token != 1 || ga.Name != name || ga.Holder != "holder-a" || ga.TTL != ttl {
			t.Fatalf("first acquire: got %+v, want token 1 for holder-a", ga)
		}
		if ga.Start.Before(before) || ga.Start.After(after) {
			t.Fatalf("Start %v not within the call (%v .. %v)", ga.Start, before, after)
		}

		// Held: nobody acquires, the holder itself neither; nothing changes.
		row := f.leaseRow(t, name)
		for _, holder := range []string{"holder-b", "holder-a"} {
			_, err := f.leases.Acquire(ctx, name, holder, ttl)
			backendtest.WantHold(t, err, leasecore.ErrHeld, "acquire", "")
		}
		if got := f.leaseRow(t, name); got != row {
			t.Fatalf("refused acquires changed the row: %s -> %s", row, got)
		}

		st, err := f.leases.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Exists || !st.Held || st.Released || st.Holder != "holder-a" || st.Token != 1 ||
			st.Remaining <= 0 || st.Remaining > ttl {
			t.Fatalf("inspect held lease: got %+v", st)
		}

		renewed, err := f.leases.Renew(ctx, ga)
		if err != nil {
			t.Fatal(err)
		}
		if renewed.Token != ga.Token || !renewed.Start.After(ga.Start) {
			t.Fatalf("renew: got %+v, want token %d and a later Start than %v", renewed, ga.Token, ga.Start)
		}

		if err := f.leases.Release(ctx, renewed); err != nil {
			t.Fatal(err)
		}
		st, err = f.leases.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Exists || st.Held || !st.Released || st.Token != 1 || st.Remaining != 0 {
			t.Fatalf("inspect released lease: got %+v", st)
		}

		// Released: release twice and renew after release fail and change nothing.
		row = f.leaseRow(t, name)
		backendtest.WantHold(t, f.leases.Release(ctx, renewed), leasecore.ErrLost, "release", "released")
		_, err = f.leases.Renew(ctx, renewed)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "released")
		if got := f.leaseRow(t, name); got != row {
			t.Fatalf("failed renew/release changed the row: %s -> %s", row, got)
		}

		// Free at once after release, with the next token.
		gb, err := f.leases.Acquire(ctx, name, "holder-b", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if gb.Token != 2 {
			t.Fatalf("acquire after release: token %d, want 2", gb.Token)
		}

		row = f.leaseRow(t, name)
		_, err = f.leases.Renew(ctx, ga)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", `token 1 was superseded by token 2 (holder "holder-b")`)
		backendtest.WantHold(t, f.leases.Release(ctx, ga), leasecore.ErrLost, "release",
			`token 1 was superseded by token 2 (holder "holder-b")`)
		impostor := gb
		impostor.Holder = "x"
		_, err = f.leases.Renew(ctx, impostor)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", `holder "x" does not hold it (held by "holder-b" with token 2)`)
		future := gb
		future.Token = 7
		_, err = f.leases.Renew(ctx, future)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "token 7 was never issued (the latest is token 2)")
		if got := f.leaseRow(t, name); got != row {
			t.Fatalf("failed renews changed the row: %s -> %s", row, got)
		}

		missing := gb
		missing.Name = "no-such-lease"
		_, err = f.leases.Renew(ctx, missing)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "no such lease")
		backendtest.WantHold(t, f.leases.Release(ctx, missing), leasecore.ErrLost, "release", "no such lease")
		st, err = f.leases.Inspect(ctx, missing.Name)
		if err != nil || st.Exists || st.Held || st.Token != 0 {
			t.Fatalf("inspect missing lease: got %+v, %v", st, err)
		}

		// The HoldError carries the grant it refused.
		var he *leasecore.HoldError
		_, err = f.leases.Renew(ctx, ga)
		if !errors.As(err, &he) || he.Name != name || he.Holder != "holder-a" || he.Token != 1 {
			t.Fatalf("HoldError fields: got %+v", he)
		}
	})
}

// TestRenewAfterExpiry: after expiry by the database clock a renew fails
// even though nobody took over; the holder must acquire again and gets a
// new token.
func TestRenewAfterExpiry(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		const name = "report-job"
		g, err := f.leases.Acquire(ctx, name, "holder-a", fencepg.MinTTL)
		if err != nil {
			t.Fatal(err)
		}
		waitExpired(t, f, name)

		row := f.leaseRow(t, name)
		_, err = f.leases.Renew(ctx, g)
		backendtest.WantHold(t, err, leasecore.ErrLost, "renew", "expired")
		backendtest.WantHold(t, f.leases.Release(ctx, g), leasecore.ErrLost, "release", "expired")
		if got := f.leaseRow(t, name); got != row {
			t.Fatalf("renew/release after expiry changed the row: %s -> %s", row, got)
		}
		st, err := f.leases.Inspect(ctx, name)
		if err != nil || st.Held || st.Released || st.Token != 1 || st.Remaining != 0 {
			t.Fatalf("inspect expired lease: got %+v, %v", st, err)
		}

		g2, err := f.leases.Acquire(ctx, name, "holder-a", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if g2.Token != 2 {
			t.Fatalf("re-acquire after expiry: token %d, want 2", g2.Token)
		}
	})
}

// waitExpired waits until the database clock says lease name expired.
func waitExpired(t *testing.T, f *fixture, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := f.leases.Inspect(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %q still held after 5s: %+v", name, st)
		}
		time.Sleep(st.Remaining)
	}
}

// TestTokenStepsByOne: every acquire — of a free, released or expired
// lease — issues exactly the previous token + 1 (I2).
func TestTokenStepsByOne(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		f := newFixture(t, driver)
		ctx := context.Background()
		const name = "report-job"
		holders := []string{"holder-a", "holder-b"}
		for want := leasecore.Token(1); want <= 6; want++ {
			ttl := time.Minute
			if want%2 == 0 {
				ttl = fencepg.MinTTL // let this one expire instead of releasing it
			}
			g, err := f.leases.Acquire(ctx, name, holders[want%2], ttl)
			if err != nil {
				t.Fatal(err)
			}
			if g.Token != want {
				t.Fatalf("acquire %d: token %d, want %d", want, g.Token, want)
			}
			if want%2 == 0 {
				waitExpired(t, f, name)
			} else if err := f.leases.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
		// Another lease name has its own sequence.
		g, err := f.leases.Acquire(ctx, "other-job", "holder-a", time.Minute)
		if err != nil || g.Token != 1 {
			t.Fatalf("acquire of another name: got %+v, %v; want token 1", g, err)
		}
	})
}
