package pgsql

// Statements of holder-session mode (fencepg.WithSharedLeases): a
// holder's names with one TTL hang on one row of holder_session, keyed by
// (holder, ttl_us), and a renewal updates that row only. A name is held
// while lease.session_id equals the session_id of its holder's row and that
// row's expires_at > now(); the lease row's own expires_at is 'infinity'
// meanwhile (see schema/lease.sql). Tokens stay per name in lease, +1 per
// grant, in the same transaction as the grant.
//
// Locks. Every statement that changes whether a name is held takes row
// locks in one order: the lease row first, then session rows, and several
// session rows in one locking pass ordered by (holder, ttl_us). A renewal
// locks only its session row (it reads the lease rows it checks without a
// lock: locking them would write to every one of them, which is what the
// mode saves); a release locks only the lease row. An acquire that takes a
// name from another holder's expired session changes that session and its
// own holder's: it locks both in the one ordered pass (AcquireSession's
// locked), because two holders taking each other's names at the same moment
// would otherwise each hold the other's session and wait for its own, a
// deadlock the server breaks only after deadlock_timeout (1 s by default).
// It takes both locks whenever the name hangs on a session, before it
// knows whether that session is over, so a refused acquire of such a name
// also holds, for its one statement, the holder's own session row, which
// the holder's renewals then wait for. One deadlock remains possible: RenewAll of a holder's names of two TTLs
// (two session rows, locked in the order the UPDATE finds them) while the
// same holder acquires a name that hangs on one of those sessions. The
// server aborts one of them, which did nothing, and pgstore.RetryConflicts
// runs it again.
//
// The trigger lease_detached_from_session (schema/lease.sql) adds to the
// generation of the session a changed lease row hung on, at the end of the
// statement that changed it: after the lease row, as the order wants. A
// release therefore also holds its session row until it commits (renewals
// of the holder wait for it, as for an acquire). TakeOverSession of a name
// on another holder's session locks its own holder's session row (sess)
// before that one (the trigger): two take-overs in opposite directions at
// the same moment can deadlock, and RetryConflicts runs the loser again.
//
// Session rows are locked FOR UPDATE, the strongest row lock, not the FOR
// NO KEY UPDATE an UPDATE of a non-key column would need: the statement
// goes on to update the rows it locked (ended, and sess's ON CONFLICT DO
// UPDATE, which locks FOR UPDATE), and a transaction that strengthens its
// own weaker row lock queues for the row's tuple lock behind the
// transactions waiting for that very row — waiting for it: a deadlock too.
// With the strongest lock taken first there is nothing to strengthen.

// refreshSession ends the INSERT of a holder's session row (alias s) by
// the statements that grant names on it (AcquireSession, AcquireAllNewSession,
// TakeOverSession): an unexpired session is extended (the inserted row's
// expires_at, now() + TTL) and keeps its session_id; an expired one starts
// anew with the inserted row's fresh session_id, so that the names of the
// old session never come back. It returns the session_id the grant hangs
// its names on. The generation is left as it was: it only counts names
// leaving a session (see schema/lease.sql), and a new session_id already
// tells every store's fast renewal that its names are gone.
const refreshSession = `  ON CONFLICT (holder, ttl_us) DO UPDATE
     SET session_id = CASE WHEN s.expires_at > now() THEN s.session_id ELSE EXCLUDED.session_id END,
         expires_at = EXCLUDED.expires_at
  RETURNING s.session_id
`

