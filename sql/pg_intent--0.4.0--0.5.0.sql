-- pg_intent 0.4.0 → 0.5.0 in one step: what pg_intent--0.4.0--0.4.1.sql and
-- pg_intent--0.4.1--0.5.0.sql do, in that order, with the one change that lets a distributed
-- installation (Citus) take it. ALTER EXTENSION pg_intent UPDATE takes this script, the shortest
-- path, from 0.4.0. No column is added or removed; rows are kept.
--
-- Why a script of its own: on Citus the CREATE INDEX of 0.4.0 → 0.4.1 reaches the workers with
-- the text of the statement being run, and in an extension script that text is the whole
-- script, which a worker refuses ("cannot insert multiple commands into a prepared
-- statement"); 0.4.0 → 0.4.1 is released and never edited. Here the index is created by
-- EXECUTE, whose text is that one statement. On one node it is the same index.
--
-- The changes of 0.4.1:
--   * the drop guard (intent._guard_checker_drop) compares a dropped function's argument type
--     as text instead of looking it up: the lookup raised "permission denied for schema" for
--     a type in a schema intent_owner may not use, and so made DROP fail for every role; and a
--     session with intent.allow_checker_drop = on may drop a checker (pg_restore --clean);
--   * (no SQL) intent.owner_id cannot change within a transaction once it has bound it, and a
--     contract's checker runs with the setting itself bound to no owner, so that parallel
--     workers, which restore the leader's settings and none of its memory, bind as it does;
--   * the partial index jobs_claimable_by_owner, so that a bound session's claim reads its own
--     owner's queue only (and the library dates what a call writes by the clock, once per call).
-- and of 0.5.0:
--   * the drop guard (intent._guard_checker_drop) reads, on a Citus worker, that node's copy
--     of the reference table intent.contracts (its one shard): its read of intent.contracts
--     there was a distributed query nested in the coordinator's propagated command, which
--     Citus refuses, so on a distributed installation the DROP of any function of one jsonb in
--     a schema Citus propagates failed, for every role;
--   * retry_at is set exactly while a job is claimable and keys the claim indexes
--     (jobs_claimable_since, jobs_claimable_since_by_owner replace jobs_claimable and
--     jobs_claimable_by_owner), with fillfactor 90: a job's outcome is a HOT update;
--   * the view intent.settings (every intent.* setting, readable before the library is loaded),
--     the library's default retention of 7 days (no SQL), and intent.purge_expired, the purge
--     an application's worker may run (by that retention only).

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.5.0'" to load this file. \quit

-- ---------------------------------------------------------------------------------------------
-- Claims by a bound session (issue 24 § 4): the claimable queue per owner, so that a session
-- bound to one owner claims from its owner's jobs only, at a cost (and a timing) independent of
-- other owners' queues. The claim order itself (the times the calls write) is the library's
-- change, not the catalog's.
-- On Citus the coordinator's CREATE INDEX reaches every node (the workers' copies of the table
-- and every shard) before a worker runs this script itself: there it is already made (an index
-- of intent.jobs; anything else of that name makes the CREATE INDEX fail, as 0.4.0 → 0.4.1 does).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_index i
                WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('intent.jobs_claimable_by_owner')
                  AND i.indrelid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass) THEN
        RETURN;
    END IF;
    EXECUTE $sql$CREATE INDEX jobs_claimable_by_owner ON intent.jobs (owner_id, (coalesce(retry_at, updated_at)))
    WHERE state = 'pending' AND attempt_count < max_attempts$sql$;
END
$$;
COMMENT ON INDEX intent.jobs_claimable_by_owner IS
    'The claimable jobs per owner, in the order claim_attempts takes them: a bound session''s claim reads its owner''s part only.';

-- The drop guard: on a Citus worker, that node's copy of intent.contracts.
CREATE OR REPLACE FUNCTION intent._guard_checker_drop()
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

