-- pg_intent: owner isolation (row-level security).
--
-- A session may be bound to one owner by the setting intent.owner_id. Only superusers can set
-- it, and roles they allow: `ALTER ROLE tenant_a SET intent.owner_id = 'tenant-a'` binds every
-- session of a role for good, and `GRANT SET ON PARAMETER intent.owner_id TO gateway` lets a
-- trusted gateway bind each request of a pooled connection (`SET LOCAL intent.owner_id = …`).
-- A bound session sees, and every function acts on, that owner's jobs, attempts and events
-- only: another owner's job is "not found" (IJ007), even for a caller who knows its ids.
-- An unbound session (the application's trusted role, operators, DBAs) sees every owner.
--
-- The policies are FORCEd so that they bind the table owner too: the SECURITY DEFINER functions
-- run as the table owner (intent_owner, deliberately not a superuser, since superusers bypass
-- row-level security), so they obey exactly the same rules as a direct SELECT.

ALTER TABLE intent.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE intent.jobs FORCE ROW LEVEL SECURITY;
ALTER TABLE intent.attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE intent.attempts FORCE ROW LEVEL SECURITY;
ALTER TABLE intent.events ENABLE ROW LEVEL SECURITY;
ALTER TABLE intent.events FORCE ROW LEVEL SECURITY;

-- (SELECT intent.bound_owner()) is evaluated once per statement, not once per row.
CREATE POLICY jobs_owner_isolation ON intent.jobs
    USING (owner_id = coalesce((SELECT intent.bound_owner()), owner_id))
    WITH CHECK (owner_id = coalesce((SELECT intent.bound_owner()), owner_id));
CREATE POLICY attempts_owner_isolation ON intent.attempts
    USING (owner_id = coalesce((SELECT intent.bound_owner()), owner_id))
    WITH CHECK (owner_id = coalesce((SELECT intent.bound_owner()), owner_id));
CREATE POLICY events_owner_isolation ON intent.events
    USING (owner_id = coalesce((SELECT intent.bound_owner()), owner_id))
    WITH CHECK (owner_id = coalesce((SELECT intent.bound_owner()), owner_id));

COMMENT ON POLICY jobs_owner_isolation ON intent.jobs IS
    'A session bound to an owner (intent.owner_id) sees and changes only that owner''s jobs.';
COMMENT ON POLICY attempts_owner_isolation ON intent.attempts IS
    'A session bound to an owner (intent.owner_id) sees and changes only that owner''s attempts.';
COMMENT ON POLICY events_owner_isolation ON intent.events IS
    'A session bound to an owner (intent.owner_id) sees only that owner''s events.';
COMMENT ON FUNCTION intent.bound_owner() IS
    'The owner this session is bound to (the setting intent.owner_id), or NULL when it is not bound.';

-- The distributed mode's policies (intent.distribute(), docs/scale-out.md) call this rather
-- than holding the comparison: Citus refuses sub-selects in policies on distributed tables,
-- and copies each policy to the shards as text that every worker parses again under its own
-- search path, where an operator written plainly is looked up anew but a function named with
-- its schema is not. Every name in the body is qualified, so it means the same under any
-- search path, and the planner inlines it (plain SQL, not strict, no settings of its own).
CREATE FUNCTION intent.owner_admits(owner_id text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT owner_id OPERATOR(pg_catalog.=) COALESCE(intent.bound_owner(), owner_id) $$;
COMMENT ON FUNCTION intent.owner_admits(text) IS
    'Whether this session''s binding (intent.bound_owner()) admits a row of this owner: the owner isolation policies of the distributed mode.';
