-- claims: intent.claim_attempts (the database as the dispatcher), fail_attempt's retry time and
-- the default backoff (docs/reference.md § 1.5). Concurrency (disjoint claims, SKIP LOCKED, a
-- claim against a begin_attempt) is in tests/isolation/specs/claim_concurrent.spec; NOTIFY in
-- the integration tests (psql prints the server's pid with each notification).
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- Four jobs, oldest first: two for gpu-a, one for gpu-b, one that allows a single attempt.
SELECT created FROM intent.submit_job('carol', 'a-1', 'gpu-a', '{"n": 1}');
SELECT pg_sleep(0.01);
SELECT created FROM intent.submit_job('carol', 'b-1', 'gpu-b', '{"n": 2}');
SELECT pg_sleep(0.01);
SELECT created FROM intent.submit_job('carol', 'a-2', 'gpu-a', '{"n": 3}', NULL, 1);
SELECT pg_sleep(0.01);
SELECT created FROM intent.submit_job('carol', 'a-3', 'gpu-a', '{"n": 4}');
-- Each job's key, recorded from intent.jobs before any claim, in a statement of its own: the
-- claims below name their jobs by joining with this table, not with intent.jobs. (A claim
-- writes as intent_owner; on Citus a statement, or a later one of the same transaction, that
-- reads a table the call wrote, as another role, is refused: docs/scale-out.md § Where single
-- node and Citus differ.) A LEFT JOIN, so that a job id the table does not hold would show.
CREATE TEMP TABLE keys AS SELECT id, idempotency_key FROM intent.jobs;
SELECT idempotency_key, id = intent.job_id('carol', idempotency_key) AS derived FROM keys ORDER BY idempotency_key;

-- 1. A claim for gpu-a takes the longest-waiting gpu-a job and begins its attempt exactly as
--    begin_attempt would: attempt 1, the job's version, the lease, the worker; the job running.
-- (Its attempts are read by the next statements: a statement does not see the rows the
-- functions it calls write, and a join with an empty intent.attempts may not even call it.)
SELECT k.idempotency_key, c.attempt_no, c.version, c.provider, c.params, c.contract,
       c.attempt_id = intent.attempt_id(c.job_id, 1) AS derived, date_trunc('second', c.deadline - statement_timestamp()) AS lease
  FROM intent.claim_attempts(ARRAY['gpu-a'], 'worker-1', '1 hour') c
  LEFT JOIN keys k ON k.id = c.job_id;
SELECT idempotency_key, state, attempt_count FROM intent.jobs ORDER BY created_at;
SELECT no, provider, state, version_read, worker FROM t.attempts(intent.job_id('carol', 'a-1'));
-- No event: a claim is a begin.
SELECT count(*) AS events FROM intent.events;

-- 2. max_jobs: up to that many, longest-waiting first; any provider when providers is NULL.
-- (In the order claim_attempts returns them: WITH ORDINALITY.)
SELECT k.idempotency_key, c.attempt_no
  FROM intent.claim_attempts(NULL, 'worker-2', '1 hour', 2) WITH ORDINALITY c
  LEFT JOIN keys k ON k.id = c.job_id ORDER BY c.ordinality;
SELECT k.idempotency_key FROM intent.claim_attempts(NULL, 'worker-2', '1 hour', 10) c
  LEFT JOIN keys k ON k.id = c.job_id;
-- Nothing left: no rows, no error.
SELECT count(*) AS claimed FROM intent.claim_attempts(NULL, NULL, '1 hour', 1000);

-- 3. Bad input, all 22023, nothing written.
SELECT * FROM t.snapshot();
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, '1 hour', 0)$$) WHERE field IN ('SQLSTATE', 'MESSAGE', 'DETAIL');
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, '1 hour', 1001)$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, '1 hour', NULL)$$) WHERE field IN ('SQLSTATE', 'MESSAGE');
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, NULL)$$) WHERE field IN ('SQLSTATE', 'MESSAGE');
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, '-1 second')$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, NULL, '2 days')$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(ARRAY['gpu-a', NULL])$$) WHERE field IN ('SQLSTATE', 'MESSAGE');
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(ARRAY[''])$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.claim_attempts(NULL, '')$$) WHERE field = 'SQLSTATE';
SELECT * FROM t.unchanged();

