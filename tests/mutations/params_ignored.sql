-- Mutation for tests/same_key_different_input.rs: a silent reuse. The stored params replace
-- the caller's, so a different params is answered with the existing job instead of IJ001.
-- The real function is kept under another name and wrapped (in PL/pgSQL, the stored params read
-- first: Citus, the citus target, cannot plan a SQL function's parameters in a query on a
-- distributed table, and would send a call with such a sub-select to a worker).
ALTER FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) RENAME TO submit_job_real;
CREATE FUNCTION intent.submit_job(
    owner_id text, idempotency_key text, provider text, params jsonb,
    contract text DEFAULT NULL, max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
DECLARE
    stored jsonb;
BEGIN
    SELECT t.params INTO stored FROM intent.jobs t WHERE t.owner_id = $1 AND t.idempotency_key = $2;
    RETURN QUERY SELECT * FROM intent.submit_job_real($1, $2, $3, coalesce(stored, $4), $5, $6);
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) OWNER TO intent_owner;
