-- pg_intent 0.3.0 → 0.4.0: reconciliations are recorded (docs/reference.md § 1.6), and the
-- distributed mode (docs/scale-out.md).
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are kept; the changes:
--   * intent.event_kind admits 'reconciled';
--   * intent.record_reconciliation (for intent_operator): records how an unknown attempt was
--     decided and on what evidence, as a reconciled event; the unique partial index
--     events_one_reconciliation keeps it to one per attempt;
--   * intent.distribute(), which refuses (55000) unless Citus is installed, and the view
--     intent.lost_races, whose join to the winning attempt names the job too (same rows).
--     Nothing else changes on a single node.

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

CREATE FUNCTION intent.distribute() RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $distribute$
DECLARE
    prepare constant text := $ddl$
        ALTER TABLE intent.jobs DROP CONSTRAINT IF EXISTS jobs_contract_fkey;
        ALTER TABLE intent.certifications DROP CONSTRAINT IF EXISTS certifications_contract_fkey;
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
            USING (owner_id = coalesce(intent.bound_owner(), owner_id))
            WITH CHECK (owner_id = coalesce(intent.bound_owner(), owner_id));
        ALTER POLICY attempts_owner_isolation ON intent.attempts
            USING (owner_id = coalesce(intent.bound_owner(), owner_id))
            WITH CHECK (owner_id = coalesce(intent.bound_owner(), owner_id));
        ALTER POLICY events_owner_isolation ON intent.events
            USING (owner_id = coalesce(intent.bound_owner(), owner_id))
            WITH CHECK (owner_id = coalesce(intent.bound_owner(), owner_id));
    $ddl$;
    r record;
    failed text;
    our_version text;
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
    IF EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'pg_catalog' AND c.relname = 'pg_dist_partition')
       AND EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = 'intent.jobs'::pg_catalog.regclass) THEN
        RETURN 'already distributed: nothing to do';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'intent.distribute() must run on the Citus coordinator'
            USING ERRCODE = '55000',
                  DETAIL = 'This node is not the coordinator (citus_is_coordinator() is false). Nothing was changed.',
                  HINT = 'Connect to the coordinator; on a fresh coordinator run citus_set_coordinator_host() first.';
    END IF;
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
        IF NOT r.success OR r.result IS DISTINCT FROM our_version THEN
            RAISE EXCEPTION 'worker %:% does not have pg_intent at this version', r.nodename, r.nodeport
                USING ERRCODE = '55000',
                      DETAIL = format('The worker answered %s.', coalesce(r.result, 'nothing')),
                      HINT = 'Install the same pg_intent on every node (CREATE EXTENSION pg_intent on the coordinator creates it on the workers), then call intent.distribute() again.';
        END IF;
    END LOOP;

    -- The same changes here and on every worker's copy. Citus runs the workers' part on
    -- connections of their own, which commit at once: should anything below fail, the
    -- workers' (unused) copies stay prepared while this node rolls back, and calling
    -- distribute() again redoes both (every change can be made twice).
    -- The calls run as intent_owner (SECURITY DEFINER), and Citus opens its connections to the
    -- workers as the current user: intent_owner must be able to log in to the workers, from the
    -- coordinator (pg_hba.conf, or a password in pg_dist_authinfo; docs/scale-out.md). Citus
    -- propagates the change to every node.
    ALTER ROLE intent_owner LOGIN;
    -- Foreign keys to reference tables: Citus needs one connection per node for the rest.
    PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    EXECUTE prepare;
    SELECT string_agg(format('%s:%s: %s', nodename, nodeport, result), '; ') INTO failed
      FROM pg_catalog.run_command_on_workers(prepare) WHERE NOT success;
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
    RETURN 'distributed: jobs, attempts, events, retired_keys by job id (colocated); contracts, certifications as reference tables';
END
$distribute$;

COMMENT ON FUNCTION intent.distribute() IS
    'Turns this installation into a Citus one (run on the coordinator, as a superuser): jobs, attempts, events and retired_keys distributed by job id and colocated, contracts and certifications reference tables. Refuses with 55000 without Citus, changing nothing. docs/scale-out.md.';

-- As sql/privileges.sql does for a fresh install: owned by intent_owner, nothing for PUBLIC
-- (only a superuser can run it anyway).
ALTER FUNCTION intent.distribute() OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.distribute() FROM PUBLIC;

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
