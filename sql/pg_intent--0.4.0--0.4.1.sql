-- pg_intent 0.4.0 → 0.4.1: fixes from the review of 0.4.0 as a host database's roles would
-- meet it (docs/security.md). No table changes shape; rows are kept.
--
-- Run by ALTER EXTENSION pg_intent UPDATE. The changes:

\echo Use "ALTER EXTENSION pg_intent UPDATE TO '0.4.1'" to load this file. \quit


-- ---------------------------------------------------------------------------------------------
-- Claims by a bound session (issue 24 § 4): the claimable queue per owner, so that a session
-- bound to one owner claims from its owner's jobs only, at a cost (and a timing) independent of
-- other owners' queues. The claim order itself (the times the calls write) is the library's
-- change, not the catalog's.
CREATE INDEX jobs_claimable_by_owner ON intent.jobs (owner_id, (coalesce(retry_at, updated_at)))
    WHERE state = 'pending' AND attempt_count < max_attempts;
COMMENT ON INDEX intent.jobs_claimable_by_owner IS
    'The claimable jobs per owner, in the order claim_attempts takes them: a bound session''s claim reads its owner''s part only.';
