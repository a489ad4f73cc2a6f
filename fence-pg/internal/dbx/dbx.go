// Package dbx is one small handle over the two drivers fence-pg supports: a
// *pgxpool.Pool (pgx/v5 native) and a *sql.DB (lib/pq, or pgx's stdlib
// driver). The stores are written once against it.
//
// It passes SQL text and arguments through unchanged (both drivers use $1
// placeholders) and returns the drivers' errors unchanged, for the stores to
// map in one place. A query that finds no row returns an error matching
// sql.ErrNoRows with errors.Is, from either driver (pgx.ErrNoRows wraps it).
package dbx

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is the result of QueryRow.
type Row interface {
	// Scan copies the row's columns into dest; with no row it returns an
	// error matching sql.ErrNoRows.
	Scan(dest ...any) error
}

// Rows iterates the result of Query. Close must be called.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements. *DB and Tx both implement it, so one function
// can run on a pool or inside a transaction.
type Querier interface {
	// Exec runs sql and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// DB is a pool of connections.
type DB interface {
	Querier
	// Begin starts a Read Committed transaction on one connection of the
	// pool, which it keeps until Commit or Rollback. The level is explicit
	// because the server's default may be stricter and the statements run
	// in it are written for Read Committed.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is an open transaction.
type Tx interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// FromPool returns a DB over a pgx pool.
func FromPool(p *pgxpool.Pool) DB { return pgxDB{pgxQuerier{p}, p} }

// FromSQL returns a DB over a database/sql pool.
func FromSQL(db *sql.DB) DB { return sqlDB{sqlQuerier{db}, db} }

// pgxRunner is what *pgxpool.Pool and pgx.Tx have in common (the shape of
// pgxpool's common_test.go interfaces).
type pgxRunner interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type pgxQuerier struct{ r pgxRunner }

func (q pgxQuerier) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := q.r.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (q pgxQuerier) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return q.r.QueryRow(ctx, sql, args...)
}

func (q pgxQuerier) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return q.r.Query(ctx, sql, args...)
}

type pgxDB struct {
	pgxQuerier
	p *pgxpool.Pool
}

func (d pgxDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.p.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, err
	}
	return pgxTx{pgxQuerier{tx}, tx}, nil
}

type pgxTx struct {
	pgxQuerier
	tx pgx.Tx
}

func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// sqlRunner is what *sql.DB and *sql.Tx have in common.
type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type sqlQuerier struct{ r sqlRunner }

func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.r.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) Row {
	return q.r.QueryRowContext(ctx, query, args...)
}

func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := q.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

// sqlRows drops the error of Close: a failure while reading is reported by
// Err, which callers check.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

type sqlDB struct {
	sqlQuerier
	db *sql.DB
}

func (d sqlDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	return sqlTx{sqlQuerier{tx}, tx}, nil
}

// sqlTx ignores the contexts of Commit and Rollback: database/sql binds a
// transaction to the context given to BeginTx and rolls it back when that
// context is done.
type sqlTx struct {
	sqlQuerier
	tx *sql.Tx
}

func (t sqlTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error { return t.tx.Rollback() }
