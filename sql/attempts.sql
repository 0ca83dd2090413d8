-- pg_intent: the tries under a job.
--
-- Rows accumulate; nothing here is ever updated into another attempt's identity. The partial
-- unique index is the gate: while one attempt of a job is open (started or unknown) no other can
-- be inserted, even by hand-written SQL.

CREATE TABLE intent.attempts (
    id            uuid                  NOT NULL,
    job_id        uuid                  NOT NULL,
    owner_id      intent.short_name     NOT NULL,
    attempt_no    intent.attempt_number NOT NULL,
    provider      intent.short_name     NOT NULL,
    state         intent.attempt_state  NOT NULL DEFAULT 'started',
    version_read  intent.fencing_token  NOT NULL,
    worker        intent.short_name,
    lease         intent.lease          NOT NULL,
    started_at    timestamptz           NOT NULL DEFAULT now(),
    deadline      timestamptz           NOT NULL,
    finished_at   timestamptz,
    result        jsonb,
    error         jsonb,

    CONSTRAINT attempts_pkey PRIMARY KEY (id),
    CONSTRAINT attempts_job_fkey FOREIGN KEY (job_id) REFERENCES intent.jobs (id) ON DELETE CASCADE,
    CONSTRAINT attempts_job_attempt_no_unique UNIQUE (job_id, attempt_no),
    -- The id names its job and its number, so logs can route on it alone.
    CONSTRAINT attempts_id_derived CHECK (id = intent.attempt_id(job_id, attempt_no)),
    CONSTRAINT attempts_deadline_after_start CHECK (deadline > started_at),
    -- finished_at is when the attempt's own outcome arrived; an abandoned attempt has none yet.
    CONSTRAINT attempts_finished_when_final
        CHECK ((finished_at IS NOT NULL) = (state = 'succeeded' OR state = 'failed' OR state = 'discarded')),
    CONSTRAINT attempts_result_only_when_returned
        CHECK (result IS NULL OR state = 'succeeded' OR state = 'discarded' OR state = 'failed')
);

-- The gate (docs/protocol.md § The state machine): at most one open attempt per job.
CREATE UNIQUE INDEX attempts_one_open_per_job ON intent.attempts (job_id)
    WHERE state IN ('started', 'unknown');
-- For intent.sweep(): only started attempts can run out of lease.
CREATE INDEX attempts_started_deadline ON intent.attempts (deadline)
    WHERE state = 'started';

COMMENT ON TABLE intent.attempts IS
    'Every try under a job: the first call, each retry, each failover. At most one is open (started or unknown) per job.';
COMMENT ON COLUMN intent.attempts.id IS
    'The job id with attempt_no in its last two bytes (big-endian): it names its job. Compute it with intent.attempt_id().';
COMMENT ON COLUMN intent.attempts.job_id IS 'The job this attempt belongs to.';
COMMENT ON COLUMN intent.attempts.owner_id IS 'Copied from the job, so an owner''s attempts can be found and isolated without a join.';
COMMENT ON COLUMN intent.attempts.attempt_no IS '1 for the first attempt, 2 for the next, ... up to the job''s max_attempts.';
COMMENT ON COLUMN intent.attempts.provider IS 'Where this attempt was sent; differs from the job''s provider on a failover.';
COMMENT ON COLUMN intent.attempts.state IS
    'started, unknown (open); succeeded, failed, abandoned, discarded. A started attempt past its deadline counts as unknown.';
COMMENT ON COLUMN intent.attempts.version_read IS
    'The job version handed out when this attempt began: the fencing token it must present to complete or fail.';
COMMENT ON COLUMN intent.attempts.worker IS 'Free-form name of the process running the attempt, for people reading the table.';
COMMENT ON COLUMN intent.attempts.lease IS 'The lease asked for at begin; heartbeat extends by it when no other extension is given.';
COMMENT ON COLUMN intent.attempts.started_at IS 'When begin_attempt handed the attempt out.';
COMMENT ON COLUMN intent.attempts.deadline IS
    'End of the lease. Past it, a started attempt counts as unknown (never failed) and blocks new attempts until resolved.';
COMMENT ON COLUMN intent.attempts.finished_at IS 'When the attempt''s own outcome arrived (succeeded, failed, discarded).';
COMMENT ON COLUMN intent.attempts.result IS
    'The result this attempt returned. For a discarded attempt it stays here for reconciliation and never reaches the job.';
COMMENT ON COLUMN intent.attempts.error IS
    'The error reported by fail_attempt, or {"kind":"contract_violation",...} for a rejected result.';

COMMENT ON INDEX intent.attempts_one_open_per_job IS
    'The gate: no new attempt while the last one is started or unknown, even for a hand-written INSERT.';
COMMENT ON INDEX intent.attempts_started_deadline IS 'Finds attempts whose lease ran out, for intent.sweep().';
COMMENT ON CONSTRAINT attempts_id_derived ON intent.attempts IS
    'The id must be intent.attempt_id(job_id, attempt_no), so it names its job.';

COMMENT ON CONSTRAINT attempts_pkey ON intent.attempts IS 'The derived attempt id.';
COMMENT ON CONSTRAINT attempts_job_fkey ON intent.attempts IS 'Every attempt belongs to a job, and goes with it when a purge removes it.';
COMMENT ON CONSTRAINT attempts_job_attempt_no_unique ON intent.attempts IS 'Attempt numbers are unique within a job.';
COMMENT ON CONSTRAINT attempts_deadline_after_start ON intent.attempts IS 'A lease ends after it starts.';
COMMENT ON CONSTRAINT attempts_finished_when_final ON intent.attempts IS 'finished_at is set exactly when the attempt''s own outcome arrived.';
COMMENT ON CONSTRAINT attempts_result_only_when_returned ON intent.attempts IS 'Only an attempt that returned holds a result (won, discarded, or rejected).';
COMMENT ON INDEX intent.attempts_pkey IS 'Finds an attempt by its id.';
COMMENT ON INDEX intent.attempts_job_attempt_no_unique IS 'A job''s attempts in order; also serves the foreign key.';

SELECT pg_catalog.pg_extension_config_dump('intent.attempts', '');
