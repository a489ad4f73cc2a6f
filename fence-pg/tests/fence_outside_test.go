package fencepg_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/conformance/backendtest"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/leasecore"
)

// The fence's floor rows written outside the fence: states that only an
// administrator's write (or a database that lost committed transactions)
// leaves behind. The fence reports them as errors wrapping
// leasecore.ErrConfig, never as ordinary rejections.

// setFloor writes the floor of scope outside the fence, as an owner
// resetting it would (the administrative setting the schema's guard asks
// for).
func setFloor(t *testing.T, f fenceFixture, scope string, floor leasecore.Token) {
	t.Helper()
	if _, err := f.resourceDB.Exec(context.Background(), `BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on;
		UPDATE leasefence.fence_floor SET max_token = `+strconv.FormatInt(int64(floor), 10)+` WHERE scope = '`+scope+`'; COMMIT`); err != nil {
		t.Fatal(err)
	}
}

// storedFloor reads the floor row of scope.
func storedFloor(t *testing.T, f fenceFixture, scope string) leasecore.Token {
	t.Helper()
	var floor int64
	if err := f.resourceDB.QueryRow(context.Background(),
		`SELECT max_token FROM leasefence.fence_floor WHERE scope = $1`, scope).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	return leasecore.Token(floor)
}

// TestRunTxFloorLoweredOutsideTheFence: a floor found below the token at
// the comparison before COMMIT, after the Fence saw it at the token, is an
// error wrapping leasecore.ErrConfig that commits nothing (the floor is not
// raised back), on every transaction of that holding period through the
// Fence (its writes may have been lost with the floor) — on either driver,
// with the default attempt log and with LogAll, whose comparison is the
// full check; a newer holding period raises the floor again as usual.
func TestRunTxFloorLoweredOutsideTheFence(t *testing.T) {
	for _, driver := range pgopen.Drivers {
		for _, logAll := range []bool{false, true} {
			name, opts := driver+"/default-log", []fencepg.Option(nil)
			if logAll {
				name, opts = driver+"/log-all", []fencepg.Option{fencepg.WithAttemptLog(leasecore.LogAll)}
			}
			t.Run(name, func(t *testing.T) { floorLowered(t, newFenceFixture(t, driver, opts...)) })
		}
	}
}

func floorLowered(t *testing.T, f fenceFixture) {
	a := leasecore.Claim{Scope: "lowered", Writer: "holder-a", Token: 5}
	backendtest.WantResult(t, "A's first transaction", f.writeJob(t, a, 1), true, 5)

	setFloor(t, f, "lowered", 3)
	for i := 1; i <= 2; i++ {
		res, called, err := f.runJob(a, 2)
		if !errors.Is(err, leasecore.ErrConfig) || !strings.Contains(err.Error(), `the floor of scope "lowered" is 3, below 5`) {
			t.Fatalf("transaction %d after the floor was lowered to 3: %+v, %v; want an error wrapping ErrConfig that names the floor", i, res, err)
		}
		if errors.Is(err, leasecore.ErrUnavailable) {
			t.Errorf("transaction %d: %v also wraps ErrUnavailable: a retry loop would retry it", i, err)
		}
		if !called {
			t.Errorf("transaction %d: fn was not called: the Fence read the floor first, where it had seen it at the token", i)
		}
	}
	if got := f.job(t, "lowered"); got != "holder-a/5/1 lines=1:1,2:2" {
		t.Errorf("rows = %q, want A's first transaction's only", got)
	}
	if got := storedFloor(t, f, "lowered"); got != 3 {
		t.Errorf("floor = %d, want 3: the failed transactions changed nothing", got)
	}

	b := leasecore.Claim{Scope: "lowered", Writer: "holder-b", Token: 6}
	backendtest.WantResult(t, "a newer holding period's transaction", f.writeJob(t, b, 7), true, 6)
	if got := f.job(t, "lowered"); got != "holder-b/6/7 lines=1:7,2:14" {
		t.Errorf("rows = %q, want B's", got)
	}
}

// TestFenceSealedFloorWithoutRecord: a floor set to the sealed floor by
// hand, with no seal record in its row, rejects every claim (the safe
// side) and says so with an error wrapping leasecore.ErrConfig, not a
// *leasecore.ScopeMovedError.
func TestFenceSealedFloorWithoutRecord(t *testing.T) {
	f := newFenceFixture(t, "pgx")
	ctx := context.Background()
	c := leasecore.Claim{Scope: "sealed-by-hand", Writer: "holder-a", Token: 4}
	if res, err := f.fence.Advance(ctx, c); err != nil || !res.Accepted {
		t.Fatalf("advance: %+v %v", res, err)
	}
	setFloor(t, f, "sealed-by-hand", leasecore.SealedFloor)

	res, err := f.fence.Advance(ctx, leasecore.Claim{Scope: "sealed-by-hand", Writer: "holder-b", Token: 9})
	backendtest.WantResult(t, "advance past a floor sealed by hand", res, false, leasecore.SealedFloor)
	var moved *leasecore.ScopeMovedError
	if !errors.Is(err, leasecore.ErrConfig) || errors.As(err, &moved) || !strings.Contains(err.Error(), "no seal record") {
		t.Fatalf("advance past a floor sealed by hand: %v, want an error wrapping ErrConfig naming the missing record (and no ScopeMovedError)", err)
	}
}
