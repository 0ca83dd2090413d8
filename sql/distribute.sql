-- pg_intent: the distributed mode (docs/scale-out.md).
--
-- intent.distribute() turns a single-node installation into a Citus one, on the coordinator,
-- after CREATE EXTENSION citus and pg_intent and citus_add_node for every worker. Every call
-- touches one job's rows, found by its job id (an attempt id names its job), so the tables
-- holding rows per job are distributed by the job id and colocated: a job, its attempts, its
-- events and its tombstone live on one shard, and every call is a single-shard transaction.
-- Contracts and certifications are small and read by every node: reference tables.
--
-- What must change first, on the coordinator and on every worker alike (Citus uses each
-- worker's own copy of an extension's tables as the shell of the distributed table, so the
-- workers' copies must have the same constraints and policies):
--   * unique constraints must contain the distribution column: jobs_owner_key_unique goes
--     (the primary key on the derived id, with jobs_id_derived, still admits one job per
--     (owner_id, idempotency_key): the id is a function of the pair), and the primary keys of
--     attempts and events gain job_id;
--   * the foreign keys to contracts are dropped while contracts becomes a reference table
--     (Citus would otherwise convert the whole foreign-key graph, dropping the extension's
--     sequence of certifications) and added back after;
--   * the owner isolation policies call intent.owner_admits(owner_id): Citus refuses the
--     single-node policies' sub-select, and a function named with its schema means the same
--     on every worker, whatever that worker's search path (a plain operator would be looked
--     up again there).
--
-- intent_owner, as whom the calls run, becomes a LOGIN role (still without a password and
-- without superuser): Citus connects to the workers as the current user. On every node:
-- Citus keeps a role's attributes equal on all nodes, and each node it adds or activates
-- gets the coordinator's. Whoever can authenticate as intent_owner holds everything pg_intent
-- holds (docs/security.md): pg_hba.conf must admit it from the cluster's nodes only.
-- distribute() itself stays the installing superuser's (sql/privileges.sql), not
-- intent_owner's: it is what a superuser runs again after adding a worker. intent_owner's
-- search path in this database is pinned to pg_catalog, pg_temp on every node.
--
-- Workers added later (citus_add_node) get pg_intent's install script from Citus, and with it
-- the single-node definitions: calling intent.distribute() again prepares them, before the
-- shards are rebalanced onto them. A worker whose search path puts a schema before pg_catalog is refused: what Citus
-- sends it is parsed with that path.
--
-- Refusals: 42501 unless a superuser calls it; 55000 (object_not_in_prerequisite_state)
-- without Citus in this database, on a node that is not the coordinator, in the transaction
-- that created pg_intent, or when a worker is not ready (no pg_intent at this version, a search path that shadows pg_catalog). A refusal
-- changes nothing on the coordinator. On an installation already distributed whose workers
-- are all prepared it does nothing and says so.

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
