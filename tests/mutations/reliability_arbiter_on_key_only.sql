-- Mutation for tests/storm.rs: submit_job whose INSERT arbitrates only the (owner_id,
-- idempotency_key) constraint, leaving the primary key (the derived id) to raise 23505 when
-- identical submits race (the regression of commit 23efd8e).
CREATE OR REPLACE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j intent.jobs;
    v bigint;
BEGIN
    INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts, retry_at)
    VALUES (intent.job_id($1, $2), $1, $2, $3, $4, $5, $6, clock_timestamp())
    ON CONFLICT (owner_id, idempotency_key) DO NOTHING
    RETURNING intent.jobs.version INTO v;
    IF v IS NOT NULL THEN
        job_id := intent.job_id($1, $2); created := true; state := 'pending'; version := v;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO j FROM intent.jobs t WHERE t.id = intent.job_id($1, $2);
    IF j.provider <> $3 OR j.params <> $4 OR j.contract IS DISTINCT FROM $5 THEN
        RAISE EXCEPTION USING ERRCODE = 'IJ001', MESSAGE = 'idempotency key reused',
            DETAIL = 'different intent', HINT = 'use a new key';
    END IF;
    job_id := j.id; created := false; state := j.state; version := j.version; result := j.result;
    RETURN NEXT;
END
$$;
