-- Mutation for tests/concurrent_begin.rs: a second worker is "helpfully" handed the attempt
-- already in flight instead of IJ002, so two workers run one attempt. The real function is
-- kept under another name and wrapped.
ALTER FUNCTION intent.begin_attempt(uuid, text, interval, text) RENAME TO begin_attempt_real;
CREATE FUNCTION intent.begin_attempt(
    job_id uuid, provider text DEFAULT NULL, lease interval DEFAULT '30 seconds', worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT * FROM intent.begin_attempt_real($1, $2, $3, $4);
EXCEPTION WHEN SQLSTATE 'IJ002' THEN
    RETURN QUERY SELECT a.id, a.attempt_no::integer, a.version_read::bigint, a.deadline
                   FROM intent.attempts a WHERE a.job_id = $1 AND a.state = 'started';
END
$$;
