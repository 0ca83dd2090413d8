-- leases: time. A started attempt whose deadline (start + lease) has passed counts as unknown
-- everywhere, swept or not (protocol.md, "The deadline rule"): a timeout makes an attempt
-- unknown, never failed, because the provider may still be working. Also mark_unknown (the
-- caller's own timer), heartbeat (keeping a lease alive) and sweep (making the tables say so).
--
-- Attempts that must lapse get a lease of 200 milliseconds and the test sleeps 0.4 s; attempts
-- that must stay alive get an hour, so a slow machine cannot turn one into the other.
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/preamble.sql
TRUNCATE intent.jobs, intent.attempts, intent.events;

-- Five jobs whose first attempt will run out of lease, and one whose attempt stays alive.
SELECT k, (SELECT created FROM intent.submit_job('frank', k, 'gpu', '{}')) AS created
  FROM unnest(ARRAY['lapse-begin', 'lapse-complete', 'lapse-heartbeat', 'lapse-fail', 'lapse-abandon', 'alive']) AS k;
SELECT k, (SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', k), NULL, '200 milliseconds', 'w-' || k)) AS attempt_no
  FROM unnest(ARRAY['lapse-begin', 'lapse-complete', 'lapse-heartbeat', 'lapse-fail', 'lapse-abandon']) AS k;
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', 'alive'), NULL, '1 hour', 'w-alive');
SELECT pg_sleep(0.4);

-- 1. Nobody has touched the lapsed attempts yet: the tables still say started / running.
SELECT j.idempotency_key, j.state AS job_state, a.state AS attempt_state, a.deadline < statement_timestamp() AS past_deadline
  FROM intent.jobs j JOIN intent.attempts a ON a.job_id = j.id ORDER BY j.idempotency_key COLLATE "C";

-- 2. begin_attempt applies the deadline rule: IJ003 (outcome unknown), not IJ002. It writes
--    nothing (a refusal changes nothing).
SELECT * FROM t.snapshot();
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('frank', 'lapse-begin'))$$);
SELECT * FROM t.unchanged();

-- 3. submit_job reports such a job as unknown, without writing anything.
SELECT * FROM intent.submit_job('frank', 'lapse-begin', 'gpu', '{}');
SELECT * FROM t.unchanged();

-- 4. complete_attempt first persists what the deadline rule says (attempt and job unknown, a
--    timeout event with "cause": "lease_expired" and who noticed), then decides: the late
--    attempt's work happened, so it wins.
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('frank', 'lapse-complete'), 1), 1, '{"frames": 10}');
SELECT * FROM t.job(intent.job_id('frank', 'lapse-complete'));
SELECT no, state, finished, result FROM t.attempts(intent.job_id('frank', 'lapse-complete'));
SELECT * FROM t.events(intent.job_id('frank', 'lapse-complete'));

-- 5. heartbeat on a lapsed attempt returns false (the worker should stop) and persists the
--    timeout: the attempt becomes unknown for good. A lapsed lease is never revived: the next
--    heartbeat is false too and writes nothing.
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-heartbeat'), 1), '1 hour');
SELECT state FROM t.job(intent.job_id('frank', 'lapse-heartbeat'));
SELECT no, state, finished FROM t.attempts(intent.job_id('frank', 'lapse-heartbeat'));
SELECT * FROM t.events(intent.job_id('frank', 'lapse-heartbeat'));
SELECT * FROM t.snapshot();
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-heartbeat'), 1), '1 hour');
SELECT * FROM t.unchanged();

-- 6. fail_attempt records its own outcome directly (no timeout event): the provider said
--    nothing happened, so the gate opens.
SELECT intent.fail_attempt(intent.attempt_id(intent.job_id('frank', 'lapse-fail'), 1), 1, '{"status": 503}');
SELECT state, version FROM t.job(intent.job_id('frank', 'lapse-fail'));
SELECT no, state, finished, error FROM t.attempts(intent.job_id('frank', 'lapse-fail'));
SELECT count(*) AS events FROM intent.events WHERE job_id = intent.job_id('frank', 'lapse-fail');

