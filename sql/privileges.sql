-- pg_intent: secure by default.
--
-- 1. Everything belongs to intent_owner, a role that cannot log in and is not a superuser:
--    superusers bypass row-level security, and the SECURITY DEFINER functions must obey the
--    owner isolation policies (isolation.sql) like everyone else. (Contract checkers run as
--    the role that owns them, never as intent_owner.)
-- 2. Nothing is usable by PUBLIC.
-- 3. Three roles carry exactly the calls each kind of user needs (grant them to login roles):
--      intent_app       submit and run attempts: submit_job, submit_jobs, begin/complete/fail/
--                       mark_unknown, heartbeat, cancel_job, validate_result, bound_owner, the
--                       id derivations, the view intent.settings, purge_expired (by the
--                       database's retention only)
--      intent_operator  intent_app, plus abandon_attempt, record_reconciliation, sweep, purge
--                       and reading the tables
--      intent_admin     intent_operator, plus contracts and certifications
-- Roles are cluster-wide: they are created once and kept when the extension is dropped.

-- CREATE EXTENSION may run in several databases of one cluster at once, and roles are
-- cluster-wide: the loser of a creation race finds the role there, which is just as good.
DO $roles$
DECLARE
    r record;
BEGIN
    FOR r IN VALUES
        ('intent_owner', 'NOLOGIN NOSUPERUSER NOBYPASSRLS',
         'pg_intent: owns the intent schema; its functions run as it. Not for logging in.'),
        ('intent_app', 'NOLOGIN',
         'pg_intent: the calls an application needs (submit, attempts, cancel, ids).'),
        ('intent_operator', 'NOLOGIN IN ROLE intent_app',
         'pg_intent: intent_app plus abandon_attempt, sweep and reading the tables.'),
        ('intent_admin', 'NOLOGIN IN ROLE intent_operator',
         'pg_intent: intent_operator plus contracts and certifications.')
    LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r.column1) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I %s', r.column1, r.column2);
                -- Only the creator comments: comments on shared objects race too.
                EXECUTE format('COMMENT ON ROLE %I IS %L', r.column1, r.column3);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$roles$;

-- Hand every member of the extension to intent_owner.
DO $owner$
DECLARE
    obj record;
BEGIN
    EXECUTE 'ALTER SCHEMA intent OWNER TO intent_owner';
    FOR obj IN
        SELECT pg_catalog.pg_describe_object(d.classid, d.objid, 0) AS what, d.classid, d.objid
          FROM pg_catalog.pg_depend d
         WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass
           AND d.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'pg_intent')
           AND d.deptype = 'e'
    LOOP
        IF obj.classid = 'pg_catalog.pg_class'::regclass THEN
            -- Sequences owned by identity columns follow their table.
            IF (SELECT relkind FROM pg_catalog.pg_class WHERE oid = obj.objid) IN ('r', 'v', 'm') THEN
                EXECUTE format('ALTER TABLE %s OWNER TO intent_owner', obj.objid::regclass);
            END IF;
        ELSIF obj.classid = 'pg_catalog.pg_proc'::regclass THEN
            -- Except intent.distribute(): only superusers run it, with their own rights (it
            -- alters roles and tables on every node), so it stays the installing superuser's;
            -- were it intent_owner's, whoever could act as intent_owner could rewrite what a
            -- superuser runs.
            IF obj.objid <> 'intent.distribute()'::regprocedure THEN
                EXECUTE format('ALTER ROUTINE %s OWNER TO intent_owner', obj.objid::regprocedure);
            END IF;
        ELSIF obj.classid = 'pg_catalog.pg_type'::regclass THEN
            IF (SELECT typtype FROM pg_catalog.pg_type WHERE oid = obj.objid) = 'e' THEN
                EXECUTE format('ALTER TYPE %s OWNER TO intent_owner', obj.objid::regtype);
            END IF;
        END IF;
    END LOOP;
END
$owner$;

REVOKE ALL ON SCHEMA intent FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA intent FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA intent FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA intent FROM PUBLIC;

GRANT USAGE ON SCHEMA intent TO intent_app;
GRANT EXECUTE ON FUNCTION
    intent.submit_job(text, text, text, jsonb, text, integer),
    intent.submit_jobs(text[], text[], text[], jsonb[], text[], integer[]),
    intent.begin_attempt(uuid, text, interval, text),
    intent.complete_attempt(uuid, bigint, jsonb),
    intent.fail_attempt(uuid, bigint, jsonb, boolean, interval),
    intent.claim_attempts(text[], text, interval, integer),
    intent.mark_unknown(uuid, text),
    intent.heartbeat(uuid, interval),
    intent.cancel_job(uuid, text),
    intent.job_id(text, text),
    intent.attempt_id(uuid, integer),
    intent.job_of(uuid),
    intent.bound_owner(),
    intent.owner_admits(text),
    intent.validate_result(text, jsonb),
    intent._load_library(),
    intent._settings(),
    intent.purge_expired(integer)
  TO intent_app;
-- The settings are no secret (any role may SHOW them once the library is loaded), and an
-- application publishes intent.retention (how long a key is kept): every role of pg_intent
-- reads intent.settings.
GRANT SELECT ON intent.settings TO intent_app;

GRANT EXECUTE ON FUNCTION
    intent.abandon_attempt(uuid, text),
    intent.record_reconciliation(uuid, text, jsonb),
    intent.sweep(),
    intent.purge(interval, integer)
  TO intent_operator;
GRANT SELECT ON intent.jobs, intent.attempts, intent.events, intent.contracts, intent.certifications,
                intent.jobs_by_state, intent.attempts_to_reconcile, intent.lost_races,
                intent.certifications_expiring
  TO intent_operator;

-- Backups: pg_read_all_data is PostgreSQL's role for reading everything (what a non-superuser
-- pg_dump needs). The owner isolation policies call intent.bound_owner() (distributed, through
-- intent.owner_admits), so a reader of the tables must be able to call them too; they only
-- report the session's own binding.
GRANT EXECUTE ON FUNCTION intent.bound_owner(), intent.owner_admits(text) TO pg_read_all_data;

GRANT EXECUTE ON FUNCTION
    intent.define_contract(text, jsonb, regprocedure),
    intent.certify_provider(text, text, jsonb, interval),
    intent.revoke_certification(text, text, text)
  TO intent_admin;
