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

-- Token-space guard (the same function guards fence_floor in the resource
-- database). A token identifies a holding period only while the lease's
-- token never goes down: a deleted row, a truncated table or a token set
-- back makes the next acquire issue tokens that were issued before
-- (1, 2, ...), which every fence that saw the old ones rejects forever,
-- and worse, which a fence that did not may accept twice. So the database
-- refuses all three, unless the transaction says it means it:
--   BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on; ...; COMMIT;
-- The WHEN clauses are evaluated without calling the function, so the
-- acquire's token + 1 costs nothing extra; renewals do not touch token.
CREATE OR REPLACE FUNCTION leasefence.refuse_token_reset() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('leasefence_admin.allow_token_reset', true) = 'on' THEN
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'leasefence: % on %.% refused: tokens would be issued or accepted twice', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
    USING ERRCODE = 'LF002',
          HINT = 'tokens only grow; to reset deliberately (every holder stopped, every fence of these tokens reset too): BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on; ...; COMMIT';
END
$$;

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
