//! pg_intent as a guest in an application's production database.
//!
//! The database holds an application of its own — schema `shop` owned by the database owner (not
//! a superuser), tables with foreign keys, indexes of every kind, a trigger, a view, data enough
//! for parallel plans, an event trigger of the application's, and roles that know nothing of
//! pg_intent — and pg_intent beside it, used by its roles. With the library loaded each way a DBA
//! loads it (on first call; `session_preload_libraries`; `shared_preload_libraries`), nothing of
//! the host may break:
//!
//! - parallel queries and parallel `VACUUM` in sessions that used pg_intent, `ANALYZE`,
//!   `VACUUM FULL`, `REINDEX`, `CLUSTER` by the DBA;
//! - DDL and `DROP` by ordinary roles and by each pg_intent role, temp tables;
//! - the application's own event triggers;
//! - `DISCARD ALL` on a pooled connection;
//! - two databases with the extension;
//! - `PREPARE TRANSACTION`;
//! - `pg_dump` by the database owner and `pg_restore` (docs/operations.md § Backups).

use pg_intent_tests::dump;
use pg_intent_tests::roles::*;
use pg_intent_tests::*;
use std::collections::BTreeSet;

/// How the library is loaded: by the first call of a session, or by the server for every
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    FirstCall,
    SessionPreload,
    SharedPreload,
}

impl Load {
    fn cluster(self) -> Cluster {
        let prepared = ("max_prepared_transactions", "5");
        match self {
            Load::FirstCall => Cluster::start_with(&[prepared]),
            Load::SessionPreload => {
                Cluster::start_with(&[prepared, ("session_preload_libraries", "pg_intent")])
            }
            Load::SharedPreload => {
                Cluster::start_with(&[prepared, ("shared_preload_libraries", "pg_intent")])
            }
        }
    }
}

/// The application's roles, all with LOGIN.
struct Roles {
    /// Owns the database and schema `shop`; not a superuser.
    owner: String,
    /// Uses the shop's tables; knows nothing of pg_intent.
    clerk: String,
    app: String,
    operator: String,
    admin: String,
    /// In intent_operator, bound to owner "tenant-a" by ALTER ROLE.
    tenant: String,
}

impl Roles {
    fn all(&self) -> [(&str, &str); 6] {
        [
            ("owner", &self.owner),
            ("clerk", &self.clerk),
            ("app", &self.app),
            ("operator", &self.operator),
            ("admin", &self.admin),
            ("tenant", &self.tenant),
        ]
    }
}

const ORDERS: i64 = 60_000;

