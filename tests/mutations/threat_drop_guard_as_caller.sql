-- Mutation for tests/threat_model.rs: the sql_drop guard runs with the dropping role's rights
-- again (as in 0.1.0), so a role without pg_intent privileges can no longer DROP anything.
ALTER FUNCTION intent._guard_checker_drop() SECURITY INVOKER;
