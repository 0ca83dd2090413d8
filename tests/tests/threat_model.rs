//! The boundaries of docs/security.md, each attacked through PostgreSQL's known escape routes by
//! a real login role. One test per route; each names the boundary it attacks.
//!
//! The tenants here are login roles in `intent_operator`, bound for good with `ALTER ROLE …
//! SET intent.owner_id`, each owning a schema of its own (where it can plant functions,
//! operators, tables, triggers, indexes). The victim is another owner's job with a started
//! attempt: after every attack it must be exactly as it was.

use pg_intent_tests::roles::*;
use pg_intent_tests::*;

/// A database with a victim (owner "victim": a job with a started attempt) and a tenant bound
/// to "tenant-a" that owns schema `evil`.
struct Scene<'c> {
    db: Db<'c>,
    su: Client,
    tenant: String,
    victim_job: Uuid,
    victim_attempt: Uuid,
}

async fn scene(prefix: &str) -> Scene<'static> {
    let db = Cluster::shared().fresh_db(prefix).await;
    let su = db.connect().await;
    let victim = submit(&su, "victim", "precious", "gpu", &json!({}))
        .await
        .unwrap();
    let attempt = begin(&su, victim.job_id, None, "1 hour").await.unwrap();
    let tenant = create_login_role(&su, "tenant", "IN ROLE intent_operator").await;
    su.batch_execute(&format!(
        "ALTER ROLE \"{tenant}\" SET intent.owner_id = 'tenant-a';
         CREATE SCHEMA evil AUTHORIZATION \"{tenant}\";"
    ))
    .await
    .unwrap();
    Scene {
        db,
        su,
        tenant,
        victim_job: victim.job_id,
        victim_attempt: attempt.attempt_id,
    }
}

impl Scene<'_> {
    async fn tenant(&self) -> Client {
        connect_role(&self.db, &self.tenant).await
    }

    /// The victim's rows are exactly as they were: job running, attempt started, no event.
    async fn victim_untouched(&self, after: &str) {
        let job = job_row(&self.su, self.victim_job).await;
        assert_eq!(
            (job.state.as_str(), job.version, job.result.is_none()),
            ("running", 1, true),
            "after {after}: the victim's job changed: {job:?}"
        );
        let a = attempt_row(&self.su, self.victim_attempt).await;
        assert_eq!(a.state, "started", "after {after}: {a:?}");
        assert!(
            event_rows(&self.su, self.victim_job).await.is_empty(),
            "after {after}: events were written for the victim"
        );
    }
}

/// The SQLSTATEs a test's own log table collected.
async fn logged(c: &Client, table: &str) -> Vec<String> {
    c.query(&format!("SELECT what FROM {table} ORDER BY n"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Boundary: bound tenant ↔ other owners. Route: an `ON DELETE CASCADE` runs its triggers with
/// row-level security not forced on table owners (SECURITY_NOFORCE_RLS), which pg_intent's
/// functions, running as the owner of its tables, would inherit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_cascade_does_not_lift_owner_isolation() {
    let s = scene("tm_cascade").await;
    let t = s.tenant().await;
    let mine = submit(&t, "tenant-a", "mine", "gpu", &json!({}))
        .await
        .unwrap();
    let my_attempt = begin(&t, mine.job_id, None, "1 hour").await.unwrap();
    t.batch_execute(&format!(
        "CREATE TEMP TABLE log (n serial, what text);
         CREATE TEMP TABLE parent (id int PRIMARY KEY);
         CREATE TEMP TABLE child (id int REFERENCES parent ON DELETE CASCADE);
         CREATE FUNCTION pg_temp.attack() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             BEGIN
                 PERFORM intent.complete_attempt('{victim}', 1, '{{\"stolen\": true}}');
                 INSERT INTO log (what) VALUES ('complete: done');
             EXCEPTION WHEN OTHERS THEN INSERT INTO log (what) VALUES ('complete: ' || SQLSTATE);
             END;
             BEGIN
                 PERFORM intent.cancel_job('{victim_job}', 'cascade');
                 INSERT INTO log (what) VALUES ('cancel: done');
             EXCEPTION WHEN OTHERS THEN INSERT INTO log (what) VALUES ('cancel: ' || SQLSTATE);
             END;
             INSERT INTO log (what) SELECT 'jobs: ' || string_agg(DISTINCT owner_id || '', ',') FROM intent.jobs;
             INSERT INTO log (what) SELECT 'reconcile view: ' || count(*) FROM intent.attempts_to_reconcile
                                     WHERE owner_id <> 'tenant-a';
             INSERT INTO log (what) SELECT 'by state view: ' || coalesce(sum(jobs), 0) FROM intent.jobs_by_state;
             -- Its own job, within the cascade, still works.
             INSERT INTO log (what) SELECT 'own: ' || intent.complete_attempt('{mine}', 1, '{{\"n\": 1}}');
             RETURN OLD;
         END $$;
         CREATE TRIGGER attack BEFORE DELETE ON child FOR EACH ROW EXECUTE FUNCTION pg_temp.attack();
         INSERT INTO parent VALUES (1); INSERT INTO child VALUES (1);
         DELETE FROM parent;",
        victim = s.victim_attempt,
        victim_job = s.victim_job,
        mine = my_attempt.attempt_id,
    ))
    .await
    .unwrap_or_else(|e| panic!("{:?}", SqlError::from_error(&e)));
    assert_eq!(
        logged(&t, "log").await,
        [
            "complete: IJ007",
            "cancel: IJ007",
            "jobs: tenant-a",
            "reconcile view: 0",
            "by state view: 1",
            "own: won",
        ]
    );
    s.victim_untouched("a trigger fired by a cascade").await;
}

/// Boundary: bound tenant ↔ other owners. Route: the caller's search path while the library
/// loads. Restoring the role's binding must not run SQL that a function planted ahead of
/// pg_catalog (`substr`, `length`, `unnest`, `=`) could answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_functions_cannot_rebind_a_tenant_while_the_library_loads() {
    let s = scene("tm_load_path").await;
    submit(&s.su, "tenant-b", "theirs", "gpu", &json!({}))
        .await
        .unwrap();
    let t = s.tenant().await;
    t.batch_execute(
        "CREATE FUNCTION evil.substr(text, integer) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT 'tenant-b'::text $$;
         CREATE FUNCTION evil.substr(text, bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT 'tenant-b'::text $$;
         CREATE FUNCTION evil.length(text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 0 $$;
         CREATE FUNCTION evil.unnest(text[]) RETURNS SETOF text LANGUAGE sql IMMUTABLE AS $$ SELECT 'intent.owner_id=tenant-b'::text $$;
         CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;
         CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
         CREATE FUNCTION evil.bound_owner() RETURNS text LANGUAGE sql STABLE AS $$ SELECT NULL::text $$;",
    )
    .await
    .unwrap();
    drop(t);
    for options in [
        "-c search_path=evil,pg_catalog -c intent.owner_id=tenant-b",
        "-c search_path=evil,pg_catalog -c intent.owner_id=",
        "-c search_path=evil,pg_catalog",
    ] {
        // Refusing the login would do as well as keeping the binding.
        let Ok((c, _)) = connect_role_with(&s.db, &s.tenant, Some(options)).await else {
            continue;
        };
        let bound: Option<String> = c
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(bound.as_deref(), Some("tenant-a"), "{options}");
        let seen: Vec<String> = c
            .query("SELECT DISTINCT owner_id::text FROM intent.jobs", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            seen.is_empty(),
            "{options}: the policy used the planted bound_owner: {seen:?}"
        );
        refusal(cancel(&c, s.victim_job, None).await, "IJ007");
    }
    s.victim_untouched("planted functions at library load")
        .await;
}

/// Boundary: bound tenant ↔ other owners. Route: code a tenant planted in an index expression
/// runs, as the tenant, in the session of whoever maintains the table — a DBA's unbound session
/// — for ANALYZE, REINDEX, VACUUM FULL, CLUSTER, CREATE INDEX and REFRESH MATERIALIZED VIEW.
/// pg_intent refuses every call made in such a restricted operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_in_index_expressions_cannot_act_through_a_dbas_session() {
    let s = scene("tm_index").await;
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE TABLE evil.log (n serial, what text);
         CREATE FUNCTION evil.note(what text) RETURNS void LANGUAGE sql VOLATILE AS
             'INSERT INTO evil.log (what) VALUES (what)';
         -- Declared IMMUTABLE, as an index expression must be; it is not.
         CREATE FUNCTION evil.steal(x int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
         BEGIN
             PERFORM intent.cancel_job('{victim}', 'planted in an index');
             PERFORM evil.note('cancelled');
             RETURN x;
         EXCEPTION WHEN OTHERS THEN
             PERFORM evil.note(SQLSTATE);
             RETURN x;
         END $$;
         CREATE TABLE evil.t (x int);
         CREATE INDEX t_steal ON evil.t (evil.steal(x));
         CREATE MATERIALIZED VIEW evil.mv AS SELECT evil.steal(x) AS y FROM evil.t;
         INSERT INTO evil.t SELECT g FROM generate_series(1, 3) g;",
        victim = s.victim_job
    ))
    .await
    .unwrap();
    // The tenant's own inserts ran it in the tenant's bound session: not found.
    assert!(logged(&t, "evil.log").await.iter().all(|w| w == "IJ007"));
    t.batch_execute("TRUNCATE evil.log").await.unwrap();
    // The DBA's maintenance, in a session that has used pg_intent and is not bound.
    submit(&s.su, "dba", "warm", "gpu", &json!({}))
        .await
        .unwrap();
    for sql in [
        "ANALYZE evil.t",
        "REINDEX TABLE evil.t",
        "VACUUM FULL evil.t",
        "CLUSTER evil.t USING t_steal",
        "CREATE INDEX t_steal_again ON evil.t (evil.steal(x + 1))",
        "REFRESH MATERIALIZED VIEW evil.mv",
    ] {
        s.su.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {:?}", SqlError::from_error(&e)));
        s.victim_untouched(sql).await;
    }
    let log = logged(&s.su, "evil.log").await;
    assert!(!log.is_empty(), "the planted function ran");
    assert!(
        log.iter().all(|w| w == "42501"),
        "every call from maintenance was refused: {log:?}"
    );
}

/// Boundary: bound tenant ↔ other owners. Route: the tenant's own SECURITY DEFINER functions,
/// triggers and RLS policies calling pg_intent, and the setting changed every way a session can
/// change it. The binding is the session's: none of them unbinds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_code_and_settings_stay_bound() {
    let s = scene("tm_own_code").await;
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE FUNCTION evil.definer() RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
         BEGIN PERFORM intent.cancel_job('{victim}', 'definer'); RETURN 'done';
         EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$;
         CREATE TABLE evil.rows (x int);
         CREATE TABLE evil.log (n serial, what text);
         CREATE FUNCTION evil.trig() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO evil.log (what) VALUES (evil.definer()); RETURN NEW; END $$;
         CREATE TRIGGER t AFTER INSERT ON evil.rows FOR EACH ROW EXECUTE FUNCTION evil.trig();
         ALTER TABLE evil.rows ENABLE ROW LEVEL SECURITY;
         ALTER TABLE evil.rows FORCE ROW LEVEL SECURITY;
         CREATE POLICY p ON evil.rows USING (evil.definer() IS NOT NULL) WITH CHECK (evil.definer() = 'IJ007');
         INSERT INTO evil.rows VALUES (1);
         INSERT INTO evil.log (what) SELECT evil.definer() FROM evil.rows;",
        victim = s.victim_job
    ))
    .await
    .unwrap_or_else(|e| panic!("{:?}", SqlError::from_error(&e)));
    assert_eq!(logged(&t, "evil.log").await, ["IJ007", "IJ007"]);
    for sql in [
        "SET intent.owner_id = 'victim'",
        "SET LOCAL intent.owner_id = 'victim'",
        "SELECT set_config('intent.owner_id', 'victim', false)",
        "SELECT set_config('intent.owner_id', '', true)",
        "RESET intent.owner_id",
        "SET SESSION AUTHORIZATION DEFAULT",
        "RESET ALL",
        "DISCARD ALL",
        "ALTER ROLE CURRENT_USER SET intent.owner_id = 'victim'",
    ] {
        let code = sqlstate_of(&t, sql).await;
        if [
            "RESET ALL",
            "DISCARD ALL",
            "SET SESSION AUTHORIZATION DEFAULT",
        ]
        .contains(&sql)
        {
            // Allowed, and they reset to the role's own binding.
            assert_eq!(code, None, "{sql}");
        } else {
            assert_eq!(code.as_deref(), Some("42501"), "{sql}");
        }
        let bound: Option<String> = t
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(bound.as_deref(), Some("tenant-a"), "after {sql}");
    }
    refusal(cancel(&t, s.victim_job, None).await, "IJ007");
    s.victim_untouched("the tenant's own code").await;
}

