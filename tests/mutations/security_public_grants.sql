-- Mutation for tests/security/: privileges beyond the documented ones (PUBLIC reads the jobs,
-- an application may abandon attempts).
GRANT USAGE ON SCHEMA intent TO PUBLIC;
GRANT SELECT ON intent.jobs TO PUBLIC;
GRANT EXECUTE ON FUNCTION intent.abandon_attempt(uuid, text) TO intent_app;
