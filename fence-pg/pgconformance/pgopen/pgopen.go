// Package pgopen opens a connection pool with either driver fence-pg
// supports and builds fence-pg's stores on it, so the conformance harness
// and fence-pg's tests choose a driver by name and share one code path.
// It lives in the pgconformance module, which already requires lib/pq for
// the harness, so that fence-pg's own module graph does not.
package pgopen

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/lib/pq" // registers database/sql driver "postgres"

	fencepg "github.com/leasefence/leasefence/fence-pg"
	"github.com/leasefence/leasefence/fence-pg/pgcontrol"
	"github.com/leasefence/leasefence/leasecore"
)

// The driver names.
const (
	Pgx   = "pgx"   // pgx/v5 through *pgxpool.Pool
	Libpq = "libpq" // lib/pq through database/sql
)

// Drivers lists every driver name, for tests that run on each.
var Drivers = []string{Pgx, Libpq}

// Pool is one connection pool of either driver; exactly one field is set.
type Pool struct {
	Pgx *pgxpool.Pool
	SQL *sql.DB
}

// Open opens a pool of at most maxConns connections to dsn with driver
// (Pgx or Libpq) and establishes one connection (Ping), so that the first
// statement does not pay for connecting.
func Open(ctx context.Context, driver, dsn string, maxConns int) (Pool, error) {
	switch driver {
	case Pgx:
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return Pool{}, err
		}
		cfg.MaxConns = int32(maxConns)
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return Pool{}, err
		}
		if err := p.Ping(ctx); err != nil {
			p.Close()
			return Pool{}, err
		}
		return Pool{Pgx: p}, nil
	case Libpq:
		db, err := sql.Open("postgres", dsn)
		if err != nil {
			return Pool{}, err
		}
		db.SetMaxOpenConns(maxConns)
		db.SetMaxIdleConns(maxConns) // keep the connection Ping made
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return Pool{}, err
		}
		return Pool{SQL: db}, nil
	}
	return Pool{}, fmt.Errorf("driver %q: want %q or %q", driver, Pgx, Libpq)
}

// Close closes the pool. A pgx pool's Close waits for connections held by
// open transactions to be returned.
func (p Pool) Close() error {
	if p.Pgx != nil {
		p.Pgx.Close()
		return nil
	}
	return p.SQL.Close()
}

// LeaseStore returns a fencepg.LeaseStore on the pool.
func (p Pool) LeaseStore(opts ...fencepg.Option) (*fencepg.LeaseStore, error) {
	if p.Pgx != nil {
		return fencepg.NewLeaseStore(p.Pgx, opts...)
	}
	return fencepg.NewLeaseStoreDB(p.SQL, opts...)
}

// Resource returns a fencepg.Resource on the pool.
func (p Pool) Resource(opts ...fencepg.Option) (*fencepg.Resource, error) {
	if p.Pgx != nil {
		return fencepg.NewResource(p.Pgx, opts...)
	}
	return fencepg.NewResourceDB(p.SQL, opts...)
}

// Fence is a fence of either driver on one pool: exactly one of Pgx and
// SQL is set, and FenceMethods is that one, for the methods both share.
// RunTx, Commit, Seal and Install take the driver's own transaction: call
// them on Pgx or SQL.
type Fence struct {
	Pgx *fencepg.Fence
	SQL *fencepg.FenceDB
	FenceMethods
}

// FenceMethods are the methods fencepg.Fence and fencepg.FenceDB share:
// none takes a transaction.
type FenceMethods interface {
	Advance(ctx context.Context, c leasecore.Claim) (leasecore.Result, error)
	Floor(ctx context.Context, scope string) (leasecore.Token, error)
	Floors(ctx context.Context, limit int) ([]leasecore.ScopeFloor, error)
	Attempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error)
	RejectedAttempts(ctx context.Context, q leasecore.AttemptQuery) ([]leasecore.Attempt, error)
	PruneAttempts(ctx context.Context, scope string, before time.Time) (int64, error)
	Migrate(ctx context.Context) error
	Preflight(ctx context.Context) error
	CheckSchema(ctx context.Context) error
}

var (
	_ FenceMethods = (*fencepg.Fence)(nil)
	_ FenceMethods = (*fencepg.FenceDB)(nil)
)

// Fence returns the fence of the pool's driver: fencepg.NewFence or
// fencepg.NewFenceDB.
func (p Pool) Fence(opts ...fencepg.Option) (Fence, error) {
	if p.Pgx != nil {
		f, err := fencepg.NewFence(p.Pgx, opts...)
		if err != nil {
			return Fence{}, err
		}
		return Fence{Pgx: f, FenceMethods: f}, nil
	}
	f, err := fencepg.NewFenceDB(p.SQL, opts...)
	if err != nil {
		return Fence{}, err
	}
	return Fence{SQL: f, FenceMethods: f}, nil
}

// Outbox is an outbox of either driver on one pool: exactly one of Pgx
// and SQL is set, and OutboxMethods is that one. Add takes the driver's
// own transaction: call it on Pgx or SQL.
type Outbox struct {
	Pgx *fencepg.Outbox
	SQL *fencepg.OutboxDB
	OutboxMethods
}

// OutboxMethods are the methods fencepg.Outbox and fencepg.OutboxDB
// share: all but Add.
type OutboxMethods interface {
	Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error)
	Pending(ctx context.Context, limit int) ([]leasecore.OutboxEntry, error)
	PruneDelivered(ctx context.Context, before time.Time) (int64, error)
	Migrate(ctx context.Context) error
	Preflight(ctx context.Context) error
	CheckSchema(ctx context.Context) error
}

var (
	_ OutboxMethods = (*fencepg.Outbox)(nil)
	_ OutboxMethods = (*fencepg.OutboxDB)(nil)
)

// Outbox returns the outbox of the pool's driver: fencepg.NewOutbox or
// fencepg.NewOutboxDB.
func (p Pool) Outbox(opts ...fencepg.Option) (Outbox, error) {
	if p.Pgx != nil {
		o, err := fencepg.NewOutbox(p.Pgx, opts...)
		if err != nil {
			return Outbox{}, err
		}
		return Outbox{Pgx: o, OutboxMethods: o}, nil
	}
	o, err := fencepg.NewOutboxDB(p.SQL, opts...)
	if err != nil {
		return Outbox{}, err
	}
	return Outbox{SQL: o, OutboxMethods: o}, nil
}

// Controls returns pgcontrol.Controls on the pool.
func (p Pool) Controls() (*pgcontrol.Controls, error) {
	if p.Pgx != nil {
		return pgcontrol.New(p.Pgx)
	}
	return pgcontrol.NewDB(p.SQL)
}
