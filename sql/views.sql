-- pg_intent: views for people (the on-call engineer at 3 a.m., the DBA, the dashboard).
--
-- They read across jobs, which only maintenance and views may do. They are security_invoker
-- views: they read the tables with the rights of whoever queries them, so the owner isolation
-- policies bind the reader exactly as on the tables themselves (a session bound to an owner sees
-- that owner's rows only). A view with the owner's rights would read as intent_owner, whom the
-- policies bind only while row-level security is forced; code reached from a foreign-key
-- cascade runs with it not forced, and would see every owner through such a view.
-- intent_operator may read them (it may read the tables too).

CREATE VIEW intent.jobs_by_state WITH (security_invoker = true) AS
SELECT j.provider,
       CASE WHEN j.state = 'running' AND EXISTS (
                SELECT 1 FROM intent.attempts a
                 WHERE a.job_id = j.id AND a.state = 'started' AND a.deadline <= statement_timestamp())
            THEN 'unknown'::intent.job_state ELSE j.state END AS state,
       count(*) AS jobs,
       min(j.created_at) AS oldest_created_at,
       max(j.updated_at) AS last_updated_at
  FROM intent.jobs j
 GROUP BY 1, 2;
COMMENT ON VIEW intent.jobs_by_state IS
    'How many jobs each provider has in each state. A running job whose attempt ran out of lease counts as unknown.';
COMMENT ON COLUMN intent.jobs_by_state.provider IS 'The jobs'' own (primary) provider.';
COMMENT ON COLUMN intent.jobs_by_state.state IS 'The state as the protocol sees it (deadline rule applied).';
COMMENT ON COLUMN intent.jobs_by_state.jobs IS 'Number of jobs.';
COMMENT ON COLUMN intent.jobs_by_state.oldest_created_at IS 'When the oldest of them was submitted.';
COMMENT ON COLUMN intent.jobs_by_state.last_updated_at IS 'When the most recent of them last changed.';

CREATE VIEW intent.attempts_to_reconcile WITH (security_invoker = true) AS
SELECT a.id AS attempt_id,
       a.job_id,
       j.owner_id,
       j.idempotency_key,
       a.attempt_no,
       a.provider,
       a.worker,
       CASE WHEN a.state = 'started' THEN 'lease_expired' ELSE 'unknown' END AS why,
       a.started_at,
       a.deadline,
       statement_timestamp() - a.started_at AS age,
       statement_timestamp() - a.deadline AS overdue,
       j.state AS job_state
  FROM intent.attempts a
  JOIN intent.jobs j ON j.id = a.job_id
 WHERE a.state = 'unknown'
    OR (a.state = 'started' AND a.deadline <= statement_timestamp());
COMMENT ON VIEW intent.attempts_to_reconcile IS
    'Attempts whose outcome is unknown (marked so, or lease ran out): each blocks its job until someone finds out what the provider did and completes, fails or abandons it. See docs/runbook.md.';
COMMENT ON COLUMN intent.attempts_to_reconcile.attempt_id IS 'The attempt to reconcile.';
COMMENT ON COLUMN intent.attempts_to_reconcile.job_id IS 'Its job.';
COMMENT ON COLUMN intent.attempts_to_reconcile.owner_id IS 'Whom the job belongs to.';
COMMENT ON COLUMN intent.attempts_to_reconcile.idempotency_key IS 'The client''s key for the intent.';
COMMENT ON COLUMN intent.attempts_to_reconcile.attempt_no IS 'Which try it is.';
COMMENT ON COLUMN intent.attempts_to_reconcile.provider IS 'Where it was sent: ask this provider what happened.';
COMMENT ON COLUMN intent.attempts_to_reconcile.worker IS 'The process that ran it (its logs tell the rest).';
COMMENT ON COLUMN intent.attempts_to_reconcile.why IS 'unknown (a caller''s timeout fired) or lease_expired (no heartbeat, no outcome).';
COMMENT ON COLUMN intent.attempts_to_reconcile.started_at IS 'When it began.';
COMMENT ON COLUMN intent.attempts_to_reconcile.deadline IS 'When its lease ran or runs out.';
COMMENT ON COLUMN intent.attempts_to_reconcile.age IS 'How long ago it began.';
COMMENT ON COLUMN intent.attempts_to_reconcile.overdue IS 'How long past its deadline it is (negative: marked unknown before the deadline).';
COMMENT ON COLUMN intent.attempts_to_reconcile.job_state IS 'The job''s stored state.';

CREATE VIEW intent.lost_races WITH (security_invoker = true) AS
SELECT a.job_id,
       j.owner_id,
       j.idempotency_key,
       a.id AS late_attempt_id,
       a.provider AS late_provider,
       a.finished_at AS late_at,
       a.result AS late_result,
       j.completed_by AS winner_attempt_id,
       w.provider AS winner_provider,
       w.finished_at AS won_at,
       j.result AS winning_result,
       j.state AS job_state
  FROM intent.attempts a
  JOIN intent.jobs j ON j.id = a.job_id
  -- The winner is an attempt of the same job (jobs_completed_by_is_own_attempt): saying so
  -- lets Citus join on the distribution column, shard by shard.
  LEFT JOIN intent.attempts w ON w.job_id = j.id AND w.id = j.completed_by
 WHERE a.state = 'discarded';
COMMENT ON VIEW intent.lost_races IS
    'Results that arrived after the outcome was decided, side by side with the result that stands. Both really happened: reconcile side effects (refunds, cleanup) from here.';
COMMENT ON COLUMN intent.lost_races.job_id IS 'The job.';
COMMENT ON COLUMN intent.lost_races.owner_id IS 'Whom it belongs to.';
COMMENT ON COLUMN intent.lost_races.idempotency_key IS 'The client''s key.';
COMMENT ON COLUMN intent.lost_races.late_attempt_id IS 'The attempt whose result was discarded.';
COMMENT ON COLUMN intent.lost_races.late_provider IS 'Its provider.';
COMMENT ON COLUMN intent.lost_races.late_at IS 'When its result arrived.';
COMMENT ON COLUMN intent.lost_races.late_result IS 'The discarded result (kept for reconciliation, never applied).';
COMMENT ON COLUMN intent.lost_races.winner_attempt_id IS 'The attempt whose outcome stands (NULL if the job was cancelled).';
COMMENT ON COLUMN intent.lost_races.winner_provider IS 'Its provider.';
COMMENT ON COLUMN intent.lost_races.won_at IS 'When it won.';
COMMENT ON COLUMN intent.lost_races.winning_result IS 'The job''s result.';
COMMENT ON COLUMN intent.lost_races.job_state IS 'succeeded, failed or cancelled.';

CREATE VIEW intent.certifications_expiring WITH (security_invoker = true) AS
SELECT DISTINCT ON (c.provider, c.contract)
       c.provider,
       c.contract,
       c.contract_version,
       k.version AS current_contract_version,
       c.certified_at,
       c.expires_at,
       c.expires_at - statement_timestamp() AS expires_in,
       c.revoked_at IS NULL AND c.expires_at > statement_timestamp() AND c.contract_version = k.version AS current
  FROM intent.certifications c
  JOIN intent.contracts k ON k.name = c.contract
 ORDER BY c.provider, c.contract, c.id DESC;
COMMENT ON VIEW intent.certifications_expiring IS
    'The certification that counts for each (provider, contract), with how long it has left. Order by expires_in to see what needs re-certifying first; current = false means failover to it is refused now.';
COMMENT ON COLUMN intent.certifications_expiring.provider IS 'The provider.';
COMMENT ON COLUMN intent.certifications_expiring.contract IS 'The contract.';
COMMENT ON COLUMN intent.certifications_expiring.contract_version IS 'The contract version the evidence was earned on.';
COMMENT ON COLUMN intent.certifications_expiring.current_contract_version IS 'The contract''s version now.';
COMMENT ON COLUMN intent.certifications_expiring.certified_at IS 'When it was certified.';
COMMENT ON COLUMN intent.certifications_expiring.expires_at IS 'When it expires.';
COMMENT ON COLUMN intent.certifications_expiring.expires_in IS 'Time left (negative: expired).';
COMMENT ON COLUMN intent.certifications_expiring.current IS 'Whether failover to this provider is allowed now.';
