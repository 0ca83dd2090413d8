-- pg_intent 0.1.0 → 0.2.0: a good citizen of the database it lives in.
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are untouched; the changes are to code and to
-- how it runs (docs/security.md):
--   * contract checkers run as their owner, in Rust; the PL/pgSQL runner is gone;
--   * the sql_drop guard runs as intent_owner, so any role may DROP its own objects;
--   * the views read with the reader's rights (security_invoker);
--   * pg_read_all_data may call intent.bound_owner(), which the policies call (backups);
--   * contracts record the role their checker runs as and the role that defined them;
--   * define_contract reads its caller (SECURITY INVOKER; it switches to intent_owner itself);
--   * a contract stores its checker by identity (schema-qualified name and argument types),
--     not as regprocedure: pg_upgrade keeps no function oids and refuses reg* columns.

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
    -- Matched by schema and name (address_names: unquoted, whatever quote_all_identifiers says)
    -- and the one jsonb argument every checker takes, never by the quoted identity text.
    SELECT k.name, d.object_identity INTO c
      FROM pg_catalog.pg_event_trigger_dropped_objects() d
      JOIN intent.contracts k
        ON (pg_catalog.parse_ident(k.checker, false))[1] OPERATOR(pg_catalog.=) d.address_names[1]
       AND (pg_catalog.parse_ident(k.checker, false))[2] OPERATOR(pg_catalog.=) d.address_names[2]
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND pg_catalog.cardinality(d.address_args) OPERATOR(pg_catalog.=) 1
       AND pg_catalog.to_regtype(d.address_args[1]) OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
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

-- A contract records the role its checker runs as, and who defined it. Contracts of 0.1.0 were
-- vetted by the rules of 0.1.0: their checker's current owner is recorded, their definer is
-- unknown (NULL), and results are judged as before, by the checker running as its owner.
ALTER TABLE intent.contracts
    ADD COLUMN checker_owner regrole,
    ADD COLUMN defined_by regrole;
UPDATE intent.contracts c
   SET checker_owner = (SELECT p.proowner FROM pg_catalog.pg_proc p
                         WHERE p.oid OPERATOR(pg_catalog.=) c.checker::pg_catalog.oid)::pg_catalog.regrole
 WHERE c.checker IS NOT NULL;
-- The checker by identity. A checker that no longer exists (only a bypassed drop guard leaves
-- one) keeps a name no function has, so its results stay rejected, and it has no owner: the
-- constraint below then stops the update, to be repaired by redefining the contract.
-- Identities are written as every call of 0.2.0 reads them (quote_all_identifiers off),
-- whatever the session says, and the session's setting is put back afterwards.
DO $identity$
DECLARE
    quoting text := pg_catalog.current_setting('quote_all_identifiers');
BEGIN
    PERFORM pg_catalog.set_config('quote_all_identifiers', 'off', true);
    ALTER TABLE intent.contracts
        ALTER COLUMN checker TYPE text USING CASE WHEN checker IS NOT NULL THEN COALESCE(
            (pg_catalog.pg_identify_object('pg_catalog.pg_proc'::pg_catalog.regclass, checker::pg_catalog.oid, 0)).identity,
            pg_catalog.format('pg_catalog.%I(pg_catalog.jsonb)', 'pg_intent: dropped checker ' OPERATOR(pg_catalog.||) checker::pg_catalog.oid::pg_catalog.text)) END;
    PERFORM pg_catalog.set_config('quote_all_identifiers', quoting, true);
END
$identity$;
COMMENT ON COLUMN intent.contracts.checker IS
    'Optional STABLE or IMMUTABLE function (jsonb) -> boolean run after the schema; anything but true (false, NULL, an error) rejects the result. Stored by its identity (schema-qualified name and argument types, as pg_identify_object gives it), which pg_upgrade keeps; renaming it detaches it.';
ALTER TABLE intent.contracts
    ADD CONSTRAINT contracts_checker_has_owner CHECK ((checker IS NULL) = (checker_owner IS NULL));
COMMENT ON COLUMN intent.contracts.checker_owner IS
    'The role that owned the checker when the contract was defined; the checker runs as it. A result is rejected if the checker has changed owner since: redefine the contract.';
COMMENT ON COLUMN intent.contracts.defined_by IS
    'The role that defined the contract (NULL: before 0.2.0). It had EXECUTE on the checker and the rights of its owner; a result is rejected once it no longer has them.';
COMMENT ON CONSTRAINT contracts_checker_has_owner ON intent.contracts IS 'A checker is recorded with the role it runs as.';

ALTER FUNCTION intent.define_contract(text, jsonb, regprocedure) SECURITY INVOKER;
