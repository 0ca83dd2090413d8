-- pg_intent 0.3.0 → 0.4.0: reconciliations are recorded (docs/reference.md § 1.6), and the
-- distributed mode (docs/scale-out.md).
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are kept; the changes:
--   * intent.event_kind admits 'reconciled';
--   * intent.record_reconciliation (for intent_operator): records how an unknown attempt was
--     decided and on what evidence, as a reconciled event; the unique partial index
--     events_one_reconciliation keeps it to one per attempt;
--   * intent.distribute(), which refuses (55000) unless Citus is installed, the function
--     intent.owner_admits that its policies call, intent._before_distributed_read that the drop
--     guard now calls (extension/src/replay.rs), and the view intent.lost_races, whose join
--     to the winning attempt names the job too (same rows). Nothing else changes on a single
--     node.

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.4.0'" to load this file. \quit

CREATE OR REPLACE VIEW intent.lost_races WITH (security_invoker = true) AS
SELECT a.job_id,
       j.owner_id,
       j.idempotency_key,
       a.id AS late_attempt_id,
       a.provider AS late_provider,
       a.finished_at AS late_at,
       a.result AS late_result,
       j.completed_by AS winner_attempt_id,
       w.provider AS winner_provider,
       w.finished_at AS won_at,
       j.result AS winning_result,
       j.state AS job_state
  FROM intent.attempts a
  JOIN intent.jobs j ON j.id = a.job_id
  -- The winner is an attempt of the same job (jobs_completed_by_is_own_attempt): saying so
  -- lets Citus join on the distribution column, shard by shard.
  LEFT JOIN intent.attempts w ON w.job_id = j.id AND w.id = j.completed_by
 WHERE a.state = 'discarded';

