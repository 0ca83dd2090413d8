-- pg_intent: the SQL API of SPEC § Contracts and failover.
--
-- Same pattern as api.sql: C functions written in Rust, SECURITY DEFINER, search path pinned
-- inside each call, refusals raised with their exact SQLSTATE. Defining contracts and certifying
-- providers is an administrator's job: checkers run with the extension owner's rights, so these
-- functions must only be granted to trusted roles (see the README, "Privileges").

CREATE FUNCTION intent._run_checker(checker regprocedure, result jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    ok boolean;
BEGIN
    -- regproc's text is the function's name, schema-qualified unless it is in pg_catalog or
    -- intent, so this calls exactly the function the contract names.
    EXECUTE format('SELECT %s($1)', checker::oid::regproc) INTO ok USING result;
    IF ok IS TRUE THEN
        RETURN NULL;
    END IF;
    RETURN format('checker %s returned %s', checker, coalesce(ok::text, 'NULL'));
EXCEPTION WHEN OTHERS THEN
    -- A checker that raises on a result it cannot interpret has rejected it.
    RETURN format('checker %s raised %s: %s', checker, SQLSTATE, SQLERRM);
END
$$;
COMMENT ON FUNCTION intent._run_checker(regprocedure, jsonb) IS
    'Internal: runs a contract''s checker on a result; NULL when it returned true, else why the result is rejected (false, NULL, or the error it raised).';

CREATE FUNCTION intent.define_contract(name text, output_schema jsonb, checker regprocedure DEFAULT NULL)
RETURNS integer
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_define_contract';
COMMENT ON FUNCTION intent.define_contract(text, jsonb, regprocedure) IS
    'Defines a contract (JSON Schema draft 2020-12, optional STABLE checker (jsonb) -> boolean) and returns its version. Redefining it with another schema or checker bumps the version, and certifications earned on the old version stop counting; the same definition again changes nothing.';

CREATE FUNCTION intent.certify_provider(provider text, contract text, evidence jsonb, valid_for interval DEFAULT '30 days')
RETURNS timestamptz
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_certify_provider';
COMMENT ON FUNCTION intent.certify_provider(text, text, jsonb, interval) IS
    'Records that a provider passed a contract''s tests (evidence: inputs, pass/fail per case, settings), valid for valid_for (at most 366 days). Returns when it expires. Failover to the provider is allowed while it is current.';

CREATE FUNCTION intent.revoke_certification(provider text, contract text, reason text)
RETURNS boolean
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_revoke_certification';
COMMENT ON FUNCTION intent.revoke_certification(text, text, text) IS
    'Withdraws a provider''s current certification for a contract: new failovers to it are refused (IJ005). Attempts that already began on it may still complete; their results are validated like any other. false when there was no current certification.';

CREATE FUNCTION intent.validate_result(contract text, result jsonb)
RETURNS TABLE (valid boolean, errors jsonb)
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_validate_result';
COMMENT ON FUNCTION intent.validate_result(text, jsonb) IS
    'Checks a result against a contract (schema, then checker) without writing anything: valid, and the errors as [{"path", "message"} | {"checker"}]. Used by the contract-test harness and by DBAs.';

-- A contract's checker is referenced by oid, which records no dependency: without this guard a
-- DROP FUNCTION would silently make every result of the contract fail its check (and a reused
-- oid could point the contract at another function).
CREATE FUNCTION intent._guard_checker_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    c record;
BEGIN
    -- Dropping the extension itself drops the contracts too: nothing to guard then.
    IF pg_catalog.to_regclass('intent.contracts') IS NULL THEN
        RETURN;
    END IF;
    SELECT k.name, d.object_identity INTO c
      FROM pg_catalog.pg_event_trigger_dropped_objects() d
      JOIN intent.contracts k ON k.checker::oid = d.objid
     WHERE d.classid = 'pg_catalog.pg_proc'::regclass
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '2BP01',
            MESSAGE = format('cannot drop function %s: contract %L uses it as its checker', c.object_identity, c.name),
            HINT = 'Redefine the contract with another checker, or none, with intent.define_contract() first.';
    END IF;
END
$$;
COMMENT ON FUNCTION intent._guard_checker_drop() IS
    'Internal: refuses to drop a function that a contract uses as its checker.';

CREATE EVENT TRIGGER intent_guard_checker_drop ON sql_drop
    EXECUTE FUNCTION intent._guard_checker_drop();
COMMENT ON EVENT TRIGGER intent_guard_checker_drop IS
    'Keeps contract checkers from being dropped while a contract uses them.';
