package pgsql

// Acquire takes lease $1 for holder $2 for $3 microseconds. It returns one
// row, the new token, when the lease was free (no row: token 1), expired or
// released (token + 1); no row when it is held.
//
// It is one INSERT ... ON CONFLICT DO UPDATE: PostgreSQL guarantees an
// atomic insert-or-update outcome, and a concurrent acquire of the same
// name waits on the row (or on the unique index for a new name) and then
// evaluates the WHERE against the row that won, so of N concurrent
// acquirers exactly one gets a row back. RETURNING returns only rows
// actually inserted or updated: a row back means acquired.
//
// The TTL travels as integer microseconds (PostgreSQL's timestamp
// resolution), so no float rounding or interval parsing is involved.
//
// Its row comes from a SELECT rather than VALUES only so that it can carry
// DurableCommit.
//
// The row also carries the schema's token space (token_space(), see
// schema/lease.sql): an immutable SQL function returning a constant, which
// the planner inlines and folds, so the grant names its space at no cost.
//
// A name on a holder session (AcquireSession) has expires_at 'infinity':
// this statement sees it as held until it is released, and never takes it
// from a session, even an expired one (see fencepg.WithSharedLeases).
const Acquire = `INSERT INTO leasefence.lease AS l (name, holder, token, expires_at)
SELECT $1::text, $2::text, 1, now() + $3::bigint * interval '1 microsecond' WHERE ` + DurableCommit + `
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at
 WHERE l.expires_at <= now()
RETURNING l.token, leasefence.token_space()`

// TokenSpacePrefix is what a PostgreSQL lease schema's token space starts
// with, before the schema's UUID: leasecore.Grant.Space reads
// "postgres:<uuid>".
const TokenSpacePrefix = "postgres:"

// DurableCommit is a condition that is always true and, as a side effect,
// makes the transaction it is evaluated in commit durably: where the
// server, database or role default is synchronous_commit = off (or local),
// it sets synchronous_commit = on for this transaction only (set_config
// with is_local), so the commit is acknowledged only after its WAL is
// flushed (and, with synchronous standbys, confirmed by them). Stricter
// levels (remote_write, remote_apply) are left alone. Every statement that
// issues a token, extends or ends a holding period, or raises or relies on
// a scope's floor carries it, where it is evaluated whenever the statement
// writes: a token acknowledged and then lost in a crash would be issued
// twice (PostgreSQL docs §19.5.1 synchronous_commit; §30.4 Asynchronous
// Commit). It is part of the statement, not a SET of its own, because the
// statements run as single-statement transactions (SET LOCAL needs a
// transaction block) and an extra statement would cost a round trip or a
// pipeline slot; the setting is read at commit, after the statement ran.
// The server's fsync cannot be changed per transaction: the startup check
// refuses fsync = off.
const DurableCommit = `CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')
  THEN set_config('synchronous_commit', 'on', true) IS NOT NULL ELSE true END`

// heldBy selects the one holding period a grant names ($1 name, $2 holder,
// $3 token) if it is unexpired. The token identifies the holding period
// (tokens are never reused); expires_at > now() refuses a late renew or
// release; holder guards against a caller mixing up grants. session_id IS
// NULL keeps these statements off a name that hangs on a holder session
// (WithSharedLeases): its expires_at is 'infinity' and means nothing to
// them; renewing it here would give it an expiry of its own that a store
// without the mode would later treat as free while the session still
// holds it. The column is in the row already read: it costs nothing.
const heldBy = `WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now() AND session_id IS NULL`

// diagnosis ends Renew and Release. A data-modifying WITH clause and the
// main query run on one snapshot, so the main query sees the lease row as
// it was before the statement: when the update did not happen, that row
// says why, without a second round trip. When the update happened, the
// uncorrelated NOT EXISTS is a one-time filter that skips the lookup and
// returns no row at all: the common case costs nothing extra. Columns of
// the one row returned on failure: exists, holder, token, released, held,
// and whether the lease hangs on a holder session (see heldBy).
const diagnosis = `
SELECT l.name IS NOT NULL, coalesce(l.holder, ''), coalesce(l.token, 0),
       coalesce(l.expires_at = '-infinity', false), coalesce(l.expires_at > now(), false),
       coalesce(l.session_id IS NOT NULL, false)
  FROM (SELECT 1) AS one LEFT JOIN leasefence.lease l ON l.name = $1
 WHERE NOT EXISTS (SELECT FROM u)`

// Renew extends the holding period ($1 name, $2 holder, $3 token) to now()
// plus $4 microseconds, only while it is unexpired. See diagnosis for the
// row it returns.
const Renew = `WITH u AS (
  UPDATE leasefence.lease SET expires_at = now() + $4::bigint * interval '1 microsecond'
  ` + heldBy + `
  RETURNING ` + DurableCommit + `
)` + diagnosis

// Release ends the holding period ($1 name, $2 holder, $3 token) by setting
// its expiry to -infinity, only while it is unexpired; the token stays, so
// the next acquire issues token + 1. See diagnosis for the row it returns.
//
// When it does end the holding period it also notifies LeaseFreeChannel
// (see there), from the UPDATE's RETURNING, so the notification is sent
// only for a lease actually released and, being part of the statement's
// transaction, delivered to listeners when the release commits and never
// when it does not.
const Release = `WITH u AS (
  UPDATE leasefence.lease SET expires_at = '-infinity'
  ` + heldBy + `
  RETURNING pg_notify('` + LeaseFreeChannel + `', 'leasefence.' || $1), ` + DurableCommit + `
)` + diagnosis