/// Boundary: the shared sql_drop event trigger ↔ every role of the database. Route: it fires on
/// every DROP, in the dropping role's session and search path. It must work for roles that know
/// nothing of pg_intent, and nothing they plant may change what it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drop_guard_works_for_everyone_and_ignores_planted_objects() {
    let s = scene("tm_drop_guard").await;
    let nobody = create_login_role(&s.su, "nobody", "").await;
    s.su.batch_execute(&format!(
        "CREATE SCHEMA nb AUTHORIZATION \"{nobody}\";
         CREATE FUNCTION public.checks(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
         SELECT intent.define_contract('guarded', '{{}}', 'public.checks(jsonb)');"
    ))
    .await
    .unwrap();
    let c = connect_role(&s.db, &nobody).await;
    c.batch_execute(
        "CREATE TEMP TABLE t (); DROP TABLE t;
         CREATE FUNCTION nb.f() RETURNS int LANGUAGE sql AS 'SELECT 1'; DROP FUNCTION nb.f();
         -- A function of one jsonb, as a checker takes, that no contract uses: the guard reads
         -- intent.contracts for it, which this role may not.
         CREATE FUNCTION nb.h(r jsonb) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         DROP FUNCTION nb.h(jsonb);
         -- Operators and casts the trigger's comparisons could pick up under this search path.
         CREATE FUNCTION nb.oideq(oid, oid) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';
         CREATE OPERATOR nb.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = nb.oideq);
         SET search_path = nb, pg_catalog;
         CREATE TABLE nb.x (i int); DROP TABLE nb.x;
         CREATE FUNCTION nb.g() RETURNS int LANGUAGE sql AS 'SELECT 1'; DROP FUNCTION nb.g();",
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "DROP by a role without pg_intent privileges: {:?}",
            SqlError::from_error(&e)
        )
    });
    // Each pg_intent role too, and the tenant.
    for role_opts in [
        "IN ROLE intent_app",
        "IN ROLE intent_operator",
        "IN ROLE intent_admin",
    ] {
        let r = create_login_role(&s.su, "dropper", role_opts).await;
        let c = connect_role(&s.db, &r).await;
        c.batch_execute("CREATE TEMP TABLE t (); DROP TABLE t;")
            .await
            .unwrap_or_else(|e| panic!("{role_opts}: {:?}", SqlError::from_error(&e)));
    }
    // The guard still guards, whoever drops, whatever was planted.
    assert_eq!(
        sqlstate_of(
            &s.su,
            "SET search_path = nb, pg_catalog; DROP FUNCTION public.checks(jsonb)"
        )
        .await
        .as_deref(),
        Some("2BP01")
    );
}

