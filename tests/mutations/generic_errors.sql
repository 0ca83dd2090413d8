-- Mutation for tests/sqlstates.rs: refusals raised the easy way, as P0001 without DETAIL or
-- HINT, which is what clients would see if the codes did not survive the trip. Every API
-- function (the SECURITY DEFINER C functions of schema intent) is kept under another name
-- (<name>_real) and wrapped; the wrapper re-raises each refusal (IJ001..IJ007, 22023, 42501)
-- with RAISE EXCEPTION '%', message. PostgreSQL's own errors (a 40001 from a concurrent
-- insert, say) pass through unchanged.
DO $mutation$
DECLARE
    f record;
    call text;
    body text;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.proretset, p.prorettype, p.pronargs,
               pg_get_function_identity_arguments(p.oid) AS identity,
               pg_get_function_arguments(p.oid) AS arguments,
               pg_get_function_result(p.oid) AS result
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_language l ON l.oid = p.prolang
         WHERE n.nspname = 'intent' AND l.lanname = 'c' AND p.prosecdef
         ORDER BY p.proname
    LOOP
        EXECUTE format('ALTER FUNCTION intent.%I(%s) RENAME TO %I', f.proname, f.identity, f.proname || '_real');
        call := format('intent.%I(%s)', f.proname || '_real',
                       (SELECT coalesce(string_agg('$' || i, ', ' ORDER BY i), '')
                          FROM generate_series(1, f.pronargs) i));
        body := CASE
            WHEN f.proretset THEN 'RETURN QUERY SELECT * FROM ' || call || ';'
            WHEN f.prorettype = 'void'::regtype THEN 'PERFORM ' || call || ';'
            ELSE 'RETURN ' || call || ';'
        END;
        EXECUTE format($create$
            CREATE FUNCTION intent.%I(%s) RETURNS %s
            LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, intent, pg_temp AS $body$
            DECLARE
                refusal_code text;
                refusal_message text;
            BEGIN
                %s
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS refusal_code = RETURNED_SQLSTATE, refusal_message = MESSAGE_TEXT;
                IF refusal_code LIKE 'IJ%%' OR refusal_code IN ('22023', '42501') THEN
                    RAISE EXCEPTION '%%', refusal_message;
                END IF;
                RAISE;
            END
            $body$ $create$, f.proname, f.arguments, f.result, body);
    END LOOP;
END
$mutation$;
