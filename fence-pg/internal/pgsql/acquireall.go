package pgsql

// Statements of LeaseStore.AcquireAll (backendkit.BatchAcquirer): the fast
// path that grants, in ONE statement and one durable commit, every name of
// a batch that has no lease row yet. Tokens start at 1 and lease rows are
// never deleted (schema/lease.sql's guard refuses it), so a name without a
// row was never issued a token, and its first grant is token 1 whoever
// gets it. The statements take nothing else: a name that has a row (held,
// expired or released, in either mode) is left to the single acquire
// statement, which AcquireAll runs for it afterwards and which is correct
// for every state. $1 is a JSON array of names (text, as RenewAll's
// parameter, so that both drivers pass it the same way), $2 the holder, $3
// the TTL in microseconds.
//
// The new rows are inserted in one order, by name (COLLATE "C": bytewise,
// whatever the database's collation), so that two batches inserting
// overlapping new names wait for each other's rows in the same order
// instead of each holding one the other wants (a deadlock the server would
// break only after deadlock_timeout). A name another transaction is
// inserting at the same moment makes the INSERT wait for that transaction
// and then do nothing for the name (ON CONFLICT): it goes to the single
// acquire, which reports it held. At Repeatable Read or Serializable such
// a conflict fails the statement with a serialization failure instead,
// and the store runs it again.

// AcquireAllNew grants, without holder sessions, every name of $1 that has
// no row: token 1, holder $2, expires_at now() + $3 microseconds, as
// Acquire inserts a new name. It returns one row per name granted: name,
// token space. It carries DurableCommit as Acquire does (the condition is
// evaluated for every input row, before the insert, so whenever the
// statement writes).
const AcquireAllNew = `INSERT INTO leasefence.lease AS l (name, holder, token, expires_at)
SELECT n.name, $2::text, 1, now() + $3::bigint * interval '1 microsecond'
  FROM json_array_elements_text($1::json) AS n(name)
 WHERE ` + DurableCommit + `
 ORDER BY n.name COLLATE "C"
ON CONFLICT (name) DO NOTHING
RETURNING l.name, leasefence.token_space()`

// AcquireAllNewSession is AcquireAllNew with holder sessions: every name of
// $1 that has no row is inserted with token 1, attached to holder $2's
// session of TTL $3 microseconds (expires_at 'infinity'), named by the
// batch's one random acquire id $4. It returns one row per name granted:
// name, token space.
//
//   - input is the names of $1 without a row in the statement's snapshot
//     (and the names whose row this very batch attached, see mine below).
//   - sess refreshes the holder's session or starts it, exactly as
//     AcquireSession's sess does (extended to now() + TTL while unexpired,
//     a new session_id when it expired, ending the old session's names for
//     good), and only when input has a name, so a batch of names that all
//     exist writes nothing here. It carries DurableCommit. The grants'
//     Start, read before the request, is thus never after the session's
//     new start, as for AcquireSession.
//   - granted inserts input's names on that session. It takes the session
//     row's lock before the new lease rows, where AcquireSession takes a
//     lease row's lock first (see Locks in session.go); that cannot close
//     a cycle, since the rows it waits for are new names' rows being
//     inserted, and the statements that insert a new name (AcquireSession,
//     TakeOverSession, this one) lock their session row before they insert
//     it, never after.
//   - mine: a row of one of $1's names that holder $2 holds with token 1
//     by this same acquire id $4, on the session sess returned, was
//     inserted by an earlier execution of this very statement: database/sql
//     sends a statement again on a new connection when lib/pq reports the
//     first one's connection broken after sending (driver.ErrBadConn), and
//     the first may have committed. The acquire id is random per batch,
//     so no other hold carries it. Such a row is returned as granted (the
//     ON CONFLICT DO UPDATE, which sets acquire_id to its own value, only
//     makes RETURNING show it; it changes no column the session triggers
//     watch): the caller gets the grant the lost answer carried, instead
//     of ErrHeld for a name its renewals would keep held for ever. A row
//     on another session (the first's session expired since) is not
//     returned, and the single acquire takes the name again.
const AcquireAllNewSession = `WITH input AS (
  SELECT n.name FROM json_array_elements_text($1::json) AS n(name)
   WHERE NOT EXISTS (SELECT FROM leasefence.lease l
                      WHERE l.name = n.name AND l.acquire_id IS DISTINCT FROM $4::bigint)
), sess AS (
  INSERT INTO leasefence.holder_session AS s (holder, ttl_us, session_id, expires_at)
  SELECT $2::text, $3::bigint, gen_random_uuid(), now() + $3::bigint * interval '1 microsecond'
   WHERE EXISTS (SELECT FROM input) AND ` + DurableCommit + `
` + refreshSession + `), granted AS (
  INSERT INTO leasefence.lease AS l (name, holder, token, expires_at, session_id, acquire_id)
  SELECT input.name, $2::text, 1, 'infinity', sess.session_id, $4::bigint
    FROM input, sess
   ORDER BY input.name COLLATE "C"
  ON CONFLICT (name) DO UPDATE SET acquire_id = EXCLUDED.acquire_id
   WHERE l.holder = EXCLUDED.holder AND l.token = 1 AND l.acquire_id = EXCLUDED.acquire_id
     AND l.session_id = EXCLUDED.session_id
  RETURNING l.name
)
SELECT granted.name, leasefence.token_space() FROM granted`