-- ---------------------------------------------------------------------------------------------
-- HOT updates of jobs (issue 30 § 2). The claimable queue was keyed on
-- coalesce(retry_at, updated_at) and filtered on state: every update of a job changed a column
-- an index reads, so none was HOT. Now retry_at is set exactly while a job is claimable (the time
-- it may be claimed from) and the two claim indexes read retry_at alone: an update that leaves
-- it NULL (a win, a failure, a cancel, a job becoming unknown) is HOT when its page has room,
-- which fillfactor 90 keeps for the jobs written from now on.
-- On Citus the coordinator's statements reach the shards and every node's copy of the table
-- before a worker runs this script itself: there each step is found done and skipped, and the
-- rows (the shards' business) are not touched again.
DO $$
DECLARE
    worker boolean := false;
BEGIN
    -- Read only where Citus is: the name is resolved when the statement is planned.
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL THEN
        worker := EXISTS (SELECT FROM pg_catalog.pg_dist_local_group g WHERE g.groupid OPERATOR(pg_catalog.<>) 0);
    END IF;
    IF NOT worker THEN
        -- Writers wait from here to the update's commit: a session still running the older
        -- library would otherwise commit a pending job without a retry time in between.
        LOCK TABLE intent.jobs IN SHARE ROW EXCLUSIVE MODE;
        -- A pending job with attempts left was claimable since its retry time, or since it
        -- last changed (the old claim's key); any other job has none.
        UPDATE intent.jobs SET retry_at = updated_at
         WHERE retry_at IS NULL AND state OPERATOR(pg_catalog.=) 'pending'
           AND attempt_count OPERATOR(pg_catalog.<) max_attempts;
        UPDATE intent.jobs SET retry_at = NULL
         WHERE retry_at IS NOT NULL
           AND NOT (state OPERATOR(pg_catalog.=) 'pending' AND attempt_count OPERATOR(pg_catalog.<) max_attempts);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class c
                    WHERE c.oid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass
                      AND 'fillfactor=90' OPERATOR(pg_catalog.=) ANY (c.reloptions)) THEN
        EXECUTE 'ALTER TABLE intent.jobs SET (fillfactor = 90)';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                    WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('intent.jobs_claimable_since')
                      AND i.indrelid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass) THEN
        EXECUTE 'CREATE INDEX jobs_claimable_since ON intent.jobs (retry_at) WHERE retry_at IS NOT NULL';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                    WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('intent.jobs_claimable_since_by_owner')
                      AND i.indrelid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass) THEN
        EXECUTE 'CREATE INDEX jobs_claimable_since_by_owner ON intent.jobs (owner_id, retry_at) WHERE retry_at IS NOT NULL';
    END IF;
    -- The old claim indexes: the library reads them only on a catalog older than this one.
    IF EXISTS (SELECT FROM pg_catalog.pg_index i
                WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('intent.jobs_claimable')
                  AND i.indrelid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass) THEN
        EXECUTE 'DROP INDEX intent.jobs_claimable';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_index i
                WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('intent.jobs_claimable_by_owner')
                  AND i.indrelid OPERATOR(pg_catalog.=) 'intent.jobs'::pg_catalog.regclass) THEN
        EXECUTE 'DROP INDEX intent.jobs_claimable_by_owner';
    END IF;
END
$$;
COMMENT ON COLUMN intent.jobs.retry_at IS
    'While the job is claimable (pending, with attempts left): when claim_attempts may begin its next attempt, the time it became pending, or after a retryable failure its retry time (fail_attempt''s retry_after, or the backoff of intent.retry_backoff). NULL while it is not claimable (running, unknown, finished, or no attempts left). begin_attempt is not held back by it.';
COMMENT ON INDEX intent.jobs_claimable_since IS
    'The claimable jobs, in the order claim_attempts takes them (retry_at is set only while a job is claimable).';
COMMENT ON INDEX intent.jobs_claimable_since_by_owner IS
    'The claimable jobs per owner, in the order claim_attempts takes them: a bound session''s claim reads its owner''s part only.';

