//! The major-version upgrade: a cluster of `PG_INTENT_PG_BIN`'s major (scripts/test.sh: PyPI's
//! stock PostgreSQL 15 build — Debian 12's 15.20 stamps every column with an option no other
//! server accepts, so nothing upgrades from it) with pg_intent and a job in every state is
//! upgraded with `pg_upgrade` to the major named by `PG_INTENT_UPGRADE_TO_BIN` (18). Every row and every answer is
//! intact afterwards, and the upgraded database goes on working. With
//! `PG_INTENT_KEEP_UPGRADED=FILE` the upgraded cluster is left running and `DIR:PORT` written
//! to FILE, so that scripts/test.sh runs the four failure points on it
//! (`PG_INTENT_TEST_CLUSTER`), then stops and removes it.
//!
//! Without `PG_INTENT_UPGRADE_TO_BIN` the test says that it skipped and passes: it needs a
//! second major, which scripts/test.sh installs.

use pg_intent_tests::fixtures::{self, EveryState};
use pg_intent_tests::*;
use std::path::PathBuf;

/// What a user would ask the upgraded database, asked before and after: replays, the gate,
/// the winner, the contract with its checker, the views. Inside a transaction rolled back,
/// so that asking changes nothing.
async fn answers(c: &Client, state: &EveryState) -> Vec<String> {
    c.batch_execute("BEGIN").await.unwrap();
    let mut out = Vec::new();
    for (owner, key) in [
        ("alice", "pending"),
        ("alice", "running"),
        ("bob", "unknown"),
        ("alice", "won"),
    ] {
        let row = c
            .query_one(
                "SELECT (s.job_id, s.created, s.state, s.version, s.result)::text
                   FROM intent.jobs j,
                        intent.submit_job(j.owner_id, j.idempotency_key, j.provider, j.params,
                                          j.contract, j.max_attempts) s
                  WHERE j.owner_id = $1 AND j.idempotency_key = $2",
                &[&owner, &key],
            )
            .await
            .unwrap_or_else(|e| panic!("replay {owner}/{key}: {:?}", SqlError::from_error(&e)));
        out.push(format!("replay {owner}/{key}: {}", row.get::<_, String>(0)));
    }
    for sql in [
        "SELECT array_agg(v::text ORDER BY v::text)::text FROM intent.jobs_by_state v",
        "SELECT array_agg((v.attempt_id, v.why)::text ORDER BY v.attempt_id)::text FROM intent.attempts_to_reconcile v",
        "SELECT array_agg(v.late_attempt_id::text ORDER BY v.late_attempt_id)::text FROM intent.lost_races v",
        "SELECT array_agg((v.provider, v.contract, v.current)::text ORDER BY v.provider)::text FROM intent.certifications_expiring v",
        "SELECT (intent.validate_result('shape', '{\"n\": 1}'))::text",
        "SELECT (intent.validate_result('shape', '{\"x\": 1}'))::text",
    ] {
        let row = c
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {:?}", SqlError::from_error(&e)));
        out.push(format!("{sql}: {:?}", row.get::<_, Option<String>>(0)));
    }
    let gate = begin(c, state.running.job_id, None, "1 hour").await;
    out.push(format!(
        "begin on the running job: {:?}",
        gate.err().map(|e| SqlError::from_error(&e).code)
    ));
    c.batch_execute("ROLLBACK").await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_upgrade_keeps_every_job_every_answer_and_the_work_going() {
    let Some(new_bin) = std::env::var_os("PG_INTENT_UPGRADE_TO_BIN").map(PathBuf::from) else {
        eprintln!(
            "pg_upgrade: SKIPPED (set PG_INTENT_UPGRADE_TO_BIN to another major's bin directory; scripts/test.sh does)"
        );
        return;
    };
    let old = Cluster::start();
    let (from, to) = (old.major(), major_of(&new_bin));
    assert!(
        to > from,
        "pg_upgrade goes from {from} to a later major, not {to}"
    );
    let name = {
        let db = old.fresh_db("pg_upgrade").await;
        db.name.clone()
    };
    let c = old.connect(&name).await;
    let state = fixtures::every_state(&c).await;
    let rows_before = dump::table_rows(&c).await;
    let answers_before = answers(&c, &state).await;
    drop(c);

    let new = old.upgrade_to(&new_bin);
    let c = new.connect(&name).await;
    let version: i32 = c
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version / 10000, to as i32, "the server is now {to}");
    assert_eq!(
        rows_before,
        dump::table_rows(&c).await,
        "{from} → {to}: every row intact"
    );
    assert_eq!(
        answers_before,
        answers(&c, &state).await,
        "{from} → {to}: every answer intact"
    );
    // The work goes on: the running attempt wins, a new intent is a new job, the checker runs.
    assert_eq!(
        complete(
            &c,
            state.running_attempt.attempt_id,
            state.running_attempt.version,
            &json!({"n": 9})
        )
        .await
        .unwrap(),
        "won"
    );
    let fresh = submit_full(
        &c,
        "erin",
        "after-upgrade",
        "gpu",
        &json!({}),
        Some("shape"),
        3,
    )
    .await
    .unwrap();
    assert!(fresh.created);
    let a = begin(&c, fresh.job_id, None, "1 minute").await.unwrap();
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"x": 1}))
            .await
            .unwrap(),
        "rejected",
        "the contract's checker is found again after the upgrade, and judges"
    );
    // Parallel query and a DBA's maintenance, on the new major.
    c.batch_execute(
        "SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0;
         SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;
         SELECT count(*) FROM intent.jobs;",
    )
    .await
    .unwrap();
    for maintenance in ["VACUUM (PARALLEL 2) intent.jobs", "ANALYZE"] {
        c.batch_execute(maintenance).await.unwrap();
    }
    drop(c);

    if let Some(file) = std::env::var_os("PG_INTENT_KEEP_UPGRADED") {
        std::fs::write(&file, new.keep()).expect("write PG_INTENT_KEEP_UPGRADED");
    }
}