-- 7. abandon_attempt records its own decision directly; the abandon event says
--    "lease_expired": true. The abandoned attempt keeps finished_at NULL.
SELECT intent.abandon_attempt(intent.attempt_id(intent.job_id('frank', 'lapse-abandon'), 1), 'worker host died');
SELECT state FROM t.job(intent.job_id('frank', 'lapse-abandon'));
SELECT no, state, finished FROM t.attempts(intent.job_id('frank', 'lapse-abandon'));
SELECT * FROM t.events(intent.job_id('frank', 'lapse-abandon'));

-- 8. sweep persists started -> unknown for every attempt past its deadline (here only
--    frank/lapse-begin is left), logs a timeout for each, and returns how many. The live
--    attempt is left alone. A second sweep finds nothing and writes nothing.
SELECT intent.sweep();
SELECT j.idempotency_key, j.state AS job_state, a.state AS attempt_state
  FROM intent.jobs j JOIN intent.attempts a ON a.job_id = j.id ORDER BY j.idempotency_key COLLATE "C";
SELECT * FROM t.events(intent.job_id('frank', 'lapse-begin'));
SELECT * FROM t.snapshot();
SELECT intent.sweep();
SELECT * FROM t.unchanged();
-- After the sweep the refusal is the same IJ003, now without a deadline in its DETAIL.
SELECT * FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('frank', 'lapse-begin'))$$);

-- 9. "Now" is fresh for every call even inside one transaction (the deadline rule compares with
--    statement_timestamp(); a call writes the clock): an attempt begun in a transaction lapses
--    while that transaction is still open.
BEGIN;
SELECT job_id FROM intent.submit_job('frank', 'in-transaction', 'gpu', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', 'in-transaction'), NULL, '2 seconds');
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('frank', 'in-transaction'))$$) WHERE field = 'SQLSTATE';
SELECT pg_sleep(2.2);
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('frank', 'in-transaction'))$$) WHERE field = 'SQLSTATE';
SELECT state FROM intent.submit_job('frank', 'in-transaction', 'gpu', '{}');
COMMIT;

-- 10. heartbeat on a live attempt extends its deadline to now + extend (default: the attempt's
--     own lease), never shortening it: deadline = greatest(deadline, now + extend).
SELECT deadline AS alive_deadline FROM intent.attempts WHERE job_id = intent.job_id('frank', 'alive') \gset
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '2 hours');
SELECT deadline > :'alive_deadline'::timestamptz AS extended,
       deadline - statement_timestamp() BETWEEN '1 hour 59 minutes' AND '2 hours' AS about_two_hours_left
  FROM intent.attempts WHERE job_id = intent.job_id('frank', 'alive');
SELECT deadline AS alive_deadline FROM intent.attempts WHERE job_id = intent.job_id('frank', 'alive') \gset
-- A shorter extension, or none (the 1 hour lease), keeps the later deadline.
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '1 second');
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1));
SELECT deadline = :'alive_deadline'::timestamptz AS deadline_kept
  FROM intent.attempts WHERE job_id = intent.job_id('frank', 'alive');
-- A heartbeat is not an outcome: the job stays running, its version unchanged, no event.
SELECT state, version FROM t.job(intent.job_id('frank', 'alive'));
SELECT count(*) AS events FROM intent.events WHERE job_id = intent.job_id('frank', 'alive');

-- 11. heartbeat returns false, and writes nothing, once the attempt is no longer started
--     (unknown, finished) or its job has ended (cancelled while the attempt was out there).
SELECT * FROM t.snapshot();
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-complete'), 1)) AS succeeded_attempt,
       intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-fail'), 1)) AS failed_attempt,
       intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-abandon'), 1)) AS abandoned_attempt,
       intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'lapse-begin'), 1)) AS unknown_attempt;
SELECT * FROM t.unchanged();
SELECT intent.cancel_job(intent.job_id('frank', 'alive'), 'user closed the tab');
SELECT * FROM t.snapshot();
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '1 hour') AS job_cancelled;
SELECT * FROM t.unchanged();
SELECT no, state FROM t.attempts(intent.job_id('frank', 'alive'));