// AcquireSession takes lease $1 for holder $2 on the holder's session of
// TTL $3 microseconds, the attaching acquire named by the random id $4. It
// returns one row: state, token, the holder found, the token space.
// state is 'granted' (token: the new token, +1, or 1 for a new name),
// 'held' (token: the current one), or 'mine' (the name is held on this
// holder's live session by an acquire with the same id $4: this very
// acquire, sent again by database/sql after its first answer was lost —
// lib/pq reports a broken connection after sending as driver.ErrBadConn —
// so its caller never got that grant).
//
// How it decides, in one statement (Read Committed; the CTE names below):
//
//   - prev locks the lease row (FOR UPDATE): in Read Committed a locking
//     read waits for a concurrent acquire, release or take-over of the
//     name and returns the row as it left it, and no other statement can
//     change the row until this one commits.
//   - A row without session_id is judged as without the mode: free when
//     its expires_at has passed (released: '-infinity').
//   - A row on a session is free when that session is over. locked reads
//     and locks that session row (FOR UPDATE, which a renewal's UPDATE
//     waits for) in its latest version, by (holder, session_id), together
//     with the holder's own session row (see Locks above); cur is the
//     former: no row means the session is gone — replaced by a newer one of the holder
//     (a session_id is never drawn twice) or deleted — and a row whose
//     expires_at has passed means expired. Either way the name is free.
//   - That conclusion needs the lease row's attachment to be in this
//     statement's snapshot (snap equals prev): a session row inserted by a
//     transaction that committed after the snapshot is invisible here,
//     and reading no row would wrongly mean gone. When the lease row was
//     attached after the snapshot (prev found it only by waiting for its
//     lock), someone acquired the name just now, on a live session: held.
//     At Repeatable Read or Serializable the locking reads fail with a
//     serialization failure instead, and the statement runs again.
//   - ended marks an expired session of ANOTHER holder (or of this holder
//     with another TTL) ended (expires_at = '-infinity') when its name is
//     taken. A renewal of that session already under way, whose now() was
//     before the expiry and whose snapshot still shows the name attached,
//     waits for locked's lock and then re-checks its WHERE on the session
//     row's new version: ended, so it fails. Without this it would extend
//     the session and report the name renewed while this holder has it.
//     The session's other names were expired anyway.
//   - sess refreshes the holder's own session (holder $2, TTL $3) or
//     starts it, only when the name is free: extended to now() + TTL while
//     unexpired, or a new session_id when it expired (ending all the names
//     of the old one for good). This renews all the holder's names of that
//     TTL: the mode's trade-off. The grant's Start, read before the
//     request, is thus never after the session's new start: the name's
//     expiry is never earlier than Start + TTL, with no backdating.
//   - granted writes the name with token + 1, attached to that session.
//     Its ON CONFLICT WHERE accepts only the row prev judged (token + 1 =
//     the new token): when prev saw no row and another acquire inserted
//     the name first, the new row is that holder's, and this acquire is
//     refused.
//
// The holder's own live name is refused ('held'), as without the mode
// (an acquire while a holding period is unexpired, whoever holds it).
//
// The statement writes only when it grants; then it carries
// DurableCommit. A refusal only takes row locks.
const AcquireSession = `WITH prev AS (
  SELECT holder, token, expires_at, session_id, acquire_id
    FROM leasefence.lease WHERE name = $1::text FOR UPDATE
), snap AS (
  SELECT token, session_id FROM leasefence.lease WHERE name = $1::text
), locked AS (
  SELECT s.holder, s.ttl_us, s.session_id, s.expires_at > now() AS live
    FROM leasefence.holder_session s
   WHERE EXISTS (SELECT FROM prev JOIN snap ON snap.token = prev.token AND snap.session_id = prev.session_id)
     AND ((s.holder = $2::text AND s.ttl_us = $3::bigint)
          OR (s.holder, s.session_id) = (SELECT holder, session_id FROM prev))
   ORDER BY s.holder, s.ttl_us
   FOR UPDATE
), cur AS (
  SELECT locked.holder, locked.ttl_us, locked.live
    FROM locked JOIN prev ON locked.holder = prev.holder AND locked.session_id = prev.session_id
), verdict AS (
  SELECT CASE
           WHEN prev.token IS NULL THEN 'free'
           WHEN prev.session_id IS NULL THEN CASE WHEN prev.expires_at <= now() THEN 'free' ELSE 'held' END
           WHEN snap.token IS DISTINCT FROM prev.token OR snap.session_id IS DISTINCT FROM prev.session_id THEN 'held'
           WHEN cur.live IS NULL OR NOT cur.live THEN 'free'
           WHEN prev.holder = $2::text AND prev.acquire_id = $4::bigint THEN 'mine'
           ELSE 'held' END AS state,
         coalesce(prev.token, 0) AS token, coalesce(prev.holder, '') AS holder
    FROM (SELECT 1) AS one LEFT JOIN prev ON true LEFT JOIN snap ON true LEFT JOIN cur ON true
), ended AS (
  UPDATE leasefence.holder_session s SET expires_at = '-infinity'
    FROM cur
   WHERE NOT cur.live AND NOT (cur.holder = $2::text AND cur.ttl_us = $3::bigint)
     AND s.holder = cur.holder AND s.ttl_us = cur.ttl_us
  RETURNING s.holder
), sess AS (
  INSERT INTO leasefence.holder_session AS s (holder, ttl_us, session_id, expires_at)
  SELECT $2::text, $3::bigint, gen_random_uuid(), now() + $3::bigint * interval '1 microsecond'
    FROM verdict WHERE verdict.state = 'free' AND ` + DurableCommit + `
` + refreshSession + `), granted AS (
  INSERT INTO leasefence.lease AS l (name, holder, token, expires_at, session_id, acquire_id)
  SELECT $1::text, $2::text, verdict.token + 1, 'infinity', sess.session_id, $4::bigint
    FROM verdict, sess
  ON CONFLICT (name) DO UPDATE
     SET holder = EXCLUDED.holder, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at,
         session_id = EXCLUDED.session_id, acquire_id = EXCLUDED.acquire_id
   WHERE l.token + 1 = EXCLUDED.token
  RETURNING l.token
)
SELECT CASE WHEN EXISTS (SELECT FROM granted) THEN 'granted'
            WHEN verdict.state = 'free' THEN 'held'
            ELSE verdict.state END,
       coalesce((SELECT token FROM granted), verdict.token), verdict.holder, leasefence.token_space()
  FROM verdict`

