-- pg_intent: its settings, readable from any session (0.5.0).
--
-- The intent.* settings exist once the library is loaded: before a session's first pg_intent
-- call (without session_preload_libraries or shared_preload_libraries), SHOW intent.retention
-- fails with "unrecognized configuration parameter", and PostgreSQL offers an extension no way
-- to answer for a name it does not know yet (docs/reference.md § 7). The view intent.settings
-- works in every session: it calls a function of the library first, which loads it (and so
-- registers every setting with its real default and the session's value), then reads
-- pg_settings. The Idempotency-Key draft asks a server to publish how long it keeps a key:
-- intent.retention is one row here.

-- Loads the library in this session (a C function: calling it is what loads it) and does
-- nothing else.
CREATE FUNCTION intent._load_library()
RETURNS void
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'intent_load_library';
COMMENT ON FUNCTION intent._load_library() IS
    'Internal: loads the pg_intent library in this session, which registers its settings (intent.*); does nothing else.';

-- Statements in order: the library is loaded before pg_settings is read.
CREATE FUNCTION intent._settings()
RETURNS TABLE (name text, setting text, unit text, type text, default_value text,
               reset_value text, context text, source text, description text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM intent._load_library();
    RETURN QUERY
    SELECT s.name, s.setting, s.unit, s.vartype, s.boot_val, s.reset_val, s.context, s.source,
           s.short_desc OPERATOR(pg_catalog.||) coalesce(' ' OPERATOR(pg_catalog.||) s.extra_desc, '')
      FROM pg_catalog.pg_settings s
     WHERE s.name OPERATOR(pg_catalog.~~) 'intent.%'
     ORDER BY s.name;
END
$$;
COMMENT ON FUNCTION intent._settings() IS
    'Internal: the rows of the view intent.settings (loads the library first, then reads pg_settings).';

CREATE VIEW intent.settings WITH (security_invoker = true) AS
SELECT name, setting, unit, type, default_value, reset_value, context, source, description
  FROM intent._settings();
COMMENT ON VIEW intent.settings IS
    'pg_intent''s settings (intent.*) with this session''s values, readable in any session: unlike SHOW, it works before the library is loaded (it loads it). intent.retention is how long a finished job, and so its idempotency key, is kept.';
COMMENT ON COLUMN intent.settings.name IS 'The setting''s name.';
COMMENT ON COLUMN intent.settings.setting IS 'Its value in this session, as SHOW gives it (without the unit: see unit).';
COMMENT ON COLUMN intent.settings.unit IS 'The unit of setting (ms for intent.claim_rescan), NULL when it has none.';
COMMENT ON COLUMN intent.settings.type IS 'bool, integer or string (an interval where the description says so), as pg_settings.vartype.';
COMMENT ON COLUMN intent.settings.default_value IS 'The built-in default: what it is when nothing sets it.';
COMMENT ON COLUMN intent.settings.reset_value IS 'What RESET gives in this session: the default, or what the configuration file, ALTER DATABASE or ALTER ROLE set.';
COMMENT ON COLUMN intent.settings.context IS 'Who may change it: user (any session), superuser (superusers and roles granted SET on it).';
COMMENT ON COLUMN intent.settings.source IS 'Where the current value comes from: default, configuration file, database, user, session…';
COMMENT ON COLUMN intent.settings.description IS 'What it does.';
