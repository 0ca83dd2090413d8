-- What a user would write instead of pg_intent, kept here so every ratio is measured against it.
-- Loaded by benches/run.sh into the benchmark database next to the extension.

CREATE SCHEMA bench;

-- 1. What "just use INSERT … ON CONFLICT" costs, on the same tables: bench.jobs and
--    bench.attempts are copies of intent.jobs and intent.attempts (same columns, keys, CHECKs
--    and indexes), with no protocol at all.
CREATE TABLE bench.jobs (LIKE intent.jobs INCLUDING ALL) WITH (fillfactor = 90);
CREATE TABLE bench.attempts (LIKE intent.attempts INCLUDING ALL);
ALTER TABLE bench.attempts ADD FOREIGN KEY (job_id) REFERENCES bench.jobs (id) ON DELETE CASCADE;

-- 1b. The same on a bare table a hurried user might write: plain types, one unique key, no
--     checks. Reported for context; no target is measured against it.
CREATE TABLE bench.bare_jobs (
    id uuid PRIMARY KEY,
    owner_id text NOT NULL,
    idempotency_key text NOT NULL,
    provider text NOT NULL,
    params jsonb NOT NULL,
    contract text,
    state text NOT NULL DEFAULT 'pending',
    version bigint NOT NULL DEFAULT 1,
    completed_by uuid,
    result jsonb,
    error jsonb,
    max_attempts integer NOT NULL DEFAULT 3,
    attempt_count integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (owner_id, idempotency_key)
);

