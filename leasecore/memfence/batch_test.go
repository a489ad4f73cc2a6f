package memfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/memfence"
)

func TestWriteBatchAllOrNone(t *testing.T) {
	ctx := context.Background()
	r := memfence.NewResource()
	parts := []leasecore.PartContent{{Part: "summary", Content: "s2"}, {Part: "detail", Content: "d2"}}
	res, err := r.WriteBatch(ctx, leasecore.Batch{Scope: "daily-report", Writer: "holder-b", Token: 2, Parts: parts})
	if err != nil || !res.Accepted || res.Floor != 2 {
		t.Fatalf("batch with token 2 = %+v, %v", res, err)
	}
	stale := []leasecore.PartContent{{Part: "summary", Content: "s1"}, {Part: "extra", Content: "e1"}}
	res, err = r.WriteBatch(ctx, leasecore.Batch{Scope: "daily-report", Writer: "holder-a", Token: 1, Parts: stale})
	if err != nil || res.Accepted || res.Floor != 2 {
		t.Fatalf("stale batch = %+v, %v", res, err)
	}
	for part, want := range map[string]string{"summary": "s2", "detail": "d2"} {
		if p, ok, _ := r.ReadPart(ctx, "daily-report", part); !ok || p.Content != want {
			t.Errorf("%s = %+v, want %q", part, p, want)
		}
	}
	if _, ok, _ := r.ReadPart(ctx, "daily-report", "extra"); ok {
		t.Error("a part of the rejected batch was stored")
	}
	if log, _ := r.Attempts(ctx, "daily-report"); len(log) != 4 {
		t.Errorf("attempts = %d, want one per part (4)", len(log))
	}
}

func TestRenewAll(t *testing.T) {
	ctx := context.Background()
	l := memfence.NewLeases(nil)
	var gs []leasecore.Grant
	for _, name := range []string{"shard-1", "shard-2", "shard-3"} {
		g, err := l.Acquire(ctx, name, "holder-a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	if err := l.Release(ctx, gs[1]); err != nil {
		t.Fatal(err)
	}
	renewed, lost, err := l.RenewAll(ctx, gs)
	if err != nil {
		t.Fatal(err)
	}
	if lost[0] != nil || lost[2] != nil || renewed[0].Token != gs[0].Token || renewed[2].Name != "shard-3" {
		t.Errorf("held shards not renewed: %+v %v", renewed, lost)
	}
	if !errors.Is(lost[1], leasecore.ErrLost) {
		t.Errorf("released shard: %v, want ErrLost", lost[1])
	}
}
