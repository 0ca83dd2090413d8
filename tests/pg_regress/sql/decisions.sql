-- decisions: the out-of-band decisions, abandon_attempt (an operator or reconciler stops
-- waiting for an attempt) and cancel_job (the owner withdraws the intent), and the story the
-- README is about: two attempts carrying one intent, finishing in either order, exactly one
-- result winning.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- 1. The reverse-order finish. Attempt 1 stalls; the caller's timer fires (unknown: the
--    provider may still be working, so no retry is allowed behind its back); an operator
--    abandons it; attempt 2 begins and finishes first, and wins. Then attempt 1 comes back:
--    its result is discarded (kept on its own row, never merged into the job) and the race is
--    logged with the winner and both versions.
SELECT job_id FROM intent.submit_job('gina', 'checkout-1', 'payments', '{"amount": 100}');
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('gina', 'checkout-1'), NULL, '1 hour', 'api-1');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 1), 'gateway timeout');
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('gina', 'checkout-1'))$$) WHERE field = 'SQLSTATE';
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 1), 'reconciler: no trace at the provider after 5 min');
SELECT attempt_id, attempt_no, version FROM intent.begin_attempt(intent.job_id('gina', 'checkout-1'), NULL, '1 hour', 'api-2');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 2), 1, '{"charge": "ch_2"}') AS attempt_2;
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 1), 1, '{"charge": "ch_1"}') AS attempt_1;
SELECT * FROM t.job(intent.job_id('gina', 'checkout-1'));
SELECT * FROM t.attempts(intent.job_id('gina', 'checkout-1'));
SELECT * FROM t.events(intent.job_id('gina', 'checkout-1'));
-- Both ask again: the same answers, nothing written.
SELECT * FROM t.snapshot();
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 2), 1, '{"charge": "ch_2"}') AS attempt_2,
       intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 1), 1, '{"charge": "ch_1"}') AS attempt_1;
SELECT * FROM t.unchanged();

-- 2. The same start, the other order: the abandoned attempt 1 returns first, and wins (its work
--    really happened, and no outcome had been decided). That ends the job although attempt 2
--    is still open; attempt 2 is told to stop (heartbeat false) and loses when it reports.
SELECT job_id FROM intent.submit_job('gina', 'checkout-2', 'payments', '{"amount": 200}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-2'), NULL, '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-2'), 1), 'looks stuck');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-2'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-2'), 1), 1, '{"charge": "ch_1"}') AS attempt_1;
SELECT * FROM t.job(intent.job_id('gina', 'checkout-2'));
SELECT no, state, finished, result FROM t.attempts(intent.job_id('gina', 'checkout-2'));
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('gina', 'checkout-2'), 2)) AS attempt_2_alive;
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-2'), 2), 1, '{"charge": "ch_2"}') AS attempt_2;
SELECT * FROM t.job(intent.job_id('gina', 'checkout-2'));
SELECT no, state, finished, result FROM t.attempts(intent.job_id('gina', 'checkout-2'));
SELECT * FROM t.events(intent.job_id('gina', 'checkout-2'));