// LeaseFreeChannel is the notification channel Release notifies and
// LeaseStore.WaitFree listens on. There is one channel for every store of a
// database, and the payload names the lease: "<schema>.<name>" (InSchema
// moves the 'leasefence.' prefix with the tables). A channel per name would
// need names that fit an identifier (63 bytes, PostgreSQL's NAMEDATALEN - 1)
// and would fail the release for longer ones; a payload takes up to 8000
// bytes, far above backendkit.MaxNameLen. The channel name has no schema in
// it for the same reason: a 63-byte schema would not leave room.
const LeaseFreeChannel = "leasefence_lease_free"

// Listen and Unlisten start and stop this session's subscription to
// LeaseFreeChannel. LISTEN takes effect when its transaction commits
// (autocommit here) and a NOTIFY is delivered when its transaction commits,
// to the sessions listening then; so a read that starts after Listen
// returned either sees a release or is notified of it.
const (
	Listen   = `LISTEN ` + LeaseFreeChannel
	Unlisten = `UNLISTEN ` + LeaseFreeChannel
)

// RenewAll renews many holding periods of holder $1 in one statement: $2
// is a JSON array of {"name", "token", "ttl_us"}. Each lease is judged on
// its own, by the same rule as Renew (holder, token, expires_at > now(),
// no holder session). It returns one row per lease it did NOT renew, with
// that lease's row as it was before the statement (see diagnosis): columns
// name, exists, holder, token, released, held, on a holder session. No row
// back means all were renewed.
//
// Its shape leaves the planner no quadratic plan, whatever the table's
// statistics say. Written as UPDATE ... FROM input WHERE l.name =
// input.name, it was planned as a nested loop of a sequential scan of
// the lease table and a scan of the input, once the table's statistics
// estimated the holder's unexpired rows at one: a RenewAll of 1,000 names
// compared 999,000 pairs and took 250-400 ms instead of 15 (the bimodal
// rounds of make bench's renew_1000_leases_per_lease). Here each input row
// locks its lease row through the primary key (a LATERAL subquery with
// FOR UPDATE, which the planner cannot flatten into a join, so it probes
// the index once per name); the UPDATE then finds exactly the locked rows
// by an index scan of the name array and takes each row's TTL from a JSON
// object built once (an InitPlan), a lookup, not a join. The locks are
// the statement's own, so nothing can change a locked row between the two.
const RenewAll = `WITH input AS (
  SELECT * FROM json_to_recordset($2::json) AS i(name text, token bigint, ttl_us bigint)
), locked AS (
  SELECT l.name, i.ttl_us
    FROM input i
   CROSS JOIN LATERAL (
     SELECT l.name FROM leasefence.lease l
      WHERE l.name = i.name AND l.holder = $1 AND l.token = i.token AND l.expires_at > now()
        AND l.session_id IS NULL
        FOR UPDATE) AS l
), u AS (
  UPDATE leasefence.lease l
     SET expires_at = now() + ((SELECT jsonb_object_agg(name, ttl_us) FROM locked) ->> l.name)::bigint * interval '1 microsecond'
   WHERE l.name = ANY (ARRAY(SELECT name FROM locked))
  RETURNING l.name, ` + DurableCommit + `
)
SELECT input.name, l.name IS NOT NULL, coalesce(l.holder, ''), coalesce(l.token, 0),
       coalesce(l.expires_at = '-infinity', false), coalesce(l.expires_at > now(), false),
       coalesce(l.session_id IS NOT NULL, false)
  FROM input LEFT JOIN leasefence.lease l ON l.name = input.name
 WHERE input.name NOT IN (SELECT name FROM u)`

// Inspect reads lease $1: holder, token, held, released, and the remaining
// time in microseconds. The remaining time is computed only for a held
// lease: subtracting now() from -infinity is an error (and from the
// 'infinity' of a name on a holder session, before PostgreSQL 17).
//
// It reads names of both modes (the store that reads need not be the one
// that acquired): a name on a holder session expires when its session
// does (see Expiry).
const Inspect = `SELECT l.holder, l.token, e.at > now(), l.session_id IS NULL AND l.expires_at = '-infinity',
       CASE WHEN e.at > now()
            THEN (extract(epoch FROM e.at - now()) * 1000000)::bigint
            ELSE 0 END
  FROM leasefence.lease l, LATERAL (SELECT ` + Expiry + ` AS at) e WHERE l.name = $1`

// Expiry is when the holding period of lease row l ends, by either mode: its
// own expires_at, or for a name on a holder session the session's
// expires_at, '-infinity' when that session is gone (replaced by a newer
// one of the holder, or deleted). The session is read through
// holder_session_expiry (schema/lease.sql), so a role without holder
// sessions needs no privilege on their table. Never 'infinity'.
const Expiry = `CASE WHEN l.session_id IS NULL THEN l.expires_at
            ELSE coalesce(leasefence.holder_session_expiry(l.holder, l.session_id), '-infinity') END`
