package pgsql

// The scope fence. Every statement below that writes under a token is
// built from fenceCTEs, so the part store (fencepg.Resource) and callers
// fencing their own rows (fencepg.Fence) run the very same check.
//
// Parameters shared by all of them: $1 scope, $2 token, $3 writer, $4 log
// an accepted attempt, $5 log a rejected attempt, $6 the token's space
// (empty when the claim names none).
//
// fenceCTEs leaves in "floor" exactly one row, the scope's floor after the
// check; accepted ⇔ floor = $2. Why it is safe (PostgreSQL docs §13.2.1,
// "Read Committed Isolation Level", and the INSERT page, "ON CONFLICT
// Clause"):
//
//   - same, the common case: the floor already equals the token (the same
//     holding period wrote before, or advanced the floor). FOR SHARE locks
//     the row without writing a new version of it. If another transaction
//     updated or locked the row after this statement's snapshot was taken,
//     the lock waits for it to end and re-evaluates the WHERE clause on the
//     newest version of the row, so a floor moved past the token is not
//     matched.
//   - raised, every other case: INSERT ... ON CONFLICT DO UPDATE acts on
//     the latest committed version of the row, not on the snapshot, locks
//     it for update even when GREATEST leaves the value as it is, and
//     returns the value it left. A scope seen for the first time takes the
//     INSERT branch; two concurrent first writers cannot both insert: the
//     second waits on the primary key for the first to commit, then takes
//     the UPDATE branch against the committed row.
//   - Either way the transaction holds a lock on the floor row until it
//     ends — which is why a fenced transaction runs its check last, in the
//     round trip of its COMMIT where it can, so that no pause of the client
//     falls while it holds it — and the two locks conflict where they must: a writer that
//     raises the floor (update lock) waits for every transaction that
//     holds it in share mode, and is waited for by every later one. So the
//     data written under token t commits before the floor passes t, and
//     every writer that locks the row after the floor passed t sees it and
//     is rejected (I3). Writers with an equal token share the lock: they
//     are one holding period.
//   - The raise also stores the token's space ($6) with the floor when it
//     moves the floor up, in the same row version: the space of the token
//     that last raised the floor, which a rejection reads (ReadFloorSpace)
//     to tell a token of another lease service from a stale one. The
//     common case above writes nothing, so it is unchanged.
//
// All sub-statements see one snapshot, so later CTEs read the floor from
// "floor", never from the table. Every statement reads "floor", which
// carries DurableCommit: the floor raised, and whatever the transaction
// writes under the token, commit durably.
const fenceCTEs = `same AS (
  SELECT max_token FROM leasefence.fence_floor WHERE scope = $1::text AND max_token = $2::bigint FOR SHARE
), raised AS (
  INSERT INTO leasefence.fence_floor AS f (scope, max_token, token_space)
  SELECT $1::text, $2::bigint, nullif($6::text, '') WHERE NOT EXISTS (SELECT FROM same)
  ON CONFLICT (scope) DO UPDATE SET max_token = GREATEST(f.max_token, EXCLUDED.max_token),
    token_space = CASE WHEN EXCLUDED.max_token > f.max_token THEN EXCLUDED.token_space ELSE f.token_space END
  RETURNING f.max_token
), floor AS (
  SELECT max_token FROM (SELECT max_token FROM same UNION ALL SELECT max_token FROM raised) AS f
   WHERE ` + DurableCommit + `
)`

// logAttempt logs the check (of part <part>) in write_attempt when $4
// (accepted) or $5 (rejected) says so.
func logAttempt(part string) string {
	return `attempt AS (
  INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, ` + part + `, $3::text, $2::bigint, floor.max_token = $2::bigint, floor.max_token FROM floor
  WHERE CASE WHEN floor.max_token = $2::bigint THEN $4::boolean ELSE $5::boolean END
)`
}

// sharedFloor is the fast path of every check: the floor already equals
// the token $2 (the same holding period wrote before, or advanced the
// floor). It share-locks the floor row and writes nothing; see fenceCTEs
// for why that suffices. No row means "not equal, or no floor": the caller
// then runs the full check, which also raises the floor.
const sharedFloor = equalFloor + ` FOR SHARE`

// equalFloor is sharedFloor without the lock: a row when the floor of
// scope $1 is the token $2 as this statement's snapshot sees it
// (OutboxAdd, whose transaction compares again at commit).
const equalFloor = `SELECT max_token FROM leasefence.fence_floor
 WHERE scope = $1::text AND max_token = $2::bigint AND ` + DurableCommit

