-- Mutation for tests/timeout.rs: a lease that ran out treated as a failure (the gate reopens
-- behind the provider's back), sweep failing attempts instead of making them unknown, and a
-- heartbeat that answers true without extending anything. begin_attempt is wrapped (the real
-- function kept under another name); sweep and heartbeat are replaced outright (the real ones
-- renamed, unused). All in PL/pgSQL, one statement at a time: Citus (the citus target) plans
-- neither a SQL function's parameters nor data-modifying CTEs across its tables.
CREATE FUNCTION intent._fail_lapsed(for_job uuid) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
DECLARE
    r record;
    jobs uuid[] := '{}';
BEGIN
    FOR r IN
        UPDATE intent.attempts a SET state = 'failed', finished_at = statement_timestamp(),
                                     error = '{"kind": "timeout"}'
         WHERE (for_job IS NULL OR a.job_id = for_job) AND a.state = 'started'
           AND a.deadline <= statement_timestamp()
        RETURNING a.job_id
    LOOP
        jobs := jobs || r.job_id;
    END LOOP;
    UPDATE intent.jobs j SET state = 'pending', retry_at = CASE WHEN j.attempt_count < j.max_attempts THEN clock_timestamp() END WHERE j.id = ANY (jobs);
    RETURN cardinality(jobs);
END
$$;

ALTER FUNCTION intent.begin_attempt(uuid, text, interval, text) RENAME TO begin_attempt_real;
CREATE FUNCTION intent.begin_attempt(
    job_id uuid, provider text DEFAULT NULL, lease interval DEFAULT '30 seconds', worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    PERFORM intent._fail_lapsed($1);
    RETURN QUERY SELECT * FROM intent.begin_attempt_real($1, $2, $3, $4);
END
$$;

ALTER FUNCTION intent.sweep() RENAME TO sweep_real;
CREATE FUNCTION intent.sweep() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    RETURN intent._fail_lapsed(NULL);
END
$$;

ALTER FUNCTION intent.heartbeat(uuid, interval) RENAME TO heartbeat_real;
CREATE FUNCTION intent.heartbeat(attempt_id uuid, extend interval DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM intent.attempts a WHERE a.id = $1 AND a.state = 'started');
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent._fail_lapsed(uuid) OWNER TO intent_owner;
ALTER FUNCTION intent.begin_attempt(uuid, text, interval, text) OWNER TO intent_owner;
ALTER FUNCTION intent.sweep() OWNER TO intent_owner;
ALTER FUNCTION intent.heartbeat(uuid, interval) OWNER TO intent_owner;
