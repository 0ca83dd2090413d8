-- Mutation for tests/model_check.rs: fail_attempt ignores retryable => false, so a job the
-- provider said can never succeed goes back to pending.
ALTER FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean, interval) RENAME TO fail_attempt_real;
CREATE FUNCTION intent.fail_attempt(attempt_id uuid, version bigint, error jsonb, retryable boolean DEFAULT true,
                                    retry_after interval DEFAULT NULL)
RETURNS intent.job_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    RETURN intent.fail_attempt_real($1, $2, $3, true, $5);
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean, interval) OWNER TO intent_owner;