-- 4. retry_after: a retryable failure returns the job to pending with a retry time; claims do
--    not take it before then, an explicit begin_attempt is not held back.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 1), 1, '{"status": 429}', true, '1 hour');
SELECT state, retry_at - updated_at AS delay FROM intent.jobs WHERE id = intent.job_id('carol', 'a-1');
SELECT count(*) AS claimed FROM intent.claim_attempts(ARRAY['gpu-a']);
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('carol', 'a-1'), NULL, '1 hour');
-- An attempt that begins clears the retry time.
SELECT state, retry_at FROM intent.jobs WHERE id = intent.job_id('carol', 'a-1');
-- retry_after zero: claimable at once.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 2), 1, '{"status": 429}', true, '0');
SELECT retry_at <= statement_timestamp() AS due FROM intent.jobs WHERE id = intent.job_id('carol', 'a-1');
SELECT k.idempotency_key, c.attempt_no FROM intent.claim_attempts(ARRAY['gpu-a']) c LEFT JOIN keys k ON k.id = c.job_id;

-- 5. Bad retry_after, all 22023, nothing written.
SELECT * FROM t.snapshot();
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 3), 1, '{}', true, '-1 second')$$) WHERE field IN ('SQLSTATE', 'MESSAGE', 'DETAIL');
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 3), 1, '{}', true, '1 mon')$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 3), 1, '{}', true, '31 days')$$) WHERE field = 'SQLSTATE';
SELECT * FROM t.unchanged();
-- The four-argument call still works as it did.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'a-1'), 3), 1, '{"status": 500}', false);
SELECT state, version FROM intent.jobs WHERE id = intent.job_id('carol', 'a-1');

-- 6. The default backoff: intent.retry_backoff doubled for each failed attempt after the
--    first, capped at intent.retry_backoff_max.
SET intent.retry_backoff = '10 seconds';
SET intent.retry_backoff_max = '25 seconds';
SELECT created FROM intent.submit_job('carol', 'backoff', 'gpu-c', '{}', NULL, 5);
INSERT INTO keys SELECT id, idempotency_key FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('carol', 'backoff'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 1), 1, '{}');
SELECT retry_at - updated_at AS delay FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('carol', 'backoff'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 2), 1, '{}');
SELECT retry_at - updated_at AS delay FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('carol', 'backoff'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 3), 1, '{}');
SELECT retry_at - updated_at AS delay FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
-- A malformed setting is PostgreSQL's own interval error, raised by the fail_attempt that needs it.
SET intent.retry_backoff = 'soon';
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('carol', 'backoff'), NULL, '1 hour');
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 4), 1, '{}')$$) WHERE field = 'SQLSTATE';
-- Out of retry_after's bounds (negative, a month, over 30 days): 22023, nothing written, so
-- that no session can put its jobs ahead of everyone's (a retry time in the past) or overflow.
SET intent.retry_backoff = '-1 hour';
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 4), 1, '{}')$$) WHERE field IN ('SQLSTATE', 'MESSAGE');
SET intent.retry_backoff = '1 second';
SET intent.retry_backoff_max = '1 mon';
SELECT field, value FROM t.error_of($$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 4), 1, '{}')$$) WHERE field IN ('SQLSTATE', 'MESSAGE');
-- Nothing was written: the job is still running.
SELECT state FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
RESET intent.retry_backoff;
RESET intent.retry_backoff_max;

-- 7. An abandon makes the job claimable at once: its retry time is the abandon's.
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('carol', 'backoff'), 4), 'worker lost');
SELECT state, retry_at = updated_at AS claimable_from_now FROM intent.jobs WHERE id = intent.job_id('carol', 'backoff');
SELECT k.idempotency_key, c.attempt_no FROM intent.claim_attempts(ARRAY['gpu-c']) c LEFT JOIN keys k ON k.id = c.job_id;

-- 8. A job with no attempt left is never claimed, even pending (after an abandon).
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('carol', 'a-2'), 1), 'worker lost');
SELECT state, attempt_count, max_attempts FROM intent.jobs WHERE id = intent.job_id('carol', 'a-2');
SELECT count(*) AS claimed FROM intent.claim_attempts(ARRAY['gpu-a']);

-- 9. The claim reads the partial index, whatever the number of finished jobs: keyed on retry_at,
--    which a job has exactly while it is claimable (so that its other updates are HOT).
SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_claimable_since';
SELECT count(*) FILTER (WHERE retry_at IS NOT NULL) AS claimable, count(*) AS jobs FROM intent.jobs;

-- 10. A session bound to an owner claims from its owner's part of a per-owner index, with the
--     same predicate and order: its claim never reads other owners' queued rows.
SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_claimable_since_by_owner';
SELECT obj_description('intent.jobs_claimable_since_by_owner'::regclass, 'pg_class') IS NOT NULL AS commented;
