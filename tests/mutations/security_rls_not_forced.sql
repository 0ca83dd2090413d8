-- Mutation for tests/security/: row-level security is enabled but not forced, so the
-- SECURITY DEFINER functions (run as the table owner) ignore owner isolation.
ALTER TABLE intent.jobs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE intent.attempts NO FORCE ROW LEVEL SECURITY;
ALTER TABLE intent.events NO FORCE ROW LEVEL SECURITY;
