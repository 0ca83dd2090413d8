//! pg_intent's drop guard in a database whose schemas its roles cannot use.
//!
//! The `sql_drop` event trigger runs for every `DROP` in the database, as `intent_owner`,
//! whoever drops. An application keeps its objects in schemas of its own, owned by its roles,
//! with no privilege for anyone else — `intent_owner` included. Every kind of object whose drop
//! fires the trigger is dropped there, by its owner and by a superuser, one by one, by
//! `CASCADE`, by `DROP SCHEMA … CASCADE` and `DROP OWNED`; another extension is installed into
//! such a schema and dropped; a `pg_dump` / `pg_restore --clean` round trip replaces them all.
//! None of it may fail for a reason that is not pg_intent's own — and the guard itself must
//! still refuse to drop a checker that lives in such a schema.

use pg_intent_tests::dump;
use pg_intent_tests::roles::*;
use pg_intent_tests::*;

/// The application's objects in `schema` (owned by `owner`, which runs this), of every kind
/// whose drop fires the trigger, with arguments of types that live in the private schema.
fn objects(schema: &str, other: &str) -> String {
    format!(
        "CREATE TYPE {schema}.status AS ENUM ('a', 'b');
         CREATE DOMAIN {schema}.amount AS int CHECK (VALUE >= 0);
         CREATE TABLE {schema}.t (x int, s {schema}.status, a {schema}.amount);
         CREATE FUNCTION {schema}.f(s {schema}.status) RETURNS int LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.f_array(s {schema}.status[]) RETURNS int LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.f_row(r {schema}.t) RETURNS int LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.f_domain(d {schema}.amount) RETURNS int LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.f_other(r {other}.t) RETURNS int LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.looks_like_a_checker(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
         CREATE PROCEDURE {schema}.p(s {schema}.status) LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION {schema}.step(n int, s {schema}.status) RETURNS int LANGUAGE sql AS 'SELECT n + 1';
         CREATE AGGREGATE {schema}.tally({schema}.status) (sfunc = {schema}.step, stype = int, initcond = '0');
         CREATE VIEW {schema}.v AS SELECT x, s FROM {schema}.t;
         CREATE SEQUENCE {schema}.seq;
         CREATE INDEX t_x ON {schema}.t (x);
         CREATE TABLE {schema}.child (id int PRIMARY KEY, s {schema}.status);"
    )
}

/// One by one, then by cascade: every object `objects` made.
fn drops(schema: &str) -> Vec<String> {
    [
        "DROP FUNCTION {s}.f({s}.status)",
        "DROP FUNCTION {s}.f_array({s}.status[])",
        "DROP FUNCTION {s}.f_other",
        "DROP FUNCTION {s}.looks_like_a_checker(jsonb)",
        "DROP PROCEDURE {s}.p({s}.status)",
        "DROP AGGREGATE {s}.tally({s}.status)",
        "DROP INDEX {s}.t_x",
        "DROP SEQUENCE {s}.seq",
        "DROP VIEW {s}.v",
        "DROP TABLE {s}.t CASCADE",
        "DROP DOMAIN {s}.amount CASCADE",
        "DROP TYPE {s}.status CASCADE",
        "DROP SCHEMA {s} CASCADE",
    ]
    .iter()
    .map(|d| d.replace("{s}", schema))
    .collect()
}

/// A database with pg_intent, a contract whose checker lives in a schema nobody else may use,
/// and the application's owners `app_owner` (schema `app`) and `other_owner` (schema `other`,
/// where `app` has a function taking `other.t`).
struct Scene<'c> {
    db: Db<'c>,
    su: Client,
    app_owner: String,
    other_owner: String,
    checker_owner: String,
}

