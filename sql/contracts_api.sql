-- pg_intent: the SQL API of contracts (docs/reference.md § 1.3; docs/protocol.md § Contracts and failover).
--
-- Same pattern as api.sql: C functions written in Rust, SECURITY DEFINER, search path pinned
-- inside each call, refusals raised with their exact SQLSTATE. Defining contracts and certifying
-- providers is an administrator's job (see the README, "Privileges"). A contract's checker runs
-- as the role that owns the checker function, never with the extension's rights: see
-- extension/src/checker.rs and docs/security.md.

-- SECURITY INVOKER on purpose, unlike the other calls: it must know who calls it (the defining
-- role must have the rights of the checker's owner), which a SECURITY DEFINER function cannot
-- tell. It switches to intent_owner itself, after reading its caller.
CREATE FUNCTION intent.define_contract(name text, output_schema jsonb, checker regprocedure DEFAULT NULL)
RETURNS integer
LANGUAGE c VOLATILE
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

-- What every pg_intent call does first (extension/src/replay.rs), for the drop guard below:
-- in the distributed mode Citus may read intent.contracts over a connection of intent_owner's,
-- and must then have nothing of the caller's to replay there (docs/security.md § 13).
CREATE FUNCTION intent._before_distributed_read() RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'intent_before_distributed_read';
COMMENT ON FUNCTION intent._before_distributed_read() IS
    'Internal: refuses (42501) in the distributed mode while Citus holds SET commands it would replay on intent_owner''s connections; nothing otherwise. The drop guard calls it before reading intent.contracts.';

-- A contract's checker is referenced by its identity (schema-qualified name and argument
-- types), which records no dependency: without this guard a DROP FUNCTION would silently make
-- every result of the contract fail its check (and a function created again under the same
-- name could take its place).
--
-- It fires on every DROP in the database, by any role. So it is SECURITY DEFINER (it runs as
-- intent_owner, which may read intent.contracts; the role dropping its own temp table may not),
-- with a SET search_path and every name qualified: it runs in whatever context the DROP runs
-- in, and must neither fail there nor pick up anything the caller planted.
CREATE FUNCTION intent._guard_checker_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    contracts text := 'intent.contracts';
BEGIN
    -- Only a dropped function taking one jsonb can be a checker. Anything else (a table, an
    -- index, a temp object, and on a Citus worker the shard DDL, where reading the reference
    -- table intent.contracts would be a nested distributed query) returns here, unread.
    -- The argument is compared as the text PostgreSQL writes for it (always schema-qualified,
    -- quoted when quote_all_identifiers is on), never looked up: a lookup of a type in a schema
    -- intent_owner may not use raises "permission denied for schema", and would make DROP fail
    -- in every database with such a schema, for every role.
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_event_trigger_dropped_objects() d
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND pg_catalog.cardinality(d.address_args) OPERATOR(pg_catalog.=) 1
           AND d.address_args[1] OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.jsonb', '"pg_catalog"."jsonb"']))
    THEN
        RETURN;
    END IF;
    -- Dropping the extension itself (or its schema) drops the contracts too: nothing to guard.
    IF pg_catalog.to_regclass('intent.contracts') IS NULL THEN
        RETURN;
    END IF;
    -- A session that says so (pg_restore --clean drops every function before the extension,
    -- and creates it again at once; docs/operations.md § Backups) may drop a checker. Before
    -- the library is loaded the setting is a placeholder, its text as given.
    IF pg_catalog.lower(pg_catalog.current_setting('intent.allow_checker_drop', true)) OPERATOR(pg_catalog.=) ANY (ARRAY['on', 'true', 'yes', '1']) THEN
        RETURN;
    END IF;
    -- Distributed, the read below may go to a worker over a connection of intent_owner's.
    PERFORM intent._before_distributed_read();
    -- On a Citus worker (a node whose group is not the coordinator's, 0) intent.contracts is a
    -- reference table, and reading it is a distributed query, which Citus refuses inside the
    -- commands the coordinator propagates: every DROP there of a function of one jsonb failed,
    -- for every role (0.4.x). Its copy on this node (the reference table's one shard) is read
    -- instead (0.5.0), so that a DROP run on a worker itself is guarded too.
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_dist_local_group g WHERE g.groupid OPERATOR(pg_catalog.<>) 0) THEN
            SELECT pg_catalog.format('intent.%I', 'contracts_' OPERATOR(pg_catalog.||) s.shardid) INTO contracts
              FROM pg_catalog.pg_dist_shard s
             WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'intent.contracts'::pg_catalog.regclass;
            -- Not distributed here: the table itself, as on one node.
            contracts := coalesce(contracts, 'intent.contracts');
            IF pg_catalog.to_regclass(contracts) IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '55000',
                    MESSAGE = pg_catalog.format('cannot check whether a contract uses the dropped function: %s is not on this node', contracts),
                    HINT = 'Drop it on the coordinator.';
            END IF;
        END IF;
    END IF;
    -- Matched by schema and name (address_names: unquoted, whatever quote_all_identifiers says)
    -- and the one jsonb argument every checker takes, never by the quoted identity text.
    EXECUTE pg_catalog.format($q$
    SELECT k.name, d.object_identity
      FROM pg_catalog.pg_event_trigger_dropped_objects() d
      JOIN %s k
        ON (pg_catalog.parse_ident(k.checker, false))[1] OPERATOR(pg_catalog.=) d.address_names[1]
       AND (pg_catalog.parse_ident(k.checker, false))[2] OPERATOR(pg_catalog.=) d.address_names[2]
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND pg_catalog.cardinality(d.address_args) OPERATOR(pg_catalog.=) 1
       AND d.address_args[1] OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.jsonb', '"pg_catalog"."jsonb"'])
     LIMIT 1$q$, contracts) INTO c;
    IF c.name IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '2BP01',
            MESSAGE = pg_catalog.format('cannot drop function %s: contract %L uses it as its checker', c.object_identity, c.name),
            HINT = 'Redefine the contract with another checker, or none, with intent.define_contract() first; to drop it anyway (a pg_restore --clean, which creates it again), SET intent.allow_checker_drop = on.';
    END IF;
END
$$;
COMMENT ON FUNCTION intent._guard_checker_drop() IS
    'Internal: refuses to drop a function that a contract uses as its checker. Runs on every DROP, by any role, as intent_owner.';

CREATE EVENT TRIGGER intent_guard_checker_drop ON sql_drop
    EXECUTE FUNCTION intent._guard_checker_drop();
COMMENT ON EVENT TRIGGER intent_guard_checker_drop IS
    'Keeps contract checkers from being dropped while a contract uses them.';
