-- pg_intent 0.2.0 → 0.3.0: workers that claim, wake and back off (docs/reference.md § 1.5).
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are kept; the changes:
--   * intent.jobs.retry_at, and the partial index jobs_claimable that claims scan;
--   * intent.claim_attempts (begins the next attempt of up to max_jobs claimable jobs);
--   * intent.fail_attempt takes retry_after (the 4-argument form is replaced: a call with four
--     arguments, or fewer, means what it meant).

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.3.0'" to load this file. \quit

-- Nullable, no default: a catalog change only, whatever the size of the table.
ALTER TABLE intent.jobs ADD COLUMN retry_at timestamptz;
COMMENT ON COLUMN intent.jobs.retry_at IS
    'After a retryable failure, when claim_attempts may begin the next attempt (fail_attempt''s retry_after, or the backoff of intent.retry_backoff). NULL: claimable as soon as pending. begin_attempt is not held back by it.';

CREATE INDEX jobs_claimable ON intent.jobs ((coalesce(retry_at, updated_at)))
    WHERE state = 'pending' AND attempt_count < max_attempts;
COMMENT ON INDEX intent.jobs_claimable IS
    'The claimable jobs, in the order claim_attempts takes them; only pending jobs with attempts left are in it.';

DROP FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean);
CREATE FUNCTION intent.fail_attempt(
    attempt_id uuid,
    version bigint,
    error jsonb,
    retryable boolean DEFAULT true,
    retry_after interval DEFAULT NULL)
RETURNS intent.job_state
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_fail_attempt';
COMMENT ON FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean, interval) IS
    'Reports a definite failure: the provider said nothing happened. The job returns to pending if retryable and attempts remain, else fails. A pending job is claimable again after retry_after (NULL: the backoff of intent.retry_backoff, doubled per failed attempt, capped at intent.retry_backoff_max). Never report a timeout here: use mark_unknown.';

CREATE FUNCTION intent.claim_attempts(
    providers text[] DEFAULT NULL,
    worker text DEFAULT NULL,
    lease interval DEFAULT '30 seconds',
    max_jobs integer DEFAULT 1)
RETURNS TABLE (job_id uuid, attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz,
               provider text, params jsonb, contract text)
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_claim_attempts';
COMMENT ON FUNCTION intent.claim_attempts(text[], text, interval, integer) IS
    'Begins the next attempt, on the job''s own provider, of up to max_jobs (1 to 1000) jobs that may begin one now: pending, attempts left, retry time passed, provider in providers (any when NULL), longest-waiting first. Each row is what begin_attempt(job_id, NULL, lease, worker) would have begun. Concurrent claimers get disjoint jobs and never wait for a job another transaction holds (SKIP LOCKED).';

-- As sql/privileges.sql does for a fresh install: owned by intent_owner, nothing for PUBLIC,
-- the protocol calls for intent_app.
ALTER FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean, interval) OWNER TO intent_owner;
ALTER FUNCTION intent.claim_attempts(text[], text, interval, integer) OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.fail_attempt(uuid, bigint, jsonb, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION intent.claim_attempts(text[], text, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    intent.fail_attempt(uuid, bigint, jsonb, boolean, interval),
    intent.claim_attempts(text[], text, interval, integer)
  TO intent_app;
