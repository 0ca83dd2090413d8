//! What PUBLIC and each of the roles may use in schema `intent`: in the catalog and by trying.

use pg_intent_tests::roles::*;
use pg_intent_tests::*;

/// The calls of each role, as README § "Privileges and owner isolation" lists them.
const APP_CALLS: &[&str] = &[
    "submit_job",
    "submit_jobs",
    "begin_attempt",
    "complete_attempt",
    "fail_attempt",
    "claim_attempts",
    "mark_unknown",
    "heartbeat",
    "cancel_job",
    "validate_result",
    "job_id",
    "attempt_id",
    "job_of",
    "bound_owner",
    "owner_admits",
    // The purge by the database's retention only, for an application's worker (0.5.0).
    "purge_expired",
    // What the view intent.settings calls (it reads no table: settings, readable by any role).
    "_load_library",
    "_settings",
];
const OPERATOR_CALLS: &[&str] = &["abandon_attempt", "record_reconciliation", "sweep", "purge"];
const ADMIN_CALLS: &[&str] = &[
    "define_contract",
    "certify_provider",
    "revoke_certification",
];
/// The granted calls that are not SECURITY DEFINER: the pure id derivations, bound_owner and
/// owner_admits (what the policies call), define_contract (which must know its caller and
/// switches to intent_owner itself), and what intent.settings calls (no table read).
const NOT_DEFINERS: &[&str] = &[
    "job_id",
    "attempt_id",
    "job_of",
    "bound_owner",
    "owner_admits",
    "define_contract",
    "_load_library",
    "_settings",
];

/// Every granted call that reads or writes the tables: a SECURITY DEFINER C function.
pub(crate) fn definer_calls() -> impl Iterator<Item = &'static str> {
    APP_CALLS
        .iter()
        .chain(OPERATOR_CALLS)
        .chain(ADMIN_CALLS)
        .copied()
        .filter(|name| !NOT_DEFINERS.contains(name))
}

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

/// What every role of pg_intent may read: its settings (docs/reference.md § 7).
const APP_READS: &[&str] = &["intent.settings"];

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
    /// names (and every role the settings); nobody writes, nobody uses a sequence, nobody reads
    /// internal tables (`intent.retired_keys`).
    fn may_use_relation(self, relation: &str, privilege: &str) -> bool {
        privilege == "SELECT"
            && ((self >= Level::Operator && OPERATOR_READS.contains(&relation))
                || (self >= Level::App && APP_READS.contains(&relation)))
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