// sharedFloorNoWait is sharedFloor for the part store's writes, where no
// row also means "being raised": SKIP LOCKED passes over a floor row
// locked for update, i.e. by a transaction raising it, and the caller's
// full check then waits for that raise where sharedFloor would have. The
// part store's fast path itself never waits on a floor row, so a
// Resource's statements in flight (see FencedWriteManyShared) are never
// held up by one scope's raise. A row that can be locked is re-checked on
// its latest version, as with sharedFloor.
const sharedFloorNoWait = sharedFloor + ` SKIP LOCKED`

// idleTimeout sets the transaction's idle_in_transaction_session_timeout
// to $N (milliseconds as text; NULL: leave the server's setting). It sits
// in the select list of the early read a fenced transaction starts with,
// so it costs no statement of its own: it only has to be in force once
// that read returns and the transaction can go idle.
func idleTimeout(param string) string {
	return `set_config('idle_in_transaction_session_timeout',
  coalesce(` + param + `::text, current_setting('idle_in_transaction_session_timeout')), true)`
}

// FenceEarlyRead is the first statement of fencepg's RunTx (Fence's and
// FenceDB's): the floor of scope $1 (0 for none), read without a lock, and
// the idle timeout $2. A floor above the token rejects the transaction
// before the caller's function runs; one below it is raised first. The
// decision itself is taken at commit (FenceGuardOrRaise, FenceShared):
// floors only go up, so this read can only reject early what the commit
// would reject too.
var FenceEarlyRead = `SELECT coalesce((SELECT max_token FROM leasefence.fence_floor WHERE scope = $1::text), 0), ` + idleTimeout("$2")

// FenceSetIdle, followed by the timeout in milliseconds, is the first
// statement of a fenced transaction whose Fence has seen the floor at the
// token already: FenceEarlyRead's setting without the read, as a utility
// statement, which the server neither plans nor answers with a row. pgx
// (fencepg.Fence) queues it in the round trip of its BEGIN, where a
// SELECT set_config(...) cost about twice as much, on the server and in
// pgx (an alternating probe: 1.05 of the transaction without it, against
// 1.02); database/sql (fencepg.FenceDB) sends it on its own, and with no
// parameter lib/pq sends it in one round trip, not two. SET LOCAL needs
// the transaction block BEGIN opened; it takes no parameter, so the value
// is part of the statement (one statement per Fence).
const FenceSetIdle = `SET LOCAL idle_in_transaction_session_timeout = `

// FenceShared is sharedFloor on its own: the comparison a database/sql
// fenced transaction ends with before its COMMIT (fencepg.FenceDB's RunTx
// and Commit). $1 scope, $2 token; a row back means accepted.
const FenceShared = sharedFloor

// FenceGuardOrRaise is the fast path of a pipeline (fencepg.Fence.SendBatch)
// and the comparison a pgx fenced transaction ends with, in the round trip
// of its COMMIT (fencepg.Fence.RunTx): it share-locks the floor row and
// returns the floor when it equals $2;
// otherwise — a floor above or below the token, or none — it raises
// RejectedState through fence_reject with the floor (0 for none) in
// DETAIL, aborting the pipeline. The caller tells a floor below the token
// (advance, then send again) from one above it (rejected).
var FenceGuardOrRaise = `SELECT CASE WHEN f.max_token = $2::bigint THEN f.max_token
            ELSE leasefence.fence_reject($1::text, $2::bigint, coalesce(f.max_token, 0)) END
  FROM (SELECT 1) AS one LEFT JOIN LATERAL (
    SELECT max_token FROM leasefence.fence_floor WHERE scope = $1::text FOR SHARE) AS f ON true
 WHERE ` + DurableCommit

// FencedWriteShared is FencedWrite's fast path: the floor equals the token,
// so the part is stored under a share lock of the floor row, with no new
// floor version and no log entry (an accepted write is logged only with
// leasecore.LogAll, which takes FencedWrite). $1 scope, $2 token, $3
// writer, $4 part, $5 content. No row back (not equal, no floor, or a
// floor being raised: sharedFloorNoWait): run FencedWrite.
var FencedWriteShared = `WITH same AS (` + sharedFloorNoWait + `), part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, $4::text, $5::text, $3::text, $2::bigint FROM same
  ` + upsertPart + `
)
SELECT max_token FROM same`

