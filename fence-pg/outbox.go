package fencepg

import (
	"context"
	"database/sql"
	_ "embed" // schema/outbox.sql
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasefence/leasefence/fence-pg/internal/dbx"
	"github.com/leasefence/leasefence/fence-pg/internal/pgsql"
	"github.com/leasefence/leasefence/fence-pg/internal/pgstore"
	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

//go:embed schema/outbox.sql
var outboxSchema string

// resourceScript is the resource database's DDL: the fence's tables, then
// the outbox, which refers to the floor.
func resourceScript() string { return resourceSchema + "\n" + outboxSchema }

// Outbox is a fenced outbox for side effects the downstream system cannot
// fence itself — "report published" sent to another service, a message, a
// webhook (the conformance case F9): the side effect is recorded as an entry in the same
// fenced transaction as the data it announces, and a relay delivers it
// afterwards with the writer's token as its version.
//
// The call sequence, inside a fenced transaction:
//
//	res, err := fence.RunTx(ctx, claim, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `INSERT INTO report ...`, ...); err != nil {
//			return err
//		}
//		_, err := outbox.Add(ctx, tx, claim, "report-published", payload)
//		return err
//	})
//
// and in a relay (any process, any number of them):
//
//	n, err := outbox.Relay(ctx, func(ctx context.Context, e leasecore.OutboxEntry) error {
//		return postToDownstream(ctx, e) // nil only once the downstream acknowledged e
//	})
//
// What it guarantees:
//
//   - An entry exists only if the fenced transaction that added it
//     committed, i.e. its claim was not beaten by a larger token when it
//     committed: a stale holder's transaction is rejected whole, entry
//     included, so its side effect never reaches the relay. Add refuses to
//     insert when the scope's floor is not the claim's token (see Add).
//   - Every entry is delivered at least once, in seq order, and is marked
//     delivered only after deliver returned nil for it. A relay that dies
//     between the downstream's acknowledgement and the mark (a crash, a
//     SIGKILL, a lost connection) leaves the entry pending: the next relay
//     delivers it again, with the same ID.
//   - Relays may run concurrently, and a frozen relay may wake up: two
//     relays can then deliver the same entry, even at the same moment, and
//     one relay's late delivery of an old entry can arrive after another's
//     of newer ones. No lock prevents it (a relay would otherwise hold a
//     transaction open across the downstream's answer, and a frozen relay
//     would stall the others). It stays correct for a downstream that
//     deduplicates by OutboxEntry.ID and, per scope, rejects a token below
//     the largest it accepted (see leasecore.OutboxEntry): a duplicate is a
//     no-op, and no entry arrives for the first time after a newer version
//     of its scope was accepted, because each relay delivers in seq order,
//     reads every page from the oldest entry still pending (an entry that
//     committed late, behind seqs already delivered, comes first), and
//     moves on only after an acknowledgement, and within a scope the
//     entries of a smaller token have smaller seqs (Add inserts only once
//     the floor reached the entry's token, and a smaller token's
//     transaction commits only while the floor is still its token). Run one relay (under a lease, with
//     leasecore.Campaign) to avoid the duplicate traffic, not for
//     correctness.
//
// What it does not guarantee: exactly-once delivery (the downstream must
// deduplicate); delivery at all while no relay runs or the downstream
// refuses (entries wait, pending); order across scopes, or between entries
// of one token written by concurrent transactions (their seqs follow
// insert order, their commits may not); anything about a downstream that
// ignores the version or forgets IDs it may still see again (a relay that
// was frozen can redeliver an entry long after it was delivered).
//
// The table is outbox in the Outbox's schema (WithSchema), created by
// Migrate and ResourceDDL with the fence's tables; delivered entries stay,
// with their delivered_at, until PruneDelivered. An Outbox is safe for
// concurrent use.
//
// Outbox is for a pgx pool (NewOutbox): its Add takes a pgx.Tx. OutboxDB
// (NewOutboxDB) is the same outbox on a database/sql pool, whose Add takes
// a *sql.Tx.
type Outbox struct {
	outboxCore
}

// OutboxDB is Outbox on a database/sql pool (lib/pq, or pgx's stdlib
// driver), from NewOutboxDB: the same methods, with Add taking the
// *sql.Tx of a FenceDB's RunTx or of a transaction its Commit ends. An
// OutboxDB is safe for concurrent use.
type OutboxDB struct {
	outboxCore
}

// outboxCore is what Outbox and OutboxDB share: everything but Add, which
// takes the driver's transaction.
type outboxCore struct {
	db   dbx.DB
	cfg  config
	stmt outboxSQL
}

type outboxSQL struct{ add, readFloor, pending, mark, prune string }

// NewOutbox returns the outbox of the database pool is connected to (the
// database of the fence and the data). The pool serves Relay, Pending,
// PruneDelivered and the schema checks; Add runs in the caller's
// transaction. Of the options only WithSchema matters. A nil pool or an
// invalid option returns a *leasecore.ArgError. The caller keeps ownership
// of the pool.
func NewOutbox(pool *pgxpool.Pool, opts ...Option) (*Outbox, error) {
	const op = "new outbox"
	if pool == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "pool", Reason: "must not be nil"}
	}
	core, err := newOutboxCore(op, dbx.FromPool(pool), opts)
	if err != nil {
		return nil, err
	}
	return &Outbox{core}, nil
}

