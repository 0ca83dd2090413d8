//! Secure by default, proven with real login roles (the test clusters trust local logins, so a
//! test connects as any role it creates):
//!
//! - PUBLIC can use nothing in schema `intent`: no table, view or sequence privilege, no
//!   EXECUTE on any function — checked in the catalog and by actually trying every one.
//! - `intent_app`, `intent_operator` and `intent_admin` carry exactly the calls the README
//!   documents, and nothing else (catalog and real calls, function by function).
//! - Functions run as `intent_owner` (no superuser, no BYPASSRLS), and nothing a caller plants in
//!   `public` or `pg_temp` — tables, functions, operators — is ever used by them, whatever the
//!   caller's search_path.
//! - Owner isolation: a session bound to an owner sees and acts on that owner's rows only.
//! - `pg_dump` / `pg_restore` keeps every row (pg_extension_config_dump).

use pg_intent_tests::dump;
use pg_intent_tests::fixtures::{self, EveryState};
use pg_intent_tests::roles::*;
use pg_intent_tests::*;
use std::collections::BTreeSet;

/// The calls of each role, as README § "Privileges and owner isolation" lists them.
const APP_CALLS: &[&str] = &[
    "submit_job",
    "submit_jobs",
    "begin_attempt",
    "complete_attempt",
    "fail_attempt",
    "mark_unknown",
    "heartbeat",
    "cancel_job",
    "validate_result",
    "job_id",
    "attempt_id",
    "job_of",
    "bound_owner",
];
const OPERATOR_CALLS: &[&str] = &["abandon_attempt", "sweep", "purge"];
const ADMIN_CALLS: &[&str] = &[
    "define_contract",
    "certify_provider",
    "revoke_certification",
];
/// What operators (and admins) may read: README § "Privileges and owner isolation" and the
/// views for the on-call engineer.
const OPERATOR_READS: &[&str] = &[
    "intent.jobs",
    "intent.attempts",
    "intent.events",
    "intent.contracts",
    "intent.certifications",
    "intent.jobs_by_state",
    "intent.attempts_to_reconcile",
    "intent.lost_races",
    "intent.certifications_expiring",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Public,
    App,
    Operator,
    Admin,
}

impl Level {
    fn may_execute(self, function: &str) -> bool {
        (self >= Level::App && APP_CALLS.contains(&function))
            || (self >= Level::Operator && OPERATOR_CALLS.contains(&function))
            || (self >= Level::Admin && ADMIN_CALLS.contains(&function))
    }

    /// Only operators and admins read, only SELECT, and only the tables and views the README
    /// names; nobody writes, nobody uses a sequence, nobody reads internal tables
    /// (`intent.retired_keys`).
    fn may_use_relation(self, relation: &str, privilege: &str) -> bool {
        self >= Level::Operator && privilege == "SELECT" && OPERATOR_READS.contains(&relation)
    }

    fn role_clause(self) -> &'static str {
        match self {
            Level::Public => "",
            Level::App => "IN ROLE intent_app",
            Level::Operator => "IN ROLE intent_operator",
            Level::Admin => "IN ROLE intent_admin",
        }
    }
}

const TABLE_PRIVILEGES: &[&str] = &[
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
];
const SEQUENCE_PRIVILEGES: &[&str] = &["USAGE", "SELECT", "UPDATE"];