// UndoAcquireSession ends the hold that the acquire with id $3 gave lease
// $1 for holder $2, if the name still hangs on a session by that acquire:
// an acquire whose answer was lost took effect unknown to its caller, and
// the holder's renewals of its other names would keep it held for ever.
// No other hold has that id, so a hold the caller knows of is never
// touched. Like Release it leaves the token and notifies waiters.
const UndoAcquireSession = `UPDATE leasefence.lease SET session_id = NULL, acquire_id = NULL, expires_at = '-infinity'
 WHERE name = $1::text AND holder = $2::text AND acquire_id = $3::bigint AND session_id IS NOT NULL
RETURNING pg_notify('` + LeaseFreeChannel + `', 'leasefence.' || $1), ` + DurableCommit

// sessionDiagnosis ends RenewSession and ReleaseSession, as diagnosis does
// Renew and Release: no row when the statement changed something, else the
// lease row as it was and its session. Columns: exists, holder, token,
// released, on a session, held without a session, the session still
// carries the lease's session_id, that session is unexpired, its TTL in
// microseconds.
const sessionDiagnosis = `
SELECT l.name IS NOT NULL, coalesce(l.holder, ''), coalesce(l.token, 0),
       coalesce(l.session_id IS NULL AND l.expires_at = '-infinity', false),
       coalesce(l.session_id IS NOT NULL, false),
       coalesce(l.session_id IS NULL AND l.expires_at > now(), false),
       s.session_id IS NOT NULL, coalesce(s.expires_at > now(), false), coalesce(s.ttl_us, 0)
  FROM (SELECT 1) AS one LEFT JOIN leasefence.lease l ON l.name = $1::text
  LEFT JOIN leasefence.holder_session s ON s.holder = l.holder AND s.session_id = l.session_id
 WHERE NOT EXISTS (SELECT FROM u)`

// RenewSession renews the grant ($1 name, $2 holder, $3 token, $4 TTL in
// microseconds) by extending its holder session to now() + TTL: one UPDATE
// of one session row, whatever the number of names on it — every one of
// them is renewed with it. It renews only while the session is unexpired
// and the lease row still hangs on it with the grant's holder and token
// (not released, not taken over, not on a session that was replaced). The
// lease row is read, never written. See sessionDiagnosis for the row it
// returns when it renewed nothing.
const RenewSession = `WITH u AS (
  UPDATE leasefence.holder_session s SET expires_at = now() + $4::bigint * interval '1 microsecond'
   WHERE s.holder = $2::text AND s.ttl_us = $4::bigint AND s.expires_at > now()
     AND s.session_id = (SELECT l.session_id FROM leasefence.lease l
                          WHERE l.name = $1::text AND l.holder = $2::text AND l.token = $3::bigint)
  RETURNING ` + DurableCommit + `
)` + sessionDiagnosis

