-- The lease database. One row per lease name; applied by LeaseStore.Migrate.
-- States: held (expires_at > now()), expired (expires_at <= now()),
-- released (expires_at = '-infinity', a special case of expired); no row = free.
-- token only ever grows: every acquire sets it to token + 1 (I2).
CREATE TABLE IF NOT EXISTS leasefence.lease (
  name       text PRIMARY KEY,
  holder     text NOT NULL,
  token      bigint NOT NULL CHECK (token > 0),
  expires_at timestamptz NOT NULL
);
