package pgconformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasefence/leasefence/conformance"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/fence-pg/pgconformance/pgopen"
	"github.com/leasefence/leasefence/leasecore"
)

var _ conformance.ScopeMoves = (*harness)(nil)

// moveDBSuffix names the second resource database after the first:
// "res_pgx" moves to "res_pgx_f17", so configurations on one cluster, each
// on resource databases of its own, never share the second one either.
const moveDBSuffix = "_f17"

// moves is a harness's second resource database (F17), made on first use,
// and the pools of its mover.
type moves struct {
	mu       sync.Mutex
	name     string // the database, also the label the seal records
	dsn      string
	old, new pgopen.Pool // the mover's pools, one connection each
	oldFence pgopen.Fence
	newFence pgopen.Fence
}

// MoveTarget implements conformance.ScopeMoves: a second resource database
// on the server of Config.ResourceDSN, "<its database>_f17", created with
// the harness's connection (CREATE DATABASE: the role needs CREATEDB) the
// first time and kept for later harnesses, migrated and emptied the way New
// empties the first; the label is its name. Its DSN is ResourceDSN with the
// database changed, so behind Config.Pooler it is reached through the
// pooler too (which must route any database to the server, as PgBouncer's
// "* =" does). The harness's Close closes its clients; the database stays.
func (h *harness) MoveTarget(ctx context.Context) (conformance.Resource, string, error) {
	m, err := h.moveTarget(ctx)
	if err != nil {
		return nil, "", err
	}
	c, err := h.open(ctx, m.dsn, resourceConns)
	if err != nil {
		return nil, "", err
	}
	res, err := c.Resource(h.cfg.logOption())
	return res, m.name, err
}

// moveTarget makes the second database ready and opens the mover's pools,
// once per harness.
func (h *harness) moveTarget(ctx context.Context) (*moves, error) {
	const op = "move target"
	m := &h.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dsn != "" {
		return m, nil
	}
	pc, err := pgconn.ParseConfig(h.cfg.ResourceDSN)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: parse Config.ResourceDSN: %w", pkg, op, err)
	}
	name := pc.Database + moveDBSuffix
	// CREATE DATABASE cannot run in a transaction block: a statement of its
	// own. An existing one (an earlier harness's) is emptied below instead.
	if _, err := h.resAdmin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil && sqlState(err) != "42P04" {
		return nil, pgstore.MapError(ctx, pkg, op+": create database "+name, err)
	}
	dsn, err := withDatabase(h.cfg.ResourceDSN, name)
	if err != nil {
		return nil, err
	}
	admin, err := h.open(ctx, dsn, adminConns)
	if err != nil {
		return nil, err
	}
	controls, err := admin.Controls()
	if err != nil {
		return nil, err
	}
	if err := controls.Migrate(ctx); err != nil { // fencepg's resource tables too
		return nil, err
	}
	if _, err := dbOf(admin).Exec(ctx, pgsql.TruncateResource); err != nil {
		return nil, pgstore.MapError(ctx, pkg, "truncate "+name, err)
	}
	if m.old, err = h.open(ctx, h.cfg.ResourceDSN, 1); err != nil {
		return nil, err
	}
	if m.new, err = h.open(ctx, dsn, 1); err != nil {
		return nil, err
	}
	if m.oldFence, err = m.old.Fence(h.cfg.logOption()); err != nil {
		return nil, err
	}
	if m.newFence, err = m.new.Fence(h.cfg.logOption()); err != nil {
		return nil, err
	}
	m.name, m.dsn = name, dsn
	return m, nil
}