/// Checks one role's privileges on everything in schema `intent`, first in the catalog, then
/// by trying: every function called with NULL arguments (refused with 42501 exactly when it is
/// not granted), every relation read, written and emptied, every sequence advanced. Nothing
/// may change.
async fn check_privileges(db: &Db<'_>, level: Level) {
    let admin = db.connect().await;
    let role = create_login_role(
        &admin,
        &format!("{level:?}").to_lowercase(),
        level.role_clause(),
    )
    .await;
    let functions = intent_functions(&admin).await;
    let relations = intent_relations(&admin).await;
    assert!(
        functions.len() >= 20 && relations.len() >= 9,
        "{functions:?} {relations:?}"
    );

    // The catalog, for the role and (at the PUBLIC level) for the pseudo-role PUBLIC itself.
    let mut subjects = vec![role.clone()];
    if level == Level::Public {
        subjects.push("public".to_string());
    }
    for subject in &subjects {
        let usage: bool = admin
            .query_one(
                "SELECT has_schema_privilege($1, 'intent', 'USAGE')",
                &[subject],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            usage,
            level >= Level::App,
            "{subject}: USAGE on schema intent"
        );
        let create: bool = admin
            .query_one(
                "SELECT has_schema_privilege($1, 'intent', 'CREATE')",
                &[subject],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!create, "{subject} may create in schema intent");
        for f in &functions {
            let may: bool = admin
                .query_one(
                    "SELECT has_function_privilege($1, $2, 'EXECUTE')",
                    &[subject, &f.signature],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                may,
                level.may_execute(&f.name),
                "{subject} ({level:?}): EXECUTE on {}",
                f.signature
            );
        }
        for r in &relations {
            let (check, privileges) = if r.kind == "S" {
                ("has_sequence_privilege", SEQUENCE_PRIVILEGES)
            } else {
                ("has_table_privilege", TABLE_PRIVILEGES)
            };
            for privilege in privileges {
                let may: bool = admin
                    .query_one(
                        &format!("SELECT {check}($1, $2, $3)"),
                        &[subject, &r.name, privilege],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(
                    may,
                    level.may_use_relation(&r.name, privilege),
                    "{subject} ({level:?}): {privilege} on {}",
                    r.name
                );
            }
        }
    }

    // By trying, as the role.
    let before = digest(&admin).await;
    let c = connect_role(db, &role).await;
    for f in &functions {
        let Some(call) = &f.call else { continue };
        let code = sqlstate_of(&c, call).await;
        if level.may_execute(&f.name) {
            assert_ne!(
                code.as_deref(),
                Some("42501"),
                "{level:?} may call {} ({call})",
                f.signature
            );
        } else {
            assert_eq!(
                code.as_deref(),
                Some("42501"),
                "{level:?} must not call {} ({call})",
                f.signature
            );
        }
    }
    for r in &relations {
        let name = &r.name;
        let attempts: Vec<(&str, String)> = if r.kind == "S" {
            vec![
                ("USAGE", format!("SELECT nextval('{name}')")),
                ("SELECT", format!("SELECT last_value FROM {name}")),
            ]
        } else {
            let col = r.first_column.as_deref().expect("a column");
            let mut v = vec![("SELECT", format!("SELECT * FROM {name} LIMIT 1"))];
            if r.kind == "r" {
                v.extend([
                    ("INSERT", format!("INSERT INTO {name} DEFAULT VALUES")),
                    (
                        "UPDATE",
                        format!("UPDATE {name} SET {col} = {col} WHERE false"),
                    ),
                    ("DELETE", format!("DELETE FROM {name} WHERE false")),
                    ("TRUNCATE", format!("TRUNCATE {name}")),
                ]);
            }
            v
        };
        for (privilege, sql) in attempts {
            let code = sqlstate_of(&c, &sql).await;
            if level.may_use_relation(&r.name, privilege) {
                assert_eq!(code, None, "{level:?}: {sql}");
            } else {
                assert_eq!(code.as_deref(), Some("42501"), "{level:?}: {sql}");
            }
        }
    }
    assert_eq!(digest(&admin).await, before, "{level:?}: nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_can_use_nothing_in_schema_intent() {
    let db = Cluster::shared().fresh_db("sec_public").await;
    let admin = db.connect().await;
    // Something to protect.
    submit(&admin, "alice", "k", "gpu", &json!({}))
        .await
        .unwrap();
    check_privileges(&db, Level::Public).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_has_exactly_the_documented_privileges() {
    let db = Cluster::shared().fresh_db("sec_roles").await;
    let admin = db.connect().await;
    submit(&admin, "alice", "k", "gpu", &json!({}))
        .await
        .unwrap();
    for level in [Level::App, Level::Operator, Level::Admin] {
        check_privileges(&db, level).await;
    }
}

/// An application login can run the whole protocol through its calls, and is refused
/// everything else; operators and admins add exactly their calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_make_their_calls_for_real() {
    let db = Cluster::shared().fresh_db("sec_calls").await;
    let admin = db.connect().await;
    let app_role = create_login_role(&admin, "app", "IN ROLE intent_app").await;
    let operator_role = create_login_role(&admin, "operator", "IN ROLE intent_operator").await;
    let admin_role = create_login_role(&admin, "admin", "IN ROLE intent_admin").await;
    let app = connect_role(&db, &app_role).await;
    let operator = connect_role(&db, &operator_role).await;
    let contracts = connect_role(&db, &admin_role).await;

    // The application: submit, begin, heartbeat, report, cancel, validate, derive ids.
    assert_eq!(
        contracts
            .query_one(
                "SELECT intent.define_contract('shape', '{\"type\": \"object\"}')",
                &[]
            )
            .await
            .unwrap()
            .get::<_, i32>(0),
        1
    );
    let s = submit_full(
        &app,
        "alice",
        "k1",
        "gpu",
        &json!({"p": 1}),
        Some("shape"),
        3,
    )
    .await
    .unwrap();
    assert!(s.created);
    let a1 = begin(&app, s.job_id, None, "1 hour").await.unwrap();
    assert!(
        heartbeat(&app, a1.attempt_id, Some("1 hour"))
            .await
            .unwrap()
    );
    mark_unknown(&app, a1.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    refusal(begin(&app, s.job_id, None, "1 hour").await, "IJ003");
    // Only an operator may abandon.
    refusal(abandon(&app, a1.attempt_id, "give up").await, "42501");
    abandon(&operator, a1.attempt_id, "reconciler: no record")
        .await
        .unwrap();
    refusal(
        begin(&app, s.job_id, Some("backup"), "1 hour").await,
        "IJ005",
    );
    // Only an admin may certify.
    let certify = "SELECT intent.certify_provider('backup', 'shape', '{\"suite\": \"passed\"}')";
    assert_eq!(sqlstate_of(&app, certify).await.as_deref(), Some("42501"));
    assert_eq!(
        sqlstate_of(&operator, certify).await.as_deref(),
        Some("42501")
    );
    assert_eq!(sqlstate_of(&contracts, certify).await, None);
    let a2 = begin(&app, s.job_id, Some("backup"), "1 hour")
        .await
        .unwrap();
    assert_eq!(
        complete(&app, a2.attempt_id, 1, &json!({"ok": true}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(&app, a1.attempt_id, 1, &json!({"late": true}))
            .await
            .unwrap(),
        "lost"
    );
    assert_eq!(
        fail(&app, a1.attempt_id, 1, &json!({"status": 500}), true)
            .await
            .unwrap(),
        "succeeded"
    );
    let s2 = submit(&app, "alice", "k2", "gpu", &json!({}))
        .await
        .unwrap();
    let b1 = begin(&app, s2.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        fail(&app, b1.attempt_id, 1, &json!({"status": 400}), false)
            .await
            .unwrap(),
        "failed"
    );
    let s3 = submit(&app, "alice", "k3", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(
        cancel(&app, s3.job_id, Some("user changed their mind"))
            .await
            .unwrap()
    );
    let row = app
        .query_one(
            "SELECT valid, intent.job_id('alice', 'k1'), intent.attempt_id($1, 2),
                    intent.job_of($2), intent.bound_owner()
               FROM intent.validate_result('shape', '[1]')",
            &[&s.job_id, &a2.attempt_id],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0));
    assert_eq!(row.get::<_, Uuid>(1), s.job_id);
    assert_eq!(row.get::<_, Uuid>(2), a2.attempt_id);
    assert_eq!(row.get::<_, Uuid>(3), s.job_id);
    assert_eq!(row.get::<_, Option<String>>(4), None);

    // What the application may not do, and operators may.
    for sql in [
        "SELECT intent.sweep()",
        "SELECT intent.purge('1 day', 10)",
        "SELECT count(*) FROM intent.jobs",
        "SELECT count(*) FROM intent.events",
        "SELECT count(*) FROM intent.jobs_by_state",
        "SELECT count(*) FROM intent.attempts_to_reconcile",
        "SELECT count(*) FROM intent.lost_races",
        "SELECT count(*) FROM intent.certifications_expiring",
    ] {
        assert_eq!(
            sqlstate_of(&app, sql).await.as_deref(),
            Some("42501"),
            "app: {sql}"
        );
        assert_eq!(sqlstate_of(&operator, sql).await, None, "operator: {sql}");
    }
    // Nobody writes the tables directly, not even an admin.
    for sql in [
        "UPDATE intent.jobs SET state = 'succeeded'",
        "DELETE FROM intent.events",
        "INSERT INTO intent.contracts (name, output_schema) VALUES ('x', '{}')",
        "UPDATE intent.certifications SET revoked_at = NULL",
        "TRUNCATE intent.attempts",
    ] {
        for c in [&app, &operator, &contracts] {
            assert_eq!(sqlstate_of(c, sql).await.as_deref(), Some("42501"), "{sql}");
        }
    }
    // Contracts: admins only.
    for sql in [
        "SELECT intent.define_contract('shape2', '{}')",
        "SELECT intent.revoke_certification('backup', 'shape', 'failed re-test')",
    ] {
        assert_eq!(sqlstate_of(&app, sql).await.as_deref(), Some("42501"));
        assert_eq!(sqlstate_of(&operator, sql).await.as_deref(), Some("42501"));
        assert_eq!(sqlstate_of(&contracts, sql).await, None);
    }
}

/// The functions run as a role that row-level security binds; SECURITY DEFINER code that is
/// not C pins its search_path with a SET clause (the C functions pin it inside each call;
/// `nothing_planted_in_public_or_pg_temp_is_ever_used` proves they do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_run_as_an_owner_that_row_security_binds() {
    let db = Cluster::shared().fresh_db("sec_definer").await;
    let admin = db.connect().await;
    let owner = admin
        .query_one(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = 'intent_owner'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            owner.get::<_, bool>(0),
            owner.get::<_, bool>(1),
            owner.get::<_, bool>(2)
        ),
        (false, false, false),
        "intent_owner: no superuser, no BYPASSRLS, no login"
    );
    let functions = intent_functions(&admin).await;
    let mut definers = BTreeSet::new();
    for f in &functions {
        assert_eq!(
            f.owner, "intent_owner",
            "{} is owned by {}",
            f.signature, f.owner
        );
        if f.security_definer {
            definers.insert(f.name.clone());
        }
        if f.language != "c" && f.language != "internal" {
            assert_eq!(
                f.config.as_deref(),
                Some(&["search_path=pg_catalog, pg_temp".to_string()][..]),
                "{} ({}) must pin its search_path",
                f.signature,
                f.language
            );
        }
    }
    // Every call a role is granted that reads or writes the tables runs as intent_owner: as a
    // SECURITY DEFINER function, or (define_contract, which must know its caller) by switching
    // to its owner itself (contract_definer_is_read_and_the_work_runs_as_intent_owner).
    for name in APP_CALLS.iter().chain(OPERATOR_CALLS).chain(ADMIN_CALLS) {
        if ![
            "job_id",
            "attempt_id",
            "job_of",
            "bound_owner",
            "define_contract",
        ]
        .contains(name)
        {
            assert!(definers.contains(*name), "{name} is not SECURITY DEFINER");
        }
    }
    assert!(
        !definers.contains("define_contract"),
        "define_contract reads its caller"
    );
    for relation in intent_relations(&admin).await {
        assert_eq!(relation.owner, "intent_owner", "{}", relation.name);
    }
    for table in ["intent.jobs", "intent.attempts", "intent.events"] {
        let row = admin
            .query_one(
                "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0) && row.get::<_, bool>(1),
            "{table}: row-level security enabled and forced"
        );
    }
}

/// README § Privileges: the API functions are C functions, SECURITY DEFINER, that pin their
/// search path to pg_catalog inside each call (no SET clause: it would cost a settings change
/// per call); every other SECURITY DEFINER function (SQL or PL/pgSQL, which could resolve names
/// at run time) must carry `SET search_path = pg_catalog, pg_temp` (and qualify every name of ours). The shadow-object
/// tests below prove that the pinning holds for the C functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_security_definer_function_pins_its_search_path() {
    let db = Cluster::shared().fresh_db("sec_proconfig").await;
    let admin = db.connect().await;
    let functions = intent_functions(&admin).await;
    let unpinned: Vec<String> = functions
        .iter()
        .filter(|f| {
            f.security_definer
                && f.language != "c"
                && f.config.as_deref() != Some(&["search_path=pg_catalog, pg_temp".to_string()][..])
        })
        .map(|f| f.signature.clone())
        .collect();
    assert!(
        unpinned.is_empty(),
        "without a pinned search_path: {unpinned:?}"
    );
    // And the C ones are exactly the API, all SECURITY DEFINER.
    let c_api: Vec<&str> = functions
        .iter()
        .filter(|f| f.language == "c" && f.security_definer)
        .map(|f| f.name.as_str())
        .collect();
    for call in [
        "submit_job",
        "submit_jobs",
        "begin_attempt",
        "complete_attempt",
        "fail_attempt",
        "mark_unknown",
        "heartbeat",
        "abandon_attempt",
        "cancel_job",
        "sweep",
        "purge",
        "certify_provider",
        "revoke_certification",
        "validate_result",
    ] {
        assert!(
            c_api.contains(&call),
            "{call} is not a SECURITY DEFINER C function: {c_api:?}"
        );
    }
}

// --- shadows ------------------------------------------------------------------------------------

/// Operators planted in `public`: (operator, left type, right type, result type).
const SHADOW_OPERATORS: &[(&str, &str, &str, &str)] = &[
    ("=", "uuid", "uuid", "boolean"),
    ("<>", "uuid", "uuid", "boolean"),
    ("=", "text", "text", "boolean"),
    ("<>", "text", "text", "boolean"),
    ("=", "bigint", "bigint", "boolean"),
    ("=", "integer", "integer", "boolean"),
    ("<", "integer", "integer", "boolean"),
    (">=", "integer", "integer", "boolean"),
    ("=", "jsonb", "jsonb", "boolean"),
    ("=", "intent.job_state", "intent.job_state", "boolean"),
    (
        "=",
        "intent.attempt_state",
        "intent.attempt_state",
        "boolean",
    ),
    ("=", "timestamptz", "timestamptz", "boolean"),
    ("<", "timestamptz", "timestamptz", "boolean"),
    ("<=", "timestamptz", "timestamptz", "boolean"),
    (">", "timestamptz", "timestamptz", "boolean"),
    (">=", "timestamptz", "timestamptz", "boolean"),
    ("+", "timestamptz", "interval", "timestamptz"),
    ("-", "timestamptz", "interval", "timestamptz"),
    (">", "interval", "interval", "boolean"),
    ("<=", "interval", "interval", "boolean"),
    ("+", "bigint", "bigint", "bigint"),
    ("+", "integer", "integer", "integer"),
    ("->", "jsonb", "text", "jsonb"),
    ("->>", "jsonb", "text", "text"),
    ("?", "jsonb", "text", "boolean"),
    ("@>", "jsonb", "jsonb", "boolean"),
];

/// Functions planted in `public`: (signature, result type, result).
const SHADOW_FUNCTIONS: &[(&str, &str, &str)] = &[
    (
        "statement_timestamp()",
        "timestamptz",
        "'2000-01-01 00:00:00+00'",
    ),
    ("now()", "timestamptz", "'2000-01-01 00:00:00+00'"),
    (
        "clock_timestamp()",
        "timestamptz",
        "'2000-01-01 00:00:00+00'",
    ),
    (
        "transaction_timestamp()",
        "timestamptz",
        "'2000-01-01 00:00:00+00'",
    ),
    (
        "gen_random_uuid()",
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
    ),
    (
        "job_id(text, text)",
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
    ),
    (
        "attempt_id(uuid, integer)",
        "uuid",
        "'00000000-0000-0000-0000-000000000001'",
    ),
    (
        "job_of(uuid)",
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
    ),
    ("bound_owner()", "text", "'mallory'"),
    ("current_setting(text)", "text", "'mallory'"),
    ("current_setting(text, boolean)", "text", "'mallory'"),
    ("set_config(text, text, boolean)", "text", "'mallory'"),
    (
        "jsonb_build_object(text, text)",
        "jsonb",
        "'{\"shadow\": true}'",
    ),
    (
        "jsonb_build_object(text, uuid)",
        "jsonb",
        "'{\"shadow\": true}'",
    ),
    (
        "jsonb_build_object(text, jsonb)",
        "jsonb",
        "'{\"shadow\": true}'",
    ),
    (
        "jsonb_build_object(text, bigint)",
        "jsonb",
        "'{\"shadow\": true}'",
    ),
    (
        "jsonb_build_object(text, text, text, text)",
        "jsonb",
        "'{\"shadow\": true}'",
    ),
    ("to_jsonb(text)", "jsonb", "'{\"shadow\": true}'"),
    ("jsonb_typeof(jsonb)", "text", "'shadow'"),
    ("char_length(text)", "integer", "1"),
    ("octet_length(text)", "integer", "1"),
    ("length(text)", "integer", "1"),
    ("lower(text)", "text", "'shadow'"),
    ("format(text)", "text", "'shadow'"),
    ("pg_column_size(jsonb)", "integer", "1"),
    ("pg_advisory_xact_lock(bigint)", "void", "NULL"),
    ("pg_try_advisory_xact_lock(bigint)", "boolean", "true"),
];

/// The tables a caller might shadow.
const SHADOW_TABLES: &[&str] = &["jobs", "attempts", "events", "contracts", "certifications"];

/// What the superuser plants in `public` (where an ordinary role may not create since
/// PostgreSQL 15; an attacker with that right is the worst case): a log, tables named like ours
/// whose every write is logged and whose rows would change the answers if read (a finished
/// copy of each job the test submits, a contract that accepts only arrays, a certification for
/// an uncertified provider), functions and operators named like the ones the extension uses,
/// each logging its call.
fn public_shadows(keys: &[String]) -> String {
    let mut sql = String::from(
        "CREATE TABLE public.shadow_log (id bigserial PRIMARY KEY, what text NOT NULL);
         GRANT SELECT, INSERT ON public.shadow_log TO PUBLIC;
         GRANT USAGE ON SEQUENCE public.shadow_log_id_seq TO PUBLIC;
         CREATE FUNCTION public.shadow_hit(what text) RETURNS void LANGUAGE sql
             AS $$ INSERT INTO public.shadow_log (what) VALUES (what) $$;
         CREATE FUNCTION public.shadow_table_touched() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM public.shadow_hit(pg_catalog.concat(TG_OP, ' ', TG_TABLE_SCHEMA, '.', TG_TABLE_NAME));
             RETURN NULL;
         END $$;\n",
    );
    for t in SHADOW_TABLES {
        sql += &format!(
            "CREATE TABLE public.{t} (LIKE intent.{t} INCLUDING DEFAULTS);
             GRANT ALL ON public.{t} TO PUBLIC;\n"
        );
    }
    sql += "ALTER TABLE public.events ALTER COLUMN id DROP NOT NULL;
            INSERT INTO public.contracts (name, output_schema) VALUES ('shape', '{\"type\": \"array\"}');
            INSERT INTO public.certifications (id, provider, contract, contract_version, evidence, expires_at)
                 VALUES (1, 'backup', 'shape', 1, '{}', now() + interval '1 year');\n";
    for key in keys {
        sql += &format!(
            "INSERT INTO public.jobs (id, owner_id, idempotency_key, provider, params, state, version,
                                      result, max_attempts, attempt_count)
                 VALUES (intent.job_id('alice', '{key}'), 'alice', '{key}', 'gpu', '{{\"prompt\": \"x\"}}',
                         'succeeded', 99, '{{\"shadow\": true}}', 3, 3);
             INSERT INTO public.attempts (id, job_id, owner_id, attempt_no, provider, state,
                                          version_read, lease, deadline)
                 VALUES (intent.attempt_id(intent.job_id('alice', '{key}'), 1),
                         intent.job_id('alice', '{key}'), 'alice', 1, 'gpu', 'started', 99,
                         interval '1 hour', now() + interval '1 hour');\n"
        );
    }
    // Every write from now on is logged.
    for t in SHADOW_TABLES {
        sql += &format!(
            "CREATE TRIGGER shadow_touched BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
                 ON public.{t} FOR EACH STATEMENT EXECUTE FUNCTION public.shadow_table_touched();\n"
        );
    }
    for (signature, result, value) in SHADOW_FUNCTIONS {
        let body = if *result == "void" {
            format!("PERFORM public.shadow_hit('public.{signature}');")
        } else {
            format!("PERFORM public.shadow_hit('public.{signature}'); RETURN {value};")
        };
        sql += &format!(
            "CREATE FUNCTION public.{signature} RETURNS {result} LANGUAGE plpgsql AS $$ BEGIN {body} END $$;\n"
        );
    }
    for (i, (op, left, right, result)) in SHADOW_OPERATORS.iter().enumerate() {
        sql += &format!(
            "CREATE FUNCTION public.shadow_op_{i}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM public.shadow_hit('public.{op}({left}, {right})');
                 RETURN a OPERATOR(pg_catalog.{op}) b;
             END $$;
             CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = public.shadow_op_{i});\n"
        );
    }
    sql
}

