-- The fenced outbox (fencepg.Outbox); applied with the resource schema by
-- Migrate and ResourceDDL, after resource.sql (it relies on fence_floor).
--
-- An entry is inserted inside a fenced transaction of its claim, only
-- while the scope's floor equals the entry's token, and commits only if
-- the transaction's comparison at commit still finds the floor at that
-- token, so a stale holder's entry never exists. A relay delivers pending
-- entries in seq order and sets delivered_at once the downstream
-- acknowledged.
--
-- seq orders the entries (identity values are handed out in insert order,
-- and within a scope an entry of a larger token is inserted only after the
-- floor reached it, so after every entry of a smaller token that commits
-- was inserted); id is the identity the downstream
-- deduplicates by: random, so it is never reused, also after the table is
-- restored from a backup or recreated (seq would start again).
CREATE TABLE IF NOT EXISTS leasefence.outbox (
  seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id           uuid NOT NULL DEFAULT gen_random_uuid(),
  scope        text NOT NULL,
  token        bigint NOT NULL,
  writer       text NOT NULL,
  topic        text NOT NULL,
  payload      bytea NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  delivered_at timestamptz
);

-- What a relay reads: the pending entries in seq order. Partial, so that
-- delivered entries kept for audit cost the relay nothing.
CREATE INDEX IF NOT EXISTS outbox_pending ON leasefence.outbox (seq) WHERE delivered_at IS NULL;
