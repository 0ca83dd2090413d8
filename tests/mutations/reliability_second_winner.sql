-- Mutation for tests/storm.rs: a result that lost the compare-and-swap overwrites the winner
-- and is told `won` (last writer wins). The storm must see a second winner.
ALTER FUNCTION intent.complete_attempt(uuid, bigint, jsonb) RENAME TO complete_attempt_original;
CREATE FUNCTION intent.complete_attempt(attempt_id uuid, version bigint, result jsonb)
RETURNS intent.completion
LANGUAGE plpgsql AS $$
DECLARE
    answer intent.completion;
BEGIN
    answer := intent.complete_attempt_original($1, $2, $3);
    IF answer = 'lost' THEN
        UPDATE intent.jobs j SET result = $3, completed_by = $1
         WHERE j.id = intent.job_of($1) AND j.state = 'succeeded';
        UPDATE intent.attempts a SET state = 'succeeded' WHERE a.id = $1 AND a.state = 'discarded';
        RETURN 'won';
    END IF;
    RETURN answer;
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.complete_attempt(uuid, bigint, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp;
ALTER FUNCTION intent.complete_attempt(uuid, bigint, jsonb) OWNER TO intent_owner;
