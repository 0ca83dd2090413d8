-- Mutation for tests/model_check.rs: cancel_job does not move the version (the fencing token),
-- so an attempt still out there can win a cancelled job.
ALTER FUNCTION intent.cancel_job(uuid, text) RENAME TO cancel_job_real;
CREATE FUNCTION intent.cancel_job(job_id uuid, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
DECLARE
    done boolean := intent.cancel_job_real($1, $2);
BEGIN
    IF done THEN
        UPDATE intent.jobs j SET version = j.version - 1 WHERE j.id = $1;
    END IF;
    RETURN done;
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.cancel_job(uuid, text) OWNER TO intent_owner;
