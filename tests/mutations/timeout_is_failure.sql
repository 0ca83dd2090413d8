-- Mutation for tests/timeout.rs: a timeout reported as a (retryable) failure, the bug rule 2
-- (README) forbids. The gate reopens although the provider may still be working.
CREATE OR REPLACE FUNCTION intent.mark_unknown(attempt_id uuid, reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM intent.fail_attempt($1, (SELECT a.version_read FROM intent.attempts a WHERE a.id = $1),
                                jsonb_build_object('timeout', coalesce($2, 'timeout')), true);
END
$$;
