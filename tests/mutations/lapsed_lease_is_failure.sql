-- Mutation for tests/timeout.rs: a lease that ran out treated as a failure (the gate reopens
-- behind the provider's back), sweep failing attempts instead of making them unknown, and a
-- heartbeat that answers true without extending anything.
CREATE FUNCTION intent._fail_lapsed(job uuid) RETURNS bigint LANGUAGE sql AS $$
    WITH a AS (
        UPDATE intent.attempts a SET state = 'failed', finished_at = statement_timestamp(),
                                     error = '{"kind": "timeout"}'
         WHERE (job IS NULL OR a.job_id = job) AND a.state = 'started'
           AND a.deadline <= statement_timestamp()
        RETURNING a.job_id),
    j AS (
        UPDATE intent.jobs j SET state = 'pending' WHERE j.id IN (SELECT job_id FROM a))
    SELECT count(*) FROM a
$$;

CREATE OR REPLACE FUNCTION intent.begin_attempt(
    job_id uuid, provider text DEFAULT NULL, lease interval DEFAULT '30 seconds', worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    PERFORM intent._fail_lapsed($1);
    SELECT * INTO r FROM intent._begin_attempt($1, $2, $3, $4);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    attempt_id := r.attempt_id; attempt_no := r.attempt_no; version := r.version; deadline := r.deadline;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION intent.sweep() RETURNS bigint LANGUAGE sql AS $$
    SELECT intent._fail_lapsed(NULL)
$$;

CREATE OR REPLACE FUNCTION intent.heartbeat(attempt_id uuid, extend interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM intent.attempts a WHERE a.id = $1 AND a.state = 'started');
END
$$;
