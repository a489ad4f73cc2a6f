package fenceetcd_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// BenchmarkRenewAllShared measures RenewAll's fast path in shared mode —
// one holder's 100 names per call, one holder per goroutine — against a
// Put of one key, the capacity run's denominator, with 4 stores (as the
// capacity run's holder processes open them: one per client) and 16
// goroutines. Compare the two variants as a ratio in one run.
func BenchmarkRenewAllShared(b *testing.B) {
	const holders, names = 16, 100
	stores := 4
	if v := os.Getenv("BENCH_STORES"); v != "" {
		stores, _ = strconv.Atoi(v)
	}
	prefix := etcdtest.Prefix()
	ss := make([]*fenceetcd.LeaseStore, stores)
	for i := range ss {
		s, err := fenceetcd.NewLeaseStore(etcdtest.Client(b), fenceetcd.WithPrefix(prefix), fenceetcd.WithSharedLeases())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		ss[i] = s
	}
	ctx := context.Background()
	grants := make([][]leasecore.Grant, holders)
	for h := range grants {
		s := ss[h%stores]
		for n := range names {
			g, err := s.Acquire(ctx, fmt.Sprintf("h%02d-n%03d", h, n), fmt.Sprintf("h%02d", h), time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			grants[h] = append(grants[h], g)
		}
		if _, _, err := s.RenewAll(ctx, grants[h]); err != nil { // the full check, once
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, op func(h int) error) {
		var next atomic.Int64
		b.SetParallelism(holders / 2) // × GOMAXPROCS goroutines; each takes a holder
		b.RunParallel(func(pb *testing.PB) {
			h := int(next.Add(1)-1) % holders
			for pb.Next() {
				if err := op(h); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("renew_all_100_names", func(b *testing.B) {
		run(b, func(h int) error {
			_, lost, err := ss[h%stores].RenewAll(ctx, grants[h])
			if err == nil && lost[0] != nil {
				err = lost[0]
			}
			return err
		})
	})
	cli := etcdtest.Client(b)
	b.Run("put", func(b *testing.B) {
		run(b, func(h int) error {
			_, err := cli.Put(ctx, fmt.Sprintf("%s/put/%d", prefix, h), "x")
			return err
		})
	})
}
