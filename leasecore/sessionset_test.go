package leasecore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

// A set of shards renewed together: each name keeps its own token; a name
// taken over is reported lost and leaves the set; the others stay held.
func TestSessionSetRenewsAllAndDropsTheLost(t *testing.T) {
	ctx := context.Background()
	leases := memfence.NewLeases(nil)
	set, err := leasecore.NewSessionSet(leases, "holder-a",
		leasecore.WithTTL(300*time.Millisecond), leasecore.WithRenewInterval(50*time.Millisecond), leasecore.WithMargin(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close(ctx)
	for i := range 5 {
		if _, err := set.Acquire(ctx, fmt.Sprintf("shard-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Someone releases shard-2 behind the set's back; the next RenewAll
	// finds it lost.
	g := leasecore.Grant{Name: "shard-2", Holder: "holder-a", Token: 1, TTL: 300 * time.Millisecond}
	if err := leases.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-set.Lost():
		if l.Name != "shard-2" || !errors.Is(l.Err, leasecore.ErrLost) {
			t.Fatalf("lost %+v", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("shard-2 was never reported lost")
	}
	time.Sleep(600 * time.Millisecond) // two TTLs: only renewal keeps the rest
	for _, n := range []string{"shard-0", "shard-1", "shard-3", "shard-4"} {
		if !set.Valid(n) {
			t.Errorf("%s no longer valid", n)
		}
		if st, _ := leases.Inspect(ctx, n); !st.Held || st.Holder != "holder-a" {
			t.Errorf("%s: %+v", n, st)
		}
	}
	if set.Valid("shard-2") {
		t.Error("shard-2 still valid")
	}
	if err := set.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := leases.Inspect(ctx, "shard-0"); st.Held {
		t.Error("Close did not release shard-0")
	}
	if _, err := set.Acquire(ctx, "shard-9"); !errors.Is(err, leasecore.ErrClosed) {
		t.Errorf("acquire after Close: %v", err)
	}
}

func TestSessionSetNeedsABatchRenewer(t *testing.T) {
	type plain struct{ leasecore.Lease }
	_, err := leasecore.NewSessionSet(plain{memfence.NewLeases(nil)}, "holder-a")
	var ae *leasecore.ArgError
	if !errors.As(err, &ae) || ae.Field != "lease" {
		t.Fatalf("err = %v, want an ArgError on lease", err)
	}
}
