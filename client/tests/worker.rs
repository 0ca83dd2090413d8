//! The worker and failover helpers against a real server, with short leases.

mod db;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use db::TestDb;
use pg_intent_client::{
    self as intent, AttemptState, BeginOptions, Completion, Error, Failover, JobState, NewJob, Run,
    Submitted, WorkError, Worker,
};
use serde_json::{Value, json};

const LEASE: Duration = Duration::from_millis(300);

async fn job(db: &intent::Connection, key: &str, max_attempts: u16) -> uuid::Uuid {
    let s: Submitted<Value> = intent::submit_job(
        db,
        &NewJob::new("owner", key, "gpu-a", &json!({"k": key})).max_attempts(max_attempts),
    )
    .await
    .unwrap();
    s.job_id
}

/// Sets a flag when dropped: tells whether the work future was stopped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn heartbeats_keep_the_lease_alive_and_the_result_wins() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let probe = t.conn().await;
    let j = job(&db, "long", 3).await;
    let worker = Worker::new(&db, Duration::from_secs(20))
        .lease(LEASE)
        .name("w-1");
    assert_eq!(worker.heartbeat_interval(), LEASE / 3);
    let run = worker
        .run(j, None, |attempt| {
            let probe = &probe;
            async move {
                // Four leases long: without heartbeats the attempt would count as unknown.
                for _ in 0..4 {
                    tokio::time::sleep(LEASE).await;
                    let err = intent::begin_attempt(probe, attempt.job_id(), BeginOptions::new())
                        .await
                        .unwrap_err();
                    assert!(matches!(err, Error::AttemptInFlight { .. }), "{err:?}");
                }
                let rec = intent::get_attempt(probe, attempt.id())
                    .await
                    .unwrap()
                    .unwrap();
                assert!(
                    rec.deadline > attempt.deadline(),
                    "heartbeats moved the deadline"
                );
                assert_eq!(rec.worker.as_deref(), Some("w-1"));
                Ok::<_, WorkError<Value>>(json!({"url": "s3://fox.png"}))
            }
        })
        .await
        .unwrap();
    let Run::Completed {
        attempt,
        completion,
        result,
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert_eq!(result, json!({"url": "s3://fox.png"}));
    let job = intent::get_job(&db, j).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.completed_by, Some(attempt.id()));
    assert_eq!(job.result, Some(result));
}

#[tokio::test]
async fn a_heartbeat_that_says_no_stops_the_work() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    for (key, decide) in [("abandoned", "abandon"), ("cancelled", "cancel")] {
        let j = job(&db, key, 3).await;
        let operator = t.conn().await;
        let decided = tokio::spawn(async move {
            tokio::time::sleep(LEASE / 2).await;
            let a1 = intent::attempt_id(j, 1).unwrap();
            if decide == "abandon" {
                intent::abandon_attempt(&operator, a1, "operator gave up")
                    .await
                    .unwrap();
            } else {
                assert!(intent::cancel_job(&operator, j, None).await.unwrap());
            }
            Instant::now()
        });
        let dropped = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let worker = Worker::new(&db, Duration::from_secs(30)).lease(LEASE);
        let run = worker
            .run(j, None, |_| {
                let flag = DropFlag(dropped.clone());
                let finished = finished.clone();
                async move {
                    let _flag = flag;
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    finished.store(true, Ordering::SeqCst);
                    Ok::<_, WorkError<Value>>(json!("too late"))
                }
            })
            .await
            .unwrap();
        let stopped_at = Instant::now();
        let decided_at = decided.await.unwrap();
        assert!(matches!(run, Run::Stopped { .. }), "{run:?}");
        assert!(dropped.load(Ordering::SeqCst), "the work was stopped");
        assert!(!finished.load(Ordering::SeqCst));
        // Within about one heartbeat interval of the decision (generous for a loaded machine).
        assert!(stopped_at.duration_since(decided_at) < Duration::from_secs(3));
        // Nothing was reported for the stopped attempt.
        let rec = intent::get_attempt(&db, intent::attempt_id(j, 1).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.result, None);
        assert_eq!(rec.error, None);
    }
}

