-- complete_fail: intent.complete_attempt and intent.fail_attempt, rule 3 (README) "exactly one
-- winner". Completing is a compare-and-swap on the job row; a result that comes too late is
-- kept on its own attempt (discarded), never merged into the job, and the race is logged.
-- Asking again returns the same answer and changes nothing.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- 1. won: the job becomes succeeded with the result, completed_by = the attempt, version + 1;
--    the attempt becomes succeeded and finished. A win is not an event.
SELECT job_id FROM intent.submit_job('erin', 'win', 'llm', '{"q": 1}');
SELECT attempt_id, version FROM intent.begin_attempt(intent.job_id('erin', 'win'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 1, '{"answer": 42}');
SELECT * FROM t.job(intent.job_id('erin', 'win'));
SELECT completed_by FROM intent.jobs WHERE id = intent.job_id('erin', 'win');
SELECT * FROM t.attempts(intent.job_id('erin', 'win'));
SELECT count(*) AS events FROM intent.events;

-- 2. Asked again: the same answer, nothing written, nothing logged. A different result in the
--    repeat does not replace the first (the first valid completion won).
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 1, '{"answer": 42}');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 1, '{"answer": 43}');
SELECT * FROM t.unchanged();
SELECT result FROM t.job(intent.job_id('erin', 'win'));
-- The version must still be the one begin_attempt handed out (1), not the job's new one (2).
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 2, '{"answer": 42}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 3. lost: the job was cancelled while attempt 1 ran (version 1 -> 2). Its result loses the
--    compare-and-swap: the job is untouched, the attempt is discarded and keeps its result on
--    its own row, and a late_result event records the race (winner: none, the version the
--    attempt presented and the current one).
SELECT job_id FROM intent.submit_job('erin', 'lose', 'llm', '{"q": 2}');
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('erin', 'lose'), NULL, '1 hour');
SELECT intent.cancel_job(intent.job_id('erin', 'lose'), 'user left');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'lose'), 1), 1, '{"answer": "late"}');
SELECT * FROM t.job(intent.job_id('erin', 'lose'));
SELECT * FROM t.attempts(intent.job_id('erin', 'lose'));
SELECT * FROM t.events(intent.job_id('erin', 'lose'));
-- Asked again: lost again, and the race is not logged twice.
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'lose'), 1), 1, '{"answer": "late"}');
SELECT * FROM t.unchanged();

-- 4. fail_attempt, retryable with attempts left: the attempt becomes failed (with its error,
--    finished), the job returns to pending with its version unchanged, and the next attempt
--    may begin. A definite failure is not an event.
SELECT job_id FROM intent.submit_job('erin', 'retry', 'llm', '{"q": 3}', NULL, 2);
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('erin', 'retry'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 1), 1, '{"status": 503}');
SELECT * FROM t.job(intent.job_id('erin', 'retry'));
SELECT * FROM t.attempts(intent.job_id('erin', 'retry'));
-- Reported again: the same answer, nothing written.
SELECT * FROM t.snapshot();
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 1), 1, '{"status": 503}');
SELECT * FROM t.unchanged();

-- 5. The last attempt fails (retryable, but none remain): the job fails through the same
--    compare-and-swap as a win: completed_by = that attempt, version + 1, its error copied.
SELECT attempt_no, version FROM intent.begin_attempt(intent.job_id('erin', 'retry'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 2), 1, '{"status": 502}');
SELECT * FROM t.job(intent.job_id('erin', 'retry'));
SELECT * FROM t.attempts(intent.job_id('erin', 'retry'));
SELECT * FROM t.snapshot();
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 2), 1, '{"status": 502}');
SELECT * FROM t.unchanged();

-- 6. Not retryable: the job fails at once, attempts left or not.
SELECT job_id FROM intent.submit_job('erin', 'fatal', 'llm', '{"q": 4}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('erin', 'fatal'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'fatal'), 1), 1, '{"status": 400}', false);
SELECT * FROM t.job(intent.job_id('erin', 'fatal'));

-- 7. A result for an attempt that had already failed definitely is lost: the attempt keeps
--    its recorded failure (no result on its row), the job is untouched, and the result is kept
--    in a late_result event with "attempt_state": "failed", for reconciliation.
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 1), 1, '{"answer": "after all"}');
SELECT * FROM t.job(intent.job_id('erin', 'retry'));
SELECT * FROM t.attempts(intent.job_id('erin', 'retry'));
SELECT * FROM t.events(intent.job_id('erin', 'retry'));

