-- pg_intent: the SQL API (docs/reference.md § 1 Functions; the rules: docs/protocol.md).
--
-- Every function here is a C function written in Rust (extension/src/entry.rs). Each returns
-- its answer or raises a refusal with its exact SQLSTATE, DETAIL and HINT, so clients in any
-- language can match on the code; the raise aborts the statement, so a refusal never leaves a
-- row behind.
--
-- They are SECURITY DEFINER: an application needs EXECUTE on the calls it makes and nothing on
-- the tables. They have no SET search_path clause: each call pins its search path to
-- pg_catalog, pg_temp itself while it runs (a GUC nesting level, as a SET clause does, on every
-- supported major), and every object of ours is schema-qualified in the SQL it executes.
-- Nothing a caller puts in public or pg_temp can be picked up.

CREATE FUNCTION intent.submit_job(
    owner_id text,
    idempotency_key text,
    provider text,
    params jsonb,
    contract text DEFAULT NULL,
    max_attempts integer DEFAULT 3)
RETURNS TABLE (job_id uuid, created boolean, state intent.job_state, version bigint, result jsonb)
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_submit_job';
COMMENT ON FUNCTION intent.submit_job(text, text, text, jsonb, text, integer) IS
    'Submits an intent. A new (owner_id, idempotency_key) creates the job (created = true); the same key with the same provider, params and contract returns the existing job and writes nothing; the same key with another fingerprint raises IJ001. Concurrent identical calls all get the same job_id and exactly one gets created = true.';

CREATE FUNCTION intent.submit_jobs(
    owner_ids text[],
    idempotency_keys text[],
    providers text[],
    params jsonb[],
    contracts text[] DEFAULT NULL,
    max_attempts integer[] DEFAULT NULL)
RETURNS TABLE (ordinality integer, job_id uuid, created boolean, state intent.job_state, version bigint,
               result jsonb, sqlstate text, message text, detail text)
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_submit_jobs';
COMMENT ON FUNCTION intent.submit_jobs(text[], text[], text[], jsonb[], text[], integer[]) IS
    'Submits many intents in one call (up to 10000; element i of every array is intent i; NULL contracts or max_attempts arrays mean the defaults). Returns one row per intent, in order, with the answer submit_job would give it, or its refusal in sqlstate, message and detail (one bad intent does not stop the others). A key repeated later in the batch is answered like a second submit_job.';

CREATE FUNCTION intent.begin_attempt(
    job_id uuid,
    provider text DEFAULT NULL,
    lease interval DEFAULT '30 seconds',
    worker text DEFAULT NULL)
RETURNS TABLE (attempt_id uuid, attempt_no integer, version bigint, deadline timestamptz)
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_begin_attempt';
COMMENT ON FUNCTION intent.begin_attempt(uuid, text, interval, text) IS
    'Starts the next attempt of a job and hands out the version to present when it finishes. Refuses with IJ002 while an attempt is in flight, IJ003 while one is unknown, IJ004 for a finished job, IJ005 for an uncertified failover provider, IJ006 when max_attempts attempts exist, IJ007 for no such job.';

CREATE FUNCTION intent.complete_attempt(attempt_id uuid, version bigint, result jsonb)
RETURNS intent.completion
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_complete_attempt';
COMMENT ON FUNCTION intent.complete_attempt(uuid, bigint, jsonb) IS
    'Reports an attempt''s result. won: the compare-and-swap made it the job''s result. lost: the outcome was already decided; the result is kept on the attempt (discarded) and the race is logged. rejected: it broke the job''s contract. Asking again returns the same answer.';

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

CREATE FUNCTION intent.mark_unknown(attempt_id uuid, reason text DEFAULT NULL)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_mark_unknown';
COMMENT ON FUNCTION intent.mark_unknown(uuid, text) IS
    'The caller''s own timeout fired: a started attempt becomes unknown, and so does its job. No effect on an attempt that is not started.';

CREATE FUNCTION intent.heartbeat(attempt_id uuid, extend interval DEFAULT NULL)
RETURNS boolean
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_heartbeat';
COMMENT ON FUNCTION intent.heartbeat(uuid, interval) IS
    'Extends a started attempt''s lease (by extend, or by its original lease). false when the attempt is no longer started, its lease already ran out, or its job has ended: the worker should stop.';

CREATE FUNCTION intent.abandon_attempt(attempt_id uuid, reason text)
RETURNS void
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_abandon_attempt';
COMMENT ON FUNCTION intent.abandon_attempt(uuid, text) IS
    'The out-of-band decision: stop waiting for a started or unknown attempt. The job returns to pending; if the attempt returns later, the compare-and-swap decides. No effect on an attempt that already has an outcome.';

CREATE FUNCTION intent.record_reconciliation(attempt_id uuid, decision text, evidence jsonb)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_record_reconciliation';
COMMENT ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) IS
    'Records how an attempt whose outcome was unknown was decided (completed, failed or abandoned) and on what evidence (what the provider said), as a reconciled event; call it after the decision''s own call, in the same transaction. Returns the event id; an attempt has at most one reconciliation, and recording it again returns the first. Refuses (22023) a decision the attempt''s state does not show, and an attempt still open.';

CREATE FUNCTION intent.cancel_job(job_id uuid, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_cancel_job';
COMMENT ON FUNCTION intent.cancel_job(uuid, text) IS
    'The owner withdraws the intent: a job that is not finished becomes cancelled (version + 1), and attempts still out there will lose. false if the job had already finished.';

CREATE FUNCTION intent.sweep()
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_sweep';
COMMENT ON FUNCTION intent.sweep() IS
    'Persists started -> unknown for every attempt past its deadline, logging a timeout event for each; returns how many. Optional: the deadline rule holds whether or not it runs.';

CREATE FUNCTION intent.purge(older_than interval DEFAULT NULL, batch_size integer DEFAULT 1000)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_purge';
COMMENT ON FUNCTION intent.purge(interval, integer) IS
    'Removes up to batch_size finished jobs (succeeded, failed, cancelled) created and last changed more than older_than ago (default: the setting intent.retention), with their attempts and events; returns how many. Never touches an open job, nor one locked right now. After a purge the same key creates a new job.';

-- The purge an application's worker may run (0.5.0): by the database's retention only.
CREATE FUNCTION intent.purge_expired(batch_size integer DEFAULT 1000)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_purge_expired';
COMMENT ON FUNCTION intent.purge_expired(integer) IS
    'intent.purge() by the retention the database publishes (intent.retention, 7 days by default; never with ''never''), for an application''s worker: removes up to batch_size finished jobs past it, with their attempts and events; returns how many. No argument can shorten the retention.';

COMMENT ON FUNCTION intent.job_id(text, text) IS
    'The job id of an intent: SHA-256(owner_id || 0x00 || idempotency_key), first 16 bytes, UUID version 8 and RFC 9562 variant, last two bytes zero.';
COMMENT ON FUNCTION intent.attempt_id(uuid, integer) IS
    'The id of attempt attempt_no (1 to 65535) of a job: the job id with the number, big-endian, in its last two bytes.';
COMMENT ON FUNCTION intent.job_of(uuid) IS 'The job an attempt id belongs to (its last two bytes zeroed).';