// ReleaseSession ends the grant ($1 name, $2 holder, $3 token, $4 TTL in
// microseconds) alone: the lease row leaves its session (session_id NULL)
// and reads released ('-infinity'), while the session and its other names
// live on. Only while the session is unexpired and the row hangs on it with
// the grant's holder and token. It notifies waiters as Release does. See
// sessionDiagnosis for the row it returns when it released nothing.
const ReleaseSession = `WITH u AS (
  UPDATE leasefence.lease l SET session_id = NULL, acquire_id = NULL, expires_at = '-infinity'
   WHERE l.name = $1::text AND l.holder = $2::text AND l.token = $3::bigint AND l.session_id IS NOT NULL
     AND EXISTS (SELECT FROM leasefence.holder_session s
                  WHERE s.holder = $2::text AND s.ttl_us = $4::bigint AND s.session_id = l.session_id
                    AND s.expires_at > now())
  RETURNING pg_notify('` + LeaseFreeChannel + `', 'leasefence.' || $1), ` + DurableCommit + `
)` + sessionDiagnosis

// RenewAllSession renews many grants of holder $1 ($2: a JSON array of
// {"name", "token", "ttl_us"}) with one UPDATE that extends each holder
// session at least one of them hangs on — one row for all the names of one
// TTL. A grant is renewed when its lease row hangs on its session (the
// holder's row of the grant's TTL) with its token and that session was
// extended. It returns one row per grant NOT renewed: name, then
// sessionDiagnosis's columns, then 0, an empty text and 0; and one row per
// session it extended: an empty name, the diagnosis columns' zero values,
// then the session's TTL
// in microseconds, its session_id (as text) and its generation as this
// statement's snapshot shows them — the generation at which the lease rows
// it judged were read, which is what a later RenewSessionGeneration may
// rely on. (When a concurrent release committed after the snapshot, the
// UPDATE extends the row's newer version, whose generation is larger: the
// one returned is then already stale, and the next fast renewal falls back
// to this statement, as it should.)
//
// Its shape leaves the planner no quadratic plan, whatever the tables'
// statistics say (as RenewAll's; see there). Written as input JOIN lease,
// att was planned, once the statistics estimated the holder's rows on a
// session at one (the lease table analyzed before the holder acquired its
// names, or while it held only names without sessions), as a nested loop
// of a sequential scan of the lease table and a scan of the input: 999,000
// pairs for 1,000 names. And the NOT EXISTS that picked the grants not
// renewed was planned, in every state, as a nested loop anti join that
// scanned att once per input row until it met its name: 499,500 pairs for
// 1,000 renewed names. Together 45-250 ms for 1,000 names instead of 3.
// Here att looks each name up through the primary key in a LATERAL
// subquery that OFFSET 0 keeps from being flattened into a join (a
// subquery with a LIMIT or OFFSET is never pulled up), and the grants
// renewed are a NOT IN list: a subquery behind NOT IN is never turned into
// a join (NOT IN is no anti join when the list may hold a NULL), and it is
// hashed whenever its estimated size fits in work_mem (json_to_recordset
// is estimated at 100 rows). No name is NULL (the store builds the list),
// so NOT IN means what NOT EXISTS did.
const RenewAllSession = `WITH input AS (
  SELECT * FROM json_to_recordset($2::json) AS i(name text, token bigint, ttl_us bigint)
), att AS (
  SELECT i.name, i.ttl_us, l.session_id
    FROM input i
   CROSS JOIN LATERAL (
     SELECT l.session_id FROM leasefence.lease l
      WHERE l.name = i.name AND l.holder = $1::text AND l.token = i.token AND l.session_id IS NOT NULL
     OFFSET 0) AS l
), seen AS (
  SELECT s.ttl_us, s.session_id, s.generation FROM leasefence.holder_session s
   WHERE s.holder = $1::text AND (s.ttl_us, s.session_id) IN (SELECT ttl_us, session_id FROM att)
), u AS (
  UPDATE leasefence.holder_session s SET expires_at = now() + s.ttl_us * interval '1 microsecond'
   WHERE s.holder = $1::text AND s.expires_at > now()
     AND (s.ttl_us, s.session_id) IN (SELECT ttl_us, session_id FROM att)
  RETURNING s.ttl_us, s.session_id, ` + DurableCommit + ` AS durable
)
SELECT input.name, l.name IS NOT NULL, coalesce(l.holder, ''), coalesce(l.token, 0),
       coalesce(l.session_id IS NULL AND l.expires_at = '-infinity', false),
       coalesce(l.session_id IS NOT NULL, false),
       coalesce(l.session_id IS NULL AND l.expires_at > now(), false),
       s.session_id IS NOT NULL, coalesce(s.expires_at > now(), false), coalesce(s.ttl_us, 0),
       0::bigint, '', 0::bigint
  FROM input LEFT JOIN leasefence.lease l ON l.name = input.name
  LEFT JOIN leasefence.holder_session s ON s.holder = l.holder AND s.session_id = l.session_id
 WHERE input.name NOT IN (SELECT att.name FROM att JOIN u ON u.ttl_us = att.ttl_us AND u.session_id = att.session_id)
UNION ALL
SELECT '', false, '', 0::bigint, false, false, false, false, false, 0::bigint,
       u.ttl_us, u.session_id::text, seen.generation
  FROM u JOIN seen ON seen.ttl_us = u.ttl_us AND seen.session_id = u.session_id`

