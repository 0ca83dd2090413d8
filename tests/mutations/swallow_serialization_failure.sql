-- Mutation for tests/isolation_levels.rs: a 40001 turned into an answer. Under REPEATABLE READ
-- or SERIALIZABLE every caller that hits the concurrent insert claims to have created the job,
-- and those transactions commit. The real function is kept under another name and wrapped.
ALTER FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) RENAME TO submit_job_real;
CREATE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT * FROM intent.submit_job_real($1, $2, $3, $4, $5, $6);
EXCEPTION WHEN serialization_failure THEN
    job_id := intent.job_id($1, $2); created := true; state := 'pending'; version := 1; result := NULL;
    RETURN NEXT;
END
$$;
