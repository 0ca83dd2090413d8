-- Mutation for tests/security/: a SECURITY DEFINER function that does not pin its search_path
-- and uses unqualified names, so a caller's search_path decides what it runs.
ALTER FUNCTION intent.sweep() RENAME TO sweep_real;
CREATE FUNCTION intent.sweep()
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM count(*) FROM attempts WHERE state = 'started' AND deadline < now();
    RETURN intent.sweep_real();
END
$$;
ALTER FUNCTION intent.sweep() OWNER TO intent_owner;
REVOKE ALL ON FUNCTION intent.sweep() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION intent.sweep() TO intent_operator;
