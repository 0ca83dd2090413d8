-- Mutation for tests/same_key_different_input.rs: a silent reuse. The stored params replace
-- the caller's, so a different params is answered with the existing job instead of IJ001.
CREATE OR REPLACE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._submit_job($1, $2, $3,
        coalesce((SELECT t.params FROM intent.jobs t WHERE t.owner_id = $1 AND t.idempotency_key = $2), $4),
        $5, $6);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    job_id := r.job_id; created := r.created; state := r.state::intent.job_state;
    version := r.version; result := r.result;
    RETURN NEXT;
END
$$;
