package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/leasecore"
)

// etcdEnv is an embedded etcd server (a child process of this binary) and
// a client.
type etcdEnv struct {
	srv     *etcdtemp.Server
	cli     *clientv3.Client
	closers []func() error // run before the client closes
}

func startEtcd(ctx context.Context, say func(string, ...any)) (_ *etcdEnv, err error) {
	e := &etcdEnv{}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	say("starting an etcd server (embedded, as a child process; WAL fsync on)")
	if e.srv, err = etcdtemp.Start(ctx, etcdtemp.WithArgs("etcd-server")); err != nil {
		return nil, err
	}
	if e.cli, err = etcdconformance.Dial(ctx, e.srv.Endpoints()); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *etcdEnv) close() error {
	var err error
	for _, c := range e.closers {
		err = errors.Join(err, c())
	}
	if e.cli != nil {
		err = e.cli.Close()
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	}
	if e.srv != nil {
		err = errors.Join(err, e.srv.Stop())
	}
	return err
}

// etcdVariants compares the fence with what etcd users run without it: a
// plain Put of the part, and concurrency.Mutex with one session.
func (e *etcdEnv) etcdVariants(ctx context.Context) ([]variant, error) {
	res, err := fenceetcd.NewResource(e.cli, fenceetcd.WithPrefix("/bench/fenced"))
	if err != nil {
		return nil, err
	}
	// Shared leases: a holder's names hang on one etcd lease, as a
	// concurrency.Session's locks hang on the session's, so acquire and
	// release are one Txn each (fenceetcd.WithSharedLeases).
	leases, err := fenceetcd.NewLeaseStore(e.cli, fenceetcd.WithPrefix("/bench/leases"), fenceetcd.WithSharedLeases())
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, leases.Close)
	session, err := concurrency.NewSession(e.cli, concurrency.WithTTL(60))
	if err != nil {
		return nil, err
	}
	e.closers = append(e.closers, session.Close)
	mutex := concurrency.NewMutex(session, "/bench/mutex")
	var shards []leasecore.Grant
	for i := range 1000 {
		g, err := leases.Acquire(ctx, fmt.Sprintf("shard-%04d", i), "bench-shards", 60*time.Second)
		if err != nil {
			return nil, err
		}
		shards = append(shards, g)
	}
	return []variant{
		{"etcd_put", 1, func(b *testing.B) {
			for b.Loop() {
				if _, err := e.cli.Put(ctx, "/bench/plain/daily-report/summary", content); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"etcd_fenced_write", 1, func(b *testing.B) {
			w := leasecore.Write{Scope: "daily-report", Part: "summary", Content: content, Writer: "holder-a", Token: 1}
			for b.Loop() {
				r, err := res.Write(ctx, w)
				if err == nil && !r.Accepted {
					err = errors.New("fenced write rejected")
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"etcd_mutex_lock_unlock", 1, func(b *testing.B) {
			for b.Loop() {
				if err := mutex.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := mutex.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"etcd_renew_1000_leases_per_lease", 1000, func(b *testing.B) {
			for b.Loop() {
				_, lost, err := leases.RenewAll(ctx, shards)
				if err == nil {
					err = errors.Join(lost...)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"etcd_acquire_release", 1, func(b *testing.B) {
			for b.Loop() {
				g, err := leases.Acquire(ctx, "daily-report", "holder-a", 60*time.Second)
				if err == nil {
					err = leases.Release(ctx, g)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}},
	}, nil
}