// MoveScope implements conformance.ScopeMoves, as a user's mover does it on
// either driver: in a transaction of the first database, the fence's Seal
// (fencepg.Fence's or FenceDB's), then the scope's parts read; committed.
// In a transaction of the second, the fence's Install, then, when
// accepted, the parts written; committed. A rejected install is rolled back and
// returned as an error. conformance.MoveDataOnly skips the seal and the
// install.
func (h *harness) MoveScope(ctx context.Context, scope string, mode conformance.MoveMode) error {
	const op = "move scope"
	if mode != conformance.MoveWithFloor && mode != conformance.MoveDataOnly {
		return fmt.Errorf("%s: %s: mode %q: want %q or %q: %w", pkg, op, mode, conformance.MoveWithFloor, conformance.MoveDataOnly,
			leasecore.ErrInvalidArgument)
	}
	m, err := h.moveTarget(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock() // one move at a time on the mover's single connections
	defer m.mu.Unlock()
	withFloor := mode == conformance.MoveWithFloor

	var (
		seal  leasecore.ScopeSeal
		parts []movedPart
	)
	err = inTx(ctx, m.old, func(tx moveTx) error {
		if withFloor {
			var err error
			if seal, err = tx.seal(ctx, m.oldFence, scope, m.name); err != nil {
				return err
			}
		}
		var err error
		parts, err = tx.readParts(ctx, scope)
		return err
	})
	if err != nil {
		return pgstore.MapError(ctx, pkg, op+": seal and read at the old database", err)
	}
	err = inTx(ctx, m.new, func(tx moveTx) error {
		if withFloor {
			res, err := tx.install(ctx, m.newFence, seal)
			if err != nil {
				return err
			}
			if !res.Accepted {
				return fmt.Errorf("the install was rejected: the scope's floor at %s is %d, above the floor %d at the seal (a newer token was accepted there)",
					m.name, res.Floor, seal.Floor)
			}
		}
		for _, p := range parts {
			if err := tx.exec(ctx, pgsql.CopyPart, scope, p.part, p.content, p.writer, p.token, p.writtenAt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return pgstore.MapError(ctx, pkg, op+": install and write at "+m.name, err)
	}
	return nil
}

// movedPart is one part as the mover copies it.
type movedPart struct {
	part, content, writer string
	token                 int64
	writtenAt             time.Time
}

// moveTx is a transaction of the mover on either driver.
type moveTx struct {
	pgx pgx.Tx
	sql *sql.Tx
}

// inTx runs fn in a transaction of p and commits it, or rolls back when
// fn fails.
func inTx(ctx context.Context, p pgopen.Pool, fn func(tx moveTx) error) error {
	var tx moveTx
	var err error
	if p.Pgx != nil {
		tx.pgx, err = p.Pgx.Begin(ctx)
	} else {
		tx.sql, err = p.SQL.BeginTx(ctx, nil)
	}
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		// Not ctx: it may be why we are rolling back.
		if tx.pgx != nil {
			_ = tx.pgx.Rollback(context.WithoutCancel(ctx))
		} else {
			_ = tx.sql.Rollback()
		}
		return err
	}
	if tx.pgx != nil {
		return tx.pgx.Commit(ctx)
	}
	return tx.sql.Commit()
}

// seal and install need a fence of the transaction's driver: the pools
// of a mover are of one driver (pgopen.Open).
func (t moveTx) seal(ctx context.Context, f pgopen.Fence, scope, to string) (leasecore.ScopeSeal, error) {
	if t.pgx != nil {
		return f.Pgx.Seal(ctx, t.pgx, scope, to)
	}
	return f.SQL.Seal(ctx, t.sql, scope, to)
}

func (t moveTx) install(ctx context.Context, f pgopen.Fence, s leasecore.ScopeSeal) (leasecore.Result, error) {
	if t.pgx != nil {
		return f.Pgx.Install(ctx, t.pgx, s)
	}
	return f.SQL.Install(ctx, t.sql, s)
}

func (t moveTx) exec(ctx context.Context, stmt string, args ...any) error {
	if t.pgx != nil {
		_, err := t.pgx.Exec(ctx, stmt, args...)
		return err
	}
	_, err := t.sql.ExecContext(ctx, stmt, args...)
	return err
}

// readParts reads every part of scope in the transaction.
func (t moveTx) readParts(ctx context.Context, scope string) ([]movedPart, error) {
	var out []movedPart
	scan := func(next func() bool, scan func(...any) error) error {
		for next() {
			var p movedPart
			if err := scan(&p.part, &p.content, &p.writer, &p.token, &p.writtenAt); err != nil {
				return err
			}
			out = append(out, p)
		}
		return nil
	}
	if t.pgx != nil {
		rows, err := t.pgx.Query(ctx, pgsql.ReadScopeParts, scope)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		if err := scan(rows.Next, rows.Scan); err != nil {
			return nil, err
		}
		return out, rows.Err()
	}
	rows, err := t.sql.QueryContext(ctx, pgsql.ReadScopeParts, scope)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if err := scan(rows.Next, rows.Scan); err != nil {
		return nil, err
	}
	return out, rows.Err()
}

// withDatabase returns dsn (a URL or keyword/value DSN) with its database
// set to name.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s: parse DSN: %w", pkg, err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// Keyword/value: a later keyword overrides an earlier one.
	return dsn + " dbname=" + name, nil
}

// sqlState returns the SQLSTATE of a server error from either driver, ""
// for other errors.
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