async fn scene(prefix: &str) -> Scene<'static> {
    let db = Cluster::shared().fresh_db(prefix).await;
    let su = db.connect().await;
    let app_owner = create_login_role(&su, "app_owner", "").await;
    let other_owner = create_login_role(&su, "other_owner", "").await;
    let checker_owner = create_login_role(&su, "checker_owner", "").await;
    su.batch_execute(&format!(
        "CREATE SCHEMA checks AUTHORIZATION \"{checker_owner}\";
         SET ROLE \"{checker_owner}\";
         CREATE FUNCTION checks.ok(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
         RESET ROLE;
         SELECT intent.define_contract('private', '{{}}', 'checks.ok(jsonb)');"
    ))
    .await
    .unwrap_or_else(|e| panic!("the contract: {:?}", SqlError::from_error(&e)));
    let s = Scene {
        db,
        su,
        app_owner,
        other_owner,
        checker_owner,
    };
    // pg_intent's roles can use none of these schemas.
    let usable: i64 = s
        .su
        .query_one(
            "SELECT count(*) FROM pg_namespace n, unnest(ARRAY['intent_owner', 'intent_admin', 'intent_operator', 'intent_app']) r
              WHERE n.nspname IN ('checks') AND has_schema_privilege(r, n.oid, 'USAGE')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(usable, 0);
    s
}

impl Scene<'_> {
    /// Creates both application schemas and their objects, each as its owner.
    async fn build(&self) {
        self.su
            .batch_execute(&format!(
                "CREATE SCHEMA other AUTHORIZATION \"{o}\";
                 CREATE TABLE other.t (y int);
                 ALTER TABLE other.t OWNER TO \"{o}\";
                 GRANT USAGE ON SCHEMA other TO \"{a}\";
                 CREATE SCHEMA app AUTHORIZATION \"{a}\";",
                o = self.other_owner,
                a = self.app_owner
            ))
            .await
            .unwrap();
        let app = connect_role(&self.db, &self.app_owner).await;
        app.batch_execute(&objects("app", "other"))
            .await
            .unwrap_or_else(|e| panic!("the app's objects: {:?}", SqlError::from_error(&e)));
        let usable: i64 = self
            .su
            .query_one(
                "SELECT count(*) FROM pg_namespace n
                  WHERE n.nspname IN ('app', 'other') AND has_schema_privilege('intent_owner', n.oid, 'USAGE')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(usable, 0, "intent_owner may use no application schema");
    }

    /// Runs each statement on `c`; every one must succeed.
    async fn all_succeed(&self, c: &Client, who: &str, statements: &[String]) {
        for sql in statements {
            if let Err(e) = c.batch_execute(sql).await {
                panic!("{who}: {sql}: {:?}", SqlError::from_error(&e));
            }
        }
    }

    /// Drops `other` (and what in `app` depends on it) when still there.
    async fn drop_other(&self) {
        self.su
            .batch_execute("DROP SCHEMA IF EXISTS app CASCADE; DROP SCHEMA IF EXISTS other CASCADE")
            .await
            .unwrap();
    }

    /// The guard still refuses to drop the checker, whoever tries, however names are quoted.
    async fn checker_still_guarded(&self) {
        let owner = connect_role(&self.db, &self.checker_owner).await;
        for c in [&owner, &self.su] {
            for quoting in ["off", "on"] {
                let e = c
                    .batch_execute(&format!(
                        "SET quote_all_identifiers = {quoting}; DROP FUNCTION checks.ok(jsonb)"
                    ))
                    .await
                    .expect_err("a contract's checker was dropped");
                let e = SqlError::from_error(&e);
                assert_eq!(e.code, "2BP01", "{e:?}");
                assert!(e.message.contains("contract 'private'"), "{e:?}");
            }
        }
        let _ = self.su.batch_execute("RESET quote_all_identifiers").await;
    }
}

/// Boundary: every role of the database ↔ pg_intent's event trigger. Route: a DROP of any kind of
/// object whose types live in a schema `intent_owner` may not use, by its owner or a superuser.
/// It used to fail with "permission denied for schema" (the guard looked the argument's type up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drop_in_schemas_pg_intent_cannot_use_works() {
    let s = scene("private_drops").await;
    s.checker_still_guarded().await;
    let app = connect_role(&s.db, &s.app_owner).await;
    // One by one and by cascade, by the owner, then by a superuser.
    s.build().await;
    s.all_succeed(&app, "the schema's owner", &drops("app"))
        .await;
    s.drop_other().await;
    s.build().await;
    s.all_succeed(&s.su, "a superuser", &drops("app")).await;
    // DROP TABLE … CASCADE of another schema's table that a function in `app` takes.
    s.drop_other().await;
    s.build().await;
    let other = connect_role(&s.db, &s.other_owner).await;
    s.all_succeed(
        &other,
        "the other schema's owner",
        &["DROP TABLE other.t CASCADE".to_string()],
    )
    .await;
    // DROP SCHEMA … CASCADE, whole, by its owner and by a superuser.
    s.drop_other().await;
    s.build().await;
    s.all_succeed(&app, "the owner", &["DROP SCHEMA app CASCADE".to_string()])
        .await;
    s.drop_other().await;
    s.build().await;
    s.all_succeed(
        &s.su,
        "a superuser",
        &["DROP SCHEMA app CASCADE".to_string()],
    )
    .await;
    // DROP OWNED, by the role itself and by a superuser.
    s.drop_other().await;
    s.build().await;
    s.all_succeed(
        &app,
        "the owner",
        &[format!("DROP OWNED BY \"{}\"", s.app_owner)],
    )
    .await;
    s.drop_other().await;
    s.build().await;
    s.all_succeed(
        &s.su,
        "a superuser",
        &[format!(
            "DROP OWNED BY \"{}\", \"{}\" CASCADE",
            s.app_owner, s.other_owner
        )],
    )
    .await;
    // Another extension, installed into a schema of its own, used, and dropped.
    s.all_succeed(
        &s.su,
        "a superuser",
        &[
            "CREATE SCHEMA ext".to_string(),
            "CREATE EXTENSION citext SCHEMA ext".to_string(),
            "CREATE TABLE public.names (n ext.citext)".to_string(),
            "DROP TABLE public.names".to_string(),
            "DROP EXTENSION citext".to_string(),
            "CREATE EXTENSION citext SCHEMA ext".to_string(),
            "DROP SCHEMA ext CASCADE".to_string(),
        ],
    )
    .await;
    // And the guard still does its own job.
    s.checker_still_guarded().await;
    let n: i64 =
        s.su.query_one(
            "SELECT count(*) FROM intent.contracts WHERE name = 'private' AND checker IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// Boundary: the host database ↔ pg_intent (availability). Route: `pg_restore --clean` of a dump
/// of a database holding private schemas (each object dropped, then created again) and
/// pg_intent with its rows and a contract whose checker lives in such a schema. `--clean` drops
/// every function before the extension: the guard refuses the checker (its own reason, 2BP01)
/// unless the restoring session sets `intent.allow_checker_drop` (docs/operations.md § Backups),
/// and then the round trip succeeds, twice, and keeps every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_clean_of_private_schemas_works() {
    let s = scene("private_restore").await;
    s.build().await;
    let job = submit(&s.su, "alice", "kept", "gpu", &json!({"n": 1}))
        .await
        .unwrap();
    let before = dump::table_rows(&s.su).await;
    let cluster = Cluster::shared();
    let file = cluster.dir().join(format!("{}.dump", s.db.name));
    dump::dump(cluster, &s.db.name, &file);
    let restore = |options: &str| {
        dump::run_pg_tool(
            cluster,
            "pg_restore",
            &[
                "--clean",
                "--if-exists",
                "--exit-on-error",
                "--dbname",
                &format!("dbname={} options='{options}'", s.db.name),
                file.to_str().unwrap(),
            ],
        )
    };
    // Without the setting: refused at the checker, for pg_intent's own reason, nothing else.
    let out = restore("");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("contract 'private' uses it as its checker")
            && stderr.contains("intent.allow_checker_drop"),
        "{stderr}"
    );
    assert!(!stderr.contains("permission denied"), "{stderr}");
    for round in 0..2 {
        let out = restore("-c intent.allow_checker_drop=on");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("error"),
            "pg_restore --clean (round {round}): {}\n{stderr}",
            out.status
        );
    }
    let su = s.db.connect().await;
    assert_eq!(dump::table_rows(&su).await, before, "pg_intent's rows");
    assert_eq!(job_row(&su, job.job_id).await.state, "pending");
    let n: i32 = su.query_one("SELECT app.f('a')", &[]).await.unwrap().get(0);
    assert_eq!(n, 1, "the application's functions are back");
    let valid: bool = su
        .query_one(
            "SELECT valid FROM intent.validate_result('private', '{}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        valid,
        "the restored checker is the contract's checker again"
    );
    let app = connect_role(&s.db, &s.app_owner).await;
    s.all_succeed(&app, "the owner after the restore", &drops("app"))
        .await;
    s.checker_still_guarded().await;
    let _ = std::fs::remove_file(&file);
}
