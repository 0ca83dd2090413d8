-- procrastinate's defer_jobs query, whose unique violation on the queueing lock its client turns
-- into AlreadyEnqueued (procrastinate/manager.py), as one call that answers NULL instead: pgbench
-- ends a client at any error but a serialization failure or deadlock, so the duplicate and
-- one-key scenarios need the error caught in the server. Where procrastinate's client ends in
-- an aborted transaction, which never waits for its WAL to be flushed, this one commits; so the
-- caught path turns synchronous_commit off for its own transaction, which then does not wait
-- either. What is left is the EXCEPTION block's subtransaction, a cost procrastinate's client
-- does not pay (it pays the error's round trip instead).
CREATE SCHEMA IF NOT EXISTS peers;
CREATE OR REPLACE FUNCTION peers.procrastinate_defer_or_already_enqueued(jobs procrastinate_job_to_defer_v1[])
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT unnest(procrastinate_defer_jobs_v1(jobs)) LIMIT 1);
EXCEPTION WHEN unique_violation THEN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN NULL;
END;
$$;
