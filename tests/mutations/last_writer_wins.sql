-- Mutation for tests/reverse_order_finish.rs: the last result overwrites the job, the bug the
-- compare-and-swap of rule 3 (README) prevents: a result that lost (to an earlier winner, or to a
-- cancel) becomes the job's result and is told `won`. The real function is kept under another
-- name and wrapped.
ALTER FUNCTION intent.complete_attempt(uuid, bigint, jsonb) RENAME TO complete_attempt_real;
CREATE FUNCTION intent.complete_attempt(attempt_id uuid, version bigint, result jsonb)
RETURNS intent.completion
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
DECLARE
    answer intent.completion := intent.complete_attempt_real($1, $2, $3);
BEGIN
    IF answer = 'lost' THEN
        UPDATE intent.jobs j SET state = 'succeeded', retry_at = NULL, result = $3, completed_by = $1
         WHERE j.id = intent.job_of($1);
        UPDATE intent.attempts a SET state = 'succeeded' WHERE a.id = $1;
        RETURN 'won';
    END IF;
    RETURN answer;
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.complete_attempt(uuid, bigint, jsonb) OWNER TO intent_owner;
