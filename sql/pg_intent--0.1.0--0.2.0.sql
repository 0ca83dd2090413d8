-- pg_intent 0.1.0 → 0.2.0: a good citizen of the database it lives in.
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are untouched; the changes are to code and to
-- how it runs (docs/security.md):
--   * contract checkers run as their owner, in Rust; the PL/pgSQL runner is gone;
--   * the sql_drop guard runs as intent_owner, so any role may DROP its own objects;
--   * the views read with the reader's rights (security_invoker);
--   * pg_read_all_data may call intent.bound_owner(), which the policies call (backups).

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.2.0'" to load this file. \quit

DROP FUNCTION intent._run_checker(regprocedure, jsonb);

CREATE OR REPLACE FUNCTION intent._guard_checker_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    -- Dropping the extension itself (or its schema) drops the contracts too: nothing to guard.
    IF pg_catalog.to_regclass('intent.contracts') IS NULL THEN
        RETURN;
    END IF;
    SELECT k.name, d.object_identity INTO c
      FROM pg_catalog.pg_event_trigger_dropped_objects() d
      JOIN intent.contracts k ON k.checker::pg_catalog.oid OPERATOR(pg_catalog.=) d.objid
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '2BP01',
            MESSAGE = pg_catalog.format('cannot drop function %s: contract %L uses it as its checker', c.object_identity, c.name),
            HINT = 'Redefine the contract with another checker, or none, with intent.define_contract() first.';
    END IF;
END
$$;
COMMENT ON FUNCTION intent._guard_checker_drop() IS
    'Internal: refuses to drop a function that a contract uses as its checker. Runs on every DROP, by any role, as intent_owner.';

ALTER VIEW intent.jobs_by_state SET (security_invoker = true);
ALTER VIEW intent.attempts_to_reconcile SET (security_invoker = true);
ALTER VIEW intent.lost_races SET (security_invoker = true);
ALTER VIEW intent.certifications_expiring SET (security_invoker = true);

GRANT EXECUTE ON FUNCTION intent.bound_owner() TO pg_read_all_data;