-- 3. An abandoned attempt reports a definite, retryable failure while attempt 2 is open: the
--    open attempt stays in charge of the job (running, no version change).
SELECT job_id FROM intent.submit_job('gina', 'checkout-3', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-3'), NULL, '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-3'), 1), 'looks stuck');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-3'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-3'), 1), 1, '{"status": 503}');
SELECT state, version, completed_by FROM t.job(intent.job_id('gina', 'checkout-3'));
SELECT no, state, finished FROM t.attempts(intent.job_id('gina', 'checkout-3'));
-- ...unless the failure is not retryable: then the job fails (protocol.md, fail_attempt),
-- and the open attempt will lose when it reports.
SELECT job_id FROM intent.submit_job('gina', 'checkout-4', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-4'), NULL, '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-4'), 1), 'looks stuck');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'checkout-4'), NULL, '1 hour');
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-4'), 1), 1, '{"status": 402}', false);
SELECT * FROM t.job(intent.job_id('gina', 'checkout-4'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-4'), 2), 1, '{"charge": "ch_2"}') AS attempt_2;
SELECT no, state, finished, result, error FROM t.attempts(intent.job_id('gina', 'checkout-4'));

-- 4. abandon_attempt in detail. A started attempt: it becomes abandoned (finished_at stays
--    NULL until it reports), the job returns to pending with its version unchanged, and an
--    abandoned event records the reason, the previous state and whether the lease had expired.
SELECT job_id FROM intent.submit_job('gina', 'abandon', 'payments', '{}', NULL, 5);
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'abandon'), NULL, '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 1), 'operator: ticket OPS-1');
SELECT state, version FROM t.job(intent.job_id('gina', 'abandon'));
SELECT no, state, finished FROM t.attempts(intent.job_id('gina', 'abandon'));
SELECT * FROM t.events(intent.job_id('gina', 'abandon'));
-- Abandoning it again, or abandoning an attempt that already has an outcome, does nothing.
SELECT * FROM t.snapshot();
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 1), 'again');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 2), 'the winner');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-1'), 1), 'the loser');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'checkout-3'), 1), 'a failure');
SELECT * FROM t.unchanged();
-- A reason may be 1000 characters, multibyte ones counted as one each.
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'abandon'), NULL, '1 hour');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 2), repeat('ж', 1000));
SELECT kind, attempt, char_length(detail::jsonb->>'reason') AS reason_chars
  FROM t.events(intent.job_id('gina', 'abandon')) WHERE attempt = 2;
-- Refusals, each writing nothing: no such attempt (IJ007); a reason that is NULL (it is
-- required here), empty or longer than 1000 characters (22023).
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'abandon'), NULL, '1 hour');
SELECT * FROM t.snapshot();
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 4), 'no such attempt');
\echo SQLSTATE :SQLSTATE
SELECT intent.abandon_attempt(intent.job_id('gina', 'abandon'), 'a job id');
\echo SQLSTATE :SQLSTATE
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 3), NULL);
\echo SQLSTATE :SQLSTATE
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 3), '');
\echo SQLSTATE :SQLSTATE
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'abandon'), 3), repeat('ж', 1001));
\echo SQLSTATE :SQLSTATE
SELECT intent.abandon_attempt(NULL, 'no id');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
SELECT no, state FROM t.attempts(intent.job_id('gina', 'abandon'));

-- 5. cancel_job on a pending job: cancelled, version + 1, true; a cancelled event with the
--    reason, the previous state, the new version and the open attempt (none).
SELECT job_id FROM intent.submit_job('gina', 'cancel-pending', 'payments', '{}');
SELECT intent.cancel_job(intent.job_id('gina', 'cancel-pending'), 'user pressed cancel');
SELECT * FROM t.job(intent.job_id('gina', 'cancel-pending'));
SELECT * FROM t.events(intent.job_id('gina', 'cancel-pending'));

-- 6. cancel_job on a running job: the open attempt is left as it is (started); its version is
--    now stale, so it loses when it reports. The event names the open attempt.
SELECT job_id FROM intent.submit_job('gina', 'cancel-running', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'cancel-running'), NULL, '1 hour');
SELECT intent.cancel_job(intent.job_id('gina', 'cancel-running'));
SELECT * FROM t.job(intent.job_id('gina', 'cancel-running'));
SELECT no, state FROM t.attempts(intent.job_id('gina', 'cancel-running'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'cancel-running'), 1), 1, '{"charge": "ch_late"}');
SELECT * FROM t.job(intent.job_id('gina', 'cancel-running'));
SELECT no, state, result FROM t.attempts(intent.job_id('gina', 'cancel-running'));
SELECT * FROM t.events(intent.job_id('gina', 'cancel-running'));

-- 7. cancel_job on a job whose outcome is unknown: cancelled too (previous state unknown).
--    Abandoning its attempt afterwards records the decision but cannot reopen the job.
SELECT job_id FROM intent.submit_job('gina', 'cancel-unknown', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'cancel-unknown'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('gina', 'cancel-unknown'), 1));
SELECT intent.cancel_job(intent.job_id('gina', 'cancel-unknown'), 'give up');
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('gina', 'cancel-unknown'), 1), 'cleanup');
SELECT * FROM t.job(intent.job_id('gina', 'cancel-unknown'));
SELECT no, state FROM t.attempts(intent.job_id('gina', 'cancel-unknown'));
SELECT kind, attempt, detail FROM t.events(intent.job_id('gina', 'cancel-unknown')) WHERE kind <> 'timeout';

