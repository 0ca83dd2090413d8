-- Mutation for tests/sqlstates.rs: refusals raised the easy way, as P0001 without DETAIL or
-- HINT, which is what clients would see if the codes did not survive the trip.
CREATE OR REPLACE FUNCTION intent._refuse(code text, message text, detail text, hint text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', message;
END
$$;
