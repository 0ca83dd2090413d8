-- pg_intent: one row per intent.
--
-- The row is keyed twice on purpose: by (owner_id, idempotency_key), which is what decides
-- "same intent" (there is no check-then-insert anywhere), and by id, which is derived from that
-- pair so every layer can name the job before asking the database.

CREATE TABLE intent.jobs (
    id              uuid                NOT NULL,
    owner_id        intent.short_name   NOT NULL,
    idempotency_key intent.short_name   NOT NULL,
    provider        intent.short_name   NOT NULL,
    params          jsonb               NOT NULL,
    contract        intent.short_name,
    state           intent.job_state    NOT NULL DEFAULT 'pending',
    version         intent.fencing_token NOT NULL DEFAULT 1,
    completed_by    uuid,
    result          jsonb,
    error           jsonb,
    max_attempts    intent.attempt_number NOT NULL DEFAULT 3,
    attempt_count   integer             NOT NULL DEFAULT 0,
    created_at      timestamptz         NOT NULL DEFAULT now(),
    updated_at      timestamptz         NOT NULL DEFAULT now(),
    -- Last, so that a database upgraded from 0.2.0 (ALTER TABLE … ADD COLUMN) has the same
    -- columns in the same places as a fresh install.
    retry_at        timestamptz,

    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    -- The rule "one job per intent" is this constraint, nothing else.
    CONSTRAINT jobs_owner_key_unique UNIQUE (owner_id, idempotency_key),
    -- A hand-written INSERT cannot invent an id that other layers would not compute.
    CONSTRAINT jobs_id_derived CHECK (id = intent.job_id(owner_id, idempotency_key)),
    CONSTRAINT jobs_attempt_count_range CHECK (attempt_count BETWEEN 0 AND max_attempts),
    -- completed_by names the attempt whose outcome stands: set exactly when a win or a final
    -- failure decided the job (a cancel decides it too, but no attempt's outcome stands then).
    CONSTRAINT jobs_completed_by_when_decided
        CHECK ((completed_by IS NOT NULL) = (state = 'succeeded' OR state = 'failed')),
    CONSTRAINT jobs_result_only_when_succeeded CHECK (result IS NULL OR state = 'succeeded'),
    -- Every attempt of a job shares the job's 14 leading bytes.
    CONSTRAINT jobs_completed_by_is_own_attempt
        CHECK (completed_by IS NULL OR intent.job_of(completed_by) = id)
    -- retry_at is set exactly while a job is pending with attempts left: the claimable queue
    -- is the jobs that have one (jobs_claimable_since). Not a CHECK: PostgreSQL rebuilds a
    -- table's CHECK expressions from their text at every INSERT and UPDATE, and this one cost 9 %
    -- of a submit's instructions (docs/architecture.md § Row versions); the statements that
    -- write retry_at are in extension/src/store/rules.rs, and the tests check the rule.
)
-- Room on each page for the new version of a job's HOT updates (its outcome, its state).
WITH (fillfactor = 90);

COMMENT ON TABLE intent.jobs IS
    'One row per intent, keyed by (owner_id, idempotency_key). Retries and fallbacks are attempts (intent.attempts) under it; the row never changes identity.';
COMMENT ON COLUMN intent.jobs.id IS
    'Derived from the intent: SHA-256(owner_id || 0x00 || idempotency_key), first 16 bytes, UUID version 8, last two bytes zero. Compute it with intent.job_id().';
COMMENT ON COLUMN intent.jobs.owner_id IS
    'Whom the intent belongs to (a user or account, not a session). 1 to 255 characters.';
COMMENT ON COLUMN intent.jobs.idempotency_key IS
    'Chosen by the client for one intent. 1 to 255 characters, compared byte for byte.';
COMMENT ON COLUMN intent.jobs.provider IS
    'The primary target of the job. An attempt on any other provider is a failover.';
COMMENT ON COLUMN intent.jobs.params IS
    'The intent''s input. Part of the fingerprint: a resubmission must carry equal jsonb.';
COMMENT ON COLUMN intent.jobs.contract IS
    'Name of the contract the result must satisfy (NULL: none). Part of the fingerprint. Failover requires one.';
COMMENT ON COLUMN intent.jobs.state IS
    'pending, running, unknown (open) or succeeded, failed, cancelled (terminal). A running job whose attempt is past its deadline counts as unknown until something touches it.';
COMMENT ON COLUMN intent.jobs.version IS
    'Fencing token: handed out by begin_attempt, incremented only when the outcome slot changes (a win, a final failure, a cancel), never when an attempt begins.';
COMMENT ON COLUMN intent.jobs.completed_by IS
    'The attempt whose outcome stands (the winner, or the final failure). NULL while open and after a cancel.';
COMMENT ON COLUMN intent.jobs.result IS
    'The winning attempt''s result. Set once, by the compare-and-swap; late results never reach it.';
COMMENT ON COLUMN intent.jobs.error IS
    'The error of the attempt whose failure ended the job (state failed).';
COMMENT ON COLUMN intent.jobs.max_attempts IS
    'How many attempts may exist under this job (1 to 65535). begin_attempt refuses with IJ006 beyond it.';
COMMENT ON COLUMN intent.jobs.attempt_count IS
    'How many attempts exist under this job; the next attempt gets attempt_no = attempt_count + 1.';
COMMENT ON COLUMN intent.jobs.created_at IS 'When the intent was first submitted.';
COMMENT ON COLUMN intent.jobs.updated_at IS 'When the job row last changed (state, version, outcome).';
COMMENT ON COLUMN intent.jobs.retry_at IS
    'While the job is claimable (pending, with attempts left): when claim_attempts may begin its next attempt, the time it became pending, or after a retryable failure its retry time (fail_attempt''s retry_after, or the backoff of intent.retry_backoff). NULL while it is not claimable (running, unknown, finished, or no attempts left). begin_attempt is not held back by it.';

COMMENT ON CONSTRAINT jobs_owner_key_unique ON intent.jobs IS
    'One job per intent: concurrent submits of one key meet here, never in application code.';
COMMENT ON CONSTRAINT jobs_id_derived ON intent.jobs IS
    'The id must be the one every other layer derives from (owner_id, idempotency_key).';
COMMENT ON CONSTRAINT jobs_completed_by_when_decided ON intent.jobs IS
    'An outcome stands (completed_by) exactly when the job succeeded or failed.';

COMMENT ON CONSTRAINT jobs_pkey ON intent.jobs IS 'The derived id: every layer can route by it.';
COMMENT ON CONSTRAINT jobs_attempt_count_range ON intent.jobs IS 'No more attempts than max_attempts (IJ006 is the API''s side of it).';
COMMENT ON CONSTRAINT jobs_result_only_when_succeeded ON intent.jobs IS 'Only a win puts a result on the job.';
COMMENT ON CONSTRAINT jobs_completed_by_is_own_attempt ON intent.jobs IS 'The attempt whose outcome stands belongs to this job.';
COMMENT ON INDEX intent.jobs_pkey IS 'Finds a job by its derived id (every call but submit_job).';
COMMENT ON INDEX intent.jobs_owner_key_unique IS 'One job per intent: the index behind jobs_owner_key_unique.';

-- For intent.purge(): finished jobs are found by age. BRIN because created_at only grows and
-- never changes, so the index costs next to nothing to keep and never blocks HOT updates.
CREATE INDEX jobs_created_at ON intent.jobs USING brin (created_at);
COMMENT ON INDEX intent.jobs_created_at IS 'Finds old jobs for intent.purge(); BRIN, cheap to maintain.';

-- For intent.claim_attempts(): the jobs that may begin an attempt now, longest-waiting first.
-- retry_at is set exactly while a job is claimable (pending, attempts left), to the time
-- it may be claimed from: when it became pending, or its retry time. Keyed and filtered on that
-- one column, so that a transition that leaves it NULL (a win, a failure, a cancel, a job
-- becoming unknown) changes no column an index reads and is a HOT update; partial, so that its
-- size is the queue's, whatever the number of finished jobs.
CREATE INDEX jobs_claimable_since ON intent.jobs (retry_at) WHERE retry_at IS NOT NULL;
COMMENT ON INDEX intent.jobs_claimable_since IS
    'The claimable jobs, in the order claim_attempts takes them (retry_at is set only while a job is claimable).';

-- For a claim by a session bound to one owner: the same jobs and order, per owner, so that its
-- claim reads its owner's queue only, whatever the size of the others' (its cost, and its
-- timing, tell nothing of theirs). owner_id never changes, so it costs no HOT update.
CREATE INDEX jobs_claimable_since_by_owner ON intent.jobs (owner_id, retry_at) WHERE retry_at IS NOT NULL;
COMMENT ON INDEX intent.jobs_claimable_since_by_owner IS
    'The claimable jobs per owner, in the order claim_attempts takes them: a bound session''s claim reads its owner''s part only.';

-- What a purge leaves of a job: its id and the last version it handed out. Ids and attempt ids
-- are derived from the key, so a new job of a purged key has the old job's ids; it starts above
-- the old job's last version, so that a late report from one of the old job's attempts presents
-- a fencing token the new job never handed out, and changes nothing.
CREATE TABLE intent.retired_keys (
    id          uuid                  NOT NULL,
    version     intent.fencing_token  NOT NULL,
    retired_at  timestamptz           NOT NULL,
    CONSTRAINT retired_keys_pkey PRIMARY KEY (id)
);
COMMENT ON CONSTRAINT retired_keys_pkey ON intent.retired_keys IS 'One row per purged job id.';
COMMENT ON INDEX intent.retired_keys_pkey IS 'Finds a purged id''s last version when its key is submitted again.';
COMMENT ON TABLE intent.retired_keys IS
    'One row per purged job id: the last version it handed out, so that a new job of the same key never reuses a fencing token. About 40 bytes per purged key, kept.';
COMMENT ON COLUMN intent.retired_keys.id IS 'The purged job''s id (derived from its key).';
COMMENT ON COLUMN intent.retired_keys.version IS 'The last version the purged job handed out; a new job of the key starts above it.';
COMMENT ON COLUMN intent.retired_keys.retired_at IS 'When the job was purged.';
SELECT pg_catalog.pg_extension_config_dump('intent.retired_keys', '');

-- Rows are written by the extension's functions and kept by pg_dump.
SELECT pg_catalog.pg_extension_config_dump('intent.jobs', '');