-- The distributed mode's policies (intent.distribute(), docs/scale-out.md) call this rather
-- than holding the comparison: Citus refuses sub-selects in policies on distributed tables,
-- and copies each policy to the shards as text that every worker parses again under its own
-- search path, where an operator written plainly is looked up anew but a function named with
-- its schema is not. Every name in the body is qualified, so it means the same under any
-- search path, and the planner inlines it (plain SQL, not strict, no settings of its own).
CREATE FUNCTION intent.owner_admits(owner_id text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT owner_id OPERATOR(pg_catalog.=) COALESCE(intent.bound_owner(), owner_id) $$;
COMMENT ON FUNCTION intent.owner_admits(text) IS
    'Whether this session''s binding (intent.bound_owner()) admits a row of this owner: the owner isolation policies of the distributed mode.';

CREATE FUNCTION intent.distribute() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $distribute$
DECLARE
    -- Once, before the tables are distributed (here and on the workers' copies); added back
    -- after, when Citus propagates them.
    unlink constant text := $ddl$
        ALTER TABLE intent.jobs DROP CONSTRAINT IF EXISTS jobs_contract_fkey;
        ALTER TABLE intent.certifications DROP CONSTRAINT IF EXISTS certifications_contract_fkey;
    $ddl$;
    -- Keys and policies; every statement can run twice.
    prepare constant text := $ddl$
        ALTER TABLE intent.jobs DROP CONSTRAINT IF EXISTS jobs_owner_key_unique;
        ALTER TABLE intent.attempts DROP CONSTRAINT attempts_pkey;
        ALTER TABLE intent.attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (id, job_id);
        COMMENT ON CONSTRAINT attempts_pkey ON intent.attempts IS
            'The derived attempt id (with its job id, the distribution column).';
        ALTER TABLE intent.events DROP CONSTRAINT events_pkey;
        ALTER TABLE intent.events ADD CONSTRAINT events_pkey PRIMARY KEY (job_id, id);
        COMMENT ON CONSTRAINT events_pkey ON intent.events IS
            'Orders the log of one job (with its job id, the distribution column).';
        ALTER POLICY jobs_owner_isolation ON intent.jobs
            USING (intent.owner_admits(owner_id)) WITH CHECK (intent.owner_admits(owner_id));
        ALTER POLICY attempts_owner_isolation ON intent.attempts
            USING (intent.owner_admits(owner_id)) WITH CHECK (intent.owner_admits(owner_id));
        ALTER POLICY events_owner_isolation ON intent.events
            USING (intent.owner_admits(owner_id)) WITH CHECK (intent.owner_admits(owner_id));
    $ddl$;
    -- What a worker runs first: names resolved in pg_catalog first, and its own changes only
    -- (once the tables are distributed, its copies are shells that Citus would otherwise
    -- refuse to alter from a worker, or alter everywhere). Not intent_owner's LOGIN: the
    -- coordinator's change reaches the workers in this transaction, which holds the role's
    -- row there until it commits.
    on_worker constant text := $ddl$
        SET LOCAL search_path = pg_catalog, pg_temp;
        SET LOCAL citus.enable_ddl_propagation TO off;
    $ddl$;
    -- Asked of every worker: the first schema its connections look names up in (every name
    -- qualified: this is parsed with the path it asks about).
    first_schema constant text :=
        $q$SELECT pg_catalog.format('%s (search_path = %s)', (pg_catalog.current_schemas(true))[1], pg_catalog.current_setting('search_path'))$q$;
    -- Asked of a worker whose names resolve in pg_catalog first: whether it is prepared.
    readiness constant text := $q$
        SELECT CASE WHEN NOT EXISTS (SELECT FROM pg_constraint
                                      WHERE conrelid = 'intent.jobs'::regclass
                                        AND conname = 'jobs_owner_key_unique')
                     AND (SELECT count(*) FROM pg_policy p
                           WHERE p.polrelid IN ('intent.jobs'::regclass, 'intent.attempts'::regclass,
                                                'intent.events'::regclass)
                             AND EXISTS (SELECT FROM pg_depend d
                                          WHERE d.classid = 'pg_policy'::regclass AND d.objid = p.oid
                                            AND d.refobjid = 'intent.owner_admits(text)'::regprocedure)) = 3
                    THEN 'prepared' ELSE 'unprepared' END
    $q$;
    r record;
    failed text;
    our_version text;
    already boolean;
    todo text[] := '{}';
    todo_ports int[] := '{}';
BEGIN
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'intent.distribute() must be run by a superuser'
            USING ERRCODE = '42501';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'intent.distribute() needs Citus, and the extension citus is not installed in this database'
            USING ERRCODE = '55000',
                  DETAIL = 'Nothing was changed: pg_intent stays a single-node installation.',
                  HINT = 'Add citus to shared_preload_libraries, CREATE EXTENSION citus, add the workers (citus_add_node), then call intent.distribute() on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'intent.distribute() must run on the Citus coordinator'
            USING ERRCODE = '55000',
                  DETAIL = 'This node is not the coordinator (citus_is_coordinator() is false). Nothing was changed.',
                  HINT = 'Connect to the coordinator; on a fresh coordinator run citus_set_coordinator_host() first.';
    END IF;
    -- Citus created pg_intent on the workers in this transaction, which has not committed: the
    -- checks below ask the workers on connections of their own, which would not see it, and
    -- creating it there again would wait for this transaction for ever.
    IF (SELECT e.xmin FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_intent')
       OPERATOR(pg_catalog.=) pg_catalog.xid(pg_catalog.pg_current_xact_id_if_assigned()) THEN
        RAISE EXCEPTION 'intent.distribute() must run after CREATE EXTENSION pg_intent has committed'
            USING ERRCODE = '55000',
                  DETAIL = 'The extension was created in this transaction. Nothing was changed.',
                  HINT = 'COMMIT, then call intent.distribute() in a transaction of its own.';
    END IF;
    already := EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                        WHERE logicalrelid = 'intent.jobs'::pg_catalog.regclass);
    -- Every worker must have pg_intent at this version: its copy of the tables is the shell.
    -- CREATE EXTENSION on the coordinator creates it on the workers; an installation that
    -- had pg_intent before it had Citus (a migration) gets it created on them here.
    SELECT extversion INTO our_version FROM pg_catalog.pg_extension WHERE extname = 'pg_intent';
    FOR r IN SELECT nodename, nodeport, success, result
               FROM pg_catalog.run_command_on_workers(
                    $q$SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_intent'$q$)
    LOOP
        IF r.success AND r.result = '' THEN
            SELECT m.success, m.result INTO r.success, r.result
              FROM pg_catalog.master_run_on_worker(ARRAY[r.nodename], ARRAY[r.nodeport],
                       ARRAY[format('SET citus.enable_ddl_propagation TO off; CREATE EXTENSION pg_intent VERSION %L', our_version)], false) m;
            IF r.success THEN
                r.result := our_version;
            END IF;
        END IF;
        IF NOT r.success THEN
            RAISE EXCEPTION 'worker %:% did not answer', r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = format('Asked whether it has pg_intent, it failed: %s. Nothing was changed.', r.result),
                      HINT = 'Bring every worker up (or remove it with citus_remove_node), then call intent.distribute() again.';
        END IF;
        IF r.result IS DISTINCT FROM our_version THEN
            RAISE EXCEPTION 'worker %:% does not have pg_intent at this version', r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = format('The coordinator has %s, the worker %s. Nothing was changed.', our_version, coalesce(nullif(r.result, ''), 'none')),
                      HINT = 'Install the same pg_intent on every node (CREATE EXTENSION pg_intent on the coordinator creates it on the workers), then call intent.distribute() again.';
        END IF;
    END LOOP;
    -- What Citus sends a worker (the shards' tables, constraints and policies) is parsed with
    -- that worker's search path: a schema before pg_catalog there could stand in for the
    -- operators and functions they use.
    SELECT string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ') INTO failed
      FROM pg_catalog.run_command_on_workers(first_schema)
     WHERE NOT success OR result NOT LIKE 'pg\_catalog %';
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'a worker looks names up in another schema before pg_catalog'
            USING ERRCODE = '55000',
                  DETAIL = format('First schema of each such worker: %s. Nothing was changed.', failed),
                  HINT = 'Reset the search_path set for this database or role on those workers (ALTER DATABASE … RESET search_path) so that pg_catalog comes first, then call intent.distribute() again.';
    END IF;

    -- Citus propagates it to every node (and gives it to the nodes it adds later).
    IF NOT (SELECT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = 'intent_owner') THEN
        ALTER ROLE intent_owner LOGIN;
    END IF;
    -- Citus's statements on intent_owner's connections name pg_catalog's functions plainly
    -- (statement_timestamp()): a search path a database owner sets on a worker later would
    -- pick up functions of theirs there, run as intent_owner. A role's setting in a database
    -- comes before the database's own, and Citus gives it to every node.
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_db_role_setting s
                    WHERE s.setrole = 'intent_owner'::pg_catalog.regrole
                      AND s.setdatabase = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
                      AND 'search_path=pg_catalog, pg_temp' = ANY (s.setconfig)) THEN
        EXECUTE pg_catalog.format('ALTER ROLE intent_owner IN DATABASE %I SET search_path = pg_catalog, pg_temp',
                                  pg_catalog.current_database());
    END IF;

    IF already THEN
        FOR r IN SELECT nodename, nodeport, success, result
                   FROM pg_catalog.run_command_on_workers(readiness)
        LOOP
            IF NOT r.success OR r.result <> 'prepared' THEN
                todo := todo || r.nodename;
                todo_ports := todo_ports || r.nodeport;
            END IF;
        END LOOP;
        IF cardinality(todo) = 0 THEN
            RETURN 'already distributed: every worker is prepared, nothing to do';
        END IF;
        SELECT string_agg(format('%s:%s: %s', node_name, node_port, result), '; ') INTO failed
          FROM pg_catalog.master_run_on_worker(todo, todo_ports,
                   array_fill(on_worker || prepare, ARRAY[cardinality(todo)]), false)
         WHERE NOT success;
        IF failed IS NOT NULL THEN
            RAISE EXCEPTION 'intent.distribute() could not prepare a worker''s tables'
                USING ERRCODE = '55000', DETAIL = failed;
        END IF;
        RETURN format('already distributed; prepared the worker(s) %s', (
            SELECT string_agg(format('%s:%s', n, p), ', ') FROM unnest(todo, todo_ports) u(n, p)));
    END IF;

    -- The same changes here and on every worker's copy. Citus runs the workers' part on
    -- connections of their own, which commit at once: should anything below fail, the
    -- workers' (unused) copies stay prepared while this node rolls back, and calling
    -- distribute() again redoes both (every change can be made twice).
    -- Foreign keys to reference tables: Citus needs one connection per node for the rest.
    PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    EXECUTE unlink;
    EXECUTE prepare;
    SELECT string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ') INTO failed
      FROM pg_catalog.run_command_on_workers(on_worker || unlink || prepare) WHERE NOT success;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'intent.distribute() could not prepare a worker''s tables'
            USING ERRCODE = '55000', DETAIL = failed;
    END IF;

    PERFORM pg_catalog.create_reference_table('intent.contracts');
    PERFORM pg_catalog.create_reference_table('intent.certifications');
    PERFORM pg_catalog.create_distributed_table('intent.jobs', 'id');
    PERFORM pg_catalog.create_distributed_table('intent.attempts', 'job_id', colocate_with => 'intent.jobs');
    PERFORM pg_catalog.create_distributed_table('intent.events', 'job_id', colocate_with => 'intent.jobs');
    PERFORM pg_catalog.create_distributed_table('intent.retired_keys', 'id', colocate_with => 'intent.jobs');
    -- Rows that were here (a migration) were copied to the shards; the coordinator's shells
    -- would keep the originals on disk, unseen.
    PERFORM pg_catalog.truncate_local_data_after_distributing_table(t)
       FROM unnest(ARRAY['intent.events', 'intent.attempts', 'intent.retired_keys', 'intent.jobs',
                         'intent.certifications', 'intent.contracts']::pg_catalog.regclass[]) t;
    ALTER TABLE intent.jobs ADD CONSTRAINT jobs_contract_fkey
        FOREIGN KEY (contract) REFERENCES intent.contracts (name);
    ALTER TABLE intent.certifications ADD CONSTRAINT certifications_contract_fkey
        FOREIGN KEY (contract) REFERENCES intent.contracts (name);
    SELECT string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ') INTO failed
      FROM pg_catalog.run_command_on_workers(readiness) WHERE NOT success OR result <> 'prepared';
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'intent.distribute() prepared a worker''s tables, and they do not say so'
            USING ERRCODE = '55000', DETAIL = failed;
    END IF;
    RETURN 'distributed: jobs, attempts, events, retired_keys by job id (colocated); contracts, certifications as reference tables';
END
$distribute$;

COMMENT ON FUNCTION intent.distribute() IS
    'Turns this installation into a Citus one (run on the coordinator, as a superuser): jobs, attempts, events and retired_keys distributed by job id and colocated, contracts and certifications reference tables; run again after adding workers, it prepares them. Refuses with 55000 without Citus, changing nothing. docs/scale-out.md.';

-- As sql/privileges.sql does for a fresh install: distribute() stays the superuser's who runs
-- this update (only superusers run it, with their own rights), nothing for PUBLIC;
-- owner_admits is intent_owner's, for the roles that may read the tables.
REVOKE ALL ON FUNCTION intent.distribute() FROM PUBLIC;
ALTER FUNCTION intent.owner_admits(text) OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.owner_admits(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent.owner_admits(text) TO intent_app, pg_read_all_data;

-- A wider CHECK: the existing rows satisfy it, and validating it reads intent.events once.
ALTER DOMAIN intent.event_kind DROP CONSTRAINT event_kind_known;
ALTER DOMAIN intent.event_kind ADD CONSTRAINT event_kind_known CHECK (VALUE IN (
        'timeout',             -- an attempt became unknown: mark_unknown, or its lease ran out
        'abandoned',           -- abandon_attempt: nobody waits for that attempt any more
        'cancelled',           -- cancel_job: the owner withdrew the intent
        'late_result',         -- a result lost the compare-and-swap (or came after a definite failure)
        'late_failure',        -- a failure arrived after the job's outcome was decided
        'contract_violation',  -- a result broke the job's contract and was rejected
        'reconciled'           -- record_reconciliation: how an unknown attempt was decided, and on what evidence
    ));
COMMENT ON CONSTRAINT event_kind_known ON DOMAIN intent.event_kind IS 'The kinds of event the protocol records.';
COMMENT ON DOMAIN intent.event_kind IS
    'What an event records: timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';

COMMENT ON TABLE intent.events IS
    'Append-only log: timeouts, abandons, cancels, late results, contract violations, reconciliations. Replays are not logged.';
COMMENT ON COLUMN intent.events.kind IS
    'timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';
COMMENT ON COLUMN intent.events.detail IS
    'The facts: for late_result the winner, the version the late attempt presented and the current one; for timeout the deadline and who noticed; for reconciled the decision, the attempt''s state after it, the evidence and the role that recorded it; reasons as given.';

-- No row is 'reconciled' yet: the index starts empty (building it reads intent.events once).
CREATE UNIQUE INDEX events_one_reconciliation ON intent.events (job_id, attempt_id)
    WHERE kind = 'reconciled';
COMMENT ON INDEX intent.events_one_reconciliation IS
    'One reconciliation per attempt (record_reconciliation), whatever the isolation level of concurrent callers.';

CREATE FUNCTION intent.record_reconciliation(attempt_id uuid, decision text, evidence jsonb)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_record_reconciliation';
COMMENT ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) IS
    'Records how an attempt whose outcome was unknown was decided (completed, failed or abandoned) and on what evidence (what the provider said), as a reconciled event; call it after the decision''s own call, in the same transaction. Returns the event id; an attempt has at most one reconciliation, and recording it again returns the first. Refuses (22023) a decision the attempt''s state does not show, and an attempt still open.';

-- As sql/privileges.sql does for a fresh install: owned by intent_owner, nothing for PUBLIC,
-- for intent_operator.
ALTER FUNCTION intent.record_reconciliation(uuid, text, jsonb) OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) TO intent_operator;

-- What every pg_intent call does first (extension/src/replay.rs), for the drop guard below:
-- in the distributed mode Citus may read intent.contracts over a connection of intent_owner's,
-- and must then have nothing of the caller's to replay there (docs/security.md § 13).
CREATE FUNCTION intent._before_distributed_read() RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'intent_before_distributed_read';
COMMENT ON FUNCTION intent._before_distributed_read() IS
    'Internal: refuses (42501) in the distributed mode while Citus holds SET commands it would replay on intent_owner''s connections; nothing otherwise. The drop guard calls it before reading intent.contracts.';

ALTER FUNCTION intent._before_distributed_read() OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent._before_distributed_read() FROM PUBLIC;

-- The drop guard reads intent.contracts only when a function taking one jsonb was dropped
-- (every other DROP returns at once; on Citus, reading the reference table from a worker's
-- shard DDL is refused). The same function otherwise: its owner and grants are kept.
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
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_event_trigger_dropped_objects() d
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND pg_catalog.cardinality(d.address_args) OPERATOR(pg_catalog.=) 1
           AND pg_catalog.to_regtype(d.address_args[1]) OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype)
    THEN
        RETURN;
    END IF;
    -- Dropping the extension itself (or its schema) drops the contracts too: nothing to guard.
    IF pg_catalog.to_regclass('intent.contracts') IS NULL THEN
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
       AND pg_catalog.to_regtype(d.address_args[1]) OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '2BP01',
            MESSAGE = pg_catalog.format('cannot drop function %s: contract %L uses it as its checker', c.object_identity, c.name),
            HINT = 'Redefine the contract with another checker, or none, with intent.define_contract() first.';
    END IF;
END
$$;
