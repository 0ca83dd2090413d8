-- pg_intent: the state types.
--
-- One enum per state machine, so that a DBA reading intent.jobs or intent.attempts sees words,
-- not codes, and a typo in hand-written SQL fails loudly instead of inventing a state.

CREATE TYPE intent.job_state AS ENUM (
    'pending',    -- no open attempt; one may begin
    'running',    -- an attempt is started and within its lease
    'unknown',    -- the open attempt's outcome is unknown (timed out, or lease ran out)
    'succeeded',  -- terminal: one attempt's result won the compare-and-swap
    'failed',     -- terminal: a definite failure with no retry left
    'cancelled'   -- terminal: the owner withdrew the intent
);
COMMENT ON TYPE intent.job_state IS
    'State of a job. pending, running and unknown are open; succeeded, failed and cancelled are terminal and never change again.';

CREATE TYPE intent.attempt_state AS ENUM (
    'started',    -- handed out by begin_attempt; counts as unknown once its deadline passes
    'unknown',    -- the caller''s timeout fired, or the lease ran out: the provider may still be working
    'succeeded',  -- its result won and is the job''s result
    'failed',     -- the provider said nothing happened, or its result broke the job''s contract
    'abandoned',  -- an operator stopped waiting for it; if it returns, the compare-and-swap decides
    'discarded'   -- it returned after the outcome was decided; its result stays here, never on the job
);
COMMENT ON TYPE intent.attempt_state IS
    'State of one attempt. started and unknown are open (at most one per job); a timeout is unknown, never failed.';

-- Single-column rules live in domains rather than table CHECK constraints on purpose:
-- PostgreSQL re-reads a table's CHECK expressions from their stored text for every INSERT and
-- UPDATE statement, but compiles a domain's constraints once per session. Profiling showed the
-- former at a third of the cost of submit_job.

-- COLLATE "C": keys are compared byte for byte (docs/reference.md § 4 Domains), and the unique index on
-- (owner_id, idempotency_key) then orders by bytes too, which is also the cheapest comparison.
CREATE DOMAIN intent.short_name AS text COLLATE "C"
    CONSTRAINT short_name_length CHECK (char_length(VALUE) BETWEEN 1 AND 255);
COMMENT ON DOMAIN intent.short_name IS
    'A name-like text of 1 to 255 characters, compared byte for byte (collation "C"): owner ids, idempotency keys, providers, contracts, workers.';

CREATE DOMAIN intent.attempt_number AS integer
    CONSTRAINT attempt_number_range CHECK (VALUE BETWEEN 1 AND 65535);
COMMENT ON DOMAIN intent.attempt_number IS
    'An attempt number, or a number of attempts: 1 to 65535, so that it fits in the last two bytes of an attempt id.';

CREATE DOMAIN intent.fencing_token AS bigint
    CONSTRAINT fencing_token_positive CHECK (VALUE >= 1);
COMMENT ON DOMAIN intent.fencing_token IS
    'A job version: starts at 1 and only grows, by one each time the outcome slot changes.';

CREATE DOMAIN intent.lease AS interval
    CONSTRAINT lease_positive CHECK (VALUE > interval '0');
COMMENT ON DOMAIN intent.lease IS 'A lease length: positive.';

CREATE DOMAIN intent.event_kind AS text
    CONSTRAINT event_kind_known CHECK (VALUE IN (
        'timeout',             -- an attempt became unknown: mark_unknown, or its lease ran out
        'abandoned',           -- abandon_attempt: nobody waits for that attempt any more
        'cancelled',           -- cancel_job: the owner withdrew the intent
        'late_result',         -- a result lost the compare-and-swap (or came after a definite failure)
        'late_failure',        -- a failure arrived after the job's outcome was decided
        'contract_violation',  -- a result broke the job's contract and was rejected
        'reconciled'           -- record_reconciliation: how an unknown attempt was decided, and on what evidence
    ));
COMMENT ON DOMAIN intent.event_kind IS
    'What an event records: timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';

COMMENT ON CONSTRAINT short_name_length ON DOMAIN intent.short_name IS '1 to 255 characters (char_length).';
COMMENT ON CONSTRAINT attempt_number_range ON DOMAIN intent.attempt_number IS 'Fits in the last two bytes of an attempt id.';
COMMENT ON CONSTRAINT fencing_token_positive ON DOMAIN intent.fencing_token IS 'Versions start at 1 (or above a purged job''s last one).';
COMMENT ON CONSTRAINT lease_positive ON DOMAIN intent.lease IS 'A deadline after the start.';
COMMENT ON CONSTRAINT event_kind_known ON DOMAIN intent.event_kind IS 'The kinds of event the protocol records.';

CREATE TYPE intent.completion AS ENUM (
    'won',       -- the compare-and-swap changed the job: this result is the job's result
    'lost',      -- another attempt already won, or the job ended: the result was kept on the attempt only
    'rejected'   -- the result broke the job's contract and can never win
);
COMMENT ON TYPE intent.completion IS
    'Answer of complete_attempt. lost and rejected are answers, not errors, so that what they record commits.';