-- 8. cancel_job on a finished job (cancelled, succeeded, failed) returns false and changes
--    nothing.
SELECT * FROM t.snapshot();
SELECT intent.cancel_job(intent.job_id('gina', 'cancel-pending'), 'twice') AS cancelled_again,
       intent.cancel_job(intent.job_id('gina', 'checkout-1')) AS succeeded_job,
       intent.cancel_job(intent.job_id('gina', 'checkout-4')) AS failed_job;
SELECT * FROM t.unchanged();
-- Refusals, each writing nothing: no such job (IJ007, also for an attempt id); job id NULL,
-- a reason that is empty or longer than 1000 characters (22023).
SELECT intent.cancel_job(intent.job_id('gina', 'never-submitted'));
\echo SQLSTATE :SQLSTATE
SELECT intent.cancel_job(intent.attempt_id(intent.job_id('gina', 'abandon'), 3));
\echo SQLSTATE :SQLSTATE
SELECT intent.cancel_job(NULL);
\echo SQLSTATE :SQLSTATE
SELECT intent.cancel_job(intent.job_id('gina', 'abandon'), '');
\echo SQLSTATE :SQLSTATE
SELECT intent.cancel_job(intent.job_id('gina', 'abandon'), repeat('r', 1001));
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
SELECT state FROM t.job(intent.job_id('gina', 'abandon'));

-- 9. record_reconciliation: a reconciler records how it decided an unknown attempt, and on what
--    evidence, after the decision's own call. One per attempt: asked again, it answers the
--    first event and writes nothing.
SELECT job_id FROM intent.submit_job('gina', 'reconciled', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'reconciled'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'caller timeout');
-- Refusals, each writing nothing: the attempt is still unknown; a decision its state does not
-- show; a decision that is not one; NULLs (22023); no such attempt (IJ007).
SELECT * FROM t.snapshot();
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'completed', '{"provider_says": "done"}');
\echo SQLSTATE :SQLSTATE
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 1, '{"charge": "ch_r"}');
SELECT * FROM t.snapshot();
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'abandoned', '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'guessed', '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.record_reconciliation(NULL, 'completed', '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), NULL, '{}');
\echo SQLSTATE :SQLSTATE
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'completed', NULL);
\echo SQLSTATE :SQLSTATE
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'never-submitted'), 1), 'completed', '{}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
-- Recorded once; the second call answers the same event.
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'completed',
                                    '{"provider_says": "done", "reconciled_by": "rec-1"}') =
       intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'reconciled'), 1), 'completed',
                                    '{"provider_says": "something else"}') AS the_same_event;
SELECT kind, detail - 'recorded_by' AS detail, detail ? 'recorded_by' AS has_role
  FROM intent.events WHERE job_id = intent.job_id('gina', 'reconciled') AND kind = 'reconciled';
-- A reconciliation needs an attempt whose outcome was unknown (a timeout event), and a
-- completed reconciliation of a failed attempt needs a contract violation: 22023.
SELECT job_id FROM intent.submit_job('gina', 'never-unknown', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'never-unknown'), NULL, '1 hour');
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('gina', 'never-unknown'), 1), 1, '{"charge": "ch_n"}');
SELECT * FROM t.snapshot();
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'never-unknown'), 1), 'completed', '{"forged": true}');
\echo SQLSTATE :SQLSTATE
SELECT job_id FROM intent.submit_job('gina', 'failed-unknown', 'payments', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('gina', 'failed-unknown'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('gina', 'failed-unknown'), 1));
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('gina', 'failed-unknown'), 1), 1, '{"kind": "provider"}', false);
SELECT * FROM t.snapshot();
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'failed-unknown'), 1), 'completed', '{}');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();
SELECT intent.record_reconciliation(intent.attempt_id(intent.job_id('gina', 'failed-unknown'), 1), 'failed', '{"provider_says": "never_received"}') > 0 AS recorded;
