package pgsql

// Statements for operators (fencepg's LeaseStore.List, LeaseStore.TakeOver,
// Fence.Floors, Fence.RejectedAttempts): reads of every lease or floor,
// and the forced take-over that ends a holding period before its TTL.

// ListLeases reads at most $1 leases in name order, with Inspect's columns
// after the name: name, holder, token, held, released, remaining
// microseconds (by the database clock at the moment of the read). Names on
// a holder session are held while their session is (see Expiry).
const ListLeases = `SELECT l.name, l.holder, l.token, e.at > now(), l.session_id IS NULL AND l.expires_at = '-infinity',
       CASE WHEN e.at > now()
            THEN (extract(epoch FROM e.at - now()) * 1000000)::bigint
            ELSE 0 END
  FROM leasefence.lease l, LATERAL (SELECT ` + Expiry + ` AS at) e ORDER BY l.name LIMIT $1::int`

// TakeOver gives lease $1 to holder $2 for $3 microseconds whatever its
// state, with token + 1 (1 for a new name), like Acquire without its WHERE:
// an unexpired holding period is ended by being replaced. The token only
// grows and the row is never deleted, so the token-space guards let it
// through and the token is never issued twice (I2).
//
// The locked CTE locks the row first (FOR UPDATE; in Read Committed a
// locking read waits for a concurrent acquire or renew and then returns
// the row as that one left it), prev reads it, and the INSERT reads prev
// in its row source, so prev is evaluated, and the row locked, before the
// update: the state it reports is the holding period this statement
// ended. Columns:
// the new token, then whether a row existed and its holder, token, held
// and released before, and the remaining microseconds it had; last the
// schema's token space (see Acquire).
//
// The previous state is read by either mode's rule (see Expiry): a name on
// a holder session is taken off it (session_id NULL), which ends that
// name's holding period and no other name of the session. The session
// itself is left alone, its other names stay held.
//
// It carries DurableCommit: it issues a token.
const TakeOver = `WITH ` + takeOverPrev + `, taken AS (
  INSERT INTO leasefence.lease AS l (name, holder, token, expires_at)
  SELECT $1::text, $2::text, 1, now() + $3::bigint * interval '1 microsecond'
    FROM (SELECT 1) AS one LEFT JOIN prev ON true
   WHERE ` + DurableCommit + `
  ON CONFLICT (name) DO UPDATE
     SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at,
         session_id = NULL, acquire_id = NULL
  RETURNING l.token
)` + takeOverResult

// takeOverPrev locks lease $1 and reads the state it had (see TakeOver),
// for TakeOver and TakeOverSession.
const takeOverPrev = `locked AS (
  SELECT * FROM leasefence.lease WHERE name = $1::text FOR UPDATE
), prev AS (
  SELECT l.holder, l.token, e.at > now() AS held, l.session_id IS NULL AND l.expires_at = '-infinity' AS released,
         CASE WHEN e.at > now()
              THEN (extract(epoch FROM e.at - now()) * 1000000)::bigint ELSE 0 END AS remaining
    FROM locked l, LATERAL (SELECT ` + Expiry + ` AS at) e
)`

// takeOverResult is the one row TakeOver and TakeOverSession return.
const takeOverResult = `
SELECT taken.token, prev.holder IS NOT NULL, coalesce(prev.holder, ''), coalesce(prev.token, 0),
       coalesce(prev.held, false), coalesce(prev.released, false), coalesce(prev.remaining, 0),
       leasefence.token_space()
  FROM taken LEFT JOIN prev ON true`

// ListFloors reads at most $1 floors in scope order: scope, max_token.
const ListFloors = `SELECT scope, max_token FROM leasefence.fence_floor ORDER BY scope LIMIT $1::int`

// RejectedAttemptsSince is AttemptsSince for rejected entries only: at
// most $3 of them, of scope $1, logged at or after $2, oldest first.
const RejectedAttemptsSince = `SELECT part, writer, token, accepted, floor, attempted_at
  FROM leasefence.write_attempt
 WHERE scope = $1::text AND attempted_at >= $2::timestamptz AND NOT accepted
 ORDER BY id LIMIT $3::int`
