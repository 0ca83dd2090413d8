-- Mutation for tests/hostile_input/: abandon_attempt rewrites the attempt row even when it
-- changes nothing (an attempt that already has an outcome), so a documented no-op writes.
ALTER FUNCTION intent.abandon_attempt(uuid, text) RENAME TO abandon_attempt_original;
CREATE FUNCTION intent.abandon_attempt(attempt_id uuid, reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM intent.abandon_attempt_original($1, $2);
    UPDATE intent.attempts a SET state = a.state WHERE a.id = $1;
END
$$;
