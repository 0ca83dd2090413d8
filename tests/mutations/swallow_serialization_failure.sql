-- Mutation for tests/isolation_levels.rs: a 40001 turned into an answer. Under REPEATABLE READ
-- or SERIALIZABLE every caller that hits the concurrent insert claims to have created the job,
-- and those transactions commit.
CREATE OR REPLACE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    BEGIN
        SELECT * INTO r FROM intent._submit_job($1, $2, $3, $4, $5, $6);
    EXCEPTION WHEN serialization_failure THEN
        job_id := intent.job_id($1, $2); created := true; state := 'pending'; version := 1;
        RETURN NEXT;
        RETURN;
    END;
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    job_id := r.job_id; created := r.created; state := r.state::intent.job_state;
    version := r.version; result := r.result;
    RETURN NEXT;
END
$$;
