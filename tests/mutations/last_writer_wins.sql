-- Mutation for tests/reverse_order_finish.rs: the last result overwrites the job, the bug the
-- compare-and-swap of SPEC rule 3 prevents.
CREATE OR REPLACE FUNCTION intent.complete_attempt(attempt_id uuid, version bigint, result jsonb)
RETURNS intent.completion
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._complete_attempt($1, $2, $3);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    IF r.completion = 'lost' THEN
        UPDATE intent.jobs j SET state = 'succeeded', result = $3, completed_by = $1
         WHERE j.id = intent.job_of($1);
        UPDATE intent.attempts a SET state = 'succeeded' WHERE a.id = $1;
        RETURN 'won';
    END IF;
    RETURN r.completion::intent.completion;
END
$$;