/// Boundary: checker owners ↔ pg_intent. Route: an object replaced by its owner after it was
/// validated. A checker is vetted once and referenced by oid; its owner may replace its body
/// with one that writes, changes settings, changes role, or calls pg_intent. It runs as its
/// owner, restricted, in a subtransaction that is always rolled back: it can do nothing its owner
/// could not, and nothing it does stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_checker_runs_with_its_owners_rights_and_leaves_nothing() {
    let s = scene("tm_checker").await;
    // In intent_app, so that a call of pg_intent from the checker reaches pg_intent's refusal.
    let owner = create_login_role(&s.su, "checker_owner", "IN ROLE intent_app").await;
    run_each(
        &s.su,
        &format!(
            "CREATE SCHEMA co AUTHORIZATION \"{owner}\";
         SET ROLE \"{owner}\";
         CREATE TABLE co.loot (what text);
         CREATE FUNCTION co.check(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
         RESET ROLE;
         SELECT intent.define_contract('vetted', '{{\"type\": \"object\"}}', 'co.check(jsonb)');"
        ),
    )
    .await;
    let c = connect_role(&s.db, &owner).await;
    // Each replacement, and what must come of it.
    let replacements: &[(&str, &str)] = &[
        (
            "ALTER TABLE intent.jobs NO FORCE ROW LEVEL SECURITY",
            "42501",
        ),
        (
            "INSERT INTO co.loot SELECT owner_id FROM intent.jobs",
            "42501",
        ),
        ("SET ROLE postgres", "42501"),
        ("CREATE TEMP TABLE grab (x int)", "42501"),
        (
            "PERFORM intent.cancel_job('VICTIM', 'from a checker')",
            "42501",
        ),
        (
            "RESET ROLE; ALTER TABLE intent.jobs NO FORCE ROW LEVEL SECURITY",
            "42501",
        ),
    ];
    for (i, (body, code)) in replacements.iter().enumerate() {
        let body = body.replace("VICTIM", &s.victim_job.to_string());
        c.batch_execute(&format!(
            "CREATE FUNCTION co.volatile_{i}() RETURNS void LANGUAGE plpgsql VOLATILE AS $$ BEGIN {body}; END $$;
             CREATE OR REPLACE FUNCTION co.check(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
             BEGIN PERFORM co.volatile_{i}(); RETURN true; END $$;"
        ))
        .await
        .unwrap();
        let job = submit_full(
            &s.su,
            "victim",
            &format!("checked-{i}"),
            "gpu",
            &json!({}),
            Some("vetted"),
            3,
        )
        .await
        .unwrap();
        let a = begin(&s.su, job.job_id, None, "1 hour").await.unwrap();
        assert_eq!(
            complete(&s.su, a.attempt_id, 1, &json!({"n": i}))
                .await
                .unwrap(),
            "rejected",
            "{body}"
        );
        let error = attempt_row(&s.su, a.attempt_id).await.error.unwrap();
        assert!(
            error.to_string().contains(&format!("raised {code}")),
            "{body}: {error}"
        );
    }
    // A checker that writes what it may write, and changes settings, then says yes: the result
    // wins, and none of it is left.
    c.batch_execute(
        "CREATE FUNCTION co.busy() RETURNS void LANGUAGE plpgsql VOLATILE AS $$
         BEGIN
             INSERT INTO co.loot VALUES ('kept?');
             PERFORM set_config('work_mem', '1234kB', false);
             PERFORM set_config('search_path', 'co', false);
             SET application_name = 'changed by a checker';
         END $$;
         CREATE OR REPLACE FUNCTION co.check(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
         BEGIN PERFORM co.busy(); RETURN true; END $$;",
    )
    .await
    .unwrap();
    let before: (String, String, String) = {
        let r = s
            .su
            .query_one(
                "SELECT current_setting('work_mem'), current_setting('search_path'), current_setting('application_name')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let (_job, a) = begun(&s.su, "victim", "busy", "vetted").await;
    assert_eq!(
        complete(&s.su, a.attempt_id, 1, &json!({})).await.unwrap(),
        "won"
    );
    let after: (String, String, String) = {
        let r = s
            .su
            .query_one(
                "SELECT current_setting('work_mem'), current_setting('search_path'), current_setting('application_name')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(before, after, "settings a checker changed do not stay");
    let loot: i64 =
        s.su.query_one("SELECT count(*) FROM co.loot", &[])
            .await
            .unwrap()
            .get(0);
    assert_eq!(loot, 0, "what a checker wrote is rolled back");
    let forced: bool =
        s.su.query_one(
            "SELECT relforcerowsecurity FROM pg_class WHERE oid = 'intent.jobs'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(forced);
    // Made VOLATILE afterwards: refused at the next run.
    c.batch_execute("ALTER FUNCTION co.check(jsonb) VOLATILE")
        .await
        .unwrap();
    let (_job, a) = begun(&s.su, "victim", "volatile", "vetted").await;
    assert_eq!(
        complete(&s.su, a.attempt_id, 1, &json!({})).await.unwrap(),
        "rejected"
    );
    assert!(
        attempt_row(&s.su, a.attempt_id)
            .await
            .error
            .unwrap()
            .to_string()
            .contains("VOLATILE")
    );
    s.victim_untouched("replaced checkers").await;
}

/// Boundary: checker owners ↔ pg_intent, and the completing session ↔ the checker. Route: the
/// search path. A checker runs with `pg_catalog, pg_temp` — never the completing session's path,
/// where anything may be planted — unless it sets its own, which is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_runs_with_its_own_search_path_never_the_callers() {
    let s = scene("tm_checker_path").await;
    s.su.batch_execute(
        "CREATE SCHEMA kinds;
         CREATE TABLE kinds.allowed (kind text);
         INSERT INTO kinds.allowed VALUES ('cat');
         CREATE FUNCTION kinds.known(r jsonb) RETURNS boolean LANGUAGE sql STABLE
             SET search_path = kinds, pg_temp AS $$ SELECT r->>'kind' IN (SELECT kind FROM allowed) $$;
         CREATE FUNCTION kinds.unqualified(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
             BEGIN RETURN r->>'kind' IN (SELECT kind FROM allowed); END $$;
         SELECT intent.define_contract('kinds', '{\"type\": \"object\"}', 'kinds.known(jsonb)');
         SELECT intent.define_contract('loose-kinds', '{\"type\": \"object\"}', 'kinds.unqualified(jsonb)');",
    )
    .await
    .unwrap();
    for (contract, expected) in [("kinds", "won"), ("loose-kinds", "rejected")] {
        for path in ["public", "kinds, public"] {
            let c = db_client(&s.db, path).await;
            let key = format!("{contract}-{path}");
            let job = submit_full(&c, "victim", &key, "gpu", &json!({}), Some(contract), 3)
                .await
                .unwrap();
            let a = begin(&c, job.job_id, None, "1 hour").await.unwrap();
            assert_eq!(
                complete(&c, a.attempt_id, 1, &json!({"kind": "cat"}))
                    .await
                    .unwrap(),
                expected,
                "{contract} with the caller's search_path {path}"
            );
            let v: bool = c
                .query_one(
                    "SELECT valid FROM intent.validate_result($1, '{\"kind\": \"cat\"}')",
                    &[&contract],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                v,
                expected == "won",
                "validate_result {contract} under {path}"
            );
        }
    }
    // The completing session's temporary table named like the checker's own never stands in
    // for it: with pg_temp last it is not found before kinds.allowed. (A checker that leaves a
    // name to fall through to pg_temp, as kinds.unqualified does, can be fed one: a known
    // limit of docs/security.md § 3, as for any SECURITY DEFINER function.)
    let c = db_client(&s.db, "public").await;
    c.batch_execute(
        "CREATE TEMP TABLE allowed (kind text); INSERT INTO allowed VALUES ('dog');
         GRANT SELECT ON allowed TO PUBLIC;",
    )
    .await
    .unwrap();
    for contract in ["kinds"] {
        let v: bool = c
            .query_one(
                "SELECT valid FROM intent.validate_result($1, '{\"kind\": \"dog\"}')",
                &[&contract],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!v, "{contract}: the caller's temp table was read");
    }
    // A search_path without pg_temp last puts the caller's temporary tables first: refused
    // when defined (22023), and rejected when set afterwards.
    s.su.batch_execute(
        "CREATE FUNCTION kinds.temp_first(r jsonb) RETURNS boolean LANGUAGE sql STABLE
             SET search_path = kinds AS $$ SELECT r->>'kind' IN (SELECT kind FROM allowed) $$;",
    )
    .await
    .unwrap();
    let e = expect_error(
        &s.su,
        "SELECT intent.define_contract('temp-first', '{}', 'kinds.temp_first(jsonb)')",
        &[],
    )
    .await;
    assert_eq!(e.code, "22023", "{e:?}");
    assert!(e.message.contains("does not end with pg_temp"), "{e:?}");
    s.su.batch_execute("ALTER FUNCTION kinds.known(jsonb) SET search_path = kinds")
        .await
        .unwrap();
    let (v, errors): (bool, String) = {
        let r = c
            .query_one(
                "SELECT valid, errors::text FROM intent.validate_result('kinds', '{\"kind\": \"dog\"}')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(
        !v && errors.contains("does not end with pg_temp"),
        "{errors}"
    );
}

/// Boundary: any session ↔ a contract's checker. Route: `quote_all_identifiers`, which changes
/// how PostgreSQL writes identities (a contract stores its checker by identity): on in the
/// defining, completing or dropping session, it must neither detach a checker nor get one
/// past the drop guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoting_settings_neither_detach_nor_unguard_a_checker() {
    let s = scene("tm_quoting").await;
    s.su.batch_execute(
        "SET quote_all_identifiers = on;
         CREATE FUNCTION public.q_check(r jsonb) RETURNS boolean LANGUAGE sql STABLE
             AS $$ SELECT r ? 'n' $$;
         SELECT intent.define_contract('quoted', '{}', 'public.q_check(jsonb)');",
    )
    .await
    .unwrap();
    let stored: String =
        s.su.query_one(
            "SELECT checker FROM intent.contracts WHERE name = 'quoted'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, "public.q_check(pg_catalog.jsonb)");
    for quoting in ["on", "off"] {
        let c = s.db.connect().await;
        c.batch_execute(&format!("SET quote_all_identifiers = {quoting}"))
            .await
            .unwrap();
        let (v, errors): (bool, String) = {
            let r = c
                .query_one(
                    "SELECT valid, errors::text FROM intent.validate_result('quoted', '{\"n\": 1}')",
                    &[],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1))
        };
        assert!(v, "quote_all_identifiers = {quoting}: {errors}");
        let e = expect_error(&c, "DROP FUNCTION public.q_check(jsonb)", &[]).await;
        assert_eq!(e.code, "2BP01", "quote_all_identifiers = {quoting}: {e:?}");
    }
    // An overload that is not the checker drops as usual.
    s.su.batch_execute(
        "SET quote_all_identifiers = on;
         CREATE FUNCTION public.q_check(r text) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
         DROP FUNCTION public.q_check(text);",
    )
    .await
    .unwrap();
}

async fn db_client(db: &Db<'_>, search_path: &str) -> Client {
    let c = db.connect().await;
    c.batch_execute(&format!("SET search_path = {search_path}"))
        .await
        .unwrap();
    c
}

/// Boundary: intent_admin ↔ functions it may not run. Route: naming, as a contract's checker, a
/// function the admin has no EXECUTE on, so that pg_intent runs it on every result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_cannot_lend_itself_a_function_it_may_not_run() {
    let s = scene("tm_admin_lend").await;
    let other = create_login_role(&s.su, "private_owner", "").await;
    run_each(&s.su, &format!(
        "CREATE SCHEMA priv AUTHORIZATION \"{other}\";
         GRANT USAGE ON SCHEMA priv TO PUBLIC;
         SET ROLE \"{other}\";
         CREATE FUNCTION priv.secret(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
         REVOKE EXECUTE ON FUNCTION priv.secret(jsonb) FROM PUBLIC;
         RESET ROLE;"
    )).await;
    let admin = create_login_role(&s.su, "admin", "IN ROLE intent_admin").await;
    let c = connect_role(&s.db, &admin).await;
    let e = expect_error(
        &c,
        "SELECT intent.define_contract('lent', '{}', 'priv.secret(jsonb)')",
        &[],
    )
    .await;
    assert_eq!(e.code, "42501", "{e:?}");
    // EXECUTE is not enough: the checker would run as private_owner, with rights (its table)
    // the admin does not have, and every caller of validate_result would get an oracle.
    s.su.batch_execute(&format!(
        "GRANT EXECUTE ON FUNCTION priv.secret(jsonb) TO \"{admin}\";
         SET ROLE \"{other}\";
         CREATE TABLE priv.cards (email text, card text);
         INSERT INTO priv.cards VALUES ('vip@example.com', '4111');
         CREATE FUNCTION priv.known(j jsonb) RETURNS boolean LANGUAGE sql STABLE AS
             $$ SELECT EXISTS (SELECT 1 FROM priv.cards WHERE card LIKE (j->>'prefix') || '%') $$;
         RESET ROLE;"
    ))
    .await
    .unwrap();
    for checker in ["priv.secret(jsonb)", "priv.known(jsonb)"] {
        let e = expect_error(
            &c,
            &format!("SELECT intent.define_contract('lent', '{{}}', '{checker}')"),
            &[],
        )
        .await;
        assert_eq!(e.code, "42501", "{checker}: {e:?}");
        assert!(e.detail().contains("runs as its owner"), "{e:?}");
    }
    // A member of the owner's role may.
    s.su.batch_execute(&format!("GRANT \"{other}\" TO \"{admin}\""))
        .await
        .unwrap();
    c.query(
        "SELECT intent.define_contract('lent', '{}', 'priv.known(jsonb)')",
        &[],
    )
    .await
    .unwrap();
}

/// Boundary: bound tenant ↔ other owners. Route: a role binding written with another case
/// (`ALTER ROLE … SET "INTENT.owner_id" = …`, which PostgreSQL applies at login, comparing names
/// without case) displaced through the startup packet: it must bind all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_written_in_another_case_binds_too() {
    let s = scene("tm_binding_case").await;
    let role = create_login_role(&s.su, "cased", "IN ROLE intent_operator").await;
    // Written by a session that has not loaded the library, so it is stored as typed.
    let fresh = s.db.connect().await;
    fresh
        .batch_execute(&format!(
            "ALTER ROLE \"{role}\" SET \"INTENT.owner_id\" = 'tenant-c'"
        ))
        .await
        .unwrap();
    let stored: String = s
        .su
        .query_one(
            "SELECT array_to_string(setconfig, ',') FROM pg_db_role_setting WHERE setrole = $1::text::regrole",
            &[&role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        stored.starts_with("INTENT.owner_id="),
        "stored as typed: {stored}"
    );
    for options in ["-c intent.owner_id=", "-c intent.owner_id=victim"] {
        let Ok((c, _)) = connect_role_with(&s.db, &role, Some(options)).await else {
            continue;
        };
        let bound: Option<String> = c
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(bound.as_deref(), Some("tenant-c"), "{options}");
        refusal(cancel(&c, s.victim_job, None).await, "IJ007");
    }
    s.victim_untouched("a binding written in another case")
        .await;
}

/// Boundary: bound tenant ↔ other owners. Route: the library's first load happening in parallel
/// mode — in the leader, under a Gather (a parallel-restricted function reading pg_intent's
/// tables), or in a parallel worker in the middle of a query — where PostgreSQL refuses to put
/// the role's binding back as the setting. The binding must hold all the same, in the worker
/// too, and after the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_load_in_parallel_mode_keeps_the_binding() {
    let s = scene("tm_parallel_load").await;
    submit(&s.su, "tenant-b", "theirs", "gpu", &json!({"secret": 1}))
        .await
        .unwrap();
    s.su.batch_execute(
        "CREATE TABLE public.spread AS SELECT g FROM generate_series(1, 20000) g;
         GRANT SELECT ON public.spread TO PUBLIC;
         CREATE FUNCTION public.peek() RETURNS bigint LANGUAGE plpgsql STABLE PARALLEL SAFE AS
             $$ BEGIN RETURN (SELECT count(*) FROM intent.jobs); END $$;",
    )
    .await
    .unwrap();
    let parallel = "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
                    SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2;";
    // In the leader, under a Gather: table_to_xml is parallel restricted.
    let t = s.tenant().await;
    t.batch_execute(parallel).await.unwrap();
    let xml: String = t
        .query_one(
            "SELECT table_to_xml('intent.jobs', true, false, '')::text
               FROM (SELECT g FROM public.spread LIMIT 1) s",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !xml.contains("tenant-b"),
        "the first load under a Gather saw another owner: {xml}"
    );
    for sql in [
        "SELECT count(*) FROM intent.jobs",
        "SELECT count(*) FROM intent.jobs WHERE owner_id = 'tenant-b'",
    ] {
        let n: i64 = t.query_one(sql, &[]).await.unwrap().get(0);
        assert_eq!(n, 0, "{sql}");
    }
    refusal(cancel(&t, s.victim_job, None).await, "IJ007");
    // In workers: the leader never loaded the library; each worker loads it mid-query.
    let t = s.tenant().await;
    t.batch_execute(parallel).await.unwrap();
    t.batch_execute(
        "SELECT set_config(name, 'on', false) FROM pg_settings
          WHERE name IN ('force_parallel_mode', 'debug_parallel_query')",
    )
    .await
    .unwrap();
    let seen: i64 = t
        .query_one("SELECT max(public.peek()) FROM public.spread", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        seen, 0,
        "a worker that loaded the library saw other owners' jobs"
    );
    let bound: Option<String> = t
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound.as_deref(), Some("tenant-a"));
    s.victim_untouched("a first load in parallel mode").await;
}

/// Boundary: bound tenant ↔ other owners. Route: `RESET ALL` (any role may run it, from any
/// code) inside a trusted gateway's transaction bound with `SET LOCAL`, from a tenant's trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_cannot_unbind_a_gateways_transaction() {
    let s = scene("tm_reset_all").await;
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_app").await;
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
    ))
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE TABLE evil.inbox (x int);
         GRANT INSERT ON evil.inbox TO \"{gateway}\";
         GRANT USAGE ON SCHEMA evil TO \"{gateway}\";
         CREATE FUNCTION evil.inbox_trigger() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
             SET search_path = pg_catalog AS $$
         BEGIN
             RESET ALL;
             PERFORM intent.cancel_job('{victim}', 'reset all');
             RETURN NEW;
         EXCEPTION WHEN OTHERS THEN RETURN NEW;
         END $$;
         CREATE TRIGGER t BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.inbox_trigger();",
        victim = s.victim_job
    ))
    .await
    .unwrap();
    // The gateway loads pg_intent before it binds (pg_intent_client::bind_owner does): before
    // the library is loaded the setting is only a placeholder, which RESET ALL clears
    // (docs/security.md, known limits).
    let g = connect_role(&s.db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    g.batch_execute(
        "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; INSERT INTO evil.inbox VALUES (1)",
    )
    .await
    .unwrap();
    let bound: Option<String> = g
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        bound.as_deref(),
        Some("tenant-a"),
        "RESET ALL unbound the request"
    );
    refusal(cancel(&g, s.victim_job, None).await, "IJ007");
    g.batch_execute("COMMIT").await.unwrap();
    s.victim_untouched("RESET ALL in a gateway's transaction")
        .await;
}

