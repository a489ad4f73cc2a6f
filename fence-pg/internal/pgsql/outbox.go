package pgsql

// The fenced outbox (fencepg.Outbox, table outbox in schema/outbox.sql).

// OutboxAdd inserts one entry for the claim ($1 scope, $2 token, $3
// writer) with topic $4 and payload $5, and returns its seq, id and
// created_at. It runs inside the caller's fenced transaction, after the
// fence check of the same claim, and inserts only when the scope's floor
// equals the token: the same condition and the same share lock of the
// floor row as the fence's fast path (sharedFloor, see fenceCTEs). In a
// transaction whose check accepted the claim that always holds — the check
// left the floor at the token and this transaction holds the row's lock,
// so no newer writer can raise it before the commit. Anywhere else (a
// transaction that skipped the check, or one that checked another claim)
// it inserts nothing and returns no row: an entry can only exist under an
// accepted check of its own token. It carries DurableCommit, as every
// statement that relies on a floor.
var OutboxAdd = `INSERT INTO leasefence.outbox (scope, token, writer, topic, payload)
SELECT $1::text, $2::bigint, $3::text, $4::text, $5::bytea FROM (` + sharedFloor + `) AS same
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
