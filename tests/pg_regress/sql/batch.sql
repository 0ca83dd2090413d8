-- batch: intent.submit_jobs, many intents in one call. Each intent gets the answer submit_job
-- would give it, in order; one intent's refusal is a row (sqlstate, message, detail), not an
-- error, so the others still go through. Only bad arrays refuse the whole call.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- 1. A job that exists before the batch.
SELECT job_id, created FROM intent.submit_job('alice', 'k0', 'gpu-a', '{"x": 1}');

-- 2. One batch, every kind of answer:
--    1 a replay of k0 (created = f);       2 k0 with another provider (IJ001, provider);
--    3 a new key k1 (created = t);          4 k1 again, other params (IJ001, params: answered
--                                             like a second submit_job after the first);
--    5 k1 again, same intent (a replay);    6 an empty owner (22023);
--    7 an undefined contract (22023);       8 a NULL params (22023);
--    9 a defined contract, new key.
SELECT * FROM intent.submit_jobs(
    ARRAY['alice', 'alice', 'alice', 'alice', 'alice', '', 'alice', 'alice', 'alice'],
    ARRAY['k0', 'k0', 'k1', 'k1', 'k1', 'k2', 'k3', 'k4', 'k5'],
    ARRAY['gpu-a', 'gpu-b', 'gpu-a', 'gpu-a', 'gpu-a', 'gpu-a', 'gpu-a', 'gpu-a', 'gpu-a'],
    ARRAY['{"x": 1}', '{"x": 1}', '{"y": 1}', '{"y": 2}', '{"y": 1}', '{}', '{}', NULL, '{}']::jsonb[],
    ARRAY[NULL, NULL, NULL, NULL, NULL, NULL, 'no-such-contract', NULL, 'image-v1']);

-- 3. What was written: the three created jobs and the one that existed, nothing else.
SELECT idempotency_key, provider, params, contract, state, version, max_attempts
  FROM intent.jobs ORDER BY idempotency_key;

-- 4. max_attempts per intent; a NULL element is refused like a NULL max_attempts.
SELECT ordinality, created, sqlstate, message
  FROM intent.submit_jobs(ARRAY['bob', 'bob'], ARRAY['m1', 'm2'], ARRAY['p', 'p'],
                          ARRAY['{}', '{}']::jsonb[], NULL, ARRAY[7, NULL]);
SELECT idempotency_key, max_attempts FROM intent.jobs WHERE owner_id = 'bob';

-- 5. Arrays of different lengths refuse the whole call (22023), and nothing is written.
SELECT * FROM t.snapshot();
SELECT * FROM intent.submit_jobs(ARRAY['carol'], ARRAY['c1', 'c2'], ARRAY['p'], ARRAY['{}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_jobs(ARRAY['carol'], ARRAY['c1'], ARRAY['p'], ARRAY['{}']::jsonb[], ARRAY[NULL, NULL]::text[]);
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.submit_jobs(NULL, ARRAY['c1'], ARRAY['p'], ARRAY['{}']::jsonb[]);
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 6. An empty batch is an empty answer.
SELECT count(*) FROM intent.submit_jobs('{}', '{}', '{}', '{}');

-- 7. A batch of 500 new keys, then the same 500 again: 500 created, then 500 replays.
SELECT count(*) FILTER (WHERE created) AS created, count(*) FILTER (WHERE NOT created) AS replays
  FROM intent.submit_jobs(ARRAY(SELECT 'dave' FROM generate_series(1, 500)),
                          ARRAY(SELECT 'd' || g FROM generate_series(1, 500) g),
                          ARRAY(SELECT 'p' FROM generate_series(1, 500)),
                          ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 500) g));
SELECT count(*) FILTER (WHERE created) AS created, count(*) FILTER (WHERE NOT created) AS replays,
       bool_and(job_id = intent.job_id('dave', 'd' || ordinality)) AS derived_ids_in_order
  FROM intent.submit_jobs(ARRAY(SELECT 'dave' FROM generate_series(1, 500)),
                          ARRAY(SELECT 'd' || g FROM generate_series(1, 500) g),
                          ARRAY(SELECT 'p' FROM generate_series(1, 500)),
                          ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 500) g));
