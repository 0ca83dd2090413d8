//! The seed's four failure points, through the client API against a real cluster.

mod db;

use std::sync::Arc;
use std::time::Duration;

use db::TestDb;
use pg_intent_client::{
    self as intent, AttemptState, BeginOptions, Completion, Error, FingerprintField, JobState,
    NewJob, Run, Submitted, WorkError, Worker,
};
use serde_json::{Value, json};

async fn events(db: &intent::Connection, job: uuid::Uuid, kind: &str) -> Vec<Value> {
    db.query(
        "SELECT detail FROM intent.events WHERE job_id = $1 AND kind = $2 ORDER BY id",
        &[&job, &kind],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// 1. The double click: 64 concurrent submits of one intent → one job, one `created = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_click_64_concurrent_submits_make_one_job() {
    let t = TestDb::new().await;
    let n = 64;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let db = t.conn().await;
        let barrier = barrier.clone();
        tasks.spawn(async move {
            let params = json!({"prompt": "a red fox", "size": [1024, 1024]});
            barrier.wait().await;
            let s: Submitted<Value> =
                intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &params))
                    .await
                    .unwrap();
            (s.job_id, s.created)
        });
    }
    let mut created = 0;
    let want = intent::job_id("alice", "click-1").unwrap();
    while let Some(r) = tasks.join_next().await {
        let (job_id, was_created) = r.unwrap();
        assert_eq!(job_id, want);
        created += usize::from(was_created);
    }
    assert_eq!(created, 1);
    let db = t.conn().await;
    let jobs: i64 = db
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1);
}

/// 2. The same key with a different input is a conflict, never a silent reuse.
#[tokio::test]
async fn same_key_different_input_is_ij001() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let fox = json!({"prompt": "a red fox"});
    let wolf = json!({"prompt": "a grey wolf"});
    let first: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &fox))
            .await
            .unwrap();
    let err = intent::submit_job::<Value>(&db, &NewJob::new("alice", "click-1", "gpu-a", &wolf))
        .await
        .unwrap_err();
    match err {
        Error::IdempotencyConflict { job_id, fields, .. } => {
            assert_eq!(job_id, first.job_id);
            assert_eq!(fields, vec![FingerprintField::Params]);
        }
        other => panic!("{other:?}"),
    }
    // The job is untouched.
    let job = intent::get_job(&db, first.job_id).await.unwrap().unwrap();
    assert_eq!(job.params, fox);
    assert_eq!(job.version, first.version);
}

/// 3. A timeout makes the attempt unknown, never failed; no attempt begins until it is
///    abandoned (or its outcome reported).
#[tokio::test]
async fn timeout_is_unknown_never_failed() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    for (key, resolve_by_completing) in [("abandoned", false), ("completed", true)] {
        let s: Submitted<Value> =
            intent::submit_job(&db, &NewJob::new("alice", key, "gpu-a", &json!({})))
                .await
                .unwrap();
        let worker = Worker::new(&db, Duration::from_millis(200)).lease(Duration::from_secs(5));
        let run = worker
            .run(s.job_id, None, |_| async {
                tokio::time::sleep(Duration::from_secs(30)).await; // the GPU is still generating
                Ok::<Value, WorkError<Value>>(json!("never"))
            })
            .await
            .unwrap();
        let Run::Unknown { attempt, reason } = run else {
            panic!("{run:?}")
        };
        assert!(reason.contains("timeout"), "{reason}");
        let rec = intent::get_attempt(&db, attempt.id())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.state, AttemptState::Unknown);
        assert_eq!(rec.error, None);
        assert_eq!(
            intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
            JobState::Unknown
        );
        assert_eq!(events(&db, s.job_id, "timeout").await.len(), 1);

        // The gate stays shut, however often one asks.
        for _ in 0..3 {
            let err = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
                .await
                .unwrap_err();
            assert!(
                matches!(&err, Error::OutcomeUnknown { attempt_id: Some(id), .. } if *id == attempt.id()),
                "{err:?}"
            );
        }

        if resolve_by_completing {
            // The reconciler learns the provider did finish: its result wins, the job is done.
            assert_eq!(
                intent::complete_attempt(&db, &attempt, &json!({"url": "s3://late.png"}))
                    .await
                    .unwrap(),
                Completion::Won
            );
            let err = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
                .await
                .unwrap_err();
            assert!(
                matches!(
                    &err,
                    Error::JobFinished {
                        state: Some(JobState::Succeeded),
                        ..
                    }
                ),
                "{err:?}"
            );
        } else {
            intent::abandon_attempt(&db, attempt.id(), "provider has no record of it")
                .await
                .unwrap();
            let next = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
                .await
                .unwrap();
            assert_eq!(next.attempt_no(), 2);
        }
        let failed: i64 = db
            .query_one(
                "SELECT count(*) FROM intent.attempts WHERE job_id = $1 AND state = 'failed'",
                &[&s.job_id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(failed, 0, "a timeout is never a failure");
    }
}