#[tokio::test]
async fn the_callers_timeout_marks_unknown_never_failed() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let probe = t.conn().await;
    let j = job(&db, "slow", 3).await;
    // The timeout is longer than the lease: heartbeats carry the attempt until it fires.
    let worker = Worker::new(&db, LEASE * 3).lease(LEASE);
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let run = worker
        .run(j, None, |attempt| {
            let flag = DropFlag(dropped.clone());
            let probe = &probe;
            async move {
                let _flag = flag;
                tokio::time::sleep(LEASE * 2).await;
                let err = intent::begin_attempt(probe, attempt.job_id(), BeginOptions::new())
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::AttemptInFlight { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<Value, WorkError<Value>>(json!("never"))
            }
        })
        .await
        .unwrap();
    assert!(started.elapsed() >= LEASE * 3);
    assert!(dropped.load(Ordering::SeqCst));
    let Run::Unknown { attempt, reason } = run else {
        panic!("{run:?}")
    };
    assert!(reason.contains("timeout"), "{reason}");
    let rec = intent::get_attempt(&db, attempt.id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, AttemptState::Unknown);
    assert_eq!(
        intent::get_job(&db, j).await.unwrap().unwrap().state,
        JobState::Unknown
    );
    let reasons: Vec<Value> = db
        .query(
            "SELECT detail FROM intent.events WHERE job_id = $1 AND kind = 'timeout'",
            &[&j],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
}

#[tokio::test]
async fn definite_failures_and_unknown_outcomes_are_reported_as_such() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(LEASE);

    let j = job(&db, "fails", 3).await;
    let run = worker
        .run(j, None, |_| async {
            Err::<Value, _>(WorkError::retryable(json!({"status": 429})))
        })
        .await
        .unwrap();
    assert!(
        matches!(&run, Run::Failed { job_state: JobState::Pending, retryable: true, error, .. } if error == &json!({"status": 429})),
        "{run:?}"
    );
    let run = worker
        .run(j, None, |_| async {
            Err::<Value, _>(WorkError::permanent(json!({"status": 400})))
        })
        .await
        .unwrap();
    let Run::Failed {
        attempt, job_state, ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(attempt.attempt_no(), 2);
    assert_eq!(job_state, JobState::Failed);
    let record = intent::get_job(&db, j).await.unwrap().unwrap();
    assert_eq!(record.error, Some(json!({"status": 400})));

    let j = job(&db, "connection-reset", 3).await;
    let run = worker
        .run(j, None, |_| async {
            Err::<Value, WorkError<Value>>(WorkError::unknown(
                "connection reset after the request was sent",
            ))
        })
        .await
        .unwrap();
    let Run::Unknown { attempt, .. } = run else {
        panic!("{run:?}")
    };
    assert_eq!(
        intent::get_attempt(&db, attempt.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        AttemptState::Unknown
    );
}

/// A worker whose attempt was abandoned (and never heard about it) reports with its own version
/// and loses to the attempt that won meanwhile.
#[tokio::test]
async fn a_late_worker_loses_and_its_result_is_kept() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let other = t.conn().await;
    let j = job(&db, "late", 3).await;
    let worker = Worker::new(&db, Duration::from_secs(10))
        .lease(Duration::from_secs(5))
        .heartbeat_every(Duration::from_secs(60));
    let run = worker
        .run(j, None, |attempt| {
            let other = &other;
            async move {
                intent::abandon_attempt(other, attempt.id(), "looks stuck")
                    .await
                    .unwrap();
                let a2 = intent::begin_attempt(other, attempt.job_id(), BeginOptions::new())
                    .await
                    .unwrap();
                assert_eq!(
                    intent::complete_attempt(other, &a2, &json!("second"))
                        .await
                        .unwrap(),
                    Completion::Won
                );
                Ok::<_, WorkError<Value>>(json!("first, but late"))
            }
        })
        .await
        .unwrap();
    let Run::Completed {
        attempt,
        completion,
        ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(completion, Completion::Lost);
    let rec = intent::get_attempt(&db, attempt.id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, AttemptState::Discarded);
    assert_eq!(rec.result, Some(json!("first, but late")));
    assert_eq!(
        intent::get_job(&db, j).await.unwrap().unwrap().result,
        Some(json!("second"))
    );
}

#[tokio::test]
async fn failover_moves_on_only_when_the_gate_allows() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(LEASE);

    // A retryable failure moves on; the job names no contract, so gpu-b is not certified.
    let j = job(&db, "uncertified", 3).await;
    let mut tried = Vec::new();
    let out = worker
        .run_failover(j, &["gpu-a", "gpu-b"], |attempt| {
            tried.push(attempt.provider().unwrap().to_string());
            async { Err::<Value, _>(WorkError::retryable(json!({"status": 503}))) }
        })
        .await
        .unwrap();
    assert_eq!(tried, ["gpu-a"]);
    match out {
        Failover::Exhausted {
            failures,
            rejected,
            not_certified,
            attempts_exhausted,
        } => {
            assert_eq!(
                failures,
                vec![("gpu-a".to_string(), json!({"status": 503}))]
            );
            assert!(rejected.is_empty());
            assert_eq!(not_certified, ["gpu-b"]);
            assert!(!attempts_exhausted);
        }
        other => panic!("{other:?}"),
    }

    // Retrying on the same provider after a retryable failure: the second attempt wins.
    let j = job(&db, "second-wins", 3).await;
    let out = worker
        .run_failover(j, &["gpu-a", "gpu-a"], |attempt| async move {
            if attempt.attempt_no() == 1 {
                Err(WorkError::retryable(json!("busy")))
            } else {
                Ok(json!({"from": attempt.attempt_no()}))
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(&out, Failover::Completed { attempt, completion: Completion::Won, .. } if attempt.attempt_no() == 2),
        "{out:?}"
    );

    // A permanent failure ends it: no next provider.
    let j = job(&db, "permanent", 3).await;
    let mut calls = 0;
    let out = worker
        .run_failover(j, &["gpu-a", "gpu-a"], |_| {
            calls += 1;
            async { Err::<Value, _>(WorkError::permanent(json!("invalid prompt"))) }
        })
        .await
        .unwrap();
    assert_eq!(calls, 1);
    assert!(
        matches!(
            &out,
            Failover::Failed {
                job_state: JobState::Failed,
                ..
            }
        ),
        "{out:?}"
    );

    // max_attempts reached.
    let j = job(&db, "exhausted", 1).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    intent::abandon_attempt(&db, a.id(), "gone").await.unwrap();
    let out = worker
        .run_failover(j, &["gpu-a"], |_| async {
            Ok::<_, WorkError<Value>>(json!("never runs"))
        })
        .await
        .unwrap();
    assert!(
        matches!(
            &out,
            Failover::Exhausted {
                attempts_exhausted: true,
                ..
            }
        ),
        "{out:?}"
    );
}

/// "Outcome unknown, reconcile first" is its own answer: no second attempt is begun.
#[tokio::test]
async fn failover_never_starts_a_second_attempt_while_an_outcome_is_unknown() {
    let t = TestDb::new().await;
    let db = t.conn().await;

    // This run's own timeout.
    let worker = Worker::new(&db, LEASE).lease(Duration::from_secs(5));
    let j = job(&db, "timeout", 3).await;
    let mut calls = 0;
    let out = worker
        .run_failover(j, &["gpu-a", "gpu-a", "gpu-b"], |_| {
            calls += 1;
            async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<Value, WorkError<Value>>(json!("never"))
            }
        })
        .await
        .unwrap();
    assert_eq!(calls, 1);
    let a1 = intent::attempt_id(j, 1).unwrap();
    assert!(
        matches!(&out, Failover::ReconcileFirst { attempt_id: Some(id), reason: Some(_) } if *id == a1),
        "{out:?}"
    );
    assert_eq!(
        intent::get_job(&db, j)
            .await
            .unwrap()
            .unwrap()
            .attempt_count,
        1
    );

    // An earlier attempt's unknown outcome: the work never runs.
    let out = worker
        .run_failover(j, &["gpu-a", "gpu-b"], |_| async {
            Ok::<Value, WorkError<Value>>(json!("must not run"))
        })
        .await
        .unwrap();
    assert!(
        matches!(&out, Failover::ReconcileFirst { attempt_id: Some(id), reason: None } if *id == a1),
        "{out:?}"
    );

    // Another attempt in flight.
    let j = job(&db, "in-flight", 3).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    let out = worker
        .run_failover(j, &["gpu-a"], |_| async {
            Ok::<Value, WorkError<Value>>(json!("must not run"))
        })
        .await
        .unwrap();
    assert!(
        matches!(&out, Failover::InFlight { attempt_id: Some(id) } if *id == a.id()),
        "{out:?}"
    );

    // A finished job.
    let j = job(&db, "cancelled", 3).await;
    intent::cancel_job(&db, j, None).await.unwrap();
    let out = worker
        .run_failover(j, &["gpu-a"], |_| async {
            Ok::<Value, WorkError<Value>>(json!("must not run"))
        })
        .await
        .unwrap();
    assert!(
        matches!(
            &out,
            Failover::JobFinished {
                state: Some(JobState::Cancelled)
            }
        ),
        "{out:?}"
    );

    // A stopped run is its own answer too.
    let j = job(&db, "stopped", 3).await;
    let short = Worker::new(&db, Duration::from_secs(30)).lease(LEASE);
    let operator = t.conn().await;
    tokio::spawn(async move {
        tokio::time::sleep(LEASE / 2).await;
        intent::cancel_job(&operator, j, None).await.unwrap();
    });
    let out = short
        .run_failover(j, &["gpu-a", "gpu-a"], |_| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<Value, WorkError<Value>>(json!("never"))
        })
        .await
        .unwrap();
    assert!(matches!(&out, Failover::Stopped { .. }), "{out:?}");
}

/// A gate refusal before any work is an error of `run`, not a `Run`.
#[tokio::test]
async fn run_reports_gate_refusals_as_errors() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "gate", 3).await;
    let _a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    let err = Worker::new(&db, Duration::from_secs(1))
        .run(j, None, |_| async {
            Ok::<Value, WorkError<Value>>(json!(1))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AttemptInFlight { .. }), "{err:?}");
}
