-- Mutation for tests/double_click.rs: submit_job as a check-then-insert, the bug rule 1 (README)
-- forbids. Two callers that both find no row both "create" the job.
CREATE OR REPLACE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j intent.jobs;
BEGIN
    SELECT * INTO j FROM intent.jobs t WHERE t.owner_id = $1 AND t.idempotency_key = $2;
    IF FOUND THEN
        job_id := j.id; created := false; state := j.state; version := j.version; result := j.result;
    ELSE
        PERFORM pg_sleep(0.05); -- the window every check-then-insert has, made wider
        INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts, retry_at)
        VALUES (intent.job_id($1, $2), $1, $2, $3, $4, $5, $6, clock_timestamp())
        ON CONFLICT DO NOTHING;
        job_id := intent.job_id($1, $2); created := true; state := 'pending'; version := 1;
    END IF;
    RETURN NEXT;
END
$$;
