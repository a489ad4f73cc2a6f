-- The lease database. One row per lease name; applied by LeaseStore.Migrate.
-- States: held (expires_at > now()), expired (expires_at <= now()),
-- released (expires_at = '-infinity', a special case of expired); no row = free.
-- token only ever grows: every acquire sets it to token + 1 (I2).
--
-- A name acquired by a store with holder sessions (fencepg.WithSharedLeases)
-- has session_id set, and expires_at = 'infinity': it is held exactly while
-- its holder's session row (holder_session below) carries that session_id
-- and has not expired. 'infinity' makes a store without the mode, whose
-- statements read expires_at only, see such a name as held, never as free
-- (see WithSharedLeases for mixing modes). acquire_id is the random id of
-- the acquire that attached the name, so that an acquire whose answer was
-- lost can be undone without touching a hold the caller does know of.
CREATE TABLE IF NOT EXISTS leasefence.lease (
  name       text PRIMARY KEY,
  holder     text NOT NULL,
  token      bigint NOT NULL CHECK (token > 0),
  expires_at timestamptz NOT NULL,
  session_id uuid,
  acquire_id bigint
);

-- A lease table made before holder sessions gets their two columns, both
-- nullable without a default, so adding them rewrites nothing. Checked in
-- the catalog first: ALTER TABLE takes an ACCESS EXCLUSIVE lock even when
-- the column exists, and Migrate runs at every start of every process, so
-- an unconditional ALTER would queue every lease statement behind it (and
-- behind whatever it waits for) each time. A foreign table of the same name
-- (no token column) is left alone: CheckSchema reports it.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.lease'::regclass AND attname = 'token' AND NOT attisdropped) THEN
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.lease'::regclass AND attname = 'session_id' AND NOT attisdropped) THEN
    ALTER TABLE leasefence.lease ADD COLUMN session_id uuid;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.lease'::regclass AND attname = 'acquire_id' AND NOT attisdropped) THEN
    ALTER TABLE leasefence.lease ADD COLUMN acquire_id bigint;
  END IF;
END
$$;

-- Holder sessions (fencepg.WithSharedLeases): one row per holder and TTL,
-- which all of that holder's names with that TTL hang on, so that a renewal
-- is one UPDATE of this row whatever the number of names. The tokens stay
-- in lease, per name.
--
-- session_id is drawn afresh (gen_random_uuid) whenever the row starts a
-- new session, that is when an acquire finds it expired: the names of the
-- expired session point at an id no row carries any more, so they never
-- come back to life, whatever the holder does next. An acquire that takes
-- a name from another holder's expired session sets that session's
-- expires_at to '-infinity' in the same statement, so that a renewal of it
-- still in flight finds it ended (see pgsql.AcquireSession).
--
-- generation counts the names that left the session while it lived: the
-- trigger lease_detached_from_session below adds 1 in the same transaction
-- whenever a lease row on the session is released, undone, taken over or
-- changed by hand. A store remembers which names (and tokens) a full
-- RenewAll found on the session at one generation; while the session row
-- still shows that session_id and generation, those names are all still on
-- it, and RenewAll renews them by updating this one row without reading a
-- lease row (see pgsql.RenewSessionGeneration).
--
-- expires_at and generation are the only columns a renewal or a release
-- changes and neither is indexed, so both are HOT updates; the fillfactor
-- leaves room on each page for the new row versions they write. Rows are
-- never deleted by the library; deleting a row whose expires_at has passed
-- is safe (its names are free already, and a new session of that holder
-- gets a new session_id).
CREATE TABLE IF NOT EXISTS leasefence.holder_session (
  holder     text NOT NULL,
  ttl_us     bigint NOT NULL CHECK (ttl_us > 0),
  session_id uuid NOT NULL,
  expires_at timestamptz NOT NULL,
  generation bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (holder, ttl_us)
) WITH (fillfactor = 50);

-- A holder_session table made before generations gets the column; a
-- constant default adds it without rewriting the table (PostgreSQL 11+).
-- Checked in the catalog first, for the reason given for lease's columns.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.holder_session'::regclass AND attname = 'generation' AND NOT attisdropped) THEN
    ALTER TABLE leasefence.holder_session ADD COLUMN generation bigint NOT NULL DEFAULT 0;
  END IF;
END
$$;

-- Whenever a lease row that hangs on a session leaves it or changes its
-- holding period (session_id, token or holder changed: a release, an undo,
-- a take-over, an acquire of a name of an expired session, an operator's
-- UPDATE), the session's generation grows, in the same transaction. A
-- trigger rather than each statement of the library, so that no path can
-- forget it, an operator's SQL included; SECURITY DEFINER because a store
-- without holder sessions (whose role has no privilege on holder_session)
-- may release or take over such a row too. It runs after the row was
-- written, so it locks the session row after the lease row, the order every
-- statement of the mode keeps (see pgsql/session.go, "Locks").
CREATE OR REPLACE FUNCTION leasefence.note_session_detach() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  UPDATE leasefence.holder_session SET generation = generation + 1
   WHERE holder = OLD.holder AND session_id = OLD.session_id;
  RETURN NULL;
END
$$;

DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'leasefence.lease'::regclass AND attname = 'session_id' AND NOT attisdropped) THEN
    RETURN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'leasefence.lease'::regclass AND tgname = 'lease_detached_from_session') THEN
    CREATE TRIGGER lease_detached_from_session AFTER UPDATE OF session_id, token, holder ON leasefence.lease
      FOR EACH ROW WHEN (OLD.session_id IS NOT NULL AND (NEW.session_id IS DISTINCT FROM OLD.session_id
                          OR NEW.token IS DISTINCT FROM OLD.token OR NEW.holder IS DISTINCT FROM OLD.holder))
      EXECUTE FUNCTION leasefence.note_session_detach();
  END IF;
END
$$;

-- The expiry of a holder's session, for the reads of every store (Inspect,
-- List, WaitFree, TakeOver's report), with or without holder sessions: a
-- store without the mode needs no privilege on holder_session (its runtime
-- role has the grants on lease only), so it reads the session through this
-- function, which runs with its owner's rights. It returns one timestamp
-- for a (holder, session id) the caller already read from lease, or NULL
-- when that session is gone; nothing else of holder_session shows. EXECUTE
-- is PUBLIC's by default, like token_space's. search_path is pinned, as
-- for every SECURITY DEFINER function, and the table is named with its
-- schema.
CREATE OR REPLACE FUNCTION leasefence.holder_session_expiry(for_holder text, for_session uuid) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$SELECT s.expires_at FROM leasefence.holder_session s WHERE s.holder = for_holder AND s.session_id = for_session$$;

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
