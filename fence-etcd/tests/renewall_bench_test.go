package fenceetcd_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// BenchmarkRenewAllShared measures RenewAll's fast path in shared mode —
// one holder's 100 names per call, 16 holders, each call on a goroutine of
// its own holder — through one store and through 4 (the fast path's reads
// and keep-alives are gathered per store), beside a Put of one key, the
// capacity run's denominator. Compare the variants as ratios in one run.
func BenchmarkRenewAllShared(b *testing.B) {
	const holders, names = 16, 100
	ctx := context.Background()
	run := func(b *testing.B, op func(h int) error) {
		var next atomic.Int64
		b.SetParallelism(holders / 2) // × GOMAXPROCS (2 here) goroutines, one holder each
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
	for _, stores := range []int{1, 4} {
		b.Run(fmt.Sprintf("renew_all_100_names/stores=%d", stores), func(b *testing.B) {
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
			b.ResetTimer()
			run(b, func(h int) error {
				_, lost, err := ss[h%stores].RenewAll(ctx, grants[h])
				if err == nil && lost[0] != nil {
					err = lost[0]
				}
				return err
			})
		})
	}
	b.Run("put", func(b *testing.B) {
		cli, prefix := etcdtest.Client(b), etcdtest.Prefix()
		run(b, func(h int) error {
			_, err := cli.Put(ctx, fmt.Sprintf("%s/put/%d", prefix, h), "x")
			return err
		})
	})
}