// NewOutboxDB is NewOutbox for a database/sql pool (lib/pq, or pgx's
// stdlib driver): it returns an OutboxDB, whose Add takes a *sql.Tx.
func NewOutboxDB(db *sql.DB, opts ...Option) (*OutboxDB, error) {
	const op = "new outbox"
	if db == nil {
		return nil, &leasecore.ArgError{Op: op, Field: "db", Reason: "must not be nil"}
	}
	core, err := newOutboxCore(op, dbx.FromSQL(db), opts)
	if err != nil {
		return nil, err
	}
	return &OutboxDB{core}, nil
}

func newOutboxCore(op string, db dbx.DB, opts []Option) (outboxCore, error) {
	cfg, err := newConfig(op, opts)
	if err != nil {
		return outboxCore{}, err
	}
	in := func(stmt string) string { return pgsql.InSchema(stmt, cfg.schema) }
	return outboxCore{db: db, cfg: cfg, stmt: outboxSQL{
		add: in(pgsql.OutboxAdd), readFloor: in(pgsql.ReadFloor), pending: in(pgsql.OutboxPending),
		mark: in(pgsql.OutboxMarkDelivered), prune: in(pgsql.OutboxPruneDelivered),
	}}, nil
}

// Add records an entry for claim c — topic, payload, and c's scope,
// writer and token as the entry's version — in tx, the caller's open
// transaction, which must be fenced for the same claim: call it inside
// Fence.RunTx (the fn it runs), or in a transaction that Fence.Commit
// ends. The entry commits with tx, or not at all; the fence's comparison
// at commit covers it, so a holder frozen after Add is rejected with its
// entry when it wakes. An entry added in a transaction the fence does not
// end is not fenced: nothing compares its token at commit.
//
// The insert is one statement that also requires the scope's floor to
// equal c.Token as it reads it, taking no lock (so it holds up no newer
// writer): inside RunTx that holds, since RunTx raises the floor to the
// token before fn runs; before Commit, call Fence.Advance first. When it
// does not hold (a stale claim, a floor not yet raised, another claim's
// scope), Add inserts nothing and returns an error wrapping
// leasecore.ErrInvalidArgument that gives the floor: roll back.
//
// Bad input (see backendkit.CheckOutboxEntry; a nil tx) returns a
// *leasecore.ArgError before anything is sent. Server and connection
// errors are classified as everywhere in this package (ErrUnavailable,
// the context's error, ...); tx is then of no more use.
func (o *Outbox) Add(ctx context.Context, tx pgx.Tx, c leasecore.Claim, topic string, payload []byte) (leasecore.OutboxEntry, error) {
	const op = "outbox add"
	if tx == nil {
		return leasecore.OutboxEntry{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return o.add(ctx, op, c, topic, payload, func(q string, args ...any) dbx.Row { return tx.QueryRow(ctx, q, args...) })
}

// Add is Outbox.Add for a database/sql transaction: inside FenceDB.RunTx,
// or in a transaction that FenceDB.Commit ends.
func (o *OutboxDB) Add(ctx context.Context, tx *sql.Tx, c leasecore.Claim, topic string, payload []byte) (leasecore.OutboxEntry, error) {
	const op = "outbox add"
	if tx == nil {
		return leasecore.OutboxEntry{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: "must not be nil"}
	}
	return o.add(ctx, op, c, topic, payload, func(q string, args ...any) dbx.Row { return tx.QueryRowContext(ctx, q, args...) })
}

func (o *outboxCore) add(ctx context.Context, op string, c leasecore.Claim, topic string, payload []byte,
	queryRow func(q string, args ...any) dbx.Row) (leasecore.OutboxEntry, error) {
	if err := backendkit.CheckOutboxEntry(ctx, op, c, topic, payload); err != nil {
		return leasecore.OutboxEntry{}, err
	}
	if payload == nil {
		payload = []byte{} // bytea NOT NULL: an empty payload is a payload
	}
	e := leasecore.OutboxEntry{Scope: c.Scope, Writer: c.Writer, Token: c.Token, Topic: topic, Payload: payload}
	err := queryRow(o.stmt.add, c.Scope, int64(c.Token), c.Writer, topic, payload).Scan(&e.Seq, &e.ID, &e.At)
	if errors.Is(err, sql.ErrNoRows) {
		// The floor is not the claim's token: say which it is (the same
		// transaction, so the caller sees what the insert saw).
		var floor int64
		if err := queryRow(o.stmt.readFloor, c.Scope).Scan(&floor); err != nil {
			return leasecore.OutboxEntry{}, pgstore.MapError(ctx, pkg, op+": read the floor", err)
		}
		return leasecore.OutboxEntry{}, &leasecore.ArgError{Op: op, Field: "tx", Reason: fmt.Sprintf(
			"is not fenced for this claim: the floor of scope %q is %d, not the claim's token %d "+
				"(add entries inside the fence's RunTx of the same claim, or after its Advance in a transaction that the fence's Commit ends); roll back",
			c.Scope, floor, c.Token)}
	}
	if err != nil {
		return leasecore.OutboxEntry{}, pgstore.MapError(ctx, pkg, op, err)
	}
	return e, nil
}

// relayPage is how many pending entries a relay reads at once.
const relayPage = 100

// Relay delivers the pending entries, oldest (lowest seq) first, in the
// caller's goroutine: for each it calls deliver and, when deliver returns
// nil, marks the entry delivered (one durable statement; a mark another
// relay made first stays). It returns the number of entries it delivered
// once none is pending (entries added while
// it runs are delivered too), at the first error of deliver — that entry
// and every later one stay pending, so order is kept; the error wraps
// deliver's — or when ctx ends (an error wrapping ctx's), and when a read
// or a mark fails (ErrUnavailable, ...). Call it again, in a loop with a
// pause, to keep relaying. ctx bounds the mark too: an entry whose mark the
// context left no time for stays pending and is delivered again (with the
// same ID).
//
// deliver must return nil only once the downstream has acknowledged the
// entry: accepted it, or recognised it as a duplicate (its ID) or as
// superseded (a token below one it accepted for the scope) — a rejection
// as stale is an answer, not a failure, and returning an error for it
// would block the outbox. deliver is called with ctx. See Outbox for what
// concurrent relays do.
func (o *outboxCore) Relay(ctx context.Context, deliver func(context.Context, leasecore.OutboxEntry) error) (int, error) {
	const op = "relay"
	if err := backendkit.CheckRelay(ctx, op, deliver); err != nil {
		return 0, err
	}
	n := 0
	for {
		// Every page starts at the oldest pending entry, not after the
		// last one delivered: seqs follow insert order, commits do not, so
		// an entry can become visible behind the last seq delivered, and
		// a newer entry of its scope may already be behind it (see Outbox).
		// What this relay delivered is marked, so it is not read again.
		page, err := o.pending(ctx, op, relayPage)
		if err != nil || len(page) == 0 {
			return n, err
		}
		for _, e := range page {
			if err := ctx.Err(); err != nil {
				return n, fmt.Errorf("%s: %s: %w", pkg, op, err)
			}
			if err := deliver(ctx, e); err != nil {
				return n, fmt.Errorf("%s: %s: deliver entry %s (seq %d, scope %q, token %d): %w", pkg, op, e.ID, e.Seq, e.Scope, e.Token, err)
			}
			// Under ctx, like every statement of Relay: when ctx ends right
			// after the downstream acknowledged, the entry stays pending
			// and is delivered again, with the same ID, by the next relay.
			err := pgstore.RetrySerialization(ctx, func() error {
				_, err := o.db.Exec(ctx, o.stmt.mark, e.Seq)
				return err
			})
			if err != nil {
				return n, pgstore.MapError(ctx, pkg, op+": mark delivered (it stays pending and is delivered again)", err)
			}
			n++
		}
	}
}

// Pending returns at most limit (1 to backendkit.MaxAttemptsRead) entries
// not yet delivered, of every scope, oldest first: what the relays have
// still to do.
func (o *outboxCore) Pending(ctx context.Context, limit int) ([]leasecore.OutboxEntry, error) {
	const op = "outbox pending"
	if limit < 1 || limit > backendkit.MaxAttemptsRead {
		return nil, &leasecore.ArgError{Op: op, Field: "limit", Value: fmt.Sprint(limit),
			Reason: fmt.Sprintf("must be 1 to %d", backendkit.MaxAttemptsRead)}
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	return o.pending(ctx, op, limit)
}

// pending reads the first limit undelivered entries in seq order.
func (o *outboxCore) pending(ctx context.Context, op string, limit int) ([]leasecore.OutboxEntry, error) {
	var out []leasecore.OutboxEntry
	err := pgstore.RetrySerialization(ctx, func() error {
		out = out[:0]
		rows, err := o.db.Query(ctx, o.stmt.pending, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var e leasecore.OutboxEntry
			var token int64
			if err := rows.Scan(&e.Seq, &e.ID, &e.Scope, &token, &e.Writer, &e.Topic, &e.Payload, &e.At); err != nil {
				return err
			}
			e.Token = leasecore.Token(token)
			out = append(out, e)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, pgstore.MapError(ctx, pkg, op, err)
	}
	return out, nil
}

// PruneDelivered deletes the entries delivered before before (by the
// database clock) and returns how many it deleted; pending entries are
// never pruned. before must be set and not in the future.
func (o *outboxCore) PruneDelivered(ctx context.Context, before time.Time) (int64, error) {
	const op = "outbox prune delivered"
	if before.IsZero() {
		return 0, &leasecore.ArgError{Op: op, Field: "before", Reason: "must be set"}
	}
	if before.After(time.Now()) {
		return 0, &leasecore.ArgError{Op: op, Field: "before", Value: before.Format(time.RFC3339Nano), Reason: "is in the future"}
	}
	if err := backendkit.CheckContext(op, ctx); err != nil {
		return 0, err
	}
	var n int64
	err := pgstore.RetrySerialization(ctx, func() (err error) {
		n, err = o.db.Exec(ctx, o.stmt.prune, before)
		return err
	})
	if err != nil {
		return 0, pgstore.MapError(ctx, pkg, op, err)
	}
	return n, nil
}

// Migrate creates the outbox, with the fence's tables (ResourceDDL), if
// they do not exist, then runs CheckSchema. It is idempotent; see
// Fence.Migrate.
func (o *outboxCore) Migrate(ctx context.Context) error {
	if err := pgstore.Migrate(ctx, o.db, pkg, ddl(resourceScript(), o.cfg.schema)); err != nil {
		return err
	}
	return o.CheckSchema(ctx)
}

// CheckSchema reports, as an error wrapping leasecore.ErrSchema that names
// the table or column, whether the outbox (or the floor table it reads) is
// missing, out of date, foreign, or not visible to this pool's role.
func (o *outboxCore) CheckSchema(ctx context.Context) error {
	return pgstore.CheckSchema(ctx, o.db, pkg, o.cfg.schema, pgsql.OutboxColumns, nil)
}

// Preflight is Fence.Preflight for the outbox: the connection, fsync, USAGE
// on the schema, SELECT and UPDATE on fence_floor (Add share-locks the
// floor row), SELECT, INSERT and UPDATE on outbox (DELETE, which only
// PruneDelivered needs, is not required); then CheckSchema.
func (o *outboxCore) Preflight(ctx context.Context) error {
	return pgstore.Preflight(ctx, o.db, pkg, ErrNotDurable, o.cfg.schema, pgstore.OutboxTables, pgsql.OutboxColumns, nil)
}
