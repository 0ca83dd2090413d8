-- Mutation for tests/security/: row-level security is enabled but not forced, so the
-- SECURITY DEFINER functions (run as the table owner) ignore owner isolation.
-- (In one DO block: Citus, on the citus target, cannot send a string of several DDL statements
-- to its workers as it came.)
DO $$
BEGIN
    ALTER TABLE intent.jobs NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE intent.attempts NO FORCE ROW LEVEL SECURITY;
    ALTER TABLE intent.events NO FORCE ROW LEVEL SECURITY;
END
$$;
