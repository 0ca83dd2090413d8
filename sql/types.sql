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

CREATE TYPE intent.completion AS ENUM (
    'won',       -- the compare-and-swap changed the job: this result is the job's result
    'lost',      -- another attempt already won, or the job ended: the result was kept on the attempt only
    'rejected'   -- the result broke the job's contract and can never win
);
COMMENT ON TYPE intent.completion IS
    'Answer of complete_attempt. lost and rejected are answers, not errors, so that what they record commits.';
