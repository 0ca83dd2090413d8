//! The views for people (sql/views.sql) and retention (`intent.purge`, the setting
//! `intent.retention`), against a real server with real concurrent connections.
//!
//! Purge must remove finished jobs with their attempts and events, oldest first, in bounded
//! batches, and never touch a job that is not terminal — not even one that is very old, and not
//! one whose late result is being recorded at that very moment. After a purge the key is free:
//! the same key creates a new job.

use pg_intent_tests::*;
use std::time::Duration;

// --- helpers ---------------------------------------------------------------------------------

/// Moves a job's `created_at` and `updated_at` back by `age` (an interval literal), as if it
/// had been submitted and last changed that long ago. (A superuser bypasses row security.)
async fn backdate(c: &Client, job_id: Uuid, age: &str) {
    let n = c
        .execute(
            "UPDATE intent.jobs SET created_at = created_at - $2::text::interval,
                                    updated_at = updated_at - $2::text::interval
              WHERE id = $1",
            &[&job_id, &age],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "no job {job_id}");
}

/// A job that succeeded (one attempt, a result).
async fn succeeded(c: &Client, owner: &str, key: &str) -> Uuid {
    let s = submit(c, owner, key, "gpu-a", &json!({"k": key}))
        .await
        .unwrap();
    let a = begin(c, s.job_id, None, "1 minute").await.unwrap();
    assert_eq!(
        complete(c, a.attempt_id, a.version, &json!({"image": key}))
            .await
            .unwrap(),
        "won"
    );
    s.job_id
}

/// A job that failed for good.
async fn failed(c: &Client, owner: &str, key: &str) -> Uuid {
    let s = submit_full(c, owner, key, "gpu-a", &json!({"k": key}), None, 1)
        .await
        .unwrap();
    let a = begin(c, s.job_id, None, "1 minute").await.unwrap();
    assert_eq!(
        fail(c, a.attempt_id, a.version, &json!({"status": 400}), false)
            .await
            .unwrap(),
        "failed"
    );
    s.job_id
}

/// A job cancelled by its owner (with a `cancelled` event).
async fn cancelled(c: &Client, owner: &str, key: &str) -> Uuid {
    let s = submit(c, owner, key, "gpu-a", &json!({"k": key}))
        .await
        .unwrap();
    assert!(cancel(c, s.job_id, Some("changed my mind")).await.unwrap());
    s.job_id
}

async fn purge(
    c: &Client,
    older_than: Option<&str>,
    batch: i32,
) -> Result<i64, tokio_postgres::Error> {
    c.query_one(
        "SELECT intent.purge($1::text::interval, $2)",
        &[&older_than, &batch],
    )
    .await
    .map(|r| r.get(0))
}

