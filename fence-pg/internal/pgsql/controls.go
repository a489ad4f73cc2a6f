package pgsql

// The statements of the negative controls (package pgcontrol). They are
// counterexamples: each one leaves out part of FencedWrite, and the
// conformance suite shows the failure that follows. Parameters, where not
// stated: $1 scope, $2 part, $3 content, $4 writer, $5 token.

// currentFloor is the scope's floor as a WITH clause, for controls that
// log it without maintaining it.
const currentFloor = `floor AS (` + ReadFloor + `)`

// UnfencedWrite upserts the part whatever the token, and logs the attempt
// as accepted with the scope's floor, which it never touches.
const UnfencedWrite = `WITH part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
  ` + upsertPart + `
), ` + currentFloor + `, attempt AS (
  INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, $2::text, $4::text, $5::bigint, true, floor.max_token FROM floor
)
SELECT max_token FROM floor`

// RowFencedWrite compares the token with the stored part's token only:
// the conflicting row is updated when its token is not larger. A part
// that does not exist yet has no token to compare with and is always
// inserted (the F7 hole). Returns accepted and the scope's floor, which
// it never touches.
const RowFencedWrite = `WITH part AS (
  INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
  ` + upsertPart + `
   WHERE p.token <= EXCLUDED.token
  RETURNING 1
), ` + currentFloor + `, attempt AS (
  INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, $2::text, $4::text, $5::bigint, EXISTS (SELECT FROM part), floor.max_token FROM floor
)
SELECT EXISTS (SELECT FROM part), max_token FROM floor`

// Publish inserts content under business key $6 unless the key exists
// (tokens ignored), and logs the attempt with the scope's floor. Returns
// accepted (a row was inserted) and the floor.
const Publish = `WITH pub AS (
  INSERT INTO leasefence.published (business_key, content, writer, token) VALUES ($6, $3, $4, $5)
  ON CONFLICT (business_key) DO NOTHING
  RETURNING 1
), ` + currentFloor + `, attempt AS (
  INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  SELECT $1::text, $2::text, $4::text, $5::bigint, EXISTS (SELECT FROM pub), floor.max_token FROM floor
)
SELECT EXISTS (SELECT FROM pub), max_token FROM floor`

// ReadPublished returns content, writer, token and published_at of
// business key $1; no row when it was never published.
const ReadPublished = `SELECT content, writer, token, published_at FROM leasefence.published WHERE business_key = $1`

// SetFloor sets the floor of scope $1 to $2 unconditionally: the
// check-then-write control's second step, which can move it backwards.
// The naive design it models has no guard on its floor, so it takes the
// administrative path past the schema's (AllowTokenReset, for its own
// transaction only); with the guard, the backwards move would be refused
// and the control would no longer show the race.
const SetFloor = `INSERT INTO leasefence.fence_floor AS f (scope, max_token)
SELECT $1::text, $2::bigint WHERE set_config('` + AllowTokenReset + `', 'on', true) IS NOT NULL
  ON CONFLICT (scope) DO UPDATE SET max_token = EXCLUDED.max_token`

// UpsertPart writes the part unconditionally: the check-then-write
// control's third step.
const UpsertPart = `INSERT INTO leasefence.report_part AS p (scope, part, content, writer, token) VALUES ($1, $2, $3, $4, $5)
  ` + upsertPart

// LogAttempt logs one attempt: $1 scope, $2 part, $3 writer, $4 token,
// $5 accepted, $6 floor.
const LogAttempt = `INSERT INTO leasefence.write_attempt (scope, part, writer, token, accepted, floor)
  VALUES ($1, $2, $3, $4, $5, $6)`
