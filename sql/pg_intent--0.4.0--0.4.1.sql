-- pg_intent 0.4.0 → 0.4.1: fixes from the review of 0.4.0 as a host database's roles would
-- meet it (docs/security.md). No table changes shape; rows are kept.
--
-- Run by ALTER EXTENSION pg_intent UPDATE. The changes:
--   * the drop guard (intent._guard_checker_drop) compares a dropped function's argument type
--     as text instead of looking it up: the lookup raised "permission denied for schema" for
--     a type in a schema intent_owner may not use, and so made DROP fail for every role; and a
--     session with intent.allow_checker_drop = on may drop a checker (pg_restore --clean);
--   * (no SQL) intent.owner_id cannot change within a transaction once it has bound it, and a
--     contract's checker runs with the setting itself bound to no owner, so that parallel
--     workers, which restore the leader's settings and none of its memory, bind as it does;
--   * the partial index jobs_claimable_by_owner, so that a bound session's claim reads its own
--     owner's queue only (and the library dates what a call writes by the clock, once per call).

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.4.1'" to load this file. \quit

-- The drop guard: argument types compared as text, never looked up.
CREATE OR REPLACE FUNCTION intent._guard_checker_drop()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
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
    -- Matched by schema and name (address_names: unquoted, whatever quote_all_identifiers says)
    -- and the one jsonb argument every checker takes, never by the quoted identity text.
    SELECT k.name, d.object_identity INTO c
      FROM pg_catalog.pg_event_trigger_dropped_objects() d
      JOIN intent.contracts k
        ON (pg_catalog.parse_ident(k.checker, false))[1] OPERATOR(pg_catalog.=) d.address_names[1]
       AND (pg_catalog.parse_ident(k.checker, false))[2] OPERATOR(pg_catalog.=) d.address_names[2]
     WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND pg_catalog.cardinality(d.address_args) OPERATOR(pg_catalog.=) 1
       AND d.address_args[1] OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.jsonb', '"pg_catalog"."jsonb"'])
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '2BP01',
            MESSAGE = pg_catalog.format('cannot drop function %s: contract %L uses it as its checker', c.object_identity, c.name),
            HINT = 'Redefine the contract with another checker, or none, with intent.define_contract() first; to drop it anyway (a pg_restore --clean, which creates it again), SET intent.allow_checker_drop = on.';
    END IF;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- Claims by a bound session (issue 24 § 4): the claimable queue per owner, so that a session
-- bound to one owner claims from its owner's jobs only, at a cost (and a timing) independent of
-- other owners' queues. The claim order itself (the times the calls write) is the library's
-- change, not the catalog's.
CREATE INDEX jobs_claimable_by_owner ON intent.jobs (owner_id, (coalesce(retry_at, updated_at)))
    WHERE state = 'pending' AND attempt_count < max_attempts;
COMMENT ON INDEX intent.jobs_claimable_by_owner IS
    'The claimable jobs per owner, in the order claim_attempts takes them: a bound session''s claim reads its owner''s part only.';
