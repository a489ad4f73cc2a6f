-- The token-space guard, applied with both the lease and the resource
-- schema (they may live in different databases); the triggers that call it
-- are in lease.sql (lease) and resource.sql (fence_floor).
--
-- A token identifies a holding period only while the lease's token (and
-- a scope's floor) never goes down: a deleted row, a truncated table or a
-- token set back makes the next acquire issue tokens that were issued before
-- (1, 2, ...), which every fence that saw the old ones rejects forever,
-- and worse, which a fence that did not may accept twice. So the database
-- refuses all three, unless the transaction says it means it, run by a
-- role with the privileges of the table's owner (a custom setting is
-- anyone's to set, so the setting alone would let a least-privilege runtime
-- role lower floors; the owner or a superuser can drop the trigger anyway):
--   BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on; ...; COMMIT;
-- The WHEN clauses are evaluated without calling the function, so the
-- acquire's token + 1 costs nothing extra; renewals do not touch token.
CREATE OR REPLACE FUNCTION leasefence.refuse_token_reset() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('leasefence_admin.allow_token_reset', true) = 'on'
     AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'leasefence: % on %.% refused: tokens would be issued or accepted twice', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
    USING ERRCODE = 'LF002',
          HINT = 'tokens only grow; to reset deliberately (every holder stopped, every fence of these tokens reset too), as the table''s owner: BEGIN; SET LOCAL leasefence_admin.allow_token_reset = on; ...; COMMIT';
END
$$;
