package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/leasefence/leasefence/conformance/backendtest"
	"github.com/leasefence/leasefence/leasecore"
)

// The fence's floor keys written outside the fence: states that only a
// raw client's write leaves behind. The fence reports them as errors
// wrapping leasecore.ErrConfig, never as ordinary rejections, and applies
// none of the caller's operations.

// putFloor writes the floor key of scope with a raw Put, outside the fence.
func (f *fixture) putFloor(t *testing.T, scope, value string) {
	t.Helper()
	if _, err := f.cli.Put(context.Background(), f.prefix+"/floor/"+url.PathEscape(scope), value); err != nil {
		t.Fatal(err)
	}
}

// TestFenceFloorNotAToken: a floor key whose value is not a token makes a
// Commit fail with an error wrapping leasecore.ErrConfig that names the
// key, and apply nothing.
func TestFenceFloorNotAToken(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	c := leasecore.Claim{Scope: "garbled", Writer: "holder-a", Token: 5}
	res, _ := commit(t, fe, c, f.putOwn("run=A"))
	backendtest.WantResult(t, "first commit", res, true, 5)

	f.putFloor(t, "garbled", "five")
	res, resp, err := fe.Commit(context.Background(), c, f.putOwn("run=A again"))
	if !errors.Is(err, leasecore.ErrConfig) || !strings.Contains(err.Error(), "/floor/garbled") || resp != nil {
		t.Fatalf("commit over a floor that is not a token: %+v, %v, %v; want an error wrapping ErrConfig naming the key", res, resp, err)
	}
	if got := f.ownKeys(t); got != "run=A" {
		t.Errorf("the caller's keys: %s, want the first commit's only", got)
	}
}

// TestFenceFloorNotATokenBelowAny: the same with a value that etcd's
// compare orders below every token ("" and "!" sort before "0"), which the
// advance's compare alone would take for a lower floor and overwrite:
// Commit reads the floor after its guard fails and stops there, and the
// key keeps its value.
func TestFenceFloorNotATokenBelowAny(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	for _, garbage := range []string{"", "!"} {
		f.putFloor(t, "garbled-low", garbage)
		c := leasecore.Claim{Scope: "garbled-low", Writer: "holder-a", Token: 5}
		res, resp, err := fe.Commit(context.Background(), c, f.putOwn("run=A"))
		if !errors.Is(err, leasecore.ErrConfig) || !strings.Contains(err.Error(), "/floor/garbled-low") || resp != nil {
			t.Fatalf("floor %q: commit: %+v, %v, %v; want an error wrapping ErrConfig naming the key", garbage, res, resp, err)
		}
		if got := f.ownKeys(t); got != "" {
			t.Errorf("floor %q: the caller's keys: %s, want none", garbage, got)
		}
		got, err := f.cli.Get(context.Background(), f.prefix+"/floor/garbled-low")
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != garbage {
			t.Errorf("floor %q after the commit: %v, want it unchanged", garbage, got.Kvs)
		}
	}
}

// TestFenceSealedFloorWithoutRecord: a floor key set to the sealed floor by
// hand, with no seal record, rejects every claim (the safe side) and says
// so with an error wrapping leasecore.ErrConfig, not a
// *leasecore.ScopeMovedError.
func TestFenceSealedFloorWithoutRecord(t *testing.T) {
	f := newFixture(t)
	fe := f.newFence(t)
	f.putFloor(t, "sealed-by-hand", fmt.Sprintf("%020d", leasecore.SealedFloor))

	res, resp, err := fe.Commit(context.Background(), leasecore.Claim{Scope: "sealed-by-hand", Writer: "holder-b", Token: 9}, f.putOwn("run=B"))
	backendtest.WantResult(t, "commit under a floor sealed by hand", res, false, leasecore.SealedFloor)
	var moved *leasecore.ScopeMovedError
	if !errors.Is(err, leasecore.ErrConfig) || errors.As(err, &moved) || !strings.Contains(err.Error(), "no seal record") || resp != nil {
		t.Fatalf("commit under a floor sealed by hand: %v, %v; want an error wrapping ErrConfig naming the missing record (and no ScopeMovedError)", resp, err)
	}
	if got := f.ownKeys(t); got != "" {
		t.Errorf("the caller's keys: %s, want none", got)
	}
}