/// 4. Reverse-order finish: the first valid completion wins, whatever order the attempts began
///    in; the late one is lost, and kept.
#[tokio::test]
async fn reverse_order_finish_first_completion_wins() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    for (key, later_finishes_first) in [("later-first", true), ("earlier-first", false)] {
        let s: Submitted<Value> =
            intent::submit_job(&db, &NewJob::new("alice", key, "gpu-a", &json!({})))
                .await
                .unwrap();
        let a1 = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        intent::mark_unknown(&db, a1.id(), Some("timeout"))
            .await
            .unwrap();
        intent::abandon_attempt(&db, a1.id(), "retry on a fresh attempt")
            .await
            .unwrap();
        let a2 = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        assert_eq!(
            a1.version(),
            a2.version(),
            "a begin never changes the version"
        );

        let (first, second) = if later_finishes_first {
            (&a2, &a1)
        } else {
            (&a1, &a2)
        };
        let r1 = json!({"from": first.attempt_no()});
        let r2 = json!({"from": second.attempt_no()});
        assert_eq!(
            intent::complete_attempt(&db, first, &r1).await.unwrap(),
            Completion::Won
        );
        assert_eq!(
            intent::complete_attempt(&db, second, &r2).await.unwrap(),
            Completion::Lost
        );
        // Asked again, the same answers.
        assert_eq!(
            intent::complete_attempt(&db, second, &r2).await.unwrap(),
            Completion::Lost
        );

        let job = intent::get_job(&db, s.job_id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.completed_by, Some(first.id()));
        assert_eq!(job.result, Some(r1));
        let late = intent::get_attempt(&db, second.id())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.state, AttemptState::Discarded);
        assert_eq!(
            late.result,
            Some(r2),
            "the late result is kept on its attempt"
        );
        let races = events(&db, s.job_id, "late_result").await;
        assert_eq!(races.len(), 1, "the race is logged once");
    }
}

/// Two completions racing on two connections: exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_completions_have_one_winner() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    for round in 0..10 {
        let key = format!("race-{round}");
        let s: Submitted<Value> =
            intent::submit_job(&db, &NewJob::new("alice", &key, "gpu-a", &json!({})))
                .await
                .unwrap();
        let a1 = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        intent::abandon_attempt(&db, a1.id(), "stuck")
            .await
            .unwrap();
        let a2 = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let mut tasks = tokio::task::JoinSet::new();
        for a in [a1, a2] {
            let c = t.conn().await;
            let barrier = barrier.clone();
            tasks.spawn(async move {
                barrier.wait().await;
                intent::complete_attempt(&c, &a, &json!({"from": a.attempt_no()}))
                    .await
                    .unwrap()
            });
        }
        let mut won = 0;
        while let Some(c) = tasks.join_next().await {
            won += usize::from(c.unwrap() == Completion::Won);
        }
        assert_eq!(won, 1, "round {round}");
    }
}

/// Concurrent begins on one job: at most one succeeds; the others see it in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_begins_let_one_through() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "begin-race", "gpu-a", &json!({})),
    )
    .await
    .unwrap();
    let n = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let c = t.conn().await;
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            intent::begin_attempt(&c, s.job_id, BeginOptions::new()).await
        });
    }
    let (mut ok, mut in_flight) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(a) => {
                ok += 1;
                assert_eq!(a.attempt_no(), 1);
            }
            Err(Error::AttemptInFlight { .. }) => in_flight += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!((ok, in_flight), (1, n - 1));
}

/// A started attempt whose lease ran out (never swept) may still win: its work happened.
#[tokio::test]
async fn a_lapsed_attempt_that_reports_first_still_wins() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let s: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("alice", "lapsed", "gpu-a", &json!({})))
            .await
            .unwrap();
    let a = intent::begin_attempt(
        &db,
        s.job_id,
        BeginOptions::new().lease(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        intent::complete_attempt(&db, &a, &json!({"url": "s3://x"}))
            .await
            .unwrap(),
        Completion::Won
    );
    assert_eq!(
        intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
        JobState::Succeeded
    );
}
