-- bad_input: every argument of every call, given a value it must refuse. Bad input is
-- 22023 (invalid_parameter_value), is checked before anything is looked up (so an unknown id
-- does not change the answer), never crashes the backend and never writes a row.
-- Lengths are counted in characters (char_length), so 255 multibyte characters are fine and
-- 256 are not. NULL is accepted only where docs/reference.md gives a NULL default.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- A job with a live attempt, so that the calls below have something real to aim at.
SELECT job_id FROM intent.submit_job('henry', 'target', 'gpu', '{}');
SELECT attempt_id FROM intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '1 hour');
-- A 2 MB params that compresses to a few kB: the limit applies to the detoasted size.
CREATE TEMP TABLE big AS SELECT jsonb_build_object('x', repeat('x', 2000000)) AS doc;
SELECT pg_column_size(doc) < 100000 AS stored_compressed FROM big;
-- Results may be larger (up to 16 MiB): this one is over that limit.
CREATE TEMP TABLE huge AS SELECT jsonb_build_object('x', repeat('x', 17000000)) AS doc;

-- t.refusals: each call with the SQLSTATE, message and DETAIL it raised.
CREATE FUNCTION t.refusals(calls text[])
RETURNS TABLE (call text, sqlstate text, message text, detail text)
LANGUAGE sql AS $$
  SELECT c.call, e.sqlstate, e.message, e.detail
    FROM unnest(calls) WITH ORDINALITY AS c(call, n),
         LATERAL (SELECT max(value) FILTER (WHERE field = 'SQLSTATE') AS sqlstate,
                         max(value) FILTER (WHERE field = 'MESSAGE') AS message,
                         max(value) FILTER (WHERE field = 'DETAIL') AS detail
                    FROM t.error_of(c.call)) AS e
   ORDER BY c.n
$$;

SELECT * FROM t.snapshot();

-- 1. submit_job: owner_id, idempotency_key, provider (1-255 characters, not NULL), params (not
--    NULL, at most 1 MiB), contract (NULL, or 1-255 characters naming a defined contract),
--    max_attempts (1-65535).
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.submit_job(NULL, 'k', 'p', '{}')$$,
  $$SELECT intent.submit_job('', 'k', 'p', '{}')$$,
  $$SELECT intent.submit_job(repeat('o', 256), 'k', 'p', '{}')$$,
  $$SELECT intent.submit_job(repeat('ö', 256), 'k', 'p', '{}')$$,
  $$SELECT intent.submit_job('o', NULL, 'p', '{}')$$,
  $$SELECT intent.submit_job('o', '', 'p', '{}')$$,
  $$SELECT intent.submit_job('o', repeat('k', 256), 'p', '{}')$$,
  $$SELECT intent.submit_job('o', repeat('😀', 256), 'p', '{}')$$,
  $$SELECT intent.submit_job('o', 'k', NULL, '{}')$$,
  $$SELECT intent.submit_job('o', 'k', '', '{}')$$,
  $$SELECT intent.submit_job('o', 'k', repeat('p', 256), '{}')$$,
  $$SELECT intent.submit_job('o', 'k', 'p', NULL)$$,
  $$SELECT intent.submit_job('o', 'k', 'p', jsonb_build_object('x', repeat('x', 1048576)))$$,
  $$SELECT intent.submit_job('o', 'k', 'p', (SELECT doc FROM big))$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', '')$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', repeat('c', 256))$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', 'no-such-contract')$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, NULL)$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, 0)$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, -1)$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, 65536)$$,
  $$SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, 2147483647)$$
]);
SELECT * FROM t.unchanged();

-- The same bad inputs against an existing key: still 22023, not a replay and not IJ001.
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.submit_job('henry', 'target', 'gpu', '{}', NULL, 0)$$,
  $$SELECT intent.submit_job('henry', 'target', 'gpu', NULL)$$,
  $$SELECT intent.submit_job('henry', 'target', 'gpu', '{}', '')$$
]);

-- The limits themselves are accepted: 255 characters of 1, 2 and 4 bytes, max_attempts 1
-- and 65535, a params of about a million bytes.
SELECT job_id IS NOT NULL AS ok, created
  FROM intent.submit_job(repeat('ö', 255), repeat('😀', 255), repeat('p', 255), '{}', repeat('ç', 255), 65535);
SELECT job_id IS NOT NULL AS ok, created
  FROM intent.submit_job(repeat('o', 255), 'max-1', 'p', jsonb_build_object('x', repeat('x', 1000000)), NULL, 1);
SELECT char_length(owner_id) AS owner, char_length(idempotency_key) AS key, char_length(provider) AS provider,
       char_length(contract) AS contract, max_attempts, pg_column_size(params) > 0 AS has_params
  FROM intent.jobs WHERE owner_id <> 'henry' ORDER BY max_attempts;
SELECT * FROM t.snapshot();