/// Creates the application's database and roles, and pg_intent in it.
async fn shop(cluster: &Cluster, load: Load) -> (Db<'_>, Roles) {
    let name = format!("shop_{}_{:?}", std::process::id(), load).to_lowercase();
    let admin = cluster.connect("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    let db = Db {
        cluster,
        name: name.clone(),
    };
    let su = db.connect().await;
    // The extension creates its roles (cluster-wide) the first time.
    su.batch_execute("CREATE EXTENSION pg_intent")
        .await
        .unwrap();
    let owner = create_login_role(&admin, "shop_owner", "").await;
    let roles = Roles {
        clerk: create_login_role(&admin, "shop_clerk", "").await,
        app: create_login_role(&admin, "shop_app", "IN ROLE intent_app").await,
        operator: create_login_role(&admin, "shop_ops", "IN ROLE intent_operator").await,
        admin: create_login_role(&admin, "shop_admin", "IN ROLE intent_admin").await,
        tenant: create_login_role(&admin, "shop_tenant", "IN ROLE intent_operator").await,
        owner,
    };
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{name}\" OWNER TO \"{o}\";
             ALTER ROLE \"{t}\" SET intent.owner_id = 'tenant-a';",
            o = roles.owner,
            t = roles.tenant
        ))
        .await
        .unwrap();
    let owner = connect_role(&db, &roles.owner).await;
    owner
        .batch_execute(&format!(
            "CREATE SCHEMA shop;
             CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL, tags text[]);
             CREATE TABLE shop.orders (
                 id bigint PRIMARY KEY,
                 customer_id bigint NOT NULL REFERENCES shop.customers ON DELETE CASCADE,
                 payload jsonb NOT NULL,
                 job_id uuid,
                 placed_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE shop.order_lines (
                 order_id bigint REFERENCES shop.orders ON DELETE CASCADE,
                 n int, sku text, PRIMARY KEY (order_id, n));
             CREATE INDEX orders_customer ON shop.orders (customer_id);
             CREATE INDEX orders_payload ON shop.orders USING gin (payload);
             CREATE INDEX orders_day ON shop.orders ((date_trunc('day', placed_at AT TIME ZONE 'UTC')));
             CREATE INDEX orders_job ON shop.orders (job_id) WHERE job_id IS NOT NULL;
             CREATE TABLE shop.audit (at timestamptz DEFAULT now(), what text);
             CREATE FUNCTION shop.log_order() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO shop.audit (what) VALUES ('order ' || NEW.id); RETURN NEW; END $$;
             CREATE TRIGGER orders_log AFTER INSERT ON shop.orders FOR EACH ROW
                 WHEN (NEW.id > {ORDERS}) EXECUTE FUNCTION shop.log_order();
             CREATE VIEW shop.big_orders AS SELECT * FROM shop.orders WHERE (payload->>'total')::int > 900;
             INSERT INTO shop.customers SELECT g, 'customer ' || g, ARRAY['t' || g % 7] FROM generate_series(1, 1000) g;
             INSERT INTO shop.orders (id, customer_id, payload)
                  SELECT g, 1 + g % 1000, jsonb_build_object('total', g % 1000, 'sku', 's' || g % 97)
                    FROM generate_series(1, {ORDERS}) g;
             INSERT INTO shop.order_lines SELECT g, 1, 's' || g FROM generate_series(1, {ORDERS}) g;
             CREATE SCHEMA sandbox;
             GRANT USAGE, CREATE ON SCHEMA sandbox TO PUBLIC;
             GRANT USAGE ON SCHEMA shop TO PUBLIC;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA shop TO PUBLIC;
             ANALYZE;"
        ))
        .await
        .unwrap_or_else(|e| panic!("the shop's schema: {:?}", SqlError::from_error(&e)));
    // The application's own event triggers (a superuser creates them), on every DDL and DROP.
    su.batch_execute(
        "CREATE TABLE shop.ddl_log (at timestamptz DEFAULT now(), tag text, object text);
         GRANT SELECT ON shop.ddl_log TO PUBLIC;
         CREATE FUNCTION shop.log_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
             SET search_path = pg_catalog, pg_temp AS $$
             DECLARE r record;
             BEGIN
                 FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
                     INSERT INTO shop.ddl_log (tag, object) VALUES (r.command_tag, r.object_identity);
                 END LOOP;
             END $$;
         CREATE FUNCTION shop.log_drop() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
             SET search_path = pg_catalog, pg_temp AS $$
             DECLARE r record;
             BEGIN
                 FOR r IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
                     INSERT INTO shop.ddl_log (tag, object) VALUES ('DROP', r.object_identity);
                 END LOOP;
             END $$;
         CREATE EVENT TRIGGER shop_ddl ON ddl_command_end EXECUTE FUNCTION shop.log_ddl();
         CREATE EVENT TRIGGER shop_drop ON sql_drop EXECUTE FUNCTION shop.log_drop();",
    )
    .await
    .unwrap();
    (db, roles)
}

