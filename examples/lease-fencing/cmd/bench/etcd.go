package main

import (
	"context"
	"errors"
	"fmt"
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
	// The baseline stores the same value as the fenced write: its part
	// record (content, writer, token, time), read back from one fenced
	// write, as the PostgreSQL baseline upserts the same row. An unfenced
	// writer keeping the same record pays the same bytes; encoding it is
	// left to the fenced side only, which keeps the ratio conservative.
	w := leasecore.Write{Scope: "daily-report", Part: "summary", Content: content, Writer: "holder-a", Token: 1}
	if _, err := res.Write(ctx, w); err != nil {
		return nil, err
	}
	stored, err := e.cli.Get(ctx, "/bench/fenced/part/daily-report/summary")
	if err != nil {
		return nil, err
	}
	if len(stored.Kvs) != 1 {
		return nil, errors.New("the fenced write's part key is not where the bench expects it")
	}
	record := string(stored.Kvs[0].Value)
	// The caller's own Txn under the fence: the guard (the floor equals
	// the token) as its only compare, the caller's Put as its Then; the
	// floor was advanced to the token once beforehand, as a new holder
	// does right after it acquires.
	fence, err := fenceetcd.NewFence(e.cli, fenceetcd.WithPrefix("/bench/fenced"))
	if err != nil {
		return nil, err
	}
	guarded := leasecore.Claim{Scope: "user-guarded", Writer: "holder-a", Token: 1}
	if r, err := fence.Advance(ctx, guarded); err != nil || !r.Accepted {
		return nil, errors.Join(err, fmt.Errorf("advance: %+v", r))
	}
	const plainKey = "/bench/plain/part/daily-report/summary"
	// etcd_limit, the cheapest the fenced write could be: its Put of the
	// same record under one compare of a key's value, the kind of compare
	// the fence's guard is (Value(floor) == token), on a key of the
	// bench's own that holds the same encoded token; no record built per
	// call (the fenced write, like it, carries no Else branch since its
	// failed guard reads the floor on its own). Its part key is as long as the
	// fenced write's. (The same shape as etcd_guarded_txn, whose compare
	// is the fence's own Guard.)
	guard := fence.Guard(guarded)
	const limitFloorKey, limitKey = "/bench/limits/floor/daily-report", "/bench/limits/part/daily-report/summary"
	limitToken := string(guard.ValueBytes())
	if _, err := e.cli.Put(ctx, limitFloorKey, limitToken); err != nil {
		return nil, err
	}
	// The acquire+release limit's key: as long as the fenced name's
	// (/bench/leases/lease/daily-report).
	const limitLeaseKey = "/bench/limits/lease/daily-report"
	var shards []leasecore.Grant
	for i := range 1000 {
		g, err := leases.Acquire(ctx, fmt.Sprintf("shard-%04d", i), "bench-shards", 60*time.Second)
		if err != nil {
			return nil, err
		}
		shards = append(shards, g)
	}
	return []variant{
		{name: "etcd_put", perOp: 1, op: func() error {
			_, err := e.cli.Put(ctx, plainKey, record)
			return err
		}},
		// The same key and value as etcd_put, in a Txn guarded by the fence.
		{name: "etcd_guarded_txn", perOp: 1, op: func() error {
			r, err := e.cli.Txn(ctx).If(fence.Guard(guarded)).Then(clientv3.OpPut(plainKey, record)).Commit()
			if err == nil && !r.Succeeded {
				err = errors.New("guarded txn: the guard failed")
			}
			return err
		}},
		{name: "etcd_put_content_only", perOp: 1, op: func() error {
			_, err := e.cli.Put(ctx, "/bench/plain/part/daily-report/raw", content)
			return err
		}},
		{name: "etcd_fenced_write", perOp: 1, op: func() error {
			r, err := res.Write(ctx, w)
			if err == nil && !r.Accepted {
				err = errors.New("fenced write rejected")
			}
			return err
		}},
		{name: "etcd_limit", perOp: 1, op: func() error {
			r, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(limitFloorKey), "=", limitToken)).
				Then(clientv3.OpPut(limitKey, record)).Commit()
			if err == nil && !r.Succeeded {
				err = errors.New("etcd limit: the compare failed")
			}
			return err
		}},
		{name: "etcd_mutex_lock_unlock", perOp: 1, op: func() error {
			if err := mutex.Lock(ctx); err != nil {
				return err
			}
			return mutex.Unlock(ctx)
		}},
		{name: "etcd_renew_1000_leases_per_lease", perOp: 1000, op: func() error {
			_, lost, err := leases.RenewAll(ctx, shards)
			return errors.Join(err, errors.Join(lost...))
		}},
		// etcd_acquire_release_limit, the least any fenced acquire+release
		// on etcd sends: the Mutex's two requests, but the acquire creates
		// the name's key only if absent (a fenced name has one key, shared
		// by all its holders in turn, where each Mutex session has a key of
		// its own) and the release deletes it only while it is this
		// holder's (one compare on its create revision, the token). The key
		// hangs on the Mutex session's etcd lease, as a shared-mode name
		// hangs on its holder's, and is as long as the fenced one.
		{name: "etcd_acquire_release_limit", perOp: 1, op: func() error {
			r, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(limitLeaseKey), "=", 0)).
				Then(clientv3.OpPut(limitLeaseKey, "holder-a", clientv3.WithLease(session.Lease()))).Commit()
			if err != nil {
				return err
			}
			if !r.Succeeded {
				return errors.New("acquire+release limit: the key exists")
			}
			d, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(limitLeaseKey), "=", r.Header.Revision)).
				Then(clientv3.OpDelete(limitLeaseKey)).Commit()
			if err == nil && !d.Succeeded {
				err = errors.New("acquire+release limit: the key is not the holder's")
			}
			return err
		}},
		{name: "etcd_acquire_release", perOp: 1, op: func() error {
			g, err := leases.Acquire(ctx, "daily-report", "holder-a", 60*time.Second)
			if err != nil {
				return err
			}
			return leases.Release(ctx, g)
		}},
	}, nil
}
