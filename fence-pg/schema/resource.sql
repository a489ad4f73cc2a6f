-- The resource database; applied by Resource.Migrate. It never holds lease
-- state: the resource decides from its own floor only.

-- The largest token accepted per scope (I3).
CREATE TABLE IF NOT EXISTS leasefence.fence_floor (
  scope     text PRIMARY KEY,
  max_token bigint NOT NULL
);

-- token_space is the token space (leasecore.Claim.Space) of the token
-- that last raised max_token, NULL when the claim named none or the floor
-- was raised before the column existed. It is written only where the floor
-- is raised and read only after a rejection, to tell a token of another
-- lease service from a stale one. At max_token = 9223372036854775807, the
-- floor of a scope sealed because it moved to another database
-- (fencepg.Fence.Seal), no token raised the floor and the column holds
-- the seal's record instead, a JSON object {moved_to, floor, token_space,
-- sealed_at}. Added apart from CREATE TABLE so that
-- Migrate upgrades an existing table, and only when missing: ALTER TABLE
-- takes an ACCESS EXCLUSIVE lock even when IF NOT EXISTS finds the column,
-- and every migration would then queue behind (and hold up) the fence's
-- writers.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.fence_floor'::regclass AND attname = 'token_space' AND NOT attisdropped) THEN
    ALTER TABLE leasefence.fence_floor ADD COLUMN IF NOT EXISTS token_space text;
  END IF;
END
$$;

-- The protected data: the current content of each part of a scope.
CREATE TABLE IF NOT EXISTS leasefence.report_part (
  scope      text,
  part       text,
  content    text NOT NULL,
  writer     text NOT NULL,
  token      bigint NOT NULL,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (scope, part)
);

-- Every write attempt and its outcome, accepted or rejected, for audit.
-- floor is the scope's floor after the attempt. One index only, (scope,
-- id), which also serves reads of a scope's log in order: every write pays
-- for each index on this table.
CREATE TABLE IF NOT EXISTS leasefence.write_attempt (
  scope        text NOT NULL,
  id           bigint GENERATED ALWAYS AS IDENTITY,
  part         text NOT NULL,
  writer       text NOT NULL,
  token        bigint NOT NULL,
  accepted     boolean NOT NULL,
  floor        bigint NOT NULL,
  attempted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (scope, id)
);

-- Raised by the pipeline form of the fence check (fencepg.Fence.SendBatch)
-- when the token is below the floor: the error aborts the pipeline's
-- implicit transaction, so none of the caller's statements after it takes
-- effect. SQLSTATE LF001; DETAIL is the floor that beat the token.
CREATE OR REPLACE FUNCTION leasefence.fence_reject(scope text, token bigint, floor bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'leasefence: token % of scope % is below the floor %', token, scope, floor
    USING ERRCODE = 'LF001', DETAIL = floor::text;
END
$$;

-- Token-space guard: a scope's floor never goes down and its row is never
-- deleted, or a stale holder's token would pass again (refuse_token_reset,
-- in guard.sql, gives the deliberate path).
-- Each trigger is created when missing, so Migrate also repairs a schema
-- where one was dropped. A foreign table of the same name (no max_token column)
-- gets none: CheckSchema reports it, naming the column.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.fence_floor'::regclass AND attname = 'max_token' AND NOT attisdropped) THEN
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.fence_floor'::regclass AND tgname = 'floor_only_grows') THEN
    CREATE TRIGGER floor_only_grows BEFORE UPDATE OF max_token ON leasefence.fence_floor
      FOR EACH ROW WHEN (NEW.max_token < OLD.max_token) EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.fence_floor'::regclass AND tgname = 'floor_never_deleted') THEN
    CREATE TRIGGER floor_never_deleted BEFORE DELETE ON leasefence.fence_floor
      FOR EACH ROW EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.fence_floor'::regclass AND tgname = 'floor_never_truncated') THEN
    CREATE TRIGGER floor_never_truncated BEFORE TRUNCATE ON leasefence.fence_floor
      FOR EACH STATEMENT EXECUTE FUNCTION leasefence.refuse_token_reset();
  END IF;
END
$$;
