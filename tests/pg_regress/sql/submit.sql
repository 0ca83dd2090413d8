-- submit: intent.submit_job, rule 1 (README) "one job per intent". The unique constraint on
-- (owner_id, idempotency_key) decides; the same key with the same fingerprint (provider, params,
-- contract) returns the existing job and writes nothing; a different fingerprint is IJ001.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- 1. A new key creates the job: created = t, state pending, version 1, no result, and the job
--    id is the derived one (docs/reference.md § 1.4's test vector for alice/click-1).
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}');
SELECT id = intent.job_id(owner_id, idempotency_key) AS derived_id, owner_id, idempotency_key,
       provider, params, contract, state, version, completed_by, result, error, max_attempts,
       attempt_count, created_at = updated_at AS untouched_since_created
  FROM intent.jobs;

-- 2. The same intent again is a replay: created = f, the same job, and nothing written
--    (not even an UPDATE that changes nothing: t.unchanged() compares xmin and ctid too).
SELECT * FROM t.snapshot();
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}');
SELECT * FROM t.unchanged();

-- 3. params are compared with jsonb equality: key order, whitespace and 1 vs 1.0 do not make
--    another intent.
SELECT job_id, created FROM intent.submit_job('alice', 'click-1', 'openai', '{ "n" : 1.0 ,"prompt":"a cat" }');
SELECT * FROM t.unchanged();

-- 4. max_attempts is not part of the fingerprint: a replay with another value returns the
--    job as it is (max_attempts stays 3).
SELECT job_id, created FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}', NULL, 7);
SELECT max_attempts FROM t.job(intent.job_id('alice', 'click-1'));
SELECT * FROM t.unchanged();

-- 5. The same key with a different intent is IJ001 (idempotency_conflict), never a silent
--    reuse; the DETAIL names the fields that differ. Nothing is written.
SELECT * FROM intent.submit_job('alice', 'click-1', 'anthropic', '{"prompt": "a cat", "n": 1}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a dog", "n": 1}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}', 'image-v1');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_job('alice', 'click-1', 'anthropic', '{"prompt": "a cat"}', 'image-v1');
\echo SQLSTATE :SQLSTATE
-- A params document nested one level deeper is a different document too.
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": [1]}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 6. The key belongs to its owner: bob may use alice's key for his own intent, and gets his
--    own job (docs/reference.md § 1.4's test vector for bob/click-1).
SELECT * FROM intent.submit_job('bob', 'click-1', 'anthropic', '{"prompt": "a dog"}');

-- 7. A contract is part of the fingerprint: NULL and a name differ both ways. (A job may
--    only name a defined contract; setup defines image-v1 and image-v2.)
SELECT job_id, created, state FROM intent.submit_job('tenant-42', 'order-2026-11-30-0001', 'openai', '{}', 'image-v1', 5);
SELECT job_id, created, state FROM intent.submit_job('tenant-42', 'order-2026-11-30-0001', 'openai', '{}', 'image-v1');
SELECT job_id, created FROM intent.submit_job('tenant-42', 'order-2026-11-30-0001', 'openai', '{}');
\echo SQLSTATE :SQLSTATE
SELECT job_id, created FROM intent.submit_job('tenant-42', 'order-2026-11-30-0001', 'openai', '{}', 'image-v2');
\echo SQLSTATE :SQLSTATE
SELECT contract, max_attempts FROM intent.jobs WHERE id = intent.job_id('tenant-42', 'order-2026-11-30-0001');
-- A contract that is not defined is bad input (22023), for a new key and for an existing
-- one alike (it is checked before the job is looked up), and nothing is written.
SELECT * FROM t.snapshot();
SELECT * FROM intent.submit_job('tenant-42', 'order-2026-11-30-0002', 'openai', '{}', 'image-v3');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_job('tenant-42', 'order-2026-11-30-0001', 'openai', '{}', 'image-v3');
\echo SQLSTATE :SQLSTATE
-- Contract names are compared exactly, like every name: Image-v1 is not image-v1.
SELECT * FROM intent.submit_job('tenant-42', 'order-2026-11-30-0002', 'openai', '{}', 'Image-v1');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 8. Multibyte owners and keys (docs/reference.md § 1.4's test vector for ö/ключ) and a key of exactly 255
--    characters, 4 bytes each.
SELECT * FROM intent.submit_job('ö', 'ключ', 'openai', '"just a string"');
SELECT job_id, created FROM intent.submit_job('ö', repeat('😀', 255), 'openai', '[]');
SELECT char_length(idempotency_key), octet_length(idempotency_key)
  FROM intent.jobs WHERE id = intent.job_id('ö', repeat('😀', 255));

-- 9. Any JSON document is a valid params, including JSON null (which is not SQL NULL).
SELECT job_id, created FROM intent.submit_job('carol', 'null-params', 'openai', 'null');
SELECT job_id, created FROM intent.submit_job('carol', 'null-params', 'openai', 'null');

-- 10. A replay reports the job as it is now: its state, version and result, still writing
--     nothing. Here alice's job runs, then wins with a result.
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('alice', 'click-1'), NULL, '1 hour');
SELECT * FROM t.snapshot();
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}');
SELECT * FROM t.unchanged();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('alice', 'click-1'), 1), 1, '{"url": "s3://bucket/cat.png"}');
SELECT * FROM t.snapshot();
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a cat", "n": 1}');
SELECT * FROM t.unchanged();
-- Even a finished job keeps refusing a different intent under its key.
SELECT * FROM intent.submit_job('alice', 'click-1', 'openai', '{"prompt": "a dog"}');
\echo SQLSTATE :SQLSTATE
-- A cancelled job is reported as cancelled, with the version the cancel gave it.
SELECT intent.cancel_job(intent.job_id('bob', 'click-1'), 'changed my mind');
SELECT * FROM intent.submit_job('bob', 'click-1', 'anthropic', '{"prompt": "a dog"}');

-- 11. The tables hold exactly one row per intent: six submitted intents, six jobs.
SELECT owner_id, idempotency_key = repeat('😀', 255) AS long_key,
       CASE WHEN idempotency_key = repeat('😀', 255) THEN NULL ELSE idempotency_key END AS idempotency_key,
       state, version
  FROM intent.jobs ORDER BY owner_id COLLATE "C", intent.jobs.idempotency_key COLLATE "C";

-- 12. Replays are read-only and are never logged: the only event is bob's cancel.
SELECT kind, count(*) FROM intent.events GROUP BY kind ORDER BY kind;