// RenewSessionsGeneration is RenewAll's fast path with holder sessions, for
// the fast renewals of one or more holders at once ($1: a JSON array of
// {"holder", "ttl_us", "session_id", "generation"}): it extends each
// holder's session of that TTL while it still has that session_id and
// generation and is unexpired, and returns holder, ttl_us, session_id and
// generation of each session it extended. The caller knows, from a
// RenewAllSession at that generation, that the names it renews were on
// that session then; the generation grows with every name that leaves the
// session or changes its holding period (the trigger
// lease_detached_from_session, in the same transaction as the change), and
// a session_id is never drawn twice, so an unchanged (session_id,
// generation) means every one of those names is still on it with its
// token: the session row alone is updated, no lease row is read.
//
// The rows are locked in one ordered pass (FOR UPDATE, as every statement
// of the mode that locks several session rows; see Locks above), which
// re-checks the conditions on each row's latest version; the UPDATE then
// changes exactly the versions it locked, found by primary key (holder =
// ANY of the locked holders, an index condition). The lock sits in a LATERAL
// subquery, one primary-key probe per input row in the input's order: a
// subquery with a locking clause is never flattened into a join, and as a
// join the planner, which guesses 100 rows for json_to_recordset, hashed
// the input and scanned the whole table (2.6 ms with 10,000 sessions, where
// the probes take microseconds). One statement, one durable
// commit, for every holder in $1: the fencepg.LeaseStore gathers the fast
// renewals that its concurrent RenewAll calls want while one is running.
const RenewSessionsGeneration = `WITH input AS (
  SELECT * FROM json_to_recordset($1::json) AS i(holder text, ttl_us bigint, session_id uuid, generation bigint)
), locked AS (
  SELECT l.holder, l.ttl_us
    FROM (SELECT * FROM input ORDER BY holder, ttl_us) AS i
   CROSS JOIN LATERAL (
     SELECT s.holder, s.ttl_us FROM leasefence.holder_session s
      WHERE s.holder = i.holder AND s.ttl_us = i.ttl_us AND s.session_id = i.session_id
        AND s.generation = i.generation AND s.expires_at > now()
        FOR UPDATE) AS l
)
UPDATE leasefence.holder_session s SET expires_at = now() + s.ttl_us * interval '1 microsecond'
 WHERE s.holder = ANY (ARRAY(SELECT holder FROM locked))
   AND (s.holder, s.ttl_us) IN (SELECT holder, ttl_us FROM locked) AND ` + DurableCommit + `
RETURNING s.holder, s.ttl_us, s.session_id::text, s.generation`

// TakeOverSession is TakeOver for a store with holder sessions: the name
// goes to holder $2 on its session of TTL $3 microseconds (refreshed or
// started as AcquireSession's sess does), whatever its state, with token +
// 1. The previous holding period ends; if it hung on another session, that
// session and its other names are left alone. Same columns as TakeOver.
const TakeOverSession = `WITH ` + takeOverPrev + `, sess AS (
  INSERT INTO leasefence.holder_session AS s (holder, ttl_us, session_id, expires_at)
  SELECT $2::text, $3::bigint, gen_random_uuid(), now() + $3::bigint * interval '1 microsecond'
    FROM (SELECT 1) AS one LEFT JOIN prev ON true
   WHERE ` + DurableCommit + `
` + refreshSession + `), taken AS (
  INSERT INTO leasefence.lease AS l (name, holder, token, expires_at, session_id, acquire_id)
  SELECT $1::text, $2::text, 1, 'infinity', sess.session_id, NULL FROM sess
  ON CONFLICT (name) DO UPDATE
     SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at,
         session_id = EXCLUDED.session_id, acquire_id = NULL
  RETURNING l.token
)` + takeOverResult