-- 8. A failure for an attempt whose result already won: logged as late_failure, nothing else
--    changes; the answer is the job's state.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 1, '{"status": 500}');
SELECT * FROM t.job(intent.job_id('erin', 'win'));
SELECT * FROM t.attempts(intent.job_id('erin', 'win'));
SELECT * FROM t.events(intent.job_id('erin', 'win'));
-- ...and for a discarded attempt (erin/lose): logged, the attempt stays discarded.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'lose'), 1), 1, '{"status": 500}');
SELECT no, state, result, error FROM t.attempts(intent.job_id('erin', 'lose'));
SELECT * FROM t.events(intent.job_id('erin', 'lose'));

-- 9. A failure of an attempt that is still started after its job was cancelled: the attempt
--    records its failure, the job stays cancelled, and the failure is logged as late_failure.
SELECT job_id FROM intent.submit_job('erin', 'fail-after-cancel', 'llm', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('erin', 'fail-after-cancel'), NULL, '1 hour');
SELECT intent.cancel_job(intent.job_id('erin', 'fail-after-cancel'));
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'fail-after-cancel'), 1), 1, '{"status": 503}');
SELECT * FROM t.job(intent.job_id('erin', 'fail-after-cancel'));
SELECT no, state, error FROM t.attempts(intent.job_id('erin', 'fail-after-cancel'));
SELECT * FROM t.events(intent.job_id('erin', 'fail-after-cancel'));

-- 10. An attempt whose outcome is unknown (the caller's timer fired) may still win: its work
--     really happened. Its job goes from unknown to succeeded.
SELECT job_id FROM intent.submit_job('erin', 'unknown-wins', 'llm', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('erin', 'unknown-wins'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('erin', 'unknown-wins'), 1));
SELECT state FROM t.job(intent.job_id('erin', 'unknown-wins'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'unknown-wins'), 1), 1, '"done"');
SELECT * FROM t.job(intent.job_id('erin', 'unknown-wins'));
SELECT no, state, result FROM t.attempts(intent.job_id('erin', 'unknown-wins'));

-- 11. An unknown attempt may also turn out to have failed definitely: the gate opens again.
SELECT job_id FROM intent.submit_job('erin', 'unknown-fails', 'llm', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('erin', 'unknown-fails'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('erin', 'unknown-fails'), 1));
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'unknown-fails'), 1), 1, '{"status": 404}');
SELECT state, version, completed_by FROM t.job(intent.job_id('erin', 'unknown-fails'));
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('erin', 'unknown-fails'), NULL, '1 hour');

-- 12. Refusals of complete_attempt and fail_attempt, each writing nothing:
--     IJ007 for an attempt that was never begun, for a job id (last two bytes zero: it names
--     no attempt) and for an attempt of a job that does not exist; 22023 for a version other
--     than the one begin_attempt handed to that attempt.
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'fatal'), 2), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.complete_attempt(intent.job_id('erin', 'fatal'), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'nobody'), 1), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'fatal'), 2), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.fail_attempt(intent.job_id('erin', 'fatal'), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'nobody'), 1), 1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'unknown-fails'), 2), 0, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'unknown-fails'), 2), 2, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'unknown-fails'), 2), -1, '{}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
SELECT no, state FROM t.attempts(intent.job_id('erin', 'unknown-fails'));

-- 13. Late reports asked again. docs/reference.md § 1.1 complete_attempt: calling again for the same attempt returns the same
--     answer and changes nothing"; protocol.md: "Replays (asking again) are never logged".
--     The result of erin/retry attempt 1 (failed) is already kept in its late_result event,
--     and the failure of erin/win attempt 1 (succeeded) in its late_failure event: the same
--     calls again must return the same answers and write nothing, not a second event.
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('erin', 'retry'), 1), 1, '{"answer": "after all"}');
SELECT * FROM t.unchanged();
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('erin', 'win'), 1), 1, '{"status": 500}');
SELECT * FROM t.unchanged();
SELECT kind, attempt FROM t.events(intent.job_id('erin', 'retry'));
SELECT kind, attempt FROM t.events(intent.job_id('erin', 'win'));