-- 2. begin_attempt: job_id (not NULL), provider (NULL or 1-255 characters), lease (not NULL,
--    positive, at most 24 hours; a month is more), worker (NULL or 1-255 characters). Checked
--    before the job: the same answers for a job that does not exist.
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.begin_attempt(NULL)$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), '')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), repeat('п', 256))$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, NULL)$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '0')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '-1 second')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '24 hours 1 microsecond')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '1 mon')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '30 seconds', '')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'target'), NULL, '30 seconds', repeat('w', 256))$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'nobody'), NULL, '0')$$,
  $$SELECT intent.begin_attempt(intent.job_id('henry', 'nobody'), NULL, '30 seconds', '')$$
]);
SELECT * FROM t.unchanged();

-- 3. complete_attempt and fail_attempt: attempt_id, version, result / error, retryable (none
--    may be NULL); result / error at most 1 MiB; version must be the attempt's own. Checked
--    before the attempt: the same answers for an attempt that does not exist.
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.complete_attempt(NULL, 1, '{}')$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), NULL, '{}')$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 1, NULL)$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 1, (SELECT doc FROM huge))$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 7, '{}')$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'nobody'), 1), 1, NULL)$$,
  $$SELECT intent.fail_attempt(NULL, 1, '{}')$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), NULL, '{}')$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 1, NULL)$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 1, (SELECT doc FROM big))$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 1, '{}', NULL)$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), 7, '{}')$$,
  $$SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('henry', 'nobody'), 1), 1, '{}', NULL)$$
]);
SELECT * FROM t.unchanged();

-- 4. mark_unknown, heartbeat, abandon_attempt, cancel_job: ids not NULL; reason NULL (except
--    for abandon_attempt, where it is required) or 1-1000 characters; extend NULL or positive
--    and at most 24 hours.
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.mark_unknown(NULL)$$,
  $$SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('henry', 'target'), 1), '')$$,
  $$SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('henry', 'target'), 1), repeat('r', 1001))$$,
  $$SELECT intent.heartbeat(NULL)$$,
  $$SELECT intent.heartbeat(intent.attempt_id(intent.job_id('henry', 'target'), 1), '0')$$,
  $$SELECT intent.heartbeat(intent.attempt_id(intent.job_id('henry', 'target'), 1), '-1 hour')$$,
  $$SELECT intent.heartbeat(intent.attempt_id(intent.job_id('henry', 'target'), 1), '25 hours')$$,
  $$SELECT intent.heartbeat(intent.attempt_id(intent.job_id('henry', 'nobody'), 1), '0')$$,
  $$SELECT intent.abandon_attempt(NULL, 'why')$$,
  $$SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), NULL)$$,
  $$SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), '')$$,
  $$SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1), repeat('r', 1001))$$,
  $$SELECT intent.cancel_job(NULL)$$,
  $$SELECT intent.cancel_job(intent.job_id('henry', 'target'), '')$$,
  $$SELECT intent.cancel_job(intent.job_id('henry', 'target'), repeat('r', 1001))$$,
  $$SELECT intent.cancel_job(intent.job_id('henry', 'nobody'), '')$$
]);
SELECT * FROM t.unchanged();

-- 5. Unknown ids are IJ007 (not_found), whatever their shape: a job id where an attempt id is
--    expected (last two bytes zero), an attempt id where a job id is expected, an attempt
--    number that was never begun, the nil UUID and the max UUID.
SELECT * FROM t.refusals(ARRAY[
  $$SELECT intent.complete_attempt(intent.job_id('henry', 'target'), 1, '{}')$$,
  $$SELECT intent.fail_attempt(intent.job_id('henry', 'target'), 1, '{}')$$,
  $$SELECT intent.mark_unknown(intent.job_id('henry', 'target'))$$,
  $$SELECT intent.heartbeat(intent.job_id('henry', 'target'))$$,
  $$SELECT intent.abandon_attempt(intent.job_id('henry', 'target'), 'why')$$,
  $$SELECT intent.begin_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 1))$$,
  $$SELECT intent.cancel_job(intent.attempt_id(intent.job_id('henry', 'target'), 1))$$,
  $$SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('henry', 'target'), 65535), 1, '{}')$$,
  $$SELECT intent.complete_attempt('00000000-0000-0000-0000-000000000000', 1, '{}')$$,
  $$SELECT intent.heartbeat('ffffffff-ffff-ffff-ffff-ffffffffffff')$$,
  $$SELECT intent.begin_attempt('00000000-0000-0000-0000-000000000000')$$,
  $$SELECT intent.cancel_job('ffffffff-ffff-ffff-ffff-ffffffffffff')$$
]);
SELECT * FROM t.unchanged();

-- 6. Text cannot carry a NUL byte: PostgreSQL refuses it before any function runs.
SELECT intent.submit_job('o', convert_from('\x6b00'::bytea, 'UTF8'), 'p', '{}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 7. After all of that the backend is still here, and the target attempt is still the live
--    attempt it was.
SELECT 1 AS still_connected;
SELECT no, state, version_read FROM t.attempts(intent.job_id('henry', 'target'));
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('henry', 'target'), 1)) AS alive;