/// What a session plants in its own `pg_temp`: tables named like ours (with rows, writes
/// logged) and functions named like ours.
fn temp_shadows(keys: &[String]) -> String {
    let mut sql = String::new();
    for t in SHADOW_TABLES {
        sql += &format!(
            "CREATE TEMP TABLE {t} (id uuid, job_id uuid, owner_id text, idempotency_key text,
                                     provider text, params jsonb, contract text, state text,
                                     version bigint, version_read bigint, completed_by uuid,
                                     result jsonb, error jsonb, max_attempts integer,
                                     attempt_count integer, attempt_no integer, name text,
                                     output_schema jsonb, kind text, detail jsonb,
                                     deadline timestamptz, expires_at timestamptz);\n"
        );
    }
    sql += "INSERT INTO pg_temp.contracts (name, output_schema) VALUES ('shape', '{\"type\": \"array\"}');
            INSERT INTO pg_temp.certifications (provider, contract, expires_at)
                 VALUES ('backup', 'shape', '2999-01-01');\n";
    for key in keys {
        for n in 0..2 {
            sql += &format!(
                "INSERT INTO pg_temp.jobs (id, owner_id, idempotency_key, provider, params, state, version)
                     VALUES ('{}', 'alice', '{key}', 'gpu', '{{\"prompt\": \"x\"}}', 'succeeded', {});\n",
                job_id_of("alice", key),
                98 + n
            );
        }
    }
    for t in SHADOW_TABLES {
        sql += &format!(
            "CREATE TRIGGER shadow_touched BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE
                 ON pg_temp.{t} FOR EACH STATEMENT EXECUTE FUNCTION public.shadow_table_touched();\n"
        );
    }
    for (signature, result, value) in SHADOW_FUNCTIONS.iter().take(9) {
        sql += &format!(
            "CREATE FUNCTION pg_temp.{signature} RETURNS {result} LANGUAGE plpgsql
                 AS $$ BEGIN PERFORM public.shadow_hit('pg_temp.{signature}'); RETURN {value}; END $$;\n"
        );
    }
    sql
}

