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

-- Token-space guard: the lease's token never goes down and its row is
-- never deleted (refuse_token_reset, in guard.sql, says why and gives the
-- deliberate path).
-- Each trigger is created when missing, so Migrate also repairs a schema
-- where one was dropped. A foreign table of the same name (no token column)
-- gets none: CheckSchema reports it, naming the column.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.lease'::regclass AND attname = 'token' AND NOT attisdropped) THEN
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.lease'::regclass AND tgname = 'lease_token_only_grows') THEN
    CREATE TRIGGER lease_token_only_grows BEFORE UPDATE OF token ON leasefence.lease
      FOR EACH ROW WHEN (NEW.token < OLD.token) EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.lease'::regclass AND tgname = 'lease_never_deleted') THEN
    CREATE TRIGGER lease_never_deleted BEFORE DELETE ON leasefence.lease
      FOR EACH ROW EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.lease'::regclass AND tgname = 'lease_never_truncated') THEN
    CREATE TRIGGER lease_never_truncated BEFORE TRUNCATE ON leasefence.lease
      FOR EACH STATEMENT EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
END
$$;