// FencedWriteManyShared is FencedWriteShared for several independent
// writes at once, each with its own scope, part, writer and token ($1: a
// JSON array of {"scope", "part", "content", "writer", "token"}, at most
// one entry per (scope, part)): the concurrent single-part writes that one
// fencepg.Resource gathers while its statements run (writeBatcher). Each
// entry is stored exactly when its scope's floor equals its token, under a
// share lock of that floor row, as FencedWriteShared does; the statement
// returns the scope and part of every entry it stored, and the others go
// on alone to FencedWrite. One statement and one durable commit for all of
// them.
//
// SKIP LOCKED: a floor row that cannot be share-locked at once is locked
// for update by a transaction raising it (a new holder's first write, or
// its check inside a RunTx that may last seconds); this statement does not
// wait for it, so one scope's raise never holds up the other scopes'
// writes in the batch. The skipped entry is not stored and not returned:
// its writer runs FencedWrite alone, which waits for the raise and then
// compares with the floor it left. A row that can be locked is re-checked
// on its latest version, as in fenceCTEs. The entries are locked in scope
// and part order, the order every other fenced write of report_part takes
// its locks in (floor, then parts), so two batches never deadlock on
// each other.
var FencedWriteManyShared = `WITH input AS (
  SELECT * FROM json_to_recordset($1::json) AS i(scope text, part text, content text, writer text, token bigint)
)
INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token)
SELECT i.scope, i.part, i.content, i.writer, i.token
  FROM (SELECT * FROM input ORDER BY scope, part) AS i
 CROSS JOIN LATERAL (
   SELECT FROM leasefence.fence_floor f
    WHERE f.scope = i.scope AND f.max_token = i.token AND ` + DurableCommit + `
      FOR SHARE SKIP LOCKED) AS same
` + upsertPart + `
RETURNING p.scope, p.part`

// FencedWriteBatchShared is FencedWriteShared for a batch: $4 is the JSON
// array of {"part", "content"}.
var FencedWriteBatchShared = `WITH same AS (` + sharedFloorNoWait + `), input AS (
  SELECT * FROM json_to_recordset($4::json) AS i(part text, content text)
), part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, input.part, input.content, $3::text, $2::bigint FROM same, input
  ` + upsertPart + `
)
SELECT max_token FROM same`

// FenceCheck is the full check: Advance's statement in autocommit, and
// Install's (a database/sql fenced transaction ends with
// FenceCheckAndBefore). It returns the floor; accepted ⇔ floor = $2. After a
// rejection the caller's transaction rolls back, which would take a
// rejected attempt's log entry with it: inside one, callers pass $5 =
// false and log it with LogAttempt on a connection of their own.
var FenceCheck = `WITH ` + fenceCTEs + `, ` + logAttempt(`''`) + `
SELECT max_token FROM floor`

// FenceCheckOrRaise is FenceCheck for a pipeline (fencepg.Fence.SendBatch
// with leasecore.LogAll) and for the round trip that ends a pgx fenced
// transaction with its COMMIT (fencepg.Fence.Commit; RunTx with LogAll
// sends FenceRunTxCheckOrRaise): a rejection raises SQLSTATE RejectedState through fence_reject (see the
// schema), which aborts the pipeline's implicit transaction, so none of the
// caller's statements queued after it takes effect.
var FenceCheckOrRaise = `WITH ` + fenceCTEs + `, ` + logAttempt(`''`) + `
SELECT CASE WHEN max_token = $2::bigint THEN max_token
            ELSE leasefence.fence_reject($1::text, $2::bigint, max_token) END FROM floor`

// floorBefore is the floor of scope $1 as the statement's snapshot has it,
// before the statement's own raise (0 for none): every sub-statement of a
// WITH sees one snapshot, so it does not see the raise.
const floorBefore = `(SELECT coalesce(max(max_token), 0) FROM leasefence.fence_floor WHERE scope = $1::text)`

// FenceCheckAndBefore is FenceCheck as the last statement before COMMIT
// of a database/sql fenced transaction (fencepg.FenceDB's RunTx and
// Commit) when FenceShared found no equal floor, and always with
// leasecore.LogAll: it also returns the floor before the check
// (floorBefore). RunTx had the floor at $2 before the caller's function
// ran (raised there, or seen by its Fence), and floors only go up: one
// below $2 there was written outside the fence or lost with committed
// transactions, and RunTx rolls back and reports it instead of committing
// under the raise the full check made. Commit, whose transaction may be a
// holding period's first write, commits under the raise.
var FenceCheckAndBefore = `WITH ` + fenceCTEs + `, ` + logAttempt(`''`) + `
SELECT max_token, ` + floorBefore + ` FROM floor`

