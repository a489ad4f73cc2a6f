package pgsql

// The fenced outbox (fencepg.Outbox, table outbox in schema/outbox.sql).

// OutboxAdd inserts one entry for the claim ($1 scope, $2 token, $3
// writer) with topic $4 and payload $5, and returns its seq, id and
// created_at. It runs inside the caller's fenced transaction, which
// compares the claim with the floor again when it commits, and inserts
// only when the scope's floor equals the token as the statement sees it,
// taking no lock (equalFloor): a stale claim inserts nothing, and within
// a scope an entry of a larger token is only ever inserted after the
// floor reached that token, so after every entry of a smaller token that
// commits was inserted (its transaction's comparison at commit found the
// floor at its own token): seqs of one scope follow token order. No row
// back means the floor is not the token. It carries DurableCommit, as
// every statement that relies on a floor.
var OutboxAdd = `INSERT INTO leasefence.outbox (scope, token, writer, topic, payload)
SELECT $1::text, $2::bigint, $3::text, $4::text, $5::bytea FROM (` + equalFloor + `) AS same
RETURNING seq, id::text, created_at`

// OutboxPending returns the first $1 undelivered entries in seq order: a
// relay's page (the partial index outbox_pending).
const OutboxPending = `SELECT seq, id::text, scope, token, writer, topic, payload, created_at
  FROM leasefence.outbox WHERE delivered_at IS NULL ORDER BY seq LIMIT $1::int`

// OutboxMarkDelivered marks entry $1 delivered, unless another relay did
// already (its time stays). It carries DurableCommit like the statements
// that move a lease or a floor: a mark lost in a crash would only cost a
// redelivery, but an acknowledged mark should stay acknowledged.
const OutboxMarkDelivered = `UPDATE leasefence.outbox SET delivered_at = clock_timestamp()
 WHERE seq = $1::bigint AND delivered_at IS NULL
RETURNING ` + DurableCommit

// OutboxPruneDelivered deletes the entries delivered before $1.
const OutboxPruneDelivered = `DELETE FROM leasefence.outbox WHERE delivered_at < $1::timestamptz`

// OutboxAddUnfenced inserts an entry with no fence at all: $1 scope, $2
// token, $3 writer, $4 topic, $5 payload. COUNTEREXAMPLE: the negative
// control of the conformance suite's F9b (pgconformance), an outbox
// written outside the fenced transaction, which lets a stale holder's
// entry in. Never for production.
const OutboxAddUnfenced = `INSERT INTO leasefence.outbox (scope, token, writer, topic, payload)
VALUES ($1::text, $2::bigint, $3::text, $4::text, $5::bytea)`

// OutboxColumns are what Outbox.CheckSchema compares with the catalog,
// besides fence_floor's (OutboxAdd reads the floor).
var OutboxColumns = []Column{
	{"outbox", "seq", "bigint"}, {"outbox", "id", "uuid"}, {"outbox", "scope", "text"},
	{"outbox", "token", "bigint"}, {"outbox", "writer", "text"}, {"outbox", "topic", "text"},
	{"outbox", "payload", "bytea"}, {"outbox", "created_at", "timestamp with time zone"},
	{"outbox", "delivered_at", "timestamp with time zone"},
	{"fence_floor", "scope", "text"}, {"fence_floor", "max_token", "bigint"},
}