/// Boundary: checker owners ↔ other owners. Route: a checker reads pg_intent's tables as its
/// owner, in the completing session — an unbound worker's, or a gateway's bound one where the
/// checker runs `RESET ALL`, or through parallel workers of its own queries. A checker judges
/// the result it is given: it sees no owner's rows, and its workers none but its own owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_sees_no_owners_rows() {
    let s = scene("tm_checker_rows").await;
    submit(
        &s.su,
        "tenant-b",
        "theirs",
        "gpu",
        &json!({"secret": "b-params-SECRET"}),
    )
    .await
    .unwrap();
    let t = s.tenant().await;
    // force_parallel_mode became debug_parallel_query in PostgreSQL 16.
    let force_parallel: String = t
        .query_one(
            "SELECT name FROM pg_settings WHERE name IN ('force_parallel_mode', 'debug_parallel_query')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    t.batch_execute(&format!(
        "CREATE FUNCTION evil.reset() RETURNS void LANGUAGE sql VOLATILE AS 'RESET ALL';
         CREATE FUNCTION evil.peek() RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS
             $$ SELECT coalesce(string_agg(owner_id || ':' || params::text, ';'), '') FROM intent.jobs $$;
         CREATE FUNCTION evil.helper() RETURNS SETOF text LANGUAGE plpgsql STABLE AS
             $$ BEGIN RETURN QUERY SELECT evil.peek(); END $$;
         CREATE FUNCTION evil.sees(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
         BEGIN
             PERFORM evil.reset();
             RETURN (SELECT count(*) = 0 FROM intent.jobs) AND (SELECT count(*) = 0 FROM intent.events);
         END $$;
         CREATE FUNCTION evil.leaks(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE
             SET {force_parallel} = on SET parallel_setup_cost = 0 SET parallel_tuple_cost = 0 AS $$
         DECLARE seen text;
         BEGIN
             SELECT string_agg(x, '|') INTO seen FROM evil.helper() x;
             RAISE EXCEPTION 'LEAK[%]', seen;
         END $$;"
    ))
    .await
    .unwrap();
    // A checker owner that may set the parameter: a reset by NULL (which runs no check hook)
    // in the leader, then reads there and through workers; and a function whose SET clause
    // names another owner, applied in a worker.
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{t}\";
         CREATE TABLE public.spread AS SELECT g FROM generate_series(1, 20000) g;
         GRANT SELECT ON public.spread TO PUBLIC;",
        t = s.tenant
    ))
    .await
    .unwrap();
    t.batch_execute(&format!(
        "CREATE FUNCTION evil.as_b(int) RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE
             SET intent.owner_id = 'tenant-b'
             AS $$ SELECT count(*) FROM intent.jobs WHERE owner_id = 'tenant-b' $$;
         CREATE FUNCTION evil.unpins(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE
             SET {force_parallel} = on SET parallel_setup_cost = 0 SET parallel_tuple_cost = 0
             SET parallel_leader_participation = off AS $$
         DECLARE seen text;
         BEGIN
             PERFORM set_config('intent.owner_id', NULL, true);
             SELECT string_agg(x, '|') INTO seen FROM evil.helper() x;
             seen := seen || '/' || coalesce((SELECT string_agg(owner_id || '', ',') FROM intent.jobs), '');
             RAISE EXCEPTION 'LEAK[%]', seen;
         END $$;
         CREATE FUNCTION evil.sets_b(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE
             SET {force_parallel} = on SET parallel_setup_cost = 0 SET parallel_tuple_cost = 0
             SET parallel_leader_participation = off AS $$
         BEGIN
             RAISE EXCEPTION 'LEAK[%]', (SELECT evil.as_b(g) FROM public.spread WHERE g = 1);
         END $$;"
    ))
    .await
    .unwrap();
    s.su.batch_execute(&format!(
        "GRANT \"{}\" TO CURRENT_USER;
         SELECT intent.define_contract('sees', '{{}}', 'evil.sees(jsonb)');
         SELECT intent.define_contract('leaks', '{{}}', 'evil.leaks(jsonb)');
         SELECT intent.define_contract('unpins', '{{}}', 'evil.unpins(jsonb)');
         SELECT intent.define_contract('sets_b', '{{}}', 'evil.sets_b(jsonb)');",
        s.tenant
    ))
    .await
    .unwrap();
    for contract in ["unpins", "sets_b"] {
        let (_job, a) = begun(&s.su, "tenant-a", contract, contract).await;
        assert_eq!(
            complete(&s.su, a.attempt_id, 1, &json!({})).await.unwrap(),
            "rejected",
            "{contract}"
        );
        let error = attempt_row(&s.su, a.attempt_id)
            .await
            .error
            .unwrap()
            .to_string();
        assert!(
            !error.contains("tenant-b") && !error.contains("victim") && !error.contains("LEAK[1]"),
            "{contract}: {error}"
        );
    }
    // Completed by an unbound worker: the checker sees nothing.
    let (_job, a) = begun(&s.su, "tenant-a", "checked", "sees").await;
    assert_eq!(
        complete(&s.su, a.attempt_id, 1, &json!({})).await.unwrap(),
        "won"
    );
    // validate_result from an unbound session: nothing either.
    let app = create_login_role(&s.su, "app", "IN ROLE intent_operator").await;
    let c = connect_role(&s.db, &app).await;
    let valid: bool = c
        .query_one(
            "SELECT valid FROM intent.validate_result('sees', '{}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(valid);
    // Through parallel workers of the checker's own query: the checker's rejection tells what
    // it saw. Never another owner's rows.
    let (_job, a) = begun(&s.su, "tenant-a", "leaky", "leaks").await;
    assert_eq!(
        complete(&s.su, a.attempt_id, 1, &json!({})).await.unwrap(),
        "rejected"
    );
    let error = attempt_row(&s.su, a.attempt_id)
        .await
        .error
        .unwrap()
        .to_string();
    assert!(error.contains("LEAK["), "{error}");
    assert!(
        !error.contains("tenant-b") && !error.contains("victim"),
        "{error}"
    );
    let v: String = c
        .query_one(
            "SELECT errors::text FROM intent.validate_result('leaks', '{}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!v.contains("tenant-b") && !v.contains("victim"), "{v}");
    s.victim_untouched("a checker reading pg_intent's tables")
        .await;
}

/// Boundary: bound tenant ↔ other owners. Route: a tenant's invoker-rights trigger fired inside a
/// gateway's bound transaction runs as the gateway, which may set the parameter: it rebinds the
/// rest of the request (SET LOCAL, set_config), or unbinds it (RESET), and then reads through
/// a parallel worker, which restores the leader's setting and none of its memory. One
/// transaction acts for one owner: once bound, any change of the binding within the transaction
/// is refused (42501), so the setting a worker restores is always the transaction's binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_cannot_change_within_a_transaction() {
    let s = scene("tm_rebind").await;
    let theirs = submit(&s.su, "tenant-b", "theirs", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_operator").await;
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\";
         CREATE TABLE public.big AS SELECT g FROM generate_series(1, 20000) g;
         GRANT SELECT ON public.big TO PUBLIC;"
    ))
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE TABLE evil.inbox (x int);
         CREATE TABLE evil.seen (n bigint);
         GRANT INSERT ON evil.inbox TO \"{gateway}\";
         GRANT INSERT, SELECT ON evil.seen TO \"{gateway}\";
         GRANT USAGE ON SCHEMA evil TO \"{gateway}\";
         CREATE FUNCTION evil.rebind() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             CASE NEW.x
                 WHEN 1 THEN SET LOCAL intent.owner_id = 'tenant-b';
                 WHEN 2 THEN RESET intent.owner_id;
                 WHEN 3 THEN PERFORM set_config('intent.owner_id', 'victim', true);
                 WHEN 4 THEN SET intent.owner_id = '';
                 -- Resets PostgreSQL makes without the setting's check hook.
                 WHEN 5 THEN PERFORM set_config('intent.owner_id', NULL, true);
                 ELSE UPDATE pg_settings SET setting = NULL WHERE name = 'intent.owner_id';
             END CASE;
             -- What the tenant's code can then read and do.
             PERFORM intent.cancel_job(j.id, 'from the trigger') FROM intent.jobs j WHERE j.owner_id <> 'tenant-a';
             INSERT INTO evil.seen SELECT count(*) FROM intent.jobs WHERE owner_id <> 'tenant-a';
             RETURN NEW;
         END $$;
         CREATE TRIGGER t BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.rebind();
         -- What a parallel worker of the gateway's transaction can read of other owners' jobs.
         CREATE FUNCTION evil.peek(int) RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE AS
             $$ SELECT count(*) FROM intent.jobs WHERE owner_id <> 'tenant-a' $$;
         GRANT EXECUTE ON FUNCTION evil.peek(int) TO \"{gateway}\";"
    ))
    .await
    .unwrap();
    let g = connect_role(&s.db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    let force: String = g
        .query_one(
            "SELECT name FROM pg_settings WHERE name IN ('force_parallel_mode', 'debug_parallel_query')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    g.batch_execute(&format!(
        "SET {force} = on; SET parallel_leader_participation = off;
         SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;"
    ))
    .await
    .unwrap();
    for x in [1, 2, 3, 4, 5, 6] {
        // The reproduction, by the tenant's trigger, then read through a worker.
        g.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; SAVEPOINT s")
            .await
            .unwrap();
        let inserted = g
            .batch_execute(&format!("INSERT INTO evil.inbox VALUES ({x})"))
            .await;
        if x <= 4 {
            // A change the setting's check hook (or, for RESET, the utility hook) sees: refused.
            let e = SqlError::from_error(&inserted.expect_err("the trigger changed the binding"));
            assert_eq!(e.code, "42501", "x = {x}: {e:?}");
            assert!(
                e.message
                    .contains("cannot change within a transaction once it has bound it"),
                "x = {x}: {e:?}"
            );
            g.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
        } else {
            // A reset PostgreSQL makes without asking: the rest of the transaction acts for no
            // owner, in the trigger and after it, in the leader and in its workers.
            inserted.unwrap_or_else(|e| panic!("x = {x}: {e:?}"));
            let seen: i64 = g
                .query_one("SELECT max(n) FROM evil.seen", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(seen, 0, "x = {x}: the trigger read other owners' jobs");
        }
        let bound: Option<String> = g
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        let expected = if x <= 4 { "tenant-a" } else { "" };
        assert_eq!(bound.as_deref(), Some(expected), "x = {x}");
        let seen: i64 = g
            .query_one("SELECT evil.peek(g) FROM public.big WHERE g = 1", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            seen, 0,
            "x = {x}: a parallel worker read other owners' jobs"
        );
        let victim = if x == 1 { theirs.job_id } else { s.victim_job };
        refusal(cancel(&g, victim, None).await, "IJ007");
        g.batch_execute("ROLLBACK").await.unwrap();
    }
    // A function's SET clause, which PostgreSQL also applies inside a parallel worker: refused
    // there as in the leader.
    s.su.batch_execute(&format!(
        "CREATE FUNCTION public.as_b(int) RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE
             SET intent.owner_id = 'tenant-b'
             AS $$ SELECT count(*) FROM intent.jobs WHERE owner_id = 'tenant-b' $$;
         GRANT EXECUTE ON FUNCTION public.as_b(int) TO \"{gateway}\";"
    ))
    .await
    .unwrap();
    for (place, sql) in [
        (
            "a worker",
            "SELECT public.as_b(g) FROM public.big WHERE g = 1",
        ),
        ("the leader", "SELECT public.as_b(1)"),
    ] {
        g.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
            .await
            .unwrap();
        g.query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap();
        let e = g.query_one(sql, &[]).await.expect_err(place);
        assert_eq!(SqlError::from_error(&e).code, "42501", "{place}: {e:?}");
        g.batch_execute("ROLLBACK").await.unwrap();
    }
    // The gateway itself, after a read bound the transaction: refused the same way.
    for change in [
        "RESET intent.owner_id",
        "SET LOCAL intent.owner_id = 'tenant-b'",
        "SELECT set_config('intent.owner_id', '', true)",
    ] {
        g.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
            .await
            .unwrap();
        g.query_one("SELECT count(*) FROM intent.jobs", &[])
            .await
            .unwrap();
        assert_eq!(
            sqlstate_of(&g, change).await.as_deref(),
            Some("42501"),
            "{change}"
        );
        g.batch_execute("ROLLBACK").await.unwrap();
    }
    // Setting the same owner again is no change; the next transaction binds afresh.
    g.batch_execute(
        "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; SET LOCAL intent.owner_id = 'tenant-a'; COMMIT;
         BEGIN; SET LOCAL intent.owner_id = 'tenant-b'",
    )
    .await
    .unwrap();
    let bound: Option<String> = g
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound.as_deref(), Some("tenant-b"));
    let seen: i64 = g
        .query_one("SELECT evil.peek(g) FROM public.big WHERE g = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        seen, 1,
        "a worker of tenant-b's transaction sees tenant-b's job"
    );
    g.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(job_row(&s.su, theirs.job_id).await.state, "pending");
    s.victim_untouched("rebinding within a transaction").await;
}

