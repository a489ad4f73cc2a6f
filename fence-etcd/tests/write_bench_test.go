package fenceetcd_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

// benchPair is two operations compared as a ratio: the fence's and the
// cheapest plain etcd request that does the same work without it.
type benchPair struct {
	fenced, limit func() error
}

// runPair runs p's operations one after the other in each iteration (so
// that both see the same server and machine state) and reports each one's
// mean time and their ratio; "fenced" and "limit" run one of them alone,
// for a CPU or allocation profile of that one.
func runPair(b *testing.B, p benchPair) {
	b.Run("fenced", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := p.fenced(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("limit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := p.limit(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("alternating", func(b *testing.B) {
		var fenced, limit []time.Duration
		for i := 0; b.Loop(); i++ {
			// Alternate which goes first, so neither always follows the
			// other's fsync.
			first, second := p.fenced, p.limit
			if i%2 == 1 {
				first, second = second, first
			}
			t0 := time.Now()
			if err := first(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := second(); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			if i%2 == 0 {
				fenced, limit = append(fenced, t1.Sub(t0)), append(limit, t2.Sub(t1))
			} else {
				limit, fenced = append(limit, t1.Sub(t0)), append(fenced, t2.Sub(t1))
			}
		}
		mf, ml := median(fenced), median(limit)
		b.ReportMetric(float64(mf.Nanoseconds()), "fenced-median-ns")
		b.ReportMetric(float64(ml.Nanoseconds()), "limit-median-ns")
		if ml > 0 {
			b.ReportMetric(float64(mf)/float64(ml), "ratio")
		}
	})
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkFencedWrite compares Resource.Write on its one-request path (the
// floor equals the token) with the limit the bench reports it against: a
// Txn with one compare of a key's value and the Put of the same record, on
// keys of the same length.
func BenchmarkFencedWrite(b *testing.B) {
	ctx := context.Background()
	cli, prefix := etcdtest.Client(b), etcdtest.Prefix()
	res, err := fenceetcd.NewResource(cli, fenceetcd.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	w := leasecore.Write{Scope: "daily-report", Part: "summary", Content: "rows=100 total=12345.67 generated for the daily report",
		Writer: "holder-a", Token: 1}
	if _, err := res.Write(ctx, w); err != nil {
		b.Fatal(err)
	}
	stored, err := cli.Get(ctx, prefix+"/part/daily-report/summary")
	if err != nil || len(stored.Kvs) != 1 {
		b.Fatal(err, "no part record")
	}
	record := string(stored.Kvs[0].Value)
	floor, err := cli.Get(ctx, prefix+"/floor/daily-report")
	if err != nil || len(floor.Kvs) != 1 {
		b.Fatal(err, "no floor")
	}
	limitFloor, limitPart := prefix+"/limit/daily-report", prefix+"/limit/daily-report/summary"
	token := string(floor.Kvs[0].Value)
	if _, err := cli.Put(ctx, limitFloor, token); err != nil {
		b.Fatal(err)
	}
	runPair(b, benchPair{
		fenced: func() error {
			r, err := res.Write(ctx, w)
			if err == nil && !r.Accepted {
				err = errors.New("fenced write rejected")
			}
			return err
		},
		limit: func() error {
			r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(limitFloor), "=", token)).
				Then(clientv3.OpPut(limitPart, record)).Commit()
			if err == nil && !r.Succeeded {
				err = errors.New("limit: the compare failed")
			}
			return err
		},
	})
}

// BenchmarkAcquireRelease compares a shared-lease Acquire and Release with
// concurrency.Mutex's Lock and Unlock on one session.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	cli, prefix := etcdtest.Client(b), etcdtest.Prefix()
	leases, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(prefix), fenceetcd.WithSharedLeases())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = leases.Close() })
	session, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = session.Close() })
	mutex := concurrency.NewMutex(session, prefix+"/mutex")
	runPair(b, benchPair{
		fenced: func() error {
			g, err := leases.Acquire(ctx, "daily-report", "holder-a", 60*time.Second)
			if err != nil {
				return err
			}
			return leases.Release(ctx, g)
		},
		limit: func() error {
			if err := mutex.Lock(ctx); err != nil {
				return err
			}
			return mutex.Unlock(ctx)
		},
	})
}
