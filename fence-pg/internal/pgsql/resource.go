package pgsql

// FencedWrite is the scope-level fence: one statement that advances the
// floor of scope $1 to token $5 unless it is already higher, writes content
// $3 of part $2 by writer $4 only if the floor now equals $5, and logs the
// attempt, accepted or not. It returns the floor after the attempt;
// accepted ⇔ floor = $5.
//
// Why this is safe:
//   - Atomic: one statement, so the floor advance, the data write and the
//     write_attempt row commit together (or not at all), and a rejected
//     attempt is logged in the same round trip.
//   - Writers of one scope queue on the floor row: INSERT ... ON CONFLICT
//     DO UPDATE locks the conflicting row until the transaction ends, and
//     it does so even when GREATEST leaves the value unchanged (the row is
//     still updated). The data write below happens while the lock is held,
//     so data writes of a scope are serialised in floor order.
//   - A writer that waited sees the advanced floor: under Read Committed,
//     ON CONFLICT DO UPDATE acts on the latest committed version of the
//     conflicting row, not on the statement's snapshot (PostgreSQL docs:
//     INSERT, "ON CONFLICT DO UPDATE"; §13.2.1). So GREATEST compares with
//     the floor the previous writer committed.
//   - A scope seen for the first time takes the INSERT branch. Two
//     concurrent first writes of one scope cannot both insert: the second
//     waits on the unique index for the first to commit, then takes the
//     UPDATE branch against the committed row.
//
// All sub-statements see one snapshot, so part and attempt read the floor
// from floor's RETURNING, never from the table.
const FencedWrite = `WITH floor AS (
  INSERT INTO fence_floor AS f (scope, max_token) VALUES ($1, $5)
  ON CONFLICT (scope) DO UPDATE SET max_token = GREATEST(f.max_token, EXCLUDED.max_token)
  RETURNING f.max_token
), part AS (
  INSERT INTO report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::bigint FROM floor WHERE floor.max_token = $5
  ` + upsertPart + `
), attempt AS (
  INSERT INTO write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, $2::text, $4::text, $5::bigint, floor.max_token = $5, floor.max_token FROM floor
)
SELECT max_token FROM floor`

// FencedWriteBatch is FencedWrite for several parts of scope $1 by writer
// $2 under token $3: one floor comparison, then every part of $4 (a JSON
// array of {"part", "content"}) stored, or none, and one write_attempt row
// per part. The same locking argument as FencedWrite applies: one
// statement, one commit, the floor row locked throughout. The parts travel
// as one JSON text parameter so that every driver can send them (arrays
// need driver-specific encoding).
const FencedWriteBatch = `WITH floor AS (
  INSERT INTO fence_floor AS f (scope, max_token) VALUES ($1, $3)
  ON CONFLICT (scope) DO UPDATE SET max_token = GREATEST(f.max_token, EXCLUDED.max_token)
  RETURNING f.max_token
), input AS (
  SELECT * FROM json_to_recordset($4::json) AS i(part text, content text)
), part AS (
  INSERT INTO report_part AS p (scope, part, content, writer, token)
  SELECT $1::text, input.part, input.content, $2::text, $3::bigint FROM floor, input WHERE floor.max_token = $3
  ` + upsertPart + `
), attempt AS (
  INSERT INTO write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, input.part, $2::text, $3::bigint, floor.max_token = $3, floor.max_token FROM floor, input
)
SELECT max_token FROM floor`

// upsertPart overwrites an existing part with the new content.
const upsertPart = `ON CONFLICT (scope, part) DO UPDATE
     SET content = EXCLUDED.content, writer = EXCLUDED.writer,
         token = EXCLUDED.token, written_at = clock_timestamp()`

// ReadFloor returns the floor of scope $1, 0 when the scope has none.
const ReadFloor = `SELECT coalesce((SELECT max_token FROM fence_floor WHERE scope = $1), 0) AS max_token`

// ReadPart returns content, writer, token and written_at of part $2 of
// scope $1; no row when it was never written.
const ReadPart = `SELECT content, writer, token, written_at FROM report_part WHERE scope = $1 AND part = $2`

// Attempts returns the write log of scope $1, oldest first.
const Attempts = `SELECT part, writer, token, accepted, floor, attempted_at
  FROM write_attempt WHERE scope = $1 ORDER BY id`
