-- Mutation for tests/threat_model.rs: the views read with their owner's rights again (as in
-- 0.1.0), so code reached from an FK cascade, where row-level security is not forced on table
-- owners, sees every owner through them.
ALTER VIEW intent.jobs_by_state SET (security_invoker = false);
ALTER VIEW intent.attempts_to_reconcile SET (security_invoker = false);
ALTER VIEW intent.lost_races SET (security_invoker = false);
ALTER VIEW intent.certifications_expiring SET (security_invoker = false);