/// Whether the library is loaded in this session before anything of it ran (a defined setting
/// reads as '' when unset; an undefined one as NULL).
async fn library_loaded(c: &Client) -> bool {
    c.query_one(
        "SELECT current_setting('intent.owner_id', true) IS NOT NULL
            AND (SELECT count(*) FROM pg_settings WHERE name = 'intent.owner_id') = 1",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Runs the protocol once for `owner` through connection `c`: submit, replay, begin, complete,
/// replay with the result.
async fn protocol(c: &Client, owner: &str, key: &str) {
    let s = submit(c, owner, key, "gpu", &json!({"order": key}))
        .await
        .unwrap_or_else(|e| panic!("{owner}/{key}: {:?}", SqlError::from_error(&e)));
    let b = begin(c, s.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(c, b.attempt_id, b.version, &json!({"ok": key}))
            .await
            .unwrap(),
        "won"
    );
    let replay = submit(c, owner, key, "gpu", &json!({"order": key}))
        .await
        .unwrap();
    assert_eq!(replay.state, "succeeded");
    assert_eq!(replay.result, Some(json!({"ok": key})));
}

/// Settings that make the planner use parallel workers for any scan.
const PARALLEL: &str = "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
     SET min_parallel_table_scan_size = 0; SET min_parallel_index_scan_size = 0;
     SET max_parallel_workers_per_gather = 2; SET max_parallel_maintenance_workers = 2;";

/// A parallel query that really ran in workers, with its answer checked.
async fn parallel_query(c: &Client, sql: &str, expected: i64, who: &str) {
    c.batch_execute(PARALLEL).await.unwrap();
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"),
            &[],
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{who}: EXPLAIN ANALYZE {sql}: {:?}",
                SqlError::from_error(&e)
            )
        })
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter()
            .any(|l| l.contains("Workers Launched: 1") || l.contains("Workers Launched: 2")),
        "{who}: {sql} ran in parallel workers: {plan:#?}"
    );
    let n: i64 = c
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{who}: {sql}: {:?}", SqlError::from_error(&e)))
        .get(0);
    assert_eq!(n, expected, "{who}: {sql}");
}

/// DDL and DROP of every kind an application's migration does, by the connected role.
async fn migrations(c: &Client, tag: &str, who: &str) {
    let t = format!("sandbox.t_{tag}");
    let sql = format!(
        "CREATE TEMP TABLE scratch_{tag} (x int); DROP TABLE scratch_{tag};
         CREATE TEMP TABLE gone_{tag} (x int) ON COMMIT DROP;
         CREATE TABLE {t} (id int PRIMARY KEY, v text);
         CREATE INDEX ON {t} (v);
         ALTER TABLE {t} ADD COLUMN w jsonb;
         CREATE VIEW sandbox.v_{tag} AS SELECT id FROM {t};
         CREATE FUNCTION sandbox.f_{tag}(jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
         CREATE TYPE sandbox.e_{tag} AS ENUM ('a', 'b');
         CREATE SEQUENCE sandbox.s_{tag};
         DROP VIEW sandbox.v_{tag};
         DROP FUNCTION sandbox.f_{tag}(jsonb);
         DROP TYPE sandbox.e_{tag};
         DROP SEQUENCE sandbox.s_{tag};
         ALTER TABLE {t} DROP COLUMN w;
         DROP TABLE {t};"
    );
    c.batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{who}: migrations: {:?}", SqlError::from_error(&e)));
    let schema = format!("own_{tag}");
    // A role with no CREATE on the database cannot make schemas: only the owner tries.
    if tag == "owner" {
        c.batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.x (i int); DROP SCHEMA {schema} CASCADE;"
        ))
        .await
        .unwrap_or_else(|e| panic!("{who}: DROP SCHEMA CASCADE: {:?}", SqlError::from_error(&e)));
    }
}

