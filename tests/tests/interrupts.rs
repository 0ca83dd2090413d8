//! Every loop of pg_intent that can run long stops, within a bounded time, on
//! `statement_timeout` and on `pg_cancel_backend`: contract validation (a schema whose work
//! doubles with each level of nesting), checkers, batches and purge. A stopped call writes
//! nothing and leaves the job as it was (in particular its row lock is gone).

use pg_intent_tests::*;
use std::time::{Duration, Instant};

/// A schema of `levels` definitions, each evaluating the next one twice (`anyOf` of an `allOf`
/// that fails late, and the same `$ref` again): validating an integer against it does 2^levels
/// steps. About 3 kB at 34 levels.
fn doubling_schema(levels: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..levels {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [{"allOf": [{"$ref": next}, {"type": "string"}]}, {"$ref": next}]}),
        );
    }
    defs.insert(format!("d{levels}"), json!({"type": "integer"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// The same doubling, with the definitions under an unknown keyword and reached by `$id` URIs
/// rather than `#/` fragments.
fn doubling_schema_by_id(levels: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..levels {
        let next = format!("urn:doubling#/x/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [{"allOf": [{"$ref": next}, {"type": "string"}]}, {"$ref": next}]}),
        );
    }
    defs.insert(format!("d{levels}"), json!({"type": "integer"}));
    json!({"$id": "urn:doubling", "x": defs, "$ref": "urn:doubling#/x/d0"})
}

/// How long a statement that must be interrupted may take past its timeout (a loaded machine).
const SLACK: Duration = Duration::from_secs(5);

/// Runs `sql` with `statement_timeout = timeout`: it must fail with 57014 within the timeout
/// plus [`SLACK`].
async fn times_out(
    c: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    timeout: Duration,
) {
    c.batch_execute(&format!("SET statement_timeout = {}", timeout.as_millis()))
        .await
        .unwrap();
    let started = Instant::now();
    let e = match c.query(sql, params).await {
        Ok(rows) => panic!("{sql} finished ({} rows) instead of timing out", rows.len()),
        Err(e) => SqlError::from_error(&e),
    };
    let took = started.elapsed();
    c.batch_execute("RESET statement_timeout").await.unwrap();
    assert_eq!(e.code, "57014", "{sql}: {e:?}");
    assert!(
        took < timeout + SLACK,
        "{sql} took {took:?} to stop under a {timeout:?} timeout"
    );
}

/// Cancels `sql` (run on `c`) from another connection after `after`: it must fail with 57014
/// within [`SLACK`] of the cancel.
async fn is_cancelled(db: &Db<'_>, c: Client, sql: &'static str, after: Duration) {
    let pid = backend_pid(&c).await;
    let run = tokio::spawn(async move { c.query(sql, &[]).await.map(|r| r.len()) });
    tokio::time::sleep(after).await;
    let admin = db.connect().await;
    let cancelled_at = Instant::now();
    let sent: bool = admin
        .query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(sent);
    let outcome = run.await.unwrap();
    let took = cancelled_at.elapsed();
    match outcome {
        Ok(n) => panic!("{sql} finished ({n} rows) although cancelled"),
        Err(e) => assert_eq!(SqlError::from_error(&e).code, "57014", "{sql}"),
    }
    assert!(took < SLACK, "{sql} took {took:?} to stop after a cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_stops_on_statement_timeout_and_cancel() {
    let db = Cluster::shared().fresh_db("int_validation").await;
    let c = db.connect().await;
    let schema = doubling_schema(34);
    assert!(schema.to_string().len() < 4096, "a schema of a few kB");
    c.query("SELECT intent.define_contract('doubling', $1)", &[&schema])
        .await
        .unwrap();
    // The same work, its definitions reached through $id into an unknown keyword: refused,
    // since nothing there could be interrupted (docs/protocol.md § Contracts).
    let e = expect_error(
        &c,
        "SELECT intent.define_contract('doubling-by-id', $1)",
        &[&doubling_schema_by_id(34)],
    )
    .await;
    assert_eq!(e.code, "22023", "{e:?}");
    // Reached through $id into $defs: accepted, and interrupted.
    let mut by_id_in_defs = doubling_schema_by_id(34);
    let defs = by_id_in_defs["x"].take();
    let text = json!({"$id": "urn:doubling", "$defs": defs, "$ref": "urn:doubling#/$defs/d0"})
        .to_string()
        .replace("urn:doubling#/x/", "urn:doubling#/$defs/");
    let by_id_in_defs: Value = serde_json::from_str(&text).unwrap();
    c.query(
        "SELECT intent.define_contract('doubling-by-id', $1)",
        &[&by_id_in_defs],
    )
    .await
    .unwrap();
    for contract in ["doubling", "doubling-by-id"] {
        times_out(
            &c,
            "SELECT * FROM intent.validate_result($1, '1')",
            &[&contract],
            Duration::from_secs(1),
        )
        .await;
    }
    // complete_attempt holds the job's row lock while it validates: the timeout frees it.
    let job = submit_full(&c, "alice", "k", "gpu", &json!({}), Some("doubling"), 3)
        .await
        .unwrap();
    let a = begin(&c, job.job_id, None, "1 hour").await.unwrap();
    times_out(
        &c,
        "SELECT intent.complete_attempt($1, 1, '1')",
        &[&a.attempt_id],
        Duration::from_secs(1),
    )
    .await;
    let other = db.connect().await;
    other
        .batch_execute("SET lock_timeout = '2s'")
        .await
        .unwrap();
    assert!(
        heartbeat(&other, a.attempt_id, None).await.unwrap(),
        "the lock is free"
    );
    assert_eq!(job_row(&other, job.job_id).await.state, "running");
    assert_eq!(attempt_row(&other, a.attempt_id).await.state, "started");
    // And pg_cancel_backend, without any timeout.
    is_cancelled(
        &db,
        db.connect().await,
        "SELECT * FROM intent.validate_result('doubling', '1')",
        Duration::from_millis(500),
    )
    .await;
    assert!(event_rows(&other, job.job_id).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checker_that_never_returns_is_stopped_not_taken_for_a_rejection() {
    let db = Cluster::shared().fresh_db("int_checker").await;
    let c = db.connect().await;
    c.batch_execute(
        "CREATE FUNCTION public.slow(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
         BEGIN PERFORM pg_sleep(60); RETURN true; END $$;
         CREATE FUNCTION public.spins(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
         DECLARE i bigint := 0; BEGIN LOOP i := i + 1; END LOOP; END $$;
         SELECT intent.define_contract('slow', '{}', 'public.slow(jsonb)');
         SELECT intent.define_contract('spins', '{}', 'public.spins(jsonb)');",
    )
    .await
    .unwrap();
    for contract in ["slow", "spins"] {
        let job = submit_full(&c, "alice", contract, "gpu", &json!({}), Some(contract), 3)
            .await
            .unwrap();
        let a = begin(&c, job.job_id, None, "1 hour").await.unwrap();
        times_out(
            &c,
            "SELECT intent.complete_attempt($1, 1, '{}')",
            &[&a.attempt_id],
            Duration::from_secs(1),
        )
        .await;
        // Not rejected: the attempt is still started and may report again.
        assert_eq!(
            attempt_row(&c, a.attempt_id).await.state,
            "started",
            "{contract}"
        );
        assert!(event_rows(&c, job.job_id).await.is_empty(), "{contract}");
    }
    is_cancelled(
        &db,
        db.connect().await,
        "SELECT * FROM intent.validate_result('spins', '{}')",
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_purge_stop_and_write_nothing() {
    let db = Cluster::shared().fresh_db("int_batch").await;
    let c = db.connect().await;
    let before = digest(&c).await;
    // 10,000 intents with 2 kB of params each.
    let sql = "SELECT count(*) FROM intent.submit_jobs(
                   array_fill('alice'::text, ARRAY[10000]),
                   (SELECT array_agg('k' || g) FROM generate_series(1, 10000) g),
                   array_fill('gpu'::text, ARRAY[10000]),
                   (SELECT array_agg(jsonb_build_object('g', g, 'pad', repeat(md5(g::text), 64)))
                      FROM generate_series(1, 10000) g))";
    times_out(&c, sql, &[], Duration::from_millis(100)).await;
    assert_eq!(digest(&c).await, before, "a stopped batch writes nothing");
    // The same batch runs to completion without a timeout, so the one above really was stopped.
    c.query(sql, &[]).await.unwrap();
    c.batch_execute(
        "UPDATE intent.jobs SET state = 'cancelled', version = version + 1, retry_at = NULL,
                created_at = created_at - interval '2 days', updated_at = updated_at - interval '2 days'",
    )
    .await
    .unwrap();
    let before = digest(&c).await;
    times_out(
        &c,
        "SELECT intent.purge('1 day', 100000)",
        &[],
        Duration::from_millis(30),
    )
    .await;
    assert_eq!(digest(&c).await, before, "a stopped purge removes nothing");
    let n: i64 = c
        .query_one("SELECT intent.purge('1 day', 100000)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 10_000);
}

/// Collecting the errors of a result that breaks a schema whose errors multiply with its nesting
/// (a failing `anyOf` of `anyOf`s) would take gigabytes: it is budgeted, and the result is
/// rejected all the same, quickly, with one error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_errors_of_an_invalid_result_are_collected_within_a_budget() {
    let db = Cluster::shared().fresh_db("int_errors").await;
    let c = db.connect().await;
    let mut defs = serde_json::Map::new();
    for i in 0..24 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
        );
    }
    defs.insert("d24".into(), json!({"type": "string"}));
    let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    c.query(
        "SELECT intent.define_contract('multiplying', $1)",
        &[&schema],
    )
    .await
    .unwrap();
    c.batch_execute("SET statement_timeout = '60s'")
        .await
        .unwrap();
    let started = Instant::now();
    let row = c
        .query_one(
            "SELECT valid, errors::text FROM intent.validate_result('multiplying', '1')",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0));
    let errors: String = row.get(1);
    assert!(errors.contains("too many to list"), "{errors}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    let rss_kb: i64 = std::fs::read_to_string(format!("/proc/{}/status", backend_pid(&c).await))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    assert!(rss_kb < 1_000_000, "the backend peaked at {rss_kb} kB");
}
