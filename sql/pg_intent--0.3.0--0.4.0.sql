-- pg_intent 0.3.0 → 0.4.0: reconciliations are recorded (docs/reference.md § 1.6).
--
-- Run by ALTER EXTENSION pg_intent UPDATE. Rows are kept; the changes:
--   * intent.event_kind admits 'reconciled';
--   * intent.record_reconciliation (for intent_operator): records how an unknown attempt was
--     decided and on what evidence, as a reconciled event; the unique partial index
--     events_one_reconciliation keeps it to one per attempt.

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.4.0'" to load this file. \quit

-- A wider CHECK: the existing rows satisfy it, and validating it reads intent.events once.
ALTER DOMAIN intent.event_kind DROP CONSTRAINT event_kind_known;
ALTER DOMAIN intent.event_kind ADD CONSTRAINT event_kind_known CHECK (VALUE IN (
        'timeout',             -- an attempt became unknown: mark_unknown, or its lease ran out
        'abandoned',           -- abandon_attempt: nobody waits for that attempt any more
        'cancelled',           -- cancel_job: the owner withdrew the intent
        'late_result',         -- a result lost the compare-and-swap (or came after a definite failure)
        'late_failure',        -- a failure arrived after the job's outcome was decided
        'contract_violation',  -- a result broke the job's contract and was rejected
        'reconciled'           -- record_reconciliation: how an unknown attempt was decided, and on what evidence
    ));
COMMENT ON CONSTRAINT event_kind_known ON DOMAIN intent.event_kind IS 'The kinds of event the protocol records.';
COMMENT ON DOMAIN intent.event_kind IS
    'What an event records: timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';

COMMENT ON TABLE intent.events IS
    'Append-only log: timeouts, abandons, cancels, late results, contract violations, reconciliations. Replays are not logged.';
COMMENT ON COLUMN intent.events.kind IS
    'timeout, abandoned, cancelled, late_result, late_failure, contract_violation or reconciled.';
COMMENT ON COLUMN intent.events.detail IS
    'The facts: for late_result the winner, the version the late attempt presented and the current one; for timeout the deadline and who noticed; for reconciled the decision, the attempt''s state after it, the evidence and the role that recorded it; reasons as given.';

-- No row is 'reconciled' yet: the index starts empty (building it reads intent.events once).
CREATE UNIQUE INDEX events_one_reconciliation ON intent.events (job_id, attempt_id)
    WHERE kind = 'reconciled';
COMMENT ON INDEX intent.events_one_reconciliation IS
    'One reconciliation per attempt (record_reconciliation), whatever the isolation level of concurrent callers.';

CREATE FUNCTION intent.record_reconciliation(attempt_id uuid, decision text, evidence jsonb)
RETURNS bigint
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'intent_record_reconciliation';
COMMENT ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) IS
    'Records how an attempt whose outcome was unknown was decided (completed, failed or abandoned) and on what evidence (what the provider said), as a reconciled event; call it after the decision''s own call, in the same transaction. Returns the event id; an attempt has at most one reconciliation, and recording it again returns the first. Refuses (22023) a decision the attempt''s state does not show, and an attempt still open.';

-- As sql/privileges.sql does for a fresh install: owned by intent_owner, nothing for PUBLIC,
-- for intent_operator.
ALTER FUNCTION intent.record_reconciliation(uuid, text, jsonb) OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent.record_reconciliation(uuid, text, jsonb) TO intent_operator;
