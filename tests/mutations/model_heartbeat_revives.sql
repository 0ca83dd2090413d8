-- Mutation for tests/model_check.rs: a heartbeat revives a lease that already ran out, so a
-- worker keeps going although its attempt counts as unknown (docs/protocol.md: "a lapsed lease
-- is never revived").
ALTER FUNCTION intent.heartbeat(uuid, interval) RENAME TO heartbeat_real;
CREATE FUNCTION intent.heartbeat(attempt_id uuid, extend interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $$
BEGIN
    UPDATE intent.attempts a SET deadline = statement_timestamp() + a.lease
     WHERE a.id = $1 AND a.state = 'started';
    RETURN intent.heartbeat_real($1, $2);
END
$$;
-- The replacement runs with pg_intent's rights, as the function it replaces did (on Citus a
-- write as another user after the real function's, in one transaction, is refused).
ALTER FUNCTION intent.heartbeat(uuid, interval) OWNER TO intent_owner;
