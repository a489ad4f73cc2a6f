package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdconformance"
	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

// leaseAPI is what a SessionSet needs of a lease store, and the batch
// acquire its AcquireAll uses when the store has it (both backends do).
type leaseAPI interface {
	leasecore.Lease
	backendkit.BatchRenewer
	backendkit.BatchAcquirer
}

// backendConfig says which lease service a process talks to, and how.
type backendConfig struct {
	Backend   string   // "pg" or "etcd"
	DSN       string   // pg
	Sessions  bool     // pg: fencepg.WithSharedLeases
	Endpoints []string // etcd; fenceetcd.WithSharedLeases always
}

// etcdPrefix is the key prefix of every etcd lease store of the run.
const etcdPrefix = "/capacity"

// openStores opens the lease store a process uses, one for all its holders:
// PostgreSQL, a store on a pool of exactly conns connections; etcd, a store
// on one client (gRPC multiplexes a client's requests on one connection;
// conns does not apply). One store per process is what fence-etcd's docs
// recommend for many holders: a store gathers its concurrent fast renewals'
// reads into one request and sends its keep-alives on one stream, so the
// holders spread over several stores would each pay more (measured by
// fence-etcd's BenchmarkRenewAllShared, one store against four, and in
// docs/capacity.md). close releases the connections, not the leases.
func openStores(ctx context.Context, bc backendConfig, conns int) (stores []leaseAPI, close func(), err error) {
	var closers []func()
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			close()
		}
	}()
	switch bc.Backend {
	case "pg":
		opts, err := pgStoreOptions(bc.Sessions)
		if err != nil {
			return nil, close, err
		}
		pool, err := openPool(ctx, bc.DSN, conns)
		if err != nil {
			return nil, close, err
		}
		closers = append(closers, pool.Close)
		store, err := fencepg.NewLeaseStore(pool, opts...)
		if err != nil {
			return nil, close, err
		}
		return []leaseAPI{store}, close, nil
	case "etcd":
		cli, err := etcdconformance.Dial(ctx, bc.Endpoints)
		if err != nil {
			return nil, close, err
		}
		closers = append(closers, func() { _ = cli.Close() })
		store, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix(etcdPrefix), fenceetcd.WithSharedLeases())
		if err != nil {
			return nil, close, err
		}
		// Close would revoke the shared leases; the run lets them expire
		// instead (closing the client is enough to stop everything).
		return []leaseAPI{store}, close, nil
	}
	return nil, close, fmt.Errorf("unknown backend %q", bc.Backend)
}

func openPool(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), int32(conns)
	return pgxpool.NewWithConfig(ctx, cfg)
}

func dialEtcd(ctx context.Context, endpoints []string, n int) ([]*clientv3.Client, func(), error) {
	var clis []*clientv3.Client
	closeAll := func() {
		for _, c := range clis {
			_ = c.Close()
		}
	}
	for range n {
		cli, err := etcdconformance.Dial(ctx, endpoints)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		clis = append(clis, cli)
	}
	return clis, closeAll, nil
}

func holderName(h int) string                       { return fmt.Sprintf("h%05d", h) }
func leaseName(h, n int) string                     { return fmt.Sprintf("h%05d-n%03d", h, n) }
func satHolderName(c int) string                    { return fmt.Sprintf("sat%02d", c) }
func satLeaseName(c, n int) string                  { return fmt.Sprintf("sat%02d-n%03d", c, n) }
func renewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

// acquireAllRetry acquires names through the set with AcquireAll, trying
// the names not granted again (up to 5 times, 100 ms apart) on errors
// other than ErrHeld: a busy server's timeouts are part of the setup's
// cost, not a reason to give up. It returns how many names the set holds
// in the end, and the last error of a name it does not hold.
func acquireAllRetry(ctx context.Context, set *leasecore.SessionSet, names []string) (held, retries int, err error) {
	todo := names
	for attempt := 0; ; attempt++ {
		_, errs, callErr := set.AcquireAll(ctx, todo)
		var again []string
		err = callErr
		for i, name := range todo {
			switch {
			case callErr != nil:
				again = append(again, name)
			case errs[i] == nil:
				held++
			case errors.Is(errs[i], leasecore.ErrHeld):
				err = errs[i]
			default:
				err = errs[i]
				again = append(again, name)
			}
		}
		if len(again) == 0 || attempt == 4 || ctx.Err() != nil {
			return held, attempt, err
		}
		todo = again
		time.Sleep(100 * time.Millisecond)
	}
}
