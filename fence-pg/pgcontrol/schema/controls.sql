-- The negative controls' own table, in the resource database; applied by
-- pgcontrol's Migrate. The other controls reuse fencepg's resource tables.

-- A stand-in for an external side effect that only deduplicates by
-- business key (F9).
CREATE TABLE IF NOT EXISTS leasefence.published (
  business_key text PRIMARY KEY,
  content      text NOT NULL,
  writer       text NOT NULL,
  token        bigint NOT NULL,
  published_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
