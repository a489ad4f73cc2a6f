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

-- The token space of this lease schema: a random UUID, made once when the
-- schema is first migrated and never changed, that every grant names
-- (leasecore.Grant.Space = 'postgres:' || token_space()), so that a fence
-- can tell tokens of this schema from those of any other lease service
-- (tokens 1, 2, ... of two schemas, or of a schema dropped and made again,
-- are not comparable). A function rather than a table: it needs no GRANT
-- (EXECUTE is PUBLIC's by default), no row can be deleted by a cleanup,
-- and the planner folds the constant into the acquire statement, which
-- returns it at no cost. Made by EXECUTE so that the UUID is drawn by the
-- server when the script runs: a script applied to two databases gives
-- two spaces. gen_random_uuid() is in core since PostgreSQL 13.
DO $$
BEGIN
  IF to_regprocedure('leasefence.token_space()') IS NULL THEN
    EXECUTE format('CREATE FUNCTION leasefence.token_space() RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
      'SELECT ' || quote_literal(gen_random_uuid()::text));
    COMMENT ON FUNCTION leasefence.token_space() IS
      'leasefence: the token space of this lease schema; never change it (fences compare it with the space stored with their floors)';
  END IF;
END
$$;

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
