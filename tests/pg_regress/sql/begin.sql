-- begin: intent.begin_attempt, rule 2 (README) "no new attempt while the last one's outcome is
-- open". Refusals, in the order protocol.md checks them: bad input (22023), no such job
-- (IJ007), job finished (IJ004), an open attempt (IJ002 within its lease, IJ003 unknown),
-- attempts exhausted (IJ006), failover without certification (IJ005). Every refusal is
-- followed by t.unchanged(): the refusal wrote nothing.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

SELECT job_id, created FROM intent.submit_job('dave', 'render-1', 'gpu-a', '{"frames": 10}');

-- 1. The first attempt: number 1, its id derived from the job id, the job's version (1), a
--    deadline = start + lease. The job becomes running; its version does NOT change when an
--    attempt begins (only when the outcome slot changes).
SELECT attempt_id, attempt_no, version, attempt_id = intent.attempt_id(intent.job_id('dave', 'render-1'), 1) AS derived
  FROM intent.begin_attempt(intent.job_id('dave', 'render-1'), NULL, '1 hour', 'worker-7');
SELECT * FROM t.job(intent.job_id('dave', 'render-1'));
-- provider NULL means the job's own provider; the lease is kept for heartbeats.
SELECT * FROM t.attempts(intent.job_id('dave', 'render-1'));
SELECT lease, deadline - started_at AS deadline_minus_start, job_id = intent.job_of(id) AS names_its_job,
       owner_id
  FROM intent.attempts WHERE job_id = intent.job_id('dave', 'render-1');

-- 2. IJ002 attempt_in_flight: attempt 1 is started and within its lease. The DETAIL names the
--    blocking attempt, its number, its worker and its deadline (masked here).
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('dave', 'render-1'))$$);
SELECT * FROM t.unchanged();
-- The same with every argument given, and with a failover provider: the open attempt is
-- checked before the failover (IJ002, not IJ005).
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('dave', 'render-1'), 'gpu-a', '5 seconds', 'worker-8')$$) WHERE field = 'SQLSTATE';
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('dave', 'render-1'), 'gpu-b')$$) WHERE field = 'SQLSTATE';
SELECT * FROM t.unchanged();

-- 3. IJ003 outcome_unknown: the caller's timeout fired (mark_unknown). The attempt may still
--    be working, so the gate stays closed. A timeout is unknown, never failed.
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('dave', 'render-1'), 1), 'client gave up after 60 s');
SELECT state FROM t.job(intent.job_id('dave', 'render-1'));
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('dave', 'render-1'))$$);
SELECT * FROM t.unchanged();

-- 4. Only an outcome or an explicit decision opens the gate: abandon attempt 1, and attempt 2
--    may begin. It gets number 2 and still version 1 (no outcome has changed).
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('dave', 'render-1'), 1), 'operator: provider lost the job');
SELECT state, version FROM t.job(intent.job_id('dave', 'render-1'));
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('dave', 'render-1'), 'gpu-a', '1 hour');
SELECT no, provider, state, version_read, worker FROM t.attempts(intent.job_id('dave', 'render-1'));
SELECT state, version, attempt_count FROM t.job(intent.job_id('dave', 'render-1'));

-- 5. IJ006 attempts_exhausted: max_attempts attempts exist (here 1), even though the gate is
--    open again after an abandon.
SELECT job_id, created FROM intent.submit_job('dave', 'render-once', 'gpu-a', '{}', NULL, 1);
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('dave', 'render-once'));
-- (Begun with the defaults: the job's provider, a lease of 30 seconds, no worker.)
SELECT provider, lease, worker FROM intent.attempts WHERE job_id = intent.job_id('dave', 'render-once');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('dave', 'render-once'), 1), 'stuck');
SELECT state, attempt_count, max_attempts FROM t.job(intent.job_id('dave', 'render-once'));
SELECT * FROM t.snapshot();
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-once'));
\echo SQLSTATE :SQLSTATE
-- A failover is checked after exhaustion: IJ006, not IJ005.
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-once'), 'gpu-b');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 6. IJ005 provider_not_certified: any provider other than the job's own is a failover, which
--    needs a contract and a current certification. Without a contract it is refused; with one
--    (frames-v1, defined in setup) it is refused too, because gpu-b was never certified for
--    it. The DETAIL says which of the two it is. (The contracts test covers certification:
--    granted, revoked, expired, outdated by a new contract version.)
SELECT job_id, created FROM intent.submit_job('dave', 'render-2', 'gpu-a', '{}');
SELECT job_id, created FROM intent.submit_job('dave', 'render-3', 'gpu-a', '{}', 'frames-v1');
SELECT * FROM t.snapshot();
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-2'), 'gpu-b');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-3'), 'gpu-b');
\echo SQLSTATE :SQLSTATE
-- Provider names are compared exactly: a different case is another provider.
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-3'), 'GPU-A');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
SELECT state, attempt_count FROM t.job(intent.job_id('dave', 'render-3'));
-- Naming the job's own provider explicitly is not a failover.
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('dave', 'render-3'), 'gpu-a', '1 hour');

-- 7. IJ004 job_finished: a succeeded, failed or cancelled job never runs again. A finished
--    job is checked before its open attempts: a job cancelled while an attempt is still out
--    there says IJ004, not IJ002.
-- (Completing an attempt that was never begun is IJ007: ids are derived, so a client can
-- name attempt 1 before it exists, but cannot report for it.)
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('dave', 'render-2'), 1), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('dave', 'render-2'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('dave', 'render-2'), 1), 1, '{"ok": true}');
SELECT job_id, created FROM intent.submit_job('dave', 'render-4', 'gpu-a', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('dave', 'render-4'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('dave', 'render-4'), 1), 1, '{"code": "bad_request"}', false);
SELECT intent.cancel_job(intent.job_id('dave', 'render-3'), 'no longer needed');
SELECT id = intent.job_id('dave', 'render-2') AS r2, id = intent.job_id('dave', 'render-3') AS r3,
       id = intent.job_id('dave', 'render-4') AS r4, state, version
  FROM intent.jobs WHERE state IN ('succeeded', 'failed', 'cancelled') ORDER BY state;
SELECT * FROM t.snapshot();
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-2'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-4'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-3'));
\echo SQLSTATE :SQLSTATE
SELECT state FROM t.attempts(intent.job_id('dave', 'render-3'));
SELECT * FROM t.unchanged();

-- 8. IJ007 not_found: a job id that was never submitted, an attempt id (its last two bytes
--    are not zero, so it names no job), a random UUID.
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'never-submitted'));
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt(intent.attempt_id(intent.job_id('dave', 'render-1'), 1));
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt('00000000-0000-4000-8000-000000000000');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 9. Bad input is checked before the job is looked up: 22023, even for a job that does not
--    exist or is finished.
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'never-submitted'), NULL, '0 seconds');
\echo SQLSTATE :SQLSTATE
SELECT * FROM intent.begin_attempt(intent.job_id('dave', 'render-2'), '', '1 minute');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 10. The log: one abandon per abandoned attempt, the timeout of dave/render-1 and one cancel.
--     Refusals left no trace.
SELECT e.kind, t.no(e.attempt_id) AS attempt, j.idempotency_key
  FROM intent.events e JOIN intent.jobs j ON j.id = e.job_id ORDER BY e.id;