/// How many rows of `job_id` are left in jobs, attempts and events.
async fn rows_of(c: &Client, job_id: Uuid) -> (i64, i64, i64) {
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM intent.jobs WHERE id = $1),
                    (SELECT count(*) FROM intent.attempts WHERE job_id = $1),
                    (SELECT count(*) FROM intent.events WHERE job_id = $1)",
            &[&job_id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Every row of the job, as text (to prove it was not touched).
async fn snapshot(c: &Client, job_id: Uuid) -> String {
    c.query_one(
        "SELECT coalesce((SELECT j::text || j.xmin::text FROM intent.jobs j WHERE id = $1), '')
             || coalesce((SELECT string_agg(a::text || a.xmin::text, '|' ORDER BY a.id) FROM intent.attempts a WHERE job_id = $1), '')
             || coalesce((SELECT string_agg(e::text, '|' ORDER BY e.id) FROM intent.events e WHERE job_id = $1), '')",
        &[&job_id],
    )
    .await
    .unwrap()
    .get(0)
}

// --- views -----------------------------------------------------------------------------------

const VIEWS: [&str; 4] = [
    "jobs_by_state",
    "attempts_to_reconcile",
    "lost_races",
    "certifications_expiring",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_and_every_column_is_commented_and_readable_by_operators_only() {
    let db = Cluster::shared().fresh_db("views_comments").await;
    let c = db.connect().await;
    for view in VIEWS {
        let row = c
            .query_one(
                "SELECT obj_description(format('intent.%I', $1::text)::regclass, 'pg_class'),
                        (SELECT count(*) FROM pg_attribute
                          WHERE attrelid = format('intent.%I', $1::text)::regclass AND attnum > 0
                            AND NOT attisdropped),
                        (SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
                          WHERE attrelid = format('intent.%I', $1::text)::regclass AND attnum > 0
                            AND NOT attisdropped
                            AND col_description(attrelid, attnum) IS NULL)",
                &[&view],
            )
            .await
            .unwrap();
        let comment: Option<String> = row.get(0);
        assert!(
            comment.is_some_and(|t| t.len() > 20),
            "intent.{view} has no COMMENT ON VIEW"
        );
        let columns: i64 = row.get(1);
        assert!(columns >= 5, "intent.{view} has {columns} columns");
        let uncommented: Option<Vec<String>> = row.get(2);
        assert_eq!(
            uncommented, None,
            "intent.{view}: columns without a comment"
        );

        // intent_operator reads them; intent_app does not.
        c.batch_execute("SET ROLE intent_operator").await.unwrap();
        c.query(&format!("SELECT * FROM intent.{view}"), &[])
            .await
            .unwrap_or_else(|e| panic!("intent_operator reads intent.{view}: {e}"));
        c.batch_execute("RESET ROLE; SET ROLE intent_app")
            .await
            .unwrap();
        refusal(
            c.query(&format!("SELECT * FROM intent.{view}"), &[]).await,
            "42501",
        );
        c.batch_execute("RESET ROLE").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_by_state_counts_per_provider_with_the_deadline_rule() {
    let db = Cluster::shared().fresh_db("views_by_state").await;
    let c = db.connect().await;
    let p = json!({});
    for k in ["p1", "p2"] {
        submit(&c, "alice", k, "gpu-a", &p).await.unwrap();
    }
    let running = submit(&c, "alice", "run", "gpu-a", &p).await.unwrap();
    begin(&c, running.job_id, None, "1 hour").await.unwrap();
    let lapsed = submit(&c, "bob", "lapsed", "gpu-a", &p).await.unwrap();
    let lapsed_a = begin(&c, lapsed.job_id, None, "100 milliseconds")
        .await
        .unwrap();
    let marked = submit(&c, "bob", "marked", "gpu-a", &p).await.unwrap();
    let marked_a = begin(&c, marked.job_id, None, "1 hour").await.unwrap();
    mark_unknown(&c, marked_a.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    succeeded(&c, "alice", "ok").await;
    let f = submit_full(&c, "carol", "f", "gpu-b", &p, None, 1)
        .await
        .unwrap();
    let fa = begin(&c, f.job_id, None, "1 minute").await.unwrap();
    fail(&c, fa.attempt_id, fa.version, &json!({}), false)
        .await
        .unwrap();
    let x = submit(&c, "carol", "x", "gpu-b", &p).await.unwrap();
    cancel(&c, x.job_id, None).await.unwrap();
    wait_past_deadline(&c, lapsed_a.attempt_id).await;

    let rows: Vec<(String, String, i64)> = c
        .query(
            "SELECT provider, state::text, jobs FROM intent.jobs_by_state ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want = |v: &[(&str, &str, i64)]| -> Vec<(String, String, i64)> {
        let mut v: Vec<_> = v
            .iter()
            .map(|(a, b, n)| (a.to_string(), b.to_string(), *n))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        rows,
        want(&[
            ("gpu-a", "pending", 2),
            ("gpu-a", "running", 1),
            // The lapsed attempt's job is still 'running' in intent.jobs, but counts as unknown.
            ("gpu-a", "unknown", 2),
            ("gpu-a", "succeeded", 1),
            ("gpu-b", "cancelled", 1),
            ("gpu-b", "failed", 1),
        ])
    );
    assert_eq!(job_row(&c, lapsed.job_id).await.state, "running");
    let ordered: bool = c
        .query_one(
            "SELECT bool_and(oldest_created_at <= last_updated_at) FROM intent.jobs_by_state",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ordered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_to_reconcile_lists_unknown_and_lapsed_attempts_with_age_provider_and_worker() {
    let db = Cluster::shared().fresh_db("views_reconcile").await;
    let c = db.connect().await;
    let p = json!({});
    let begin_as = |job: Uuid, lease: &'static str, worker: &'static str| {
        let c = &c;
        async move {
            let r = c
                .query_one(
                    "SELECT attempt_id FROM intent.begin_attempt($1, NULL, $2::text::interval, $3)",
                    &[&job, &lease, &worker],
                )
                .await
                .unwrap();
            r.get::<_, Uuid>(0)
        }
    };
    let marked = submit(&c, "alice", "marked", "gpu-a", &p).await.unwrap();
    let marked_a = begin_as(marked.job_id, "1 hour", "w-1").await;
    mark_unknown(&c, marked_a, Some("client timeout"))
        .await
        .unwrap();
    let lapsed = submit(&c, "bob", "lapsed", "gpu-b", &p).await.unwrap();
    let lapsed_a = begin_as(lapsed.job_id, "100 milliseconds", "w-2").await;
    let live = submit(&c, "bob", "live", "gpu-a", &p).await.unwrap();
    begin_as(live.job_id, "1 hour", "w-3").await;
    succeeded(&c, "alice", "done").await;
    wait_past_deadline(&c, lapsed_a).await;

    type Row = (
        Uuid,
        Uuid,
        String,
        String,
        i32,
        String,
        Option<String>,
        String,
        String,
        bool,
        bool,
    );
    let read = || async {
        c.query(
            "SELECT attempt_id, job_id, owner_id, idempotency_key::text, attempt_no, provider::text,
                    worker::text, why, job_state::text, age >= interval '0', overdue > interval '0'
               FROM intent.attempts_to_reconcile ORDER BY started_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get::<_, String>(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
                r.get(7),
                r.get(8),
                r.get(9),
                r.get(10),
            )
        })
        .collect::<Vec<Row>>()
    };
    let rows = read().await;
    assert_eq!(
        rows,
        vec![
            (
                marked_a,
                marked.job_id,
                "alice".into(),
                "marked".into(),
                1,
                "gpu-a".into(),
                Some("w-1".into()),
                "unknown".into(),
                "unknown".into(),
                true,
                false, // marked unknown long before its deadline: overdue is negative
            ),
            (
                lapsed_a,
                lapsed.job_id,
                "bob".into(),
                "lapsed".into(),
                1,
                "gpu-b".into(),
                Some("w-2".into()),
                "lease_expired".into(),
                "running".into(), // not swept yet: the view applies the deadline rule itself
                true,
                true,
            ),
        ]
    );

    // Swept, the lapsed attempt is unknown for good; abandoned, an attempt leaves the list.
    assert_eq!(sweep(&c).await.unwrap(), 1);
    let rows = read().await;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[1].7.as_str(), rows[1].8.as_str()),
        ("unknown", "unknown")
    );
    abandon(&c, marked_a, "provider has no record of it")
        .await
        .unwrap();
    let rows = read().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, lapsed_a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_races_show_both_results_side_by_side() {
    let db = Cluster::shared().fresh_db("views_lost").await;
    let c = db.connect().await;
    assert!(
        ensure_contract(&c, "image").await,
        "contracts are supported"
    );
    c.execute(
        "SELECT intent.certify_provider('gpu-b', 'image', '{\"suite\": \"passed\"}')",
        &[],
    )
    .await
    .unwrap();

    // gpu-a stalls; the operator abandons it; a failover to gpu-b wins; gpu-a reports late.
    let s = submit_full(
        &c,
        "alice",
        "race",
        "gpu-a",
        &json!({"p": 1}),
        Some("image"),
        3,
    )
    .await
    .unwrap();
    let a1 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, a1.attempt_id, "gpu-a stalled").await.unwrap();
    let a2 = begin(&c, s.job_id, Some("gpu-b"), "1 hour").await.unwrap();
    assert_eq!(
        complete(&c, a2.attempt_id, a2.version, &json!({"image": "b.png"}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(&c, a1.attempt_id, a1.version, &json!({"image": "a.png"}))
            .await
            .unwrap(),
        "lost"
    );
    // A cancelled job whose attempt reports afterwards: nobody won.
    let x = submit(&c, "bob", "withdrawn", "gpu-a", &json!({}))
        .await
        .unwrap();
    let xa = begin(&c, x.job_id, None, "1 hour").await.unwrap();
    cancel(&c, x.job_id, Some("user left")).await.unwrap();
    assert_eq!(
        complete(&c, xa.attempt_id, xa.version, &json!({"image": "x.png"}))
            .await
            .unwrap(),
        "lost"
    );
    // An ordinary win is not a race.
    succeeded(&c, "alice", "calm").await;

    let rows = c
        .query(
            "SELECT job_id, owner_id::text, idempotency_key::text, late_attempt_id, late_provider::text,
                    late_result, winner_attempt_id, winner_provider::text, winning_result,
                    job_state::text, late_at >= won_at
               FROM intent.lost_races ORDER BY owner_id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    let r = &rows[0];
    assert_eq!(r.get::<_, Uuid>(0), s.job_id);
    assert_eq!(
        (r.get::<_, String>(1), r.get::<_, String>(2)),
        ("alice".into(), "race".into())
    );
    assert_eq!(r.get::<_, Uuid>(3), a1.attempt_id);
    assert_eq!(r.get::<_, String>(4), "gpu-a");
    assert_eq!(r.get::<_, Value>(5), json!({"image": "a.png"}));
    assert_eq!(r.get::<_, Option<Uuid>>(6), Some(a2.attempt_id));
    assert_eq!(r.get::<_, Option<String>>(7).as_deref(), Some("gpu-b"));
    assert_eq!(
        r.get::<_, Option<Value>>(8),
        Some(json!({"image": "b.png"}))
    );
    assert_eq!(r.get::<_, String>(9), "succeeded");
    assert_eq!(r.get::<_, Option<bool>>(10), Some(true));
    let r = &rows[1];
    assert_eq!(r.get::<_, Uuid>(3), xa.attempt_id);
    assert_eq!(r.get::<_, Value>(5), json!({"image": "x.png"}));
    assert_eq!(r.get::<_, Option<Uuid>>(6), None, "a cancel has no winner");
    assert_eq!(r.get::<_, Option<Value>>(8), None);
    assert_eq!(r.get::<_, String>(9), "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certifications_expiring_shows_the_certification_that_counts() {
    let db = Cluster::shared().fresh_db("views_certs").await;
    let c = db.connect().await;
    assert!(ensure_contract(&c, "image").await);
    let certify = |provider: &'static str, valid_for: &'static str| {
        let c = &c;
        async move {
            c.execute(
                "SELECT intent.certify_provider($1, 'image', '{\"suite\": \"passed\"}', $2::text::interval)",
                &[&provider, &valid_for],
            )
            .await
            .unwrap();
        }
    };
    certify("gpu-a", "1 day").await;
    certify("gpu-a", "20 days").await; // re-certified: only the newest counts
    certify("gpu-b", "2 days").await;
    certify("gpu-c", "30 days").await;
    c.execute(
        "SELECT intent.revoke_certification('gpu-c', 'image', 'failed the nightly contract tests')",
        &[],
    )
    .await
    .unwrap();
    certify("gpu-d", "5 days").await;
    // gpu-e's certification ran out an hour ago.
    certify("gpu-e", "5 days").await;
    c.execute(
        "UPDATE intent.certifications SET certified_at = now() - interval '5 days 1 hour',
                                          expires_at = now() - interval '1 hour'
          WHERE provider = 'gpu-e'",
        &[],
    )
    .await
    .unwrap();

    let read = || async {
        c.query(
            "SELECT provider::text, contract_version, current_contract_version, current,
                    expires_in > interval '0', round(extract(epoch FROM expires_in) / 86400)::int
               FROM intent.certifications_expiring ORDER BY expires_in",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                r.get::<_, i32>(1),
                r.get::<_, i32>(2),
                r.get::<_, bool>(3),
                r.get::<_, bool>(4),
                r.get::<_, i32>(5),
            )
        })
        .collect::<Vec<_>>()
    };
    assert_eq!(
        read().await,
        vec![
            ("gpu-e".into(), 1, 1, false, false, 0),
            ("gpu-b".into(), 1, 1, true, true, 2),
            ("gpu-d".into(), 1, 1, true, true, 5),
            ("gpu-a".into(), 1, 1, true, true, 20),
            ("gpu-c".into(), 1, 1, false, true, 30), // revoked
        ]
    );

    // A new definition of the contract retires every certification earned on the old one.
    c.execute(
        "SELECT intent.define_contract('image', '{\"type\": \"object\", \"required\": [\"url\"]}')",
        &[],
    )
    .await
    .unwrap();
    certify("gpu-a", "10 days").await;
    let rows = read().await;
    let a = rows.iter().find(|r| r.0 == "gpu-a").unwrap();
    assert_eq!((a.1, a.2, a.3), (2, 2, true), "re-certified on version 2");
    let b = rows.iter().find(|r| r.0 == "gpu-b").unwrap();
    assert_eq!(
        (b.1, b.2, b.3),
        (1, 2, false),
        "earned on version 1: no longer counts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bound_to_an_owner_sees_only_its_rows_in_the_views() {
    let db = Cluster::shared().fresh_db("views_bound").await;
    let c = db.connect().await;
    for owner in ["alice", "bob"] {
        let s = submit(&c, owner, "k", "gpu-a", &json!({})).await.unwrap();
        let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
        mark_unknown(&c, a.attempt_id, None).await.unwrap();
    }
    c.batch_execute("SET intent.owner_id = 'alice'; SET ROLE intent_operator")
        .await
        .unwrap();
    let owners: Vec<String> = c
        .query(
            "SELECT owner_id::text FROM intent.attempts_to_reconcile",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(owners, vec!["alice".to_string()]);
    let jobs: i64 = c
        .query_one("SELECT sum(jobs)::bigint FROM intent.jobs_by_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1);
}

// --- purge -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_old_finished_jobs_with_their_attempts_and_events() {
    let db = Cluster::shared().fresh_db("purge_finished").await;
    let c = db.connect().await;
    let ok = succeeded(&c, "alice", "ok").await;
    let bad = failed(&c, "alice", "bad").await;
    let gone = cancelled(&c, "bob", "gone").await;
    // A job with a lost race: two attempts, events for the abandon and the late result.
    let s = submit(&c, "bob", "race", "gpu-a", &json!({}))
        .await
        .unwrap();
    let a1 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, a1.attempt_id, "stalled").await.unwrap();
    let a2 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    complete(&c, a2.attempt_id, a2.version, &json!({"r": 2}))
        .await
        .unwrap();
    complete(&c, a1.attempt_id, a1.version, &json!({"r": 1}))
        .await
        .unwrap();
    assert_eq!(rows_of(&c, s.job_id).await, (1, 2, 2));
    // Finished too, but recently: kept.
    let recent = succeeded(&c, "carol", "recent").await;
    let recent_rows = snapshot(&c, recent).await;

    for job in [ok, bad, gone, s.job_id] {
        backdate(&c, job, "31 days").await;
    }
    assert_eq!(purge(&c, Some("30 days"), 1000).await.unwrap(), 4);
    for job in [ok, bad, gone, s.job_id] {
        assert_eq!(rows_of(&c, job).await, (0, 0, 0), "job {job} is gone whole");
    }
    assert_eq!(snapshot(&c, recent).await, recent_rows);
    assert_eq!(purge(&c, Some("30 days"), 1000).await.unwrap(), 0);

    // Both ages count: submitted long ago but finished just now is kept.
    let late = submit(&c, "dave", "slow", "gpu-a", &json!({}))
        .await
        .unwrap();
    backdate(&c, late.job_id, "40 days").await;
    let a = begin(&c, late.job_id, None, "1 hour").await.unwrap();
    complete(&c, a.attempt_id, a.version, &json!({}))
        .await
        .unwrap();
    assert_eq!(purge(&c, Some("30 days"), 1000).await.unwrap(), 0);
    assert_eq!(rows_of(&c, late.job_id).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_never_touches_a_job_that_is_not_finished_however_old() {
    let db = Cluster::shared().fresh_db("purge_open").await;
    let c = db.connect().await;
    let p = json!({});
    let pending = submit(&c, "alice", "pending", "gpu-a", &p)
        .await
        .unwrap()
        .job_id;
    let running = submit(&c, "alice", "running", "gpu-a", &p)
        .await
        .unwrap()
        .job_id;
    begin(&c, running, None, "1 hour").await.unwrap();
    let unknown = submit(&c, "alice", "unknown", "gpu-a", &p)
        .await
        .unwrap()
        .job_id;
    let ua = begin(&c, unknown, None, "1 hour").await.unwrap();
    mark_unknown(&c, ua.attempt_id, Some("timeout"))
        .await
        .unwrap();
    let lapsed = submit(&c, "alice", "lapsed", "gpu-a", &p)
        .await
        .unwrap()
        .job_id;
    let la = begin(&c, lapsed, None, "100 milliseconds").await.unwrap();
    // Back to pending after an abandon, with an abandoned attempt and its event.
    let retry = submit(&c, "alice", "retry", "gpu-a", &p)
        .await
        .unwrap()
        .job_id;
    let ra = begin(&c, retry, None, "1 hour").await.unwrap();
    abandon(&c, ra.attempt_id, "stalled").await.unwrap();
    let done = succeeded(&c, "alice", "done").await;
    wait_past_deadline(&c, la.attempt_id).await;

    let open = [pending, running, unknown, lapsed, retry];
    for job in open.iter().chain([&done]) {
        backdate(&c, *job, "1 year").await;
    }
    let mut before = Vec::new();
    for job in open {
        before.push(snapshot(&c, job).await);
    }
    assert_eq!(
        purge(&c, Some("1 day"), 1000).await.unwrap(),
        1,
        "only the finished one"
    );
    assert_eq!(rows_of(&c, done).await, (0, 0, 0));
    for (job, rows) in open.iter().zip(before) {
        assert_eq!(snapshot(&c, *job).await, rows, "job {job} untouched");
    }
    // Not even the lapsed attempt's state: purge is not sweep.
    assert_eq!(attempt_row(&c, la.attempt_id).await.state, "started");
    assert_eq!(purge(&c, Some("1 microsecond"), 1000).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_works_in_bounded_batches_oldest_first() {
    let db = Cluster::shared().fresh_db("purge_batches").await;
    let c = db.connect().await;
    let mut jobs = Vec::new();
    for i in 0..25 {
        let job = cancelled(&c, "alice", &format!("k{i:02}")).await;
        // k00 is the oldest.
        backdate(&c, job, &format!("{} days", 100 - i)).await;
        jobs.push(job);
    }
    let left = || async {
        c.query(
            "SELECT idempotency_key::text FROM intent.jobs ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
    };
    assert_eq!(purge(&c, Some("1 day"), 10).await.unwrap(), 10);
    let keys = left().await;
    assert_eq!(keys.len(), 15);
    assert_eq!(keys[0], "k10", "the ten oldest went first");
    assert_eq!(purge(&c, Some("1 day"), 10).await.unwrap(), 10);
    assert_eq!(purge(&c, Some("1 day"), 10).await.unwrap(), 5);
    assert_eq!(purge(&c, Some("1 day"), 10).await.unwrap(), 0);
    assert!(left().await.is_empty());
    let events: i64 = c
        .query_one("SELECT count(*) FROM intent.events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, 0, "their cancel events went with them");

    // The default batch is 1000; the largest allowed is 100000.
    for bad in [0, -1, 100_001] {
        let e = refusal(purge(&c, Some("1 day"), bad).await, "22023");
        assert!(e.hint().contains("repeatedly"), "{e:?}");
    }
    let n: i64 = c
        .query_one("SELECT intent.purge('1 day')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_takes_its_retention_from_the_argument_or_intent_retention() {
    let db = Cluster::shared().fresh_db("purge_setting").await;
    let c = db.connect().await;
    let old = cancelled(&c, "alice", "old").await;
    backdate(&c, old, "40 days").await;
    let mid = cancelled(&c, "alice", "mid").await;
    backdate(&c, mid, "20 days").await;

    // No retention (an empty setting; unset, it is 7 days: tests/tests/retention.rs):
    // refused, nothing written.
    c.batch_execute("SET intent.retention = ''").await.unwrap();
    let before = digest(&c).await;
    let e = refusal(purge(&c, None, 1000).await, "22023");
    assert!(e.hint().contains("intent.retention"), "{e:?}");
    for bad in ["0", "-1 day", "-1 microsecond"] {
        let e = refusal(purge(&c, Some(bad), 1000).await, "22023");
        assert!(e.detail().contains("retention"), "{e:?}");
    }
    c.batch_execute("SET intent.retention = 'thirty days'")
        .await
        .unwrap();
    refusal(purge(&c, None, 1000).await, "22007");
    assert_eq!(digest(&c).await, before);

    // The setting: 30 days removes the 40-day-old job only.
    c.batch_execute("SET intent.retention = '30 days'")
        .await
        .unwrap();
    assert_eq!(purge(&c, None, 1000).await.unwrap(), 1);
    assert_eq!(rows_of(&c, old).await.0, 0);
    assert_eq!(rows_of(&c, mid).await.0, 1);
    // An argument wins over the setting.
    assert_eq!(purge(&c, Some("10 days"), 1000).await.unwrap(), 1);
    assert_eq!(rows_of(&c, mid).await.0, 0);

    // Only superusers set it (it decides when keys become reusable).
    c.batch_execute("RESET intent.retention; SET ROLE intent_operator")
        .await
        .unwrap();
    refusal(
        c.batch_execute("SET intent.retention = '1 second'").await,
        "42501",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_for_operators_and_a_bound_session_purges_its_owner_only() {
    let db = Cluster::shared().fresh_db("purge_roles").await;
    let c = db.connect().await;
    let a = cancelled(&c, "alice", "k").await;
    let b = cancelled(&c, "bob", "k").await;
    backdate(&c, a, "2 days").await;
    backdate(&c, b, "2 days").await;

    c.batch_execute("SET ROLE intent_app").await.unwrap();
    refusal(purge(&c, Some("1 day"), 1000).await, "42501");
    c.batch_execute("RESET ROLE; SET intent.owner_id = 'alice'; SET ROLE intent_operator")
        .await
        .unwrap();
    assert_eq!(purge(&c, Some("1 day"), 1000).await.unwrap(), 1);
    c.batch_execute("RESET ROLE; RESET intent.owner_id")
        .await
        .unwrap();
    assert_eq!(rows_of(&c, a).await.0, 0);
    assert_eq!(
        rows_of(&c, b).await.0,
        1,
        "bob's job is not alice's session's to purge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_purge_the_same_key_creates_a_new_job() {
    let db = Cluster::shared().fresh_db("purge_reuse").await;
    let c = db.connect().await;
    let first = succeeded(&c, "alice", "order-1").await;
    backdate(&c, first, "31 days").await;
    // Before the purge: a replay.
    let replay = submit(&c, "alice", "order-1", "gpu-a", &json!({"k": "order-1"}))
        .await
        .unwrap();
    assert!(!replay.created);
    assert_eq!(replay.state, "succeeded");
    assert_eq!(purge(&c, Some("30 days"), 1000).await.unwrap(), 1);

    // After it: a new job, with the same derived id, from scratch — even with other params,
    // since nothing of the old intent is left to compare with.
    let again = submit(&c, "alice", "order-1", "gpu-b", &json!({"k": "another"}))
        .await
        .unwrap();
    assert!(again.created, "the key is free again");
    assert_eq!(again.job_id, first);
    // Its versions start above the purged job's last one (2: created at 1, won at 2), so no
    // fencing token of the old job is ever handed out again.
    assert_eq!((again.state.as_str(), again.version), ("pending", 3));
    assert!(again.result.is_none());
    let row = job_row(&c, again.job_id).await;
    assert_eq!((row.attempt_count, row.provider.as_str()), (0, "gpu-b"));
    assert!(event_rows(&c, again.job_id).await.is_empty());
    let a = begin(&c, again.job_id, None, "1 minute").await.unwrap();
    assert_eq!(a.attempt_no, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_a_job_whose_late_result_is_being_recorded() {
    let db = Cluster::shared().fresh_db("purge_vs_late").await;
    let c = db.connect().await;
    let late = db.connect_as("late_reporter").await;
    let purger = db.connect_as("purger").await;
    // Decided long ago; its abandoned first attempt is only now reporting.
    let s = submit(&c, "alice", "k", "gpu-a", &json!({})).await.unwrap();
    let a1 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, a1.attempt_id, "stalled").await.unwrap();
    let a2 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    complete(&c, a2.attempt_id, a2.version, &json!({"r": 2}))
        .await
        .unwrap();
    let other = succeeded(&c, "bob", "k").await;
    backdate(&c, s.job_id, "40 days").await;
    backdate(&c, other, "40 days").await;

    // The late result is being recorded: its transaction holds the job row.
    late.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        complete(&late, a1.attempt_id, a1.version, &json!({"r": 1}))
            .await
            .unwrap(),
        "lost"
    );
    // The purge does not wait for it and does not remove it; other jobs go.
    let purged = tokio::time::timeout(
        Duration::from_secs(10),
        purge(&purger, Some("30 days"), 1000),
    )
    .await
    .expect("purge never waits for a busy job")
    .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(rows_of(&c, other).await, (0, 0, 0));
    late.batch_execute("COMMIT").await.unwrap();

    // The late result was kept for reconciliation, next to the winner.
    let a = attempt_row(&c, a1.attempt_id).await;
    assert_eq!(
        (a.state.as_str(), a.result),
        ("discarded", Some(json!({"r": 1})))
    );
    let kinds: Vec<String> = event_rows(&c, s.job_id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec!["abandoned", "late_result"]);
    // A race lost long ago leaves no trace once its job is purged: the next purge takes it all.
    assert_eq!(purge(&purger, Some("30 days"), 1000).await.unwrap(), 1);
    assert_eq!(rows_of(&c, s.job_id).await, (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_waiting_behind_a_purge_finds_no_job_and_writes_nothing() {
    let db = Cluster::shared().fresh_db("purge_then_late").await;
    let c = db.connect().await;
    let purger = db.connect_as("purger").await;
    let late = std::sync::Arc::new(db.connect_as("late_reporter").await);
    let s = submit(&c, "alice", "k", "gpu-a", &json!({})).await.unwrap();
    let a1 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, a1.attempt_id, "stalled").await.unwrap();
    let a2 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    complete(&c, a2.attempt_id, a2.version, &json!({"r": 2}))
        .await
        .unwrap();
    backdate(&c, s.job_id, "40 days").await;

    // The purge's transaction has removed the job but not committed yet.
    purger.batch_execute("BEGIN").await.unwrap();
    assert_eq!(purge(&purger, Some("30 days"), 1000).await.unwrap(), 1);
    let reporter = {
        let late = late.clone();
        tokio::spawn(
            async move { complete(&late, a1.attempt_id, a1.version, &json!({"r": 1})).await },
        )
    };
    wait_for_lock_waiters(&c, "late_reporter", 1, Duration::from_secs(10)).await;
    purger.batch_execute("COMMIT").await.unwrap();

    // The attempt went with its job: "not found", and nothing is left behind.
    let answer = reporter.await.unwrap();
    let e = refusal(answer, "IJ007");
    assert!(e.detail().contains(&a1.attempt_id.to_string()), "{e:?}");
    assert_eq!(rows_of(&c, s.job_id).await, (0, 0, 0));
    let orphans: i64 = c
        .query_one("SELECT count(*) FROM intent.events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orphans, 0);
}

/// After a purge the key is reusable, and attempt ids are derived from the job id, so the new
/// job's attempt 1 has the very id of the purged job's attempt 1, and both begin at version 1.
/// A late report of the purged attempt then lands on the new job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_of_a_purged_attempt_never_reaches_the_new_job_of_its_key() {
    let db = Cluster::shared().fresh_db("purge_reuse_late").await;
    let c = db.connect().await;
    let s = submit(&c, "alice", "order-1", "gpu-a", &json!({"v": 1}))
        .await
        .unwrap();
    let old = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, old.attempt_id, "stalled").await.unwrap();
    let a2 = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    complete(&c, a2.attempt_id, a2.version, &json!({"for": "v1"}))
        .await
        .unwrap();
    backdate(&c, s.job_id, "31 days").await;
    assert_eq!(purge(&c, Some("30 days"), 1000).await.unwrap(), 1);

    let again = submit(&c, "alice", "order-1", "gpu-a", &json!({"v": 2}))
        .await
        .unwrap();
    assert!(again.created);
    let new = begin(&c, again.job_id, None, "1 hour").await.unwrap();
    // The old worker, still holding attempt 1 of the purged job, reports at last.
    let answer = complete(
        &c,
        old.attempt_id,
        old.version,
        &json!({"for": "v1, stale"}),
    )
    .await;
    // The new job started above the purged job's last version, so the stale version is refused
    // as not the one this attempt was given (22023), and nothing is written.
    let refusal = answer.expect_err("a stale version must not complete the new job's attempt");
    assert_eq!(
        refusal.code().map(|c| c.code()),
        Some("22023"),
        "{refusal:?}"
    );
    assert!(
        new.version > a2.version,
        "the new job's version {} must be above the purged job's {}",
        new.version,
        a2.version
    );
    let job = job_row(&c, again.job_id).await;
    assert_eq!(job.state, "running");
    assert_ne!(
        job.result,
        Some(json!({"for": "v1, stale"})),
        "the purged job's result became the result of the new job (attempt {}, version {})",
        new.attempt_id,
        new.version
    );
}
