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
