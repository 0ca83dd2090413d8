//! Tables, functions and operators planted in `public` and `pg_temp` are never used.

use pg_intent_tests::roles::*;
use pg_intent_tests::*;

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
        lapse_lease(&admin, la.attempt_id).await.unwrap();
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
        lapse_lease(&admin, lba.attempt_id).await.unwrap();
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
            "settings",
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
