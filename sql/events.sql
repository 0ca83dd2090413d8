-- pg_intent: the append-only log of what the protocol decided.
--
-- It records the moments an on-call engineer needs to reconstruct a story: timeouts, abandons,
-- cancels, late results (with the winner and both versions), contract violations and
-- reconciliations (how an unknown attempt was decided, with the provider's evidence). Replays
-- are read-only and are not logged. There is no foreign key to intent.jobs: the log is cheap to
-- append to and is purged with its job.

CREATE TABLE intent.events (
    id          bigint       GENERATED ALWAYS AS IDENTITY,
    at          timestamptz  NOT NULL DEFAULT statement_timestamp(),
    job_id      uuid         NOT NULL,
    owner_id    intent.short_name NOT NULL,
    attempt_id  uuid,
    kind        intent.event_kind NOT NULL,
    detail      jsonb        NOT NULL DEFAULT '{}',

    CONSTRAINT events_pkey PRIMARY KEY (id),
    CONSTRAINT events_attempt_of_job CHECK (attempt_id IS NULL OR intent.job_of(attempt_id) = job_id)
);

CREATE INDEX events_job_id ON intent.events (job_id, id);
CREATE UNIQUE INDEX events_one_reconciliation ON intent.events (job_id, attempt_id)
    WHERE kind = 'reconciled';

COMMENT ON TABLE intent.events IS
    'Append-only log: timeouts, abandons, cancels, late results, contract violations, reconciliations. Replays are not logged.';
COMMENT ON COLUMN intent.events.id IS 'Monotonic within a server; orders the events of one job.';
COMMENT ON COLUMN intent.events.at IS 'When the event was recorded (start of the statement that recorded it).';
COMMENT ON COLUMN intent.events.job_id IS 'The job the event belongs to.';
COMMENT ON COLUMN intent.events.owner_id IS
    'Copied from the job, so that owner isolation (row-level security) needs no join.';
COMMENT ON COLUMN intent.events.attempt_id IS 'The attempt concerned, when there is one.';
COMMENT ON COLUMN intent.events.kind IS
    'timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';
COMMENT ON COLUMN intent.events.detail IS
    'The facts: for late_result the winner, the version the late attempt presented and the current one; for timeout the deadline and who noticed; for reconciled the decision, the attempt''s state after it, the evidence and the role that recorded it; reasons as given.';
COMMENT ON INDEX intent.events_job_id IS 'Reads one job''s story in order.';
COMMENT ON INDEX intent.events_one_reconciliation IS
    'One reconciliation per attempt (record_reconciliation), whatever the isolation level of concurrent callers.';

COMMENT ON CONSTRAINT events_pkey ON intent.events IS 'Orders the log.';
COMMENT ON CONSTRAINT events_attempt_of_job ON intent.events IS 'An event''s attempt belongs to the event''s job.';
COMMENT ON INDEX intent.events_pkey IS 'The log in order.';

SELECT pg_catalog.pg_extension_config_dump('intent.events', '');
SELECT pg_catalog.pg_extension_config_dump('intent.events_id_seq', '');