/// What the shadows logged so far.
async fn shadow_log(admin: &Client) -> Vec<String> {
    admin
        .query("SELECT what FROM public.shadow_log ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The planted rows of the public shadow tables, as text.
async fn public_shadow_rows(admin: &Client) -> Vec<String> {
    let mut rows = Vec::new();
    for t in SHADOW_TABLES {
        for r in admin
            .query(&format!("SELECT t::text FROM public.{t} t ORDER BY 1"), &[])
            .await
            .unwrap()
        {
            rows.push(format!("{t}: {}", r.get::<_, String>(0)));
        }
    }
    rows
}

/// A caller's search_path cannot make the extension use anything but its own objects: shadow
/// tables, functions and operators planted in `public` and in `pg_temp` are never called, read
/// or written, under three hostile search paths (public before pg_catalog; pg_temp first;
/// public and pg_temp with pg_catalog implicit), while every call answers right and changes
/// the real tables. A control at the end of each round shows the shadows are live: the same
/// session's own unqualified SQL does reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_planted_in_public_or_pg_temp_is_ever_used() {
    let db = Cluster::shared().fresh_db("sec_shadows").await;
    let admin = db.connect().await;
    let paths = [
        "public, pg_catalog, pg_temp",
        "pg_temp, public, pg_catalog",
        "public, pg_temp",
    ];
    let keys: Vec<String> = (0..paths.len()).map(|i| format!("shadow-{i}")).collect();
    admin
        .batch_execute("SELECT intent.define_contract('shape', '{\"type\": \"object\", \"required\": [\"ok\"]}')")
        .await
        .unwrap();
    admin
        .batch_execute(&public_shadows(&keys))
        .await
        .unwrap_or_else(|e| panic!("plant public shadows: {:?}", SqlError::from_error(&e)));
    let planted = public_shadow_rows(&admin).await;
    let app_role = create_login_role(&admin, "shadow_app", "IN ROLE intent_app").await;
    let operator_role = create_login_role(&admin, "shadow_op", "IN ROLE intent_operator").await;
    let admin_role = create_login_role(&admin, "shadow_admin", "IN ROLE intent_admin").await;

    for (round, path) in paths.iter().enumerate() {
        let key = &keys[round];
        let mut sessions = Vec::new();
        for role in [&app_role, &operator_role, &admin_role] {
            let c = connect_role(&db, role).await;
            c.batch_execute(&temp_shadows(&keys))
                .await
                .unwrap_or_else(|e| panic!("plant temp shadows: {:?}", SqlError::from_error(&e)));
            c.batch_execute(&format!("SET search_path = {path}"))
                .await
                .unwrap();
            sessions.push(c);
        }
        let [app, operator, contracts] = &sessions[..] else {
            unreachable!()
        };
        let what = format!("search_path = {path}");

        // A job with a contract: the shadow job row (succeeded, version 99) is not a replay.
        let s = submit_full(
            app,
            "alice",
            key,
            "gpu",
            &json!({"prompt": "x"}),
            Some("shape"),
            3,
        )
        .await
        .unwrap();
        assert_eq!(
            (
                s.job_id,
                s.created,
                s.state.as_str(),
                s.version,
                s.result.clone()
            ),
            (job_id_of("alice", key), true, "pending", 1, None),
            "{what}"
        );
        let again = submit_full(
            app,
            "alice",
            key,
            "gpu",
            &json!({"prompt": "x"}),
            Some("shape"),
            3,
        )
        .await
        .unwrap();
        assert!(!again.created, "{what}");
        // And in a batch: a replay, and a new job (whose shadow copy is not a replay either).
        let batch = app
            .query(
                "SELECT job_id, created, version, sqlstate
                   FROM intent.submit_jobs(ARRAY['alice', 'alice'], ARRAY[$1, $2],
                                           ARRAY['gpu', 'gpu'],
                                           ARRAY['{\"prompt\": \"x\"}', '{}']::jsonb[],
                                           ARRAY['shape', NULL])
                  ORDER BY ordinality",
                &[key, &format!("{key}-batch")],
            )
            .await
            .unwrap();
        let batch: Vec<(Uuid, bool, i64, Option<String>)> = batch
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        assert_eq!(
            batch,
            [
                (s.job_id, false, 1, None),
                (job_id_of("alice", &format!("{key}-batch")), true, 1, None)
            ],
            "{what}"
        );
        // The shadow certification does not count.
        refusal(
            begin(app, s.job_id, Some("backup"), "1 hour").await,
            "IJ005",
        );
        let a1 = begin(app, s.job_id, None, "1 hour").await.unwrap();
        assert_eq!((a1.attempt_no, a1.version), (1, 1), "{what}");
        assert_eq!(a1.attempt_id, attempt_id_of(s.job_id, 1));
        refusal(begin(app, s.job_id, None, "1 hour").await, "IJ002");
        assert!(
            heartbeat(app, a1.attempt_id, Some("1 hour")).await.unwrap(),
            "{what}"
        );
        // The real contract wants an object; the shadow one an array.
        assert_eq!(
            complete(app, a1.attempt_id, 1, &json!([1, 2]))
                .await
                .unwrap(),
            "rejected",
            "{what}"
        );
        let a2 = begin(app, s.job_id, None, "1 hour").await.unwrap();
        mark_unknown(app, a2.attempt_id, Some("client timeout"))
            .await
            .unwrap();
        refusal(begin(app, s.job_id, None, "1 hour").await, "IJ003");
        abandon(operator, a2.attempt_id, "reconciler")
            .await
            .unwrap();
        contracts
            .query_one(
                "SELECT intent.certify_provider('backup', 'shape', '{\"suite\": \"passed\"}')",
                &[],
            )
            .await
            .unwrap();
        let a3 = begin(app, s.job_id, Some("backup"), "1 hour")
            .await
            .unwrap();
        assert_eq!(a3.attempt_no, 3, "{what}");
        assert_eq!(
            complete(app, a3.attempt_id, 1, &json!({"ok": true}))
                .await
                .unwrap(),
            "won",
            "{what}"
        );
        assert_eq!(
            complete(app, a2.attempt_id, 1, &json!({"ok": "late"}))
                .await
                .unwrap(),
            "lost"
        );
        assert_eq!(
            fail(app, a2.attempt_id, 1, &json!({"status": 500}), true)
                .await
                .unwrap(),
            "succeeded"
        );
        assert!(
            contracts
                .query_one(
                    "SELECT intent.revoke_certification('backup', 'shape', 'failed re-test')",
                    &[]
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        );
        assert_eq!(
            contracts
                .query_one(
                    "SELECT intent.define_contract('shape', '{\"type\": \"object\", \"required\": [\"ok\"]}')",
                    &[]
                )
                .await
                .unwrap()
                .get::<_, i32>(0),
            1,
            "{what}: the same definition changes nothing"
        );

        // A definite failure, a cancel, a lease that runs out (simulated) and a sweep.
        let f = submit(app, "alice", &format!("{key}-fail"), "gpu", &json!({}))
            .await
            .unwrap();
        let fa = begin(app, f.job_id, None, "1 hour").await.unwrap();
        assert_eq!(
            fail(app, fa.attempt_id, 1, &json!({"status": 400}), false)
                .await
                .unwrap(),
            "failed"
        );
        let k = submit(app, "alice", &format!("{key}-cancel"), "gpu", &json!({}))
            .await
            .unwrap();
        assert!(cancel(app, k.job_id, Some("withdrawn")).await.unwrap());
        assert!(!cancel(app, k.job_id, None).await.unwrap());
        let l = submit(app, "alice", &format!("{key}-lapse"), "gpu", &json!({}))
            .await
            .unwrap();
        let la = begin(app, l.job_id, None, "1 hour").await.unwrap();
        admin
            .execute(
                "UPDATE intent.attempts SET deadline = started_at + interval '1 microsecond' WHERE id = $1",
                &[&la.attempt_id],
            )
            .await
            .unwrap();
        assert_eq!(
            submit(app, "alice", &format!("{key}-lapse"), "gpu", &json!({}))
                .await
                .unwrap()
                .state,
            "unknown",
            "{what}: the deadline rule"
        );
        assert!(
            !heartbeat(app, la.attempt_id, None).await.unwrap(),
            "{what}"
        );
        let lb = submit(app, "alice", &format!("{key}-sweep"), "gpu", &json!({}))
            .await
            .unwrap();
        let lba = begin(app, lb.job_id, None, "1 hour").await.unwrap();
        admin
            .execute(
                "UPDATE intent.attempts SET deadline = started_at + interval '1 microsecond' WHERE id = $1",
                &[&lba.attempt_id],
            )
            .await
            .unwrap();
        assert_eq!(sweep(operator).await.unwrap(), 1, "{what}");
        assert_eq!(
            operator
                .query_one("SELECT intent.purge('1 day', 10)", &[])
                .await
                .unwrap()
                .get::<_, i64>(0),
            0
        );
        let ids = app
            .query_one(
                "SELECT intent.job_id('alice', $1), intent.attempt_id($2, 3), intent.job_of($3),
                        intent.bound_owner(), v.valid
                   FROM intent.validate_result('shape', '{\"ok\": true}') v",
                &[key, &s.job_id, &a3.attempt_id],
            )
            .await
            .unwrap();
        assert_eq!(ids.get::<_, Uuid>(0), s.job_id);
        assert_eq!(ids.get::<_, Uuid>(1), a3.attempt_id);
        assert_eq!(ids.get::<_, Uuid>(2), s.job_id);
        assert_eq!(ids.get::<_, Option<String>>(3), None);
        assert!(ids.get::<_, bool>(4));
        for view in [
            "jobs_by_state",
            "attempts_to_reconcile",
            "lost_races",
            "certifications_expiring",
        ] {
            operator
                .query_one(&format!("SELECT count(*) FROM intent.{view}"), &[])
                .await
                .unwrap_or_else(|e| panic!("{what}: {view}: {e:?}"));
        }

        // The real tables hold all of it.
        let job = job_row(&admin, s.job_id).await;
        assert_eq!(
            (
                job.state.as_str(),
                job.version,
                job.completed_by,
                job.result
            ),
            (
                "succeeded",
                2,
                Some(a3.attempt_id),
                Some(json!({"ok": true}))
            ),
            "{what}"
        );
        let states: Vec<String> = attempt_rows(&admin, s.job_id)
            .await
            .into_iter()
            .map(|a| a.state)
            .collect();
        assert_eq!(states, ["failed", "discarded", "succeeded"], "{what}");
        let kinds: Vec<String> = event_rows(&admin, s.job_id)
            .await
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                "contract_violation",
                "timeout",
                "abandoned",
                "late_result",
                "late_failure"
            ],
            "{what}"
        );
        assert_eq!(job_row(&admin, f.job_id).await.state, "failed");
        assert_eq!(job_row(&admin, k.job_id).await.state, "cancelled");
        assert_eq!(job_row(&admin, l.job_id).await.state, "unknown");
        assert_eq!(job_row(&admin, lb.job_id).await.state, "unknown");

        // The shadows were never used.
        assert_eq!(shadow_log(&admin).await, Vec::<String>::new(), "{what}");
        assert_eq!(public_shadow_rows(&admin).await, planted, "{what}");
        let temp_rows: i64 = app
            .query_one("SELECT count(*) FROM pg_temp.jobs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(temp_rows, 2 * keys.len() as i64, "{what}");

        // Control: the same session's own unqualified SQL does reach the shadows.
        let visible: i64 = app
            .query_one("SELECT count(*) FROM jobs", &[])
            .await
            .unwrap()
            .get(0);
        let expected = if path.starts_with("pg_temp") {
            2 * keys.len()
        } else {
            keys.len()
        };
        assert_eq!(
            visible, expected as i64,
            "{what}: control, unqualified table"
        );
        if path.contains("pg_catalog") {
            app.query_one("SELECT now()", &[]).await.unwrap();
            assert_eq!(
                shadow_log(&admin).await,
                ["public.now()"],
                "{what}: control, unqualified function"
            );
            admin
                .batch_execute("TRUNCATE public.shadow_log")
                .await
                .unwrap();
        }
    }
}

// --- owner isolation ----------------------------------------------------------------------------

/// One tenant's stake: a job in each interesting state, with its ids.
struct Stake {
    running: Begun,
    unknown: Begun,
    won_job: Uuid,
    lost: Begun,
    ids: Vec<Uuid>,
}

/// As `c` (bound to `owner`), creates a running job, an unknown attempt, and a job won by one
/// attempt and lost by another (a lost race).
async fn stake(c: &Client, operator: &Client, owner: &str) -> Stake {
    let j1 = submit(c, owner, "running", "gpu", &json!({}))
        .await
        .unwrap();
    let running = begin(c, j1.job_id, None, "1 hour").await.unwrap();
    let j2 = submit(c, owner, "unknown", "gpu", &json!({}))
        .await
        .unwrap();
    let unknown = begin(c, j2.job_id, None, "1 hour").await.unwrap();
    mark_unknown(c, unknown.attempt_id, Some("timeout"))
        .await
        .unwrap();
    let j3 = submit(c, owner, "raced", "gpu", &json!({})).await.unwrap();
    let lost = begin(c, j3.job_id, None, "1 hour").await.unwrap();
    abandon(operator, lost.attempt_id, "stuck").await.unwrap();
    let winner = begin(c, j3.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(c, winner.attempt_id, 1, &json!({"n": 1}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(c, lost.attempt_id, 1, &json!({"n": 2}))
            .await
            .unwrap(),
        "lost"
    );
    Stake {
        running,
        unknown,
        won_job: j3.job_id,
        lost,
        ids: vec![j1.job_id, j2.job_id, j3.job_id],
    }
}

/// The owners a session can see in each table and view.
async fn owners_seen(c: &Client) -> Vec<(String, BTreeSet<String>)> {
    let mut seen = Vec::new();
    for (what, sql) in [
        ("jobs", "SELECT DISTINCT owner_id FROM intent.jobs"),
        ("attempts", "SELECT DISTINCT owner_id FROM intent.attempts"),
        ("events", "SELECT DISTINCT owner_id FROM intent.events"),
        (
            "attempts_to_reconcile",
            "SELECT DISTINCT owner_id FROM intent.attempts_to_reconcile",
        ),
        (
            "lost_races",
            "SELECT DISTINCT owner_id FROM intent.lost_races",
        ),
    ] {
        let owners = c
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        seen.push((what.to_string(), owners));
    }
    seen
}

fn only(owner: &str) -> BTreeSet<String> {
    BTreeSet::from([owner.to_string()])
}

async fn bound_owner(c: &Client) -> Option<String> {
    c.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0)
}

async fn total_jobs_by_state(c: &Client) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(jobs), 0)::bigint FROM intent.jobs_by_state",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Two tenants, each a login role bound for good (`ALTER ROLE … SET intent.owner_id`). Tenant
/// A cannot read tenant B's jobs, attempts or events (tables and views), and cannot act on
/// them even knowing their ids: every call is "not found" (IJ007), a submit for B is 42501,
/// and B's rows do not change. A cannot rebind its session. An unbound session sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_and_touches_only_its_own_jobs() {
    let db = Cluster::shared().fresh_db("sec_tenants").await;
    let admin = db.connect().await;
    let mut tenants = Vec::new();
    for owner in ["tenant-a", "tenant-b"] {
        let role = create_login_role(&admin, "tenant", "IN ROLE intent_operator").await;
        admin
            .batch_execute(&format!(
                "ALTER ROLE \"{role}\" SET intent.owner_id = '{owner}'"
            ))
            .await
            .unwrap();
        tenants.push(role);
    }
    let a = connect_role(&db, &tenants[0]).await;
    let b = connect_role(&db, &tenants[1]).await;
    assert_eq!(bound_owner(&a).await.as_deref(), Some("tenant-a"));
    assert_eq!(bound_owner(&b).await.as_deref(), Some("tenant-b"));
    let stake_a = stake(&a, &a, "tenant-a").await;
    let stake_b = stake(&b, &b, "tenant-b").await;

    // Reading: only its own rows, in every table and view.
    for (what, owners) in owners_seen(&a).await {
        assert_eq!(owners, only("tenant-a"), "tenant A reads {what}");
    }
    for (what, owners) in owners_seen(&b).await {
        assert_eq!(owners, only("tenant-b"), "tenant B reads {what}");
    }
    assert_eq!(
        total_jobs_by_state(&a).await,
        3,
        "jobs_by_state counts A's jobs only"
    );
    for id in &stake_b.ids {
        let n: i64 = a
            .query_one("SELECT count(*) FROM intent.jobs WHERE id = $1", &[id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "A finds B's job {id} by id");
    }
    // A leaky function in A's own query sees A's rows only (the policy is applied first).
    admin
        .batch_execute(
            "CREATE FUNCTION public.leak(o text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
                 $$ BEGIN RAISE NOTICE 'leak: %', o; RETURN true; END $$;",
        )
        .await
        .unwrap();
    let (leaky, notices) = connect_role_with(&db, &tenants[0], None).await.unwrap();
    leaky
        .query("SELECT 1 FROM intent.jobs WHERE public.leak(owner_id)", &[])
        .await
        .unwrap();
    leaky
        .query(
            "SELECT 1 FROM intent.events WHERE public.leak(owner_id)",
            &[],
        )
        .await
        .unwrap();
    let leaked: BTreeSet<String> = notices.all().into_iter().collect();
    assert_eq!(
        leaked,
        BTreeSet::from(["NOTICE: leak: tenant-a".to_string()]),
        "what a leaky function saw"
    );

    // Acting on B's job with the right ids: not found, and nothing changes.
    let before = digest(&admin).await;
    let b_job = stake_b.ids[0];
    refusal(begin(&a, b_job, None, "1 hour").await, "IJ007");
    refusal(
        heartbeat(&a, stake_b.running.attempt_id, None).await,
        "IJ007",
    );
    refusal(
        complete(&a, stake_b.running.attempt_id, 1, &json!({"stolen": true})).await,
        "IJ007",
    );
    refusal(
        fail(
            &a,
            stake_b.running.attempt_id,
            1,
            &json!({"status": 400}),
            false,
        )
        .await,
        "IJ007",
    );
    refusal(
        mark_unknown(&a, stake_b.running.attempt_id, None).await,
        "IJ007",
    );
    refusal(
        abandon(&a, stake_b.unknown.attempt_id, "mine now").await,
        "IJ007",
    );
    refusal(
        abandon(&a, stake_b.running.attempt_id, "mine now").await,
        "IJ007",
    );
    refusal(cancel(&a, b_job, None).await, "IJ007");
    refusal(cancel(&a, stake_b.won_job, None).await, "IJ007");
    refusal(
        complete(&a, stake_b.lost.attempt_id, 1, &json!({"n": 3})).await,
        "IJ007",
    );
    // Submitting for B: refused whether or not the key exists, alone or in a batch.
    refusal(
        submit(&a, "tenant-b", "running", "gpu", &json!({})).await,
        "42501",
    );
    refusal(
        submit(&a, "tenant-b", "new-key", "gpu", &json!({})).await,
        "42501",
    );
    let batch: Vec<Option<String>> = a
        .query(
            "SELECT sqlstate FROM intent.submit_jobs(ARRAY['tenant-b', 'tenant-b'],
                                                     ARRAY['running', 'batch-key'],
                                                     ARRAY['gpu', 'gpu'], ARRAY['{}', '{}']::jsonb[])
              ORDER BY ordinality",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_else(|e| vec![SqlError::code_of(&e)]);
    assert!(
        batch.iter().all(|code| code.as_deref() == Some("42501")),
        "a batch for B: {batch:?}"
    );
    assert_eq!(digest(&admin).await, before, "B's rows are untouched");

    // sweep and purge in A's session concern A's rows only.
    admin
        .execute(
            "UPDATE intent.attempts SET deadline = started_at + interval '1 microsecond' WHERE id = $1",
            &[&stake_b.running.attempt_id],
        )
        .await
        .unwrap();
    admin
        .execute(
            "UPDATE intent.jobs SET created_at = created_at - interval '400 days',
                                    updated_at = updated_at - interval '400 days' WHERE id = $1",
            &[&stake_b.won_job],
        )
        .await
        .unwrap();
    let before = digest(&admin).await;
    assert_eq!(
        sweep(&a).await.unwrap(),
        0,
        "A's sweep skips B's lapsed attempt"
    );
    assert_eq!(
        a.query_one("SELECT intent.purge('1 day', 100)", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0,
        "A's purge skips B's old finished job"
    );
    assert_eq!(digest(&admin).await, before);
    assert_eq!(sweep(&b).await.unwrap(), 1, "B's own sweep finds it");

    // A cannot rebind its session, by SET, set_config or RESET.
    for sql in [
        "SET intent.owner_id = 'tenant-b'",
        "SET LOCAL intent.owner_id = 'tenant-b'",
        "SELECT set_config('intent.owner_id', 'tenant-b', false)",
        "SET intent.owner_id = ''",
        "RESET intent.owner_id",
        "SET SESSION AUTHORIZATION postgres",
    ] {
        let code = sqlstate_of(&a, sql).await;
        assert!(
            code.as_deref() == Some("42501") || (sql.starts_with("RESET") && code.is_none()),
            "{sql}: {code:?}"
        );
        assert_eq!(
            bound_owner(&a).await.as_deref(),
            Some("tenant-a"),
            "after {sql}"
        );
    }
    // Nor its role's setting.
    let code = sqlstate_of(
        &a,
        &format!("ALTER ROLE \"{}\" RESET intent.owner_id", tenants[0]),
    )
    .await;
    assert_eq!(code.as_deref(), Some("42501"));
    let code = sqlstate_of(
        &a,
        &format!(
            "ALTER ROLE \"{}\" SET intent.owner_id = 'tenant-b'",
            tenants[0]
        ),
    )
    .await;
    assert_eq!(code.as_deref(), Some("42501"));
    let fresh = connect_role(&db, &tenants[0]).await;
    assert_eq!(bound_owner(&fresh).await.as_deref(), Some("tenant-a"));

    // An unbound session (here the superuser; any role without the setting) sees every owner.
    for (what, owners) in owners_seen(&admin).await {
        assert_eq!(
            owners,
            BTreeSet::from(["tenant-a".to_string(), "tenant-b".to_string()]),
            "unbound session reads {what}"
        );
    }
    let _ = stake_a;
}

/// The setting can be given before the library is loaded (it is a placeholder then): the value
/// is discarded with a WARNING when the library loads, and the role's binding stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_before_the_library_loads_is_discarded() {
    let db = Cluster::shared().fresh_db("sec_preload").await;
    let admin = db.connect().await;
    submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let role = create_login_role(&admin, "tenant", "IN ROLE intent_operator").await;
    admin
        .batch_execute(&format!(
            "ALTER ROLE \"{role}\" SET intent.owner_id = 'tenant-a'"
        ))
        .await
        .unwrap();
    for first in [
        "SET intent.owner_id = 'tenant-b'",
        "SELECT set_config('intent.owner_id', 'tenant-b', false)",
        "BEGIN; SET LOCAL intent.owner_id = 'tenant-b'",
    ] {
        let (c, notices) = connect_role_with(&db, &role, None).await.unwrap();
        // Nothing of the extension has run in this session yet.
        c.batch_execute(first)
            .await
            .unwrap_or_else(|e| panic!("{first}: {e:?}"));
        assert_eq!(
            bound_owner(&c).await.as_deref(),
            Some("tenant-a"),
            "after {first}"
        );
        assert!(
            notices
                .all()
                .iter()
                .any(|n| n.starts_with("WARNING") && n.contains("intent.owner_id")),
            "{first}: a WARNING says the value was discarded: {:?}",
            notices.all()
        );
        let seen: i64 = c
            .query_one("SELECT count(*) FROM intent.jobs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, 0, "{first}: tenant-b's job stays hidden");
        refusal(
            submit(&c, "tenant-b", "k", "gpu", &json!({})).await,
            "42501",
        );
    }
}

/// The same attempt through the connection's startup options (`PGOPTIONS='-c
/// intent.owner_id=…'`, or `options=` in a connection string): the placeholder takes the place
/// of the role's setting, is discarded with a WARNING when the library loads — and the
/// session is left *unbound*, seeing and acting on every owner's jobs — unless the library puts
/// the role's binding back when it loads, as it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_through_startup_options_does_not_unbind() {
    let db = Cluster::shared().fresh_db("sec_options").await;
    let admin = db.connect().await;
    let theirs = submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let role = create_login_role(&admin, "tenant", "IN ROLE intent_operator").await;
    admin
        .batch_execute(&format!(
            "ALTER ROLE \"{role}\" SET intent.owner_id = 'tenant-a'"
        ))
        .await
        .unwrap();
    for options in ["-c intent.owner_id=tenant-b", "-c intent.owner_id="] {
        // Refusing the connection would do as well as keeping the binding.
        let Ok((c, _notices)) = connect_role_with(&db, &role, Some(options)).await else {
            continue;
        };
        assert_eq!(
            bound_owner(&c).await.as_deref(),
            Some("tenant-a"),
            "{options}"
        );
        let seen: i64 = c
            .query_one("SELECT count(*) FROM intent.jobs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, 0, "{options}: tenant-b's job stays hidden");
        refusal(cancel(&c, theirs.job_id, None).await, "IJ007");
    }
}

/// A trusted gateway on pooled connections binds each request with `SET LOCAL` (it was granted
/// SET on the parameter); the binding ends with the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_binds_each_transaction() {
    let db = Cluster::shared().fresh_db("sec_gateway").await;
    let admin = db.connect().await;
    let theirs = submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&admin, "gateway", "IN ROLE intent_app").await;
    admin
        .batch_execute(&format!(
            "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
        ))
        .await
        .unwrap();
    let c = connect_role(&db, &gateway).await;
    // The very first statement of the session binds (before the library is loaded, too).
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    assert_eq!(bound_owner(&c).await.as_deref(), Some("tenant-a"));
    let mine = submit(&c, "tenant-a", "k", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(mine.created);
    refusal(cancel(&c, theirs.job_id, None).await, "IJ007");
    c.batch_execute("ROLLBACK").await.unwrap();
    // Per request, each bound to its owner.
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    let mine = submit(&c, "tenant-a", "k", "gpu", &json!({}))
        .await
        .unwrap();
    refusal(
        submit(&c, "tenant-b", "k2", "gpu", &json!({})).await,
        "42501",
    );
    c.batch_execute("ROLLBACK").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    assert!(
        submit(&c, "tenant-a", "k", "gpu", &json!({}))
            .await
            .unwrap()
            .created
    );
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-b'")
        .await
        .unwrap();
    assert!(cancel(&c, theirs.job_id, Some("withdrawn")).await.unwrap());
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-b'")
        .await
        .unwrap();
    refusal(begin(&c, mine.job_id, None, "1 hour").await, "IJ007");
    c.batch_execute("ROLLBACK").await.unwrap();
    // After the transaction the session is unbound again (as the gateway's own role is).
    assert_eq!(bound_owner(&c).await, None);
    assert_eq!(job_row(&admin, theirs.job_id).await.state, "cancelled");
    assert_eq!(job_row(&admin, mine.job_id).await.state, "pending");
    // Without the grant, a role cannot bind at all.
    let app = create_login_role(&admin, "app", "IN ROLE intent_app").await;
    let c = connect_role(&db, &app).await;
    c.query_one("SELECT intent.job_id('a', 'b')", &[])
        .await
        .unwrap();
    assert_eq!(
        sqlstate_of(&c, "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
            .await
            .as_deref(),
        Some("42501")
    );
}

// --- backups --------------------------------------------------------------------------------

/// `pg_dump` (custom format) and `pg_restore` into a fresh database keep every row of jobs,
/// attempts, events, contracts and certifications, byte for byte, and the identity sequences:
/// the next event after the restore gets a new id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_restore_keep_every_row() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db("sec_dump").await;
    let c = db.connect().await;
    let EveryState {
        running,
        running_attempt,
        rejected_attempt: w1,
    } = fixtures::every_state(&c).await;
    let before = dump::table_rows(&c).await;

    let file = cluster.dir().join(format!("{}.dump", db.name));
    dump::dump(cluster, &db.name, &file);
    let restored = format!("{}_restored", db.name);
    c.batch_execute(&format!("CREATE DATABASE \"{restored}\""))
        .await
        .unwrap();
    dump::restore(cluster, &restored, &file);
    let r = cluster.connect(&restored).await;
    let after = dump::table_rows(&r).await;
    for ((table, rows), (_, restored_rows)) in before.iter().zip(&after) {
        assert_eq!(rows, restored_rows, "{table} after dump and restore");
    }
    assert_eq!(before, after);

    // The restored database works: privileges, isolation and the identity sequence.
    let app_may: bool = r
        .query_one(
            "SELECT has_function_privilege('intent_app', 'intent.submit_job(text,text,text,jsonb,text,integer)', 'EXECUTE')
                AND NOT has_function_privilege('public', 'intent.submit_job(text,text,text,jsonb,text,integer)', 'EXECUTE')
                AND NOT has_table_privilege('public', 'intent.jobs', 'SELECT')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(app_may, "grants survive");
    let reused = submit(&r, "dave", "purged", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(
        reused.created && reused.version > 1,
        "the purged key's fencing tokens are remembered: {reused:?}"
    );
    let max_id: i64 = r
        .query_one("SELECT max(id) FROM intent.events", &[])
        .await
        .unwrap()
        .get(0);
    mark_unknown(&r, running_attempt.attempt_id, Some("after restore"))
        .await
        .unwrap();
    let new_id: i64 = r
        .query_one(
            "SELECT max(id) FROM intent.events WHERE attempt_id = $1",
            &[&running_attempt.attempt_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        new_id > max_id,
        "the new event's id {new_id} follows {max_id}"
    );
    assert_eq!(
        job_row(&r, running.job_id).await.state,
        "unknown",
        "the protocol goes on"
    );
    assert_eq!(
        complete(&r, w1.attempt_id, 1, &json!({"x": 1}))
            .await
            .unwrap(),
        "rejected",
        "the contract's checker is restored with it"
    );
    let _ = std::fs::remove_file(&file);
}

/// define_contract is SECURITY INVOKER (so that it knows its caller) and does its work as
/// intent_owner: an intent_admin that may not write intent.contracts itself defines a contract,
/// and the contract records it as the definer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_definer_is_read_and_the_work_runs_as_intent_owner() {
    let db = Cluster::shared().fresh_db("sec_define").await;
    let admin = db.connect().await;
    let role = create_login_role(&admin, "definer", "IN ROLE intent_admin").await;
    let c = connect_role(&db, &role).await;
    assert_eq!(
        sqlstate_of(
            &c,
            "INSERT INTO intent.contracts (name, output_schema) VALUES ('x', '{}')"
        )
        .await
        .as_deref(),
        Some("42501")
    );
    c.query("SELECT intent.define_contract('mine', '{}')", &[])
        .await
        .unwrap();
    let defined_by: String = admin
        .query_one(
            "SELECT defined_by::text FROM intent.contracts WHERE name = 'mine'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(defined_by, role);
}
