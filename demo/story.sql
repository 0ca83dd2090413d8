-- The story pg_intent exists for, told against the real extension.
-- Run by scripts/demo.sh on a throwaway cluster; every answer below comes from PostgreSQL.
\set ON_ERROR_STOP on
\set SHOW_CONTEXT never
\pset footer off
\pset null '∅'

\echo
\echo '── 1. Alice clicks "Generate". The API handler submits her intent. ─────────────────────'
\echo '   The job id is derived from (owner, key): every layer can name it before asking.'
SELECT intent.job_id('alice', 'click-1') AS job_id_everyone_computes;
SELECT job_id, created, state, version FROM intent.submit_job('alice', 'click-1', 'gpu-a', '{"prompt": "a cat in a hat"}');

\echo
\echo '── 2. A worker starts attempt 1 on gpu-a, with a 1-second lease. ────────────────────────'
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('alice', 'click-1'), lease => '1 second', worker => 'worker-1');

\echo
\echo '── 3. The request stalls. Alice clicks again: the same intent finds the same job. ──────'
SELECT job_id, created, state, version FROM intent.submit_job('alice', 'click-1', 'gpu-a', '{"prompt": "a cat in a hat"}');

\echo
\echo '── 4. Her second click tries to start another attempt: refused, one is in flight. ──────'
\set ON_ERROR_STOP off
SELECT * FROM intent.begin_attempt(intent.job_id('alice', 'click-1'));
\echo '   SQLSTATE' :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on

\echo
\echo '── 5. The worker''s own timeout fires. The GPU may still be generating: the attempt ─────'
\echo '      becomes UNKNOWN, never failed.'
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('alice', 'click-1'), 1), 'worker gave up after 1s');
SELECT id AS attempt_id, attempt_no, provider, state FROM intent.attempts ORDER BY attempt_no;

\echo
\echo '── 6. A retry now would risk a double charge: refused until someone reconciles. ────────'
\set ON_ERROR_STOP off
SELECT * FROM intent.begin_attempt(intent.job_id('alice', 'click-1'));
\echo '   SQLSTATE' :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on

\echo
\echo '── 7. The on-call engineer decides out of band: stop waiting for attempt 1. ─────────────'
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('alice', 'click-1'), 1), 'gpu-a queue is stuck; retrying');

\echo
\echo '── 8. Attempt 2 begins (same job, same version: it is a retry, not a new intent). ───────'
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('alice', 'click-1'), worker => 'worker-2');

\echo
\echo '── 9. Results arrive in reverse order. Attempt 2 returns first: it wins the ────────────'
\echo '      compare-and-swap on the job row.'
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('alice', 'click-1'), 2), 1, '{"image": "blob://cat-2.png"}') AS attempt_2;

\echo
\echo '── 10. Attempt 1 was not dead after all. Its late result loses: kept on its own row, ────'
\echo '       never merged into the job, and the race is logged.'
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('alice', 'click-1'), 1), 1, '{"image": "blob://cat-1.png"}') AS attempt_1;

\echo
\echo '── 11. Alice clicks a third time: the stored result, no new work. ──────────────────────'
SELECT job_id, created, state, version, result FROM intent.submit_job('alice', 'click-1', 'gpu-a', '{"prompt": "a cat in a hat"}');

\echo
\echo '── 12. Same key, different intent: a conflict, never a silent reuse. ───────────────────'
\set ON_ERROR_STOP off
SELECT * FROM intent.submit_job('alice', 'click-1', 'gpu-a', '{"prompt": "a dog"}');
\echo '   SQLSTATE' :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on

\echo
\echo '══ What a DBA sees at 3 a.m. ════════════════════════════════════════════════════════════'
\echo 'intent.jobs'
SELECT id, owner_id, idempotency_key, provider, state, version, completed_by, result, attempt_count FROM intent.jobs;
\echo 'intent.attempts'
SELECT id, attempt_no, provider, state, version_read, worker, result FROM intent.attempts ORDER BY attempt_no;
\echo 'intent.events'
SELECT id, kind, attempt_id, detail FROM intent.events ORDER BY id;