/// Boundary: bound tenant ↔ other owners. Route: a reset by NULL made by the tenant's code
/// *inside* ExecutorStart — executor-startup partition pruning evaluates a STABLE function —
/// after the check at ExecutorStart's entry and before the Gather copies the settings to its
/// workers (found by the second review of #24). The workers must read no owner's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_during_executor_start_does_not_reach_the_workers() {
    let s = scene("tm_prune_reset").await;
    submit(&s.su, "tenant-b", "theirs", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_operator").await;
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
    ))
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE TABLE evil.parted (k int) PARTITION BY LIST (k);
         CREATE TABLE evil.p1 PARTITION OF evil.parted FOR VALUES IN (1);
         CREATE TABLE evil.p2 PARTITION OF evil.parted FOR VALUES IN (2);
         INSERT INTO evil.parted VALUES (1);
         CREATE FUNCTION evil.reset() RETURNS int LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
         BEGIN
             -- Resets a binding, leaving pg_intent's own \"no owner\" alone (resetting that
             -- in a worker would only make PostgreSQL refuse the statement).
             IF coalesce(current_setting('intent.owner_id', true), '') NOT IN ('')
                AND current_setting('intent.owner_id', true) NOT LIKE '(no owner%' THEN
                 PERFORM set_config('intent.owner_id', NULL, true);
             END IF;
             RETURN 1;
         END $$;
         CREATE FUNCTION evil.who(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS
             $$ SELECT coalesce(string_agg(owner_id || '', ','), '') FROM intent.jobs $$;
         CREATE FUNCTION evil.grab() RETURNS SETOF text LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM set_config(name, 'on', true) FROM pg_settings
               WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
             PERFORM set_config('parallel_leader_participation', 'off', true);
             PERFORM set_config('parallel_setup_cost', '0', true);
             PERFORM set_config('parallel_tuple_cost', '0', true);
             RETURN QUERY SELECT evil.who(k) FROM evil.parted WHERE k = evil.reset();
         END $$;
         CREATE TABLE evil.inbox (x int);
         CREATE TABLE evil.loot (what text);
         CREATE FUNCTION evil.steal() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO evil.loot SELECT * FROM evil.grab(); RETURN NEW; END $$;
         CREATE TRIGGER t BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.steal();
         GRANT USAGE ON SCHEMA evil TO \"{gateway}\";
         GRANT SELECT ON evil.parted, evil.p1, evil.p2, evil.loot TO \"{gateway}\";
         GRANT INSERT ON evil.inbox, evil.loot TO \"{gateway}\";
         GRANT EXECUTE ON FUNCTION evil.reset(), evil.who(int), evil.grab() TO \"{gateway}\";"
    ))
    .await
    .unwrap();
    let g = connect_role(&s.db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    g.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; SAVEPOINT s")
        .await
        .unwrap();
    // Either the tenant's statement fails (its function, run again in a worker that restored
    // "no owner", tries to reset the setting there, which PostgreSQL refuses in parallel
    // mode), or it runs and its workers read nothing. Never another owner's rows.
    if let Err(e) = g.batch_execute("INSERT INTO evil.inbox VALUES (1)").await {
        let e = SqlError::from_error(&e);
        assert!(["25000", "42501"].contains(&e.code.as_str()), "{e:?}");
        g.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    }
    let loot: Vec<String> = g
        .query("SELECT what FROM evil.loot", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        loot.iter().all(|w| w.is_empty()),
        "the workers read other owners' jobs: {loot:?}"
    );
    refusal(cancel(&g, s.victim_job, None).await, "IJ007");
    g.batch_execute("ROLLBACK").await.unwrap();
    s.victim_untouched("a reset during ExecutorStart").await;
}