-- ---------------------------------------------------------------------------------------------
-- 0.5.0, bounded by default (issue 30 part 3): the view intent.settings, every intent.* setting
-- readable from any session, before the library is loaded too (sql/settings.sql). The default
-- retention (intent.retention = '7 days', 'never' to keep finished jobs for ever) is the
-- library's, no SQL. Self-contained: it creates what sql/settings.sql creates and grants what
-- sql/privileges.sql grants on it.

-- Loads the library in this session (a C function: calling it is what loads it) and does
-- nothing else.
CREATE FUNCTION intent._load_library()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'intent_load_library';
COMMENT ON FUNCTION intent._load_library() IS
    'Internal: loads the pg_intent library in this session, which registers its settings (intent.*); does nothing else.';

-- Statements in order: the library is loaded before pg_settings is read.
CREATE FUNCTION intent._settings()
RETURNS TABLE (name text, setting text, unit text, type text, default_value text,
               reset_value text, context text, source text, description text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM intent._load_library();
    RETURN QUERY
    SELECT s.name, s.setting, s.unit, s.vartype, s.boot_val, s.reset_val, s.context, s.source,
           s.short_desc OPERATOR(pg_catalog.||) coalesce(' ' OPERATOR(pg_catalog.||) s.extra_desc, '')
      FROM pg_catalog.pg_settings s
     WHERE s.name OPERATOR(pg_catalog.~~) 'intent.%'
     ORDER BY s.name;
END
$$;
COMMENT ON FUNCTION intent._settings() IS
    'Internal: the rows of the view intent.settings (loads the library first, then reads pg_settings).';

CREATE VIEW intent.settings WITH (security_invoker = true) AS
SELECT name, setting, unit, type, default_value, reset_value, context, source, description
  FROM intent._settings();
COMMENT ON VIEW intent.settings IS
    'pg_intent''s settings (intent.*) with this session''s values, readable in any session: unlike SHOW, it works before the library is loaded (it loads it). intent.retention is how long a finished job, and so its idempotency key, is kept.';
COMMENT ON COLUMN intent.settings.name IS 'The setting''s name.';
COMMENT ON COLUMN intent.settings.setting IS 'Its value in this session, as SHOW gives it (without the unit: see unit).';
COMMENT ON COLUMN intent.settings.unit IS 'The unit of setting (ms for intent.claim_rescan), NULL when it has none.';
COMMENT ON COLUMN intent.settings.type IS 'bool, integer or string (an interval where the description says so), as pg_settings.vartype.';
COMMENT ON COLUMN intent.settings.default_value IS 'The built-in default: what it is when nothing sets it.';
COMMENT ON COLUMN intent.settings.reset_value IS 'What RESET gives in this session: the default, or what the configuration file, ALTER DATABASE or ALTER ROLE set.';
COMMENT ON COLUMN intent.settings.context IS 'Who may change it: user (any session), superuser (superusers and roles granted SET on it).';
COMMENT ON COLUMN intent.settings.source IS 'Where the current value comes from: default, configuration file, database, user, session…';
COMMENT ON COLUMN intent.settings.description IS 'What it does.';

ALTER FUNCTION intent._load_library() OWNER TO intent_owner;
ALTER FUNCTION intent._settings() OWNER TO intent_owner;
ALTER VIEW intent.settings OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent._load_library(), intent._settings() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent._load_library(), intent._settings() TO intent_app;
GRANT SELECT ON intent.settings TO intent_app;
-- End of 0.5.0, bounded by default.

-- ---------------------------------------------------------------------------------------------
-- 0.5.0: intent.purge_expired(batch_size), the purge an application's worker (intent_app) may
-- run, by the database's retention only, so that a default Runner keeps the tables bounded.
CREATE FUNCTION intent.purge_expired(batch_size integer DEFAULT 1000)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_purge_expired';
COMMENT ON FUNCTION intent.purge_expired(integer) IS
    'intent.purge() by the retention the database publishes (intent.retention, 7 days by default; never with ''never''), for an application''s worker: removes up to batch_size finished jobs past it, with their attempts and events; returns how many. No argument can shorten the retention.';
ALTER FUNCTION intent.purge_expired(integer) OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.purge_expired(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent.purge_expired(integer) TO intent_app;
