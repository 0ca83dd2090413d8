-- Mutation for tests/concurrent_begin.rs: a second worker is "helpfully" handed the attempt
-- already in flight instead of IJ002, so two workers run one attempt.
CREATE OR REPLACE FUNCTION intent.begin_attempt(
    job_id uuid, provider text DEFAULT NULL, lease interval DEFAULT '30 seconds', worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._begin_attempt($1, $2, $3, $4);
    IF r.err_code = 'IJ002' THEN
        RETURN QUERY SELECT a.id, a.attempt_no, a.version_read, a.deadline
                       FROM intent.attempts a WHERE a.job_id = $1 AND a.state = 'started';
        RETURN;
    END IF;
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    attempt_id := r.attempt_id; attempt_no := r.attempt_no; version := r.version; deadline := r.deadline;
    RETURN NEXT;
END
$$;