/// Boundary: bound tenant ↔ other owners. Route: a parallel index build, which launches its
/// workers without the executor: PostgreSQL folds the index expression's constant parts in the
/// leader just before, and a tenant's IMMUTABLE function there resets the setting by NULL after
/// every pin (found by the third review of #24). The workers trust
/// `intent.transaction_binding`, which no SQL can change: they read no other owner's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_a_parallel_index_build_does_not_reach_its_workers() {
    let s = scene("tm_index_reset").await;
    submit(&s.su, "tenant-b", "theirs", "gpu", &json!({}))
        .await
        .unwrap();
    submit(&s.su, "tenant-a", "mine", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_operator").await;
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
    ))
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE FUNCTION evil.reset() RETURNS int LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
         BEGIN
             IF coalesce(current_setting('intent.owner_id', true), '') <> ''
                AND current_setting('intent.owner_id', true) NOT LIKE '(no owner%' THEN
                 PERFORM set_config('intent.owner_id', NULL, true);
             END IF;
             RETURN 0;
         END $$;
         -- What a worker (not the leader) of the build reads, as an error the trigger records.
         CREATE FUNCTION evil.who(int) RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
         DECLARE j text := (SELECT coalesce(string_agg(owner_id || '', ',' ORDER BY owner_id), '') FROM intent.jobs);
         BEGIN
             IF pg_backend_pid() <> current_setting('evil.leader')::int THEN
                 RAISE EXCEPTION 'WORKER[%]', j;
             END IF;
             -- The leader takes part in an index build (a compile-time choice, not the
             -- setting): slowed, it cannot scan every block before a late worker starts.
             PERFORM pg_sleep(0.01);
             RETURN j;
         END $$;
         CREATE TABLE evil.inbox (x int);
         CREATE TABLE evil.loot (what text);
         CREATE FUNCTION evil.steal() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM set_config('evil.leader', pg_backend_pid()::text, true);
             CREATE TABLE evil.t (k int) WITH (parallel_workers = 2);
             INSERT INTO evil.t SELECT generate_series(1, 1000);
             BEGIN
                 IF NEW.x = 1 THEN CREATE INDEX ON evil.t ((evil.who(k + evil.reset())));
                 ELSE CREATE INDEX ON evil.t ((evil.who(k))); END IF;
                 INSERT INTO evil.loot VALUES ('no worker read anything, x=' || NEW.x);
             EXCEPTION WHEN OTHERS THEN
                 INSERT INTO evil.loot VALUES (SQLERRM);
             END;
             DROP TABLE evil.t;
             RETURN NEW;
         END $$;
         CREATE TRIGGER t BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.steal();
         GRANT USAGE, CREATE ON SCHEMA evil TO \"{gateway}\";
         GRANT INSERT, SELECT ON evil.inbox, evil.loot TO \"{gateway}\";
         GRANT EXECUTE ON FUNCTION evil.reset(), evil.who(int) TO \"{gateway}\";"
    ))
    .await
    .unwrap();
    let g = connect_role(&s.db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    for x in [2, 1] {
        g.batch_execute(&format!(
            "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; INSERT INTO evil.inbox VALUES ({x}); COMMIT"
        ))
        .await
        .unwrap();
    }
    let loot: Vec<String> = g
        .query("SELECT what FROM evil.loot", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(loot.len(), 2, "{loot:?}");
    // The control (no reset): the workers read the bound owner's jobs only. With the reset:
    // nothing, or only that owner's — never another owner's.
    assert!(
        loot.iter().any(|w| w.contains("WORKER[tenant-a]")),
        "a worker of the control build ran: {loot:?}"
    );
    assert!(
        loot.iter()
            .all(|w| !w.contains("tenant-b") && !w.contains("victim")),
        "a worker of a bound transaction read other owners' jobs: {loot:?}"
    );
    s.victim_untouched("a reset before a parallel index build")
        .await;
}

/// Boundary: bound tenant ↔ other owners. Route: a gateway that binds with a session-level
/// `SET` (not `SET LOCAL`): in each later transaction, tenant code that runs before anything
/// has read the binding (a trigger on the tenant's own table) rebinds or unbinds it (found by
/// the fourth review of #24). The binding in force at a transaction's first statement binds
/// the transaction: the change is refused, or, for a reset PostgreSQL makes without asking,
/// the rest of the transaction acts for no owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_level_binding_binds_each_transaction() {
    let s = scene("tm_session_bind").await;
    submit(&s.su, "tenant-b", "theirs", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_operator").await;
    s.su.batch_execute(&format!(
        "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
    ))
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(&format!(
        "CREATE TABLE evil.inbox (x int);
         CREATE TABLE evil.loot (x int, what text);
         CREATE FUNCTION evil.rebind() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             CASE NEW.x
                 WHEN 1 THEN PERFORM set_config('intent.owner_id', NULL, true);
                 WHEN 2 THEN PERFORM set_config('intent.owner_id', 'victim', true);
                 ELSE RESET intent.owner_id;
             END CASE;
             INSERT INTO evil.loot SELECT NEW.x, coalesce(string_agg(owner_id || '', ','), '') FROM intent.jobs;
             RETURN NEW;
         END $$;
         CREATE TRIGGER t BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.rebind();
         GRANT USAGE ON SCHEMA evil TO \"{gateway}\";
         GRANT INSERT, SELECT ON evil.inbox, evil.loot TO \"{gateway}\";"
    ))
    .await
    .unwrap();
    let g = connect_role(&s.db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    g.batch_execute("SET intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    for x in [1, 2, 3] {
        match g
            .batch_execute(&format!("INSERT INTO evil.inbox VALUES ({x})"))
            .await
        {
            Ok(()) => {}
            Err(e) => assert_eq!(SqlError::from_error(&e).code, "42501", "x = {x}: {e:?}"),
        }
        let bound: Option<String> = g
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            bound.as_deref(),
            Some("tenant-a"),
            "x = {x}: the session's binding"
        );
    }
    let loot: Vec<String> = g
        .query("SELECT what FROM evil.loot", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        loot.iter().all(|w| w.is_empty() || w == "tenant-a"),
        "the tenant's trigger read other owners' jobs: {loot:?}"
    );
    // The gateway itself still rebinds between transactions, with SET statements.
    for sql in [
        "SET intent.owner_id = 'tenant-b'",
        "BEGIN",
        "SET LOCAL intent.owner_id = 'victim'",
        "COMMIT",
    ] {
        g.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    refusal(cancel(&g, s.victim_job, None).await, "IJ007");
    s.victim_untouched("a session-level binding").await;
}

/// Boundary: bound tenant ↔ other owners. Route: a gateway binds with `SET LOCAL` before the
/// library is loaded (a placeholder), and the library's first load happens in parallel mode,
/// where PostgreSQL would drop the placeholder's value — in the leader under a Gather, or in a
/// worker mid-query. The load is refused (55000) and the placeholder kept: once the library is
/// loaded outside parallel mode, the leader and its workers act for the gateway's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_dropped_by_a_parallel_first_load_is_refused() {
    let s = scene("tm_poison").await;
    submit(&s.su, "tenant-a", "mine", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&s.su, "gateway", "IN ROLE intent_app").await;
    // A reader of pg_intent's tables that row-level security binds (not a superuser).
    let reader = create_login_role(&s.su, "reader", "IN ROLE intent_operator").await;
    run_each(
        &s.su,
        &format!(
            "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\";
         CREATE TABLE public.spread AS SELECT g FROM generate_series(1, 20000) g;
         GRANT SELECT ON public.spread TO PUBLIC;
         CREATE SCHEMA r AUTHORIZATION \"{reader}\";
         GRANT USAGE ON SCHEMA r TO PUBLIC;
         SET ROLE \"{reader}\";
         CREATE FUNCTION r.peek_definer() RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE
             SECURITY DEFINER AS 'SELECT count(*) FROM intent.jobs';
         RESET ROLE;"
        ),
    )
    .await;
    let parallel = "SET LOCAL parallel_setup_cost = 0; SET LOCAL parallel_tuple_cost = 0;
         SET LOCAL min_parallel_table_scan_size = 0;
         SELECT set_config(name, 'on', true) FROM pg_settings
          WHERE name IN ('force_parallel_mode', 'debug_parallel_query');";
    for participation in ["on", "off"] {
        let g = connect_role(&s.db, &gateway).await;
        g.batch_execute(&format!(
            "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; {parallel}
             SET LOCAL parallel_leader_participation = {participation};"
        ))
        .await
        .unwrap();
        let e = g
            .query_one("SELECT max(r.peek_definer()) FROM public.spread", &[])
            .await
            .expect_err("a first load in parallel mode that would drop the binding");
        let e = SqlError::from_error(&e);
        assert_eq!(e.code, "55000", "participation {participation}: {e:?}");
        g.batch_execute("ROLLBACK").await.unwrap();
        // Loaded outside parallel mode, the binding holds in the leader and in every worker.
        g.batch_execute(&format!(
            "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'; {parallel}
             SET LOCAL parallel_leader_participation = {participation};"
        ))
        .await
        .unwrap();
        let bound: Option<String> = g
            .query_one("SELECT intent.bound_owner()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(bound.as_deref(), Some("tenant-a"));
        let seen: i64 = g
            .query_one("SELECT max(r.peek_definer()) FROM public.spread", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            seen, 1,
            "participation {participation}: the workers' binding"
        );
        refusal(cancel(&g, s.victim_job, None).await, "IJ007");
        g.batch_execute("ROLLBACK").await.unwrap();
    }
    s.victim_untouched("a parallel first load").await;
}

/// Boundary: bound tenant ↔ other owners. Route: a tenant's index expression reads pg_intent's
/// tables (nothing refuses a read) when a DBA's `ANALYZE` or autovacuum runs it, as the tenant,
/// in an unbound session: what it reads lands in `pg_stats`. It reads as the tenant it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_reads_as_the_table_owner() {
    let s = scene("tm_maintenance_reads").await;
    submit(
        &s.su,
        "tenant-b",
        "theirs",
        "gpu",
        &json!({"secret": "b-params-SECRET"}),
    )
    .await
    .unwrap();
    let t = s.tenant().await;
    t.batch_execute(
        "CREATE FUNCTION evil.leak(int) RETURNS text LANGUAGE sql IMMUTABLE AS
             $$ SELECT coalesce(string_agg(DISTINCT owner_id || params::text, ';'), 'none') FROM intent.jobs $$;
         CREATE TABLE evil.t2 (x int);
         CREATE INDEX t2_leak ON evil.t2 ((evil.leak(x)));
         INSERT INTO evil.t2 SELECT 1 FROM generate_series(1, 100);",
    )
    .await
    .unwrap();
    s.su.batch_execute("ANALYZE evil.t2").await.unwrap();
    let stats: Option<String> =
        s.su.query_one(
            "SELECT most_common_vals::text FROM pg_stats WHERE tablename = 't2_leak'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let stats = stats.unwrap_or_default();
    assert!(
        !stats.contains("SECRET") && !stats.contains("victim"),
        "{stats}"
    );
}

/// Boundary: the role that defines a contract ↔ the rights its checker runs with. Routes: a
/// SECURITY DEFINER function of an admin calling define_contract for a caller who has the
/// checker owner's rights (a confused deputy); the checker changing owner, or the definer
/// losing the owner's rights, after the contract was defined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_runs_only_while_its_vetting_holds() {
    let s = scene("tm_vetting").await;
    let vault = create_login_role(&s.su, "vault", "").await;
    let vaultdev = create_login_role(&s.su, "vaultdev", &format!("IN ROLE \"{vault}\"")).await;
    let admin2 = create_login_role(&s.su, "admin2", "IN ROLE intent_admin").await;
    run_each(
        &s.su,
        &format!(
            "CREATE SCHEMA v AUTHORIZATION \"{vault}\";
         GRANT USAGE ON SCHEMA v TO PUBLIC;
         SET ROLE \"{vault}\";
         CREATE TABLE v.cards (card text);
         INSERT INTO v.cards VALUES ('4111-V');
         CREATE FUNCTION v.oracle(j jsonb) RETURNS boolean LANGUAGE sql STABLE AS
             $$ SELECT EXISTS (SELECT 1 FROM v.cards WHERE card LIKE (j->>'prefix') || '%') $$;
         RESET ROLE;
         CREATE SCHEMA a2 AUTHORIZATION \"{admin2}\";
         GRANT USAGE ON SCHEMA a2 TO PUBLIC;
         SET ROLE \"{admin2}\";
         CREATE FUNCTION a2.helpful() RETURNS integer LANGUAGE sql SECURITY DEFINER AS
             $$ SELECT intent.define_contract('deputy', '{{}}', 'v.oracle(jsonb)') $$;
         RESET ROLE;"
        ),
    )
    .await;
    let dev = connect_role(&s.db, &vaultdev).await;
    assert_eq!(
        sqlstate_of(&dev, "SELECT a2.helpful()").await.as_deref(),
        Some("42501"),
        "define_contract judged the deputy's caller, not the deputy"
    );
    // Defined by a member of vault, the contract works; then its vetting stops holding.
    s.su.batch_execute(&format!("GRANT \"{vault}\" TO \"{admin2}\""))
        .await
        .unwrap();
    let a2 = connect_role(&s.db, &admin2).await;
    a2.query(
        "SELECT intent.define_contract('vaulted', '{}', 'v.oracle(jsonb)')",
        &[],
    )
    .await
    .unwrap();
    assert!(vaulted(&s.su).await.0);
    s.su.batch_execute(&format!("REVOKE \"{vault}\" FROM \"{admin2}\""))
        .await
        .unwrap();
    let (ok, errors) = vaulted(&s.su).await;
    assert!(
        !ok && errors.contains("no longer has the rights"),
        "{errors}"
    );
    s.su.batch_execute(&format!(
        "GRANT \"{vault}\" TO \"{admin2}\"; ALTER FUNCTION v.oracle(jsonb) OWNER TO postgres;"
    ))
    .await
    .unwrap();
    let (ok, errors) = vaulted(&s.su).await;
    assert!(!ok && errors.contains("changed owner"), "{errors}");
    // "Redefine the contract", as the message says: vetted again, it works again, and the
    // version moves on (the checker now runs as another role: certifications start over).
    let before = version(&s.su).await;
    s.su.query(
        "SELECT intent.define_contract('vaulted', '{}', 'v.oracle(jsonb)')",
        &[],
    )
    .await
    .unwrap();
    assert!(
        vaulted(&s.su).await.0,
        "redefined, the contract is vetted again"
    );
    assert_eq!(version(&s.su).await, before + 1);
    // Its definer losing the owner's rights, then redefining by another role that has them:
    // vetted again, same version (same schema, checker and owner).
    s.su.batch_execute(&format!(
        "ALTER FUNCTION v.oracle(jsonb) OWNER TO \"{vault}\"; GRANT \"{vault}\" TO \"{admin2}\""
    ))
    .await
    .unwrap();
    a2.query(
        "SELECT intent.define_contract('vaulted', '{}', 'v.oracle(jsonb)')",
        &[],
    )
    .await
    .unwrap();
    s.su.batch_execute(&format!("REVOKE \"{vault}\" FROM \"{admin2}\""))
        .await
        .unwrap();
    assert!(!vaulted(&s.su).await.0);
    let v = version(&s.su).await;
    let dev = connect_role(&s.db, &vaultdev).await;
    s.su.batch_execute(&format!("GRANT intent_admin TO \"{vaultdev}\""))
        .await
        .unwrap();
    dev.query(
        "SELECT intent.define_contract('vaulted', '{}', 'v.oracle(jsonb)')",
        &[],
    )
    .await
    .unwrap();
    assert!(vaulted(&s.su).await.0, "re-vetted by a member of the owner");
    assert_eq!(version(&s.su).await, v, "same schema, checker and owner");
}

async fn version(c: &Client) -> i32 {
    c.query_one(
        "SELECT version FROM intent.contracts WHERE name = 'vaulted'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn vaulted(c: &Client) -> (bool, String) {
    let r = c
        .query_one(
            "SELECT valid, errors::text FROM intent.validate_result('vaulted', '{\"prefix\": \"4111\"}')",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// Availability: a role binding written by a transaction that rolled back must not stick to the
/// session that read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_binding_does_not_stick() {
    let s = scene("tm_rollback_binding").await;
    // A superuser session binds its own role, reads the binding in the same transaction (the
    // catalog snapshot sees its own uncommitted row), and rolls back.
    let su = s.db.connect().await;
    su.batch_execute("BEGIN; ALTER ROLE CURRENT_USER SET intent.owner_id = 'oops'")
        .await
        .unwrap();
    let inside: Option<String> = su
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    su.batch_execute("ROLLBACK").await.unwrap();
    let after: Option<String> = su
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, None, "bound after the rollback (inside: {inside:?})");
    submit(&su, "anyone", "k", "gpu", &json!({})).await.unwrap();
}

/// A new job of `owner` under `contract` (three attempts allowed) and its first attempt, begun
/// with a one-hour lease.
async fn begun(c: &Client, owner: &str, key: &str, contract: &str) -> (Submitted, Begun) {
    let job = submit_full(c, owner, key, "gpu", &json!({}), Some(contract), 3)
        .await
        .unwrap();
    let a = begin(c, job.job_id, None, "1 hour").await.unwrap();
    (job, a)
}