/// Everything of the host that must keep working, with pg_intent used and loaded `load`'s way.
async fn host_keeps_working(load: Load) {
    let cluster = load.cluster();
    let (db, roles) = shop(&cluster, load).await;
    let su = db.connect().await;
    su.batch_execute(
        "CREATE FUNCTION public.has_ok(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT r ? 'ok' $$;
         SELECT intent.define_contract('shop-receipt', '{\"type\": \"object\"}', 'public.has_ok(jsonb)');",
    )
    .await
    .unwrap();

    for (tag, role) in roles.all() {
        let (c, notices) = connect_role_with(&db, role, None)
            .await
            .unwrap_or_else(|e| panic!("{tag} cannot log in ({load:?}): {e:?}"));
        let who = format!("{tag} ({load:?})");
        // Loaded at login by the server, or not yet.
        assert_eq!(
            library_loaded(&c).await,
            load != Load::FirstCall,
            "{who}: the library is loaded at login"
        );
        let uses_intent = tag != "owner" && tag != "clerk";
        if uses_intent {
            let owner = if tag == "tenant" { "tenant-a" } else { "shop" };
            protocol(&c, owner, &format!("order-{tag}")).await;
        } else {
            // A role without pg_intent privileges cannot use it (nor load it on first call).
            assert_eq!(
                sqlstate_of(&c, "SELECT intent.job_id('a', 'b')")
                    .await
                    .as_deref(),
                Some("42501"),
                "{who}: no privileges on schema intent"
            );
        }
        // The host's own work, in a session where the library is loaded (and has run).
        parallel_query(&c, "SELECT count(*) FROM shop.orders", ORDERS, &who).await;
        parallel_query(
            &c,
            "SELECT count(*) FROM shop.orders o JOIN shop.customers k ON k.id = o.customer_id
              WHERE o.payload @> '{\"sku\": \"s7\"}'",
            ORDERS / 97 + i64::from(ORDERS % 97 >= 7),
            &who,
        )
        .await;
        if tag == "operator" || tag == "tenant" {
            // Parallel workers see the session's binding: a tenant counts its own jobs only.
            let filter = if tag == "tenant" {
                "WHERE owner_id = 'tenant-a'"
            } else {
                ""
            };
            let expected: i64 = su
                .query_one(&format!("SELECT count(*) FROM intent.jobs {filter}"), &[])
                .await
                .unwrap()
                .get(0);
            parallel_query(&c, "SELECT count(*) FROM intent.jobs", expected, &who).await;
        }
        migrations(&c, tag, &who).await;
        // A pooler resets the connection between clients.
        c.batch_execute("DISCARD ALL").await.unwrap();
        if uses_intent {
            let owner = if tag == "tenant" { "tenant-a" } else { "shop" };
            protocol(&c, owner, &format!("after-discard-{tag}")).await;
            if tag == "tenant" {
                let bound: Option<String> = c
                    .query_one("SELECT intent.bound_owner()", &[])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(
                    bound.as_deref(),
                    Some("tenant-a"),
                    "{who}: still bound after DISCARD ALL"
                );
            }
        }
        parallel_query(&c, "SELECT count(*) FROM shop.order_lines", ORDERS, &who).await;
        let errors: Vec<String> = notices
            .all()
            .into_iter()
            .filter(|n| n.starts_with("WARNING") || n.starts_with("ERROR"))
            .collect();
        assert!(errors.is_empty(), "{who}: warnings: {errors:?}");
    }
    // The application's event triggers saw every migration.
    let logged: i64 = su
        .query_one(
            "SELECT count(*) FROM shop.ddl_log WHERE object LIKE 'sandbox.t_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(logged >= 6 * 2, "the shop's event triggers ran: {logged}");

    maintenance(&db, &roles, load).await;
    prepared_transactions(&db, load).await;
    two_databases(&cluster, &db, &roles, load).await;
    backups(&cluster, &db, &roles, load).await;
}

/// The DBA's maintenance, in sessions that used pg_intent: parallel VACUUM of the application's
/// tables (by their owner) and of pg_intent's (by a superuser), ANALYZE, VACUUM FULL, REINDEX,
/// CLUSTER; the protocol works before and after.
async fn maintenance(db: &Db<'_>, roles: &Roles, load: Load) {
    let (owner, notices) = connect_role_with(db, &roles.owner, None).await.unwrap();
    owner.batch_execute(PARALLEL).await.unwrap();
    // Dead tuples, so that VACUUM has index work to share among workers.
    owner
        .batch_execute("DELETE FROM shop.order_lines WHERE n = 1 AND order_id % 3 = 0;
                        UPDATE shop.orders SET payload = payload || '{\"seen\": true}' WHERE id % 5 = 0;")
        .await
        .unwrap();
    // The owner administers the application and calls pg_intent too: the library is loaded.
    let su = db.connect().await;
    su.batch_execute(&format!("GRANT intent_app TO \"{}\"", roles.owner))
        .await
        .unwrap();
    owner
        .query_one("SELECT intent.job_id('a', 'b')", &[])
        .await
        .unwrap();
    for sql in [
        "VACUUM (PARALLEL 2, VERBOSE) shop.orders",
        "VACUUM (PARALLEL 2) shop.order_lines",
        "ANALYZE shop.orders",
    ] {
        owner
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql} ({load:?}): {:?}", SqlError::from_error(&e)));
    }
    assert!(
        notices
            .all()
            .iter()
            .any(|n| n.contains("parallel vacuum worker")),
        "VACUUM ran parallel workers ({load:?}): {:?}",
        notices.all()
    );

    protocol(&su, "dba", "before-maintenance").await;
    su.batch_execute(PARALLEL).await.unwrap();
    // One statement each: most of these refuse to run inside a transaction block.
    for sql in [
        "VACUUM (PARALLEL 2, ANALYZE) intent.jobs",
        "VACUUM (PARALLEL 2) intent.attempts",
        "VACUUM (FREEZE) intent.events",
        "ANALYZE",
        "VACUUM FULL intent.jobs",
        "REINDEX TABLE intent.attempts",
        "REINDEX SCHEMA shop",
        "CLUSTER intent.events USING events_pkey",
        "CREATE EXTENSION IF NOT EXISTS amcheck",
    ] {
        su.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql} ({load:?}): {:?}", SqlError::from_error(&e)));
    }
    // bt_index_check raises on any inconsistency.
    let checked: i64 = su
        .query_one(
            "SELECT count(bt_index_check(c.oid, true))
               FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
              WHERE a.amname = 'btree' AND c.relnamespace IN ('intent'::regnamespace, 'shop'::regnamespace)",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("amcheck ({load:?}): {:?}", SqlError::from_error(&e)))
        .get(0);
    assert!(checked > 10, "indexes checked: {checked}");
    protocol(&su, "dba", "after-maintenance").await;
    let replay = submit(
        &su,
        "dba",
        "before-maintenance",
        "gpu",
        &json!({"order": "before-maintenance"}),
    )
    .await
    .unwrap();
    assert_eq!(replay.result, Some(json!({"ok": "before-maintenance"})));
}

/// A transaction that used pg_intent can be prepared, and committed or rolled back from
/// another session.
async fn prepared_transactions(db: &Db<'_>, load: Load) {
    let a = db.connect().await;
    a.batch_execute("BEGIN").await.unwrap();
    protocol(&a, "shop", "prepared-commit").await;
    a.batch_execute(
        "INSERT INTO shop.audit (what) VALUES ('prepared'); PREPARE TRANSACTION 'pg_intent_commit'",
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "PREPARE TRANSACTION ({load:?}): {:?}",
            SqlError::from_error(&e)
        )
    });
    a.batch_execute("BEGIN").await.unwrap();
    submit(&a, "shop", "prepared-rollback", "gpu", &json!({}))
        .await
        .unwrap();
    a.batch_execute("PREPARE TRANSACTION 'pg_intent_rollback'")
        .await
        .unwrap();
    let b = db.connect().await;
    b.batch_execute("COMMIT PREPARED 'pg_intent_commit'")
        .await
        .unwrap();
    b.batch_execute("ROLLBACK PREPARED 'pg_intent_rollback'")
        .await
        .unwrap();
    let replay = submit(
        &b,
        "shop",
        "prepared-commit",
        "gpu",
        &json!({"order": "prepared-commit"}),
    )
    .await
    .unwrap();
    assert_eq!(replay.state, "succeeded", "{load:?}");
    let again = submit(&b, "shop", "prepared-rollback", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(
        again.created,
        "the rolled-back prepared submit left nothing ({load:?})"
    );
}

