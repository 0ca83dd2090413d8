-- pg_intent: the SQL API of SPEC § Functions.
--
-- Why a wrapper per call: the work is done by a Rust core function (intent._submit_job, ...)
-- that returns a refusal instead of raising it, because pgrx would re-raise a custom SQLSTATE
-- such as IJ002 as XX000. Each wrapper below raises the refusal with its exact SQLSTATE, DETAIL
-- and HINT, so clients in any language can match on the code. The raise aborts the statement,
-- so a refusal never leaves a row behind.
--
-- Every wrapper is SECURITY DEFINER, so an application needs EXECUTE on it and nothing on the
-- tables, with search_path pinned to pg_catalog, intent, pg_temp (pg_temp last, so a temporary
-- object can never shadow ours) and every name schema-qualified.

CREATE FUNCTION intent._refuse(code text, message text, detail text, hint text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, intent, pg_temp
AS $$
BEGIN
    -- RAISE rejects NULL options, hence one branch per combination.
    IF detail IS NOT NULL AND hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail, HINT = hint;
    ELSIF detail IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, DETAIL = detail;
    ELSIF hint IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message, HINT = hint;
    ELSE
        RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
    END IF;
END
$$;
COMMENT ON FUNCTION intent._refuse(text, text, text, text) IS
    'Internal: raises a refusal returned by a Rust core function with its exact SQLSTATE, DETAIL and HINT.';

CREATE FUNCTION intent.submit_job(
    owner_id text,
    idempotency_key text,
    provider text,
    params jsonb,
    contract text DEFAULT NULL,
    max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._submit_job($1, $2, $3, $4, $5, $6);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    job_id := r.job_id;
    created := r.created;
    state := r.state::intent.job_state;
    version := r.version;
    result := r.result;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) IS
    'Submits an intent. A new (owner_id, idempotency_key) creates the job (created = true); the same key with the same provider, params and contract returns the existing job and writes nothing; the same key with another fingerprint raises IJ001. Concurrent identical calls all get the same job_id and exactly one gets created = true.';

CREATE FUNCTION intent.begin_attempt(
    job_id uuid,
    provider text DEFAULT NULL,
    lease interval DEFAULT '30 seconds',
    worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._begin_attempt($1, $2, $3, $4);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    attempt_id := r.attempt_id;
    attempt_no := r.attempt_no;
    version := r.version;
    deadline := r.deadline;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION intent.begin_attempt(uuid, text, interval, text) IS
    'Starts the next attempt of a job and hands out the version to present when it finishes. Refuses with IJ002 while an attempt is in flight, IJ003 while one is unknown, IJ004 for a finished job, IJ005 for an uncertified failover provider, IJ006 when max_attempts attempts exist, IJ007 for no such job.';

CREATE FUNCTION intent.complete_attempt(attempt_id uuid, version bigint, result jsonb)
RETURNS intent.completion
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._complete_attempt($1, $2, $3);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    RETURN r.completion::intent.completion;
END
$$;
COMMENT ON FUNCTION intent.complete_attempt(uuid, bigint, jsonb) IS
    'Reports an attempt''s result. won: the compare-and-swap made it the job''s result. lost: the outcome was already decided; the result is kept on the attempt (discarded) and the race is logged. rejected: it broke the job''s contract. Asking again returns the same answer.';

CREATE FUNCTION intent.fail_attempt(attempt_id uuid, version bigint, error jsonb, retryable boolean DEFAULT true)
RETURNS intent.job_state
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._fail_attempt($1, $2, $3, $4);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    RETURN r.job_state::intent.job_state;
END
$$;
COMMENT ON FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean) IS
    'Reports a definite failure: the provider said nothing happened. The job returns to pending if retryable and attempts remain, else fails. Never report a timeout here: use mark_unknown.';

CREATE FUNCTION intent.mark_unknown(attempt_id uuid, reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._mark_unknown($1, $2);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
END
$$;
COMMENT ON FUNCTION intent.mark_unknown(uuid, text) IS
    'The caller''s own timeout fired: a started attempt becomes unknown, and so does its job. No effect on an attempt that is not started.';

CREATE FUNCTION intent.heartbeat(attempt_id uuid, extend interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._heartbeat($1, $2);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    RETURN r.alive;
END
$$;
COMMENT ON FUNCTION intent.heartbeat(uuid, interval) IS
    'Extends a started attempt''s lease (by extend, or by its original lease). false when the attempt is no longer started, its lease already ran out, or its job has ended: the worker should stop.';

CREATE FUNCTION intent.abandon_attempt(attempt_id uuid, reason text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._abandon_attempt($1, $2);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
END
$$;
COMMENT ON FUNCTION intent.abandon_attempt(uuid, text) IS
    'The out-of-band decision: stop waiting for a started or unknown attempt. The job returns to pending; if the attempt returns later, the compare-and-swap decides. No effect on an attempt that already has an outcome.';

CREATE FUNCTION intent.cancel_job(job_id uuid, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._cancel_job($1, $2);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    RETURN r.cancelled;
END
$$;
COMMENT ON FUNCTION intent.cancel_job(uuid, text) IS
    'The owner withdraws the intent: a job that is not finished becomes cancelled (version + 1), and attempts still out there will lose. false if the job had already finished.';

CREATE FUNCTION intent.sweep()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$ SELECT intent._sweep() $$;
COMMENT ON FUNCTION intent.sweep() IS
    'Persists started -> unknown for every attempt past its deadline, logging a timeout event for each; returns how many. Optional: the deadline rule holds whether or not it runs.';

CREATE FUNCTION intent.purge(older_than interval DEFAULT NULL, batch_size integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, intent, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM intent._purge($1, $2);
    IF r.err_code IS NOT NULL THEN
        PERFORM intent._refuse(r.err_code, r.err_message, r.err_detail, r.err_hint);
    END IF;
    RETURN r.purged;
END
$$;
COMMENT ON FUNCTION intent.purge(interval, integer) IS
    'Removes up to batch_size finished jobs (succeeded, failed, cancelled) created and last changed more than older_than ago (default: the setting intent.retention), with their attempts and events; returns how many. Never touches an open job, nor one locked right now. After a purge the same key creates a new job.';

COMMENT ON FUNCTION intent.job_id(text, text) IS
    'The job id of an intent: SHA-256(owner_id || 0x00 || idempotency_key), first 16 bytes, UUID version 8 and RFC 9562 variant, last two bytes zero.';
COMMENT ON FUNCTION intent.attempt_id(uuid, integer) IS
    'The id of attempt attempt_no (1 to 65535) of a job: the job id with the number, big-endian, in its last two bytes.';
COMMENT ON FUNCTION intent.job_of(uuid) IS 'The job an attempt id belongs to (its last two bytes zeroed).';

COMMENT ON FUNCTION intent._submit_job(text, text, text, jsonb, text, integer) IS 'Internal core of intent.submit_job: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._begin_attempt(uuid, text, interval, text) IS 'Internal core of intent.begin_attempt: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._complete_attempt(uuid, bigint, jsonb) IS 'Internal core of intent.complete_attempt: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._fail_attempt(uuid, bigint, jsonb, boolean) IS 'Internal core of intent.fail_attempt: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._mark_unknown(uuid, text) IS 'Internal core of intent.mark_unknown: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._heartbeat(uuid, interval) IS 'Internal core of intent.heartbeat: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._abandon_attempt(uuid, text) IS 'Internal core of intent.abandon_attempt: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._cancel_job(uuid, text) IS 'Internal core of intent.cancel_job: returns refusals instead of raising them.';
COMMENT ON FUNCTION intent._sweep() IS 'Internal core of intent.sweep.';
COMMENT ON FUNCTION intent._purge(interval, integer) IS 'Internal core of intent.purge.';
