-- The token-space guard, applied with both the lease and the resource
-- schema (they may live in different databases); the triggers that call it
-- are in lease.sql (lease) and resource.sql (fence_floor).
--
-- A token identifies a holding period only while the lease's token (and
-- a scope's floor) never goes down: a deleted row, a truncated table or a
-- token set back makes the next acquire issue tokens that were issued before
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