/// A second database of the cluster with the extension: the same keys are other jobs there,
/// the roles (cluster-wide) and the tenant's binding work in both, and dropping the extension
/// in one leaves the other intact.
async fn two_databases(cluster: &Cluster, db: &Db<'_>, roles: &Roles, load: Load) {
    let other = format!("{}_second", db.name);
    let su = cluster.connect("postgres").await;
    su.batch_execute(&format!("CREATE DATABASE \"{other}\""))
        .await
        .unwrap();
    let second = Db {
        cluster,
        name: other.clone(),
    };
    let c2 = second.connect().await;
    c2.batch_execute("CREATE EXTENSION pg_intent")
        .await
        .unwrap();
    let t1 = connect_role(db, &roles.tenant).await;
    let t2 = connect_role(&second, &roles.tenant).await;
    let first = submit(&t1, "tenant-a", "shared-key", "gpu", &json!({"db": 1}))
        .await
        .unwrap();
    let there = submit(&t2, "tenant-a", "shared-key", "gpu", &json!({"db": 2}))
        .await
        .unwrap();
    assert!(
        first.created && there.created,
        "one job per database ({load:?})"
    );
    assert_eq!(first.job_id, there.job_id, "the same derived id");
    refusal(
        submit(&t2, "tenant-b", "k", "gpu", &json!({})).await,
        "42501",
    );
    c2.batch_execute("DROP EXTENSION pg_intent").await.unwrap();
    let replay = submit(&t1, "tenant-a", "shared-key", "gpu", &json!({"db": 1}))
        .await
        .unwrap();
    assert!(!replay.created, "the first database's jobs stay ({load:?})");
    let still: i64 = su
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE rolname IN ('intent_owner', 'intent_app', 'intent_operator', 'intent_admin')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, 4, "the roles are cluster-wide and stay");
}

