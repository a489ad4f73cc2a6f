package pgsql

// MigrateLock serialises concurrent migrations of one database: taken
// inside the migration's transaction, it is held until that transaction
// ends. Without it two concurrent CREATE TABLE IF NOT EXISTS of one table
// can both pass the existence check and one fails on a catalog unique
// index.
const MigrateLock = `SELECT pg_advisory_xact_lock(7810756276994336110)` // the bytes "leasefen" as a big-endian integer

// AllowTokenReset is the setting a transaction turns on (SET LOCAL) to
// delete, truncate or lower what the token-space guards protect (the
// schema's refuse_token_reset triggers): the administrative path.
const AllowTokenReset = "leasefence_admin.allow_token_reset"

// TruncateLease empties the lease database, holder sessions included
// (tests only), through the administrative path: a script, for the simple
// query protocol.
const TruncateLease = `BEGIN; SET LOCAL ` + AllowTokenReset + ` = on; TRUNCATE leasefence.lease, leasefence.holder_session; COMMIT`

// TruncateResource empties the resource database, negative controls'
// table and the outbox included (tests only), through the administrative
// path.
const TruncateResource = `BEGIN; SET LOCAL ` + AllowTokenReset + ` = on;
TRUNCATE leasefence.fence_floor, leasefence.report_part, leasefence.write_attempt, leasefence.published, leasefence.outbox RESTART IDENTITY; COMMIT`

// LockWaits lists the other sessions of this database whose fence
// statements wait for a lock (F6b observes a blocked writer through it).
const LockWaits = `SELECT wait_event_type, wait_event FROM pg_stat_activity
 WHERE datname = current_database() AND wait_event_type = 'Lock'
   AND pid <> pg_backend_pid() AND query ILIKE '%fence_floor%'
 ORDER BY pid`

// Now reads the transaction's clock: now() is the time the transaction
// started and does not advance inside it (PostgreSQL docs §9.9.5).
const Now = `SELECT now()`

// ClockNow reads the current time, which advances inside a transaction.
const ClockNow = `SELECT clock_timestamp()`