// FenceRunTxCheckOrRaise is FenceCheckOrRaise for the comparison that ends
// a pgx RunTx with leasecore.LogAll: a floor before the check below $2
// (see FenceCheckAndBefore) raises RejectedState too, with that floor in
// DETAIL, so the full check's raise rolls back with the transaction and
// the caller reports the floor below the token.
var FenceRunTxCheckOrRaise = `WITH ` + fenceCTEs + `, ` + logAttempt(`''`) + `
SELECT CASE WHEN before.max_token < $2::bigint THEN leasefence.fence_reject($1::text, $2::bigint, before.max_token)
            WHEN floor.max_token = $2::bigint THEN floor.max_token
            ELSE leasefence.fence_reject($1::text, $2::bigint, floor.max_token) END
  FROM floor, (SELECT ` + floorBefore + ` AS max_token) AS before`

// RejectedState is the SQLSTATE fence_reject raises. Its DETAIL is the
// floor that beat the token.
const RejectedState = "LF001"

// FenceAdvance raises the floor without writing data, in autocommit, and
// logs the attempt as $4/$5 say (fencepg.Fence.Advance).
var FenceAdvance = FenceCheck

// FencedWrite is the part store's write: the fence, then part $7 with
// content $8 stored only when accepted, and the attempt logged, all in one
// statement and one commit.
var FencedWrite = `WITH ` + fenceCTEs + `, part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, $7::text, $8::text, $3::text, $2::bigint FROM floor WHERE floor.max_token = $2::bigint
  ` + upsertPart + `
), ` + logAttempt(`$7::text`) + `
SELECT max_token FROM floor`

// FencedWriteBatch is FencedWrite for several parts: $7 is a JSON array of
// {"part", "content"}; one floor comparison, every part stored or none, one
// write_attempt row per part. The parts travel as one JSON text parameter
// so that every driver can send them (arrays need driver-specific
// encoding).
var FencedWriteBatch = `WITH ` + fenceCTEs + `, input AS (
  SELECT * FROM json_to_recordset($7::json) AS i(part text, content text)
), part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, input.part, input.content, $3::text, $2::bigint FROM floor, input WHERE floor.max_token = $2::bigint
  ` + upsertPart + `
), attempt AS (
  INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, input.part, $3::text, $2::bigint, floor.max_token = $2::bigint, floor.max_token FROM floor, input
  WHERE CASE WHEN floor.max_token = $2::bigint THEN $4::boolean ELSE $5::boolean END
)
SELECT max_token FROM floor`

// upsertPart overwrites an existing part with the new content.
const upsertPart = `ON CONFLICT (scope, part) DO UPDATE
     SET content = EXCLUDED.content, writer = EXCLUDED.writer,
         token = EXCLUDED.token, written_at = clock_timestamp()`

// ReadFloor returns the floor of scope $1, 0 when the scope has none.
const ReadFloor = `SELECT coalesce((SELECT max_token FROM leasefence.fence_floor WHERE scope = $1), 0) AS max_token`

// ReadFloorSpace returns the floor of scope $1 and the token space stored
// with it (empty when unknown); no row when the scope has none. Only a
// rejection reads it.
const ReadFloorSpace = `SELECT max_token, coalesce(token_space, '') FROM leasefence.fence_floor WHERE scope = $1::text`

// ReadPart returns content, writer, token and written_at of part $2 of
// scope $1; no row when it was never written.
const ReadPart = `SELECT content, writer, token, written_at FROM leasefence.report_part WHERE scope = $1 AND part = $2`

// Attempts returns the write log of scope $1, oldest first.
const Attempts = `SELECT part, writer, token, accepted, floor, attempted_at
  FROM leasefence.write_attempt WHERE scope = $1 ORDER BY id`

// AttemptsSince returns at most $3 entries of the write log of scope $1
// logged at or after $2, oldest first.
const AttemptsSince = `SELECT part, writer, token, accepted, floor, attempted_at
  FROM leasefence.write_attempt WHERE scope = $1::text AND attempted_at >= $2::timestamptz ORDER BY id LIMIT $3::int`

// PruneAttempts deletes the entries of scope $1 logged before $2.
const PruneAttempts = `DELETE FROM leasefence.write_attempt WHERE scope = $1::text AND attempted_at < $2::timestamptz`