/// The database owner dumps the whole database (docs/operations.md § Backups: a member of
/// pg_read_all_data, with --enable-row-security), a superuser restores it into a new database
/// of the same owner, and every row of the application and of pg_intent is there. The owner
/// alone dumps and restores its own schema into a database where pg_intent already is.
async fn backups(cluster: &Cluster, db: &Db<'_>, roles: &Roles, load: Load) {
    let su = db.connect().await;
    su.batch_execute(&format!("GRANT pg_read_all_data TO \"{}\"", roles.owner))
        .await
        .unwrap();
    let before = dump::table_rows(&su).await;
    let shop_before = shop_rows(&su).await;
    let file = cluster.dir().join(format!("{}.dump", db.name));
    let path = file.to_str().unwrap();
    let out = dump::run_pg_tool_as(
        cluster,
        &roles.owner,
        "pg_dump",
        &[
            "--format=custom",
            "--enable-row-security",
            "--file",
            path,
            &db.name,
        ],
    );
    assert!(
        out.status.success(),
        "pg_dump as the database owner ({load:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = format!("{}_restored", db.name);
    su.batch_execute(&format!(
        "CREATE DATABASE \"{restored}\" OWNER \"{}\"",
        roles.owner
    ))
    .await
    .unwrap();
    dump::restore(cluster, &restored, &file);
    let r = cluster.connect(&restored).await;
    assert_eq!(
        before,
        dump::table_rows(&r).await,
        "pg_intent's rows ({load:?})"
    );
    assert_eq!(
        shop_before,
        shop_rows(&r).await,
        "the shop's rows ({load:?})"
    );
    let r_db = Db {
        cluster,
        name: restored.clone(),
    };
    let app = connect_role(&r_db, &roles.app).await;
    let replay = submit(
        &app,
        "shop",
        "order-app",
        "gpu",
        &json!({"order": "order-app"}),
    )
    .await
    .unwrap();
    assert_eq!(replay.result, Some(json!({"ok": "order-app"})), "{load:?}");
    protocol(&app, "shop", "after-restore").await;

    // Schema only, by the owner alone, into a database where a superuser created pg_intent.
    let schema_file = cluster.dir().join(format!("{}.shop.dump", db.name));
    let out = dump::run_pg_tool_as(
        cluster,
        &roles.owner,
        "pg_dump",
        &[
            "--format=custom",
            "--schema=shop",
            "--file",
            schema_file.to_str().unwrap(),
            &db.name,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let third = format!("{}_shop_only", db.name);
    su.batch_execute(&format!(
        "CREATE DATABASE \"{third}\" OWNER \"{}\"",
        roles.owner
    ))
    .await
    .unwrap();
    let t = cluster.connect(&third).await;
    t.batch_execute("CREATE EXTENSION pg_intent").await.unwrap();
    let out = dump::run_pg_tool_as(
        cluster,
        &roles.owner,
        "pg_restore",
        &[
            "--exit-on-error",
            "--no-owner",
            "--dbname",
            &third,
            schema_file.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "pg_restore of the shop's schema as its owner ({load:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let orders: i64 = t
        .query_one("SELECT count(*) FROM shop.orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, ORDERS);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&schema_file);
}

async fn shop_rows(c: &Client) -> Vec<BTreeSet<String>> {
    let mut all = Vec::new();
    for table in [
        "shop.customers",
        "shop.orders",
        "shop.order_lines",
        "shop.audit",
    ] {
        all.push(
            c.query(&format!("SELECT t::text FROM {table} t"), &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
        );
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_on_first_call() {
    host_keeps_working(Load::FirstCall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_by_session_preload_libraries() {
    host_keeps_working(Load::SessionPreload).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_by_shared_preload_libraries() {
    host_keeps_working(Load::SharedPreload).await;
}
