package pgconformance_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/pgconformance"
	"github.com/leasefence/leasefence/fence-pg/tests/internal/pgtest"
)

// TestMain doubles as the holder process of F4 and F5 (the suite behind
// PgBouncer re-executes this test binary with pgconformance.HolderEnv set).
func TestMain(m *testing.M) {
	if pgconformance.IsHolderProcess() {
		os.Exit(pgconformance.HolderMain())
	}
	pgtest.Main(m)
}

func TestUnknownDriver(t *testing.T) {
	h, err := pgconformance.New(pgconformance.Config{Driver: "odbc"})(context.Background())
	if err == nil {
		h.Close()
		t.Fatal("a harness for driver \"odbc\"")
	}
}

// TestCloseEndsEverything: Close ends what a case left open — a long
// transaction never rolled back, a commit-gap write's pool, lease clients —
// without hanging, and leaves no goroutine behind (pgtest.Main checks).
func TestCloseEndsEverything(t *testing.T) {
	pgtest.ForEachDriver(t, func(t *testing.T, driver string) {
		newHarness := pgconformance.New(pgconformance.Config{
			Driver:      driver,
			LeaseDSN:    pgtest.CreateDB(t, "lease"),
			ResourceDSN: pgtest.CreateDB(t, "res"),
		})
		ctx := context.Background()
		h, err := newHarness(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tr := h.Traits()
		if tr.Name != "postgres/"+driver || tr.TokenStep != 1 || tr.MinTTL <= 0 {
			t.Errorf("traits: %+v", tr)
		}
		for range 3 {
			if _, err := h.OpenLease(ctx); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := h.(conformance.LongTransactions).BeginLongTransaction(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g, err := tx.Acquire(ctx, "report-job", "holder-a", time.Minute)
		if err != nil || g.Token != 1 {
			t.Fatalf("acquire in the long transaction: %+v, %v", g, err)
		}
		if _, err := h.(conformance.CommitGapResources).FencedResourceWithGap(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := h.(conformance.NegativeControls).UnfencedResource(ctx); err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- h.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Close hangs")
		}
		if _, err := h.OpenLease(ctx); err == nil {
			t.Fatal("OpenLease after Close succeeded")
		}

		// The long transaction was rolled back: a new harness starts empty
		// and the lease is free.
		h2, err := newHarness(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer h2.Close()
		l, err := h2.OpenLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if g, err := l.Acquire(ctx, "report-job", "holder-b", time.Minute); err != nil || g.Token != 1 {
			t.Fatalf("acquire after Close: %+v, %v", g, err)
		}
	})
}