-- 2. A careful hand-written PL/pgSQL implementation of the same protocol, with the same tables
--    and the same rules: copies of the tables with their checks and indexes, the same owner
--    isolation policies, owned by a non-superuser, SECURITY DEFINER functions with a pinned
--    search_path; uniqueness by the constraint, the lookup in a fresh statement, the gate under
--    a row lock, the compare-and-swap. Errors are raised with the same SQLSTATEs.
CREATE TABLE bench.p_jobs (LIKE intent.jobs INCLUDING ALL) WITH (fillfactor = 90);
CREATE TABLE bench.p_attempts (LIKE intent.attempts INCLUDING ALL);
ALTER TABLE bench.p_attempts ADD FOREIGN KEY (job_id) REFERENCES bench.p_jobs (id) ON DELETE CASCADE;
CREATE TABLE bench.p_events (LIKE intent.events INCLUDING ALL);
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['p_jobs', 'p_attempts', 'p_events'] LOOP
        EXECUTE format('ALTER TABLE bench.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE bench.%I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY owner_isolation ON bench.%I
                            USING (owner_id = coalesce((SELECT intent.bound_owner()), owner_id))
                            WITH CHECK (owner_id = coalesce((SELECT intent.bound_owner()), owner_id))', t);
        EXECUTE format('ALTER TABLE bench.%I OWNER TO intent_owner', t);
    END LOOP;
END $$;
GRANT USAGE ON SCHEMA bench TO intent_owner;
GRANT EXECUTE ON FUNCTION intent.job_id(text, text), intent.attempt_id(uuid, integer), intent.job_of(uuid),
    intent.bound_owner() TO intent_owner;

CREATE FUNCTION bench.p_submit_job(p_owner text, p_key text, p_provider text, p_params jsonb,
                                   p_contract text DEFAULT NULL, p_max_attempts int DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := intent.job_id(p_owner, p_key);
    j bench.p_jobs;
BEGIN
    INSERT INTO bench.p_jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts, retry_at)
    VALUES (v_id, p_owner, p_key, p_provider, p_params, p_contract, p_max_attempts, statement_timestamp())
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT v_id, true, 'pending'::intent.job_state, 1::bigint, NULL::jsonb;
        RETURN;
    END IF;
    SELECT * INTO j FROM bench.p_jobs WHERE id = v_id;
    IF j.provider IS DISTINCT FROM p_provider OR j.params IS DISTINCT FROM p_params
       OR j.contract IS DISTINCT FROM p_contract THEN
        RAISE EXCEPTION USING ERRCODE = 'IJ001', MESSAGE = 'idempotency key reused for a different intent';
    END IF;
    RETURN QUERY SELECT v_id, false, j.state, j.version::bigint, j.result;
END $$;

CREATE FUNCTION bench.p_begin_attempt(p_job uuid, p_lease interval DEFAULT '30 seconds')
RETURNS TABLE (attempt_id uuid, attempt_no int, version bigint, deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    j bench.p_jobs;
    a bench.p_attempts;
    n int;
BEGIN
    SELECT * INTO j FROM bench.p_jobs WHERE id = p_job FOR NO KEY UPDATE;
    IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'IJ007', MESSAGE = 'no such job'; END IF;
    IF j.state IN ('succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'IJ004', MESSAGE = 'job finished';
    END IF;
    SELECT * INTO a FROM bench.p_attempts WHERE job_id = p_job AND state IN ('started', 'unknown');
    IF FOUND THEN
        IF a.state = 'started' AND a.deadline > statement_timestamp() THEN
            RAISE EXCEPTION USING ERRCODE = 'IJ002', MESSAGE = 'attempt in flight';
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'IJ003', MESSAGE = 'outcome unknown';
    END IF;
    IF j.attempt_count >= j.max_attempts THEN
        RAISE EXCEPTION USING ERRCODE = 'IJ006', MESSAGE = 'attempts exhausted';
    END IF;
    n := j.attempt_count + 1;
    INSERT INTO bench.p_attempts (id, job_id, owner_id, attempt_no, provider, state, version_read, lease, started_at, deadline)
    VALUES (intent.attempt_id(p_job, n), p_job, j.owner_id, n, j.provider, 'started', j.version, p_lease,
            statement_timestamp(), statement_timestamp() + p_lease);
    UPDATE bench.p_jobs SET state = 'running', attempt_count = n, retry_at = NULL, updated_at = statement_timestamp() WHERE id = p_job;
    RETURN QUERY SELECT intent.attempt_id(p_job, n), n, j.version::bigint, statement_timestamp() + p_lease;
END $$;

CREATE FUNCTION bench.p_complete_attempt(p_attempt uuid, p_version bigint, p_result jsonb)
RETURNS intent.completion
LANGUAGE plpgsql AS $$
DECLARE
    v_job uuid := intent.job_of(p_attempt);
    j bench.p_jobs;
    a bench.p_attempts;
BEGIN
    SELECT * INTO j FROM bench.p_jobs WHERE id = v_job FOR NO KEY UPDATE;
    SELECT * INTO a FROM bench.p_attempts WHERE id = p_attempt;
    IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'IJ007', MESSAGE = 'no such attempt'; END IF;
    IF a.state = 'succeeded' THEN RETURN 'won'; END IF;
    IF a.state = 'discarded' THEN RETURN 'lost'; END IF;
    UPDATE bench.p_jobs SET state = 'succeeded', result = p_result, completed_by = p_attempt,
           version = version + 1, updated_at = statement_timestamp()
     WHERE id = v_job AND version = p_version AND completed_by IS NULL
       AND state IN ('pending', 'running', 'unknown');
    IF FOUND THEN
        UPDATE bench.p_attempts SET state = 'succeeded', result = p_result, finished_at = statement_timestamp() WHERE id = p_attempt;
        RETURN 'won';
    END IF;
    UPDATE bench.p_attempts SET state = 'discarded', result = p_result, finished_at = statement_timestamp() WHERE id = p_attempt;
    INSERT INTO bench.p_events (job_id, owner_id, attempt_id, kind, detail)
    VALUES (v_job, j.owner_id, p_attempt, 'late_result', jsonb_build_object('presented_version', p_version, 'current_version', j.version));
    RETURN 'lost';
END $$;

DO $$
DECLARE f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['bench.p_submit_job(text, text, text, jsonb, text, integer)',
                             'bench.p_begin_attempt(uuid, interval)',
                             'bench.p_complete_attempt(uuid, bigint, jsonb)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, bench, intent, pg_temp', f);
        EXECUTE format('ALTER FUNCTION %s OWNER TO intent_owner', f);
    END LOOP;
END $$;