-- 12. heartbeat refusals: no such attempt (IJ007); an extension that is not positive or longer
--     than 24 hours (22023). Nothing written.
SELECT * FROM t.snapshot();
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 2));
\echo SQLSTATE :SQLSTATE
SELECT intent.heartbeat(intent.job_id('frank', 'alive'));
\echo SQLSTATE :SQLSTATE
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '0 seconds');
\echo SQLSTATE :SQLSTATE
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '-5 seconds');
\echo SQLSTATE :SQLSTATE
SELECT intent.heartbeat(intent.attempt_id(intent.job_id('frank', 'alive'), 1), '24 hours 0.000001 seconds');
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 13. mark_unknown: the caller's own timeout fired on a live attempt. The attempt and its job
--     become unknown (never failed), and a timeout event says so ("cause": "caller_timeout",
--     the reason, "lease_expired": false). The gate stays closed (IJ003).
SELECT job_id FROM intent.submit_job('frank', 'caller-timeout', 'gpu', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', 'caller-timeout'), NULL, '1 hour');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'caller-timeout'), 1), 'HTTP client timeout after 30 s');
SELECT * FROM t.job(intent.job_id('frank', 'caller-timeout'));
SELECT no, state, finished FROM t.attempts(intent.job_id('frank', 'caller-timeout'));
SELECT * FROM t.events(intent.job_id('frank', 'caller-timeout'));
-- Again (already unknown), or on an attempt that already has an outcome: nothing happens.
SELECT * FROM t.snapshot();
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'caller-timeout'), 1), 'again');
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'lapse-complete'), 1));
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'lapse-fail'), 1));
SELECT * FROM t.unchanged();
-- mark_unknown refusals: no such attempt (IJ007), a reason of 0 or 1001 characters (22023).
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'nobody'), 1));
\echo SQLSTATE :SQLSTATE
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'caller-timeout'), 1), '');
\echo SQLSTATE :SQLSTATE
SELECT intent.mark_unknown(intent.attempt_id(intent.job_id('frank', 'caller-timeout'), 1), repeat('x', 1001));
\echo SQLSTATE :SQLSTATE
SELECT * FROM t.unchanged();

-- 14. Lease bounds: positive and at most 24 hours (1 day counts as 24 hours). A lease of
--     one microsecond is valid, and lapses at once.
SELECT k, (SELECT created FROM intent.submit_job('frank', k, 'gpu', '{}', NULL, 1)) AS created
  FROM unnest(ARRAY['lease-24h', 'lease-1d', 'lease-1us']) AS k;
SELECT (SELECT deadline - statement_timestamp() > '23:59:59' FROM intent.begin_attempt(intent.job_id('frank', 'lease-24h'), NULL, '24 hours')) AS lease_24h,
       (SELECT deadline - statement_timestamp() > '23:59:59' FROM intent.begin_attempt(intent.job_id('frank', 'lease-1d'), NULL, '1 day')) AS lease_1d,
       (SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', 'lease-1us'), NULL, '1 microsecond')) AS lease_1us;
SELECT field, value FROM t.error_of($$SELECT intent.begin_attempt(intent.job_id('frank', 'lease-1us'))$$) WHERE field IN ('SQLSTATE', 'DETAIL');

-- 15. cancel_job applies the deadline rule too: on a running job whose attempt is past its
--     deadline (a lease of one microsecond, lapsed at once), it first persists the timeout
--     (attempt and job unknown, a timeout event noticed by cancel_job), then cancels, and the
--     cancelled event records the state the job really had: previous_state unknown. The
--     attempt stays unknown (the provider may still be working); if it reports, it loses.
SELECT job_id FROM intent.submit_job('frank', 'lapse-cancel', 'gpu', '{}');
SELECT attempt_no FROM intent.begin_attempt(intent.job_id('frank', 'lapse-cancel'), NULL, '1 microsecond');
SELECT intent.cancel_job(intent.job_id('frank', 'lapse-cancel'), 'user closed the tab');
SELECT * FROM t.job(intent.job_id('frank', 'lapse-cancel'));
SELECT no, state, finished FROM t.attempts(intent.job_id('frank', 'lapse-cancel'));
SELECT * FROM t.events(intent.job_id('frank', 'lapse-cancel'));
SELECT intent.complete_attempt(intent.attempt_id(intent.job_id('frank', 'lapse-cancel'), 1), 1, '{"frames": 10}');
SELECT no, state, finished, result FROM t.attempts(intent.job_id('frank', 'lapse-cancel'));
SELECT kind, attempt FROM t.events(intent.job_id('frank', 'lapse-cancel'));
