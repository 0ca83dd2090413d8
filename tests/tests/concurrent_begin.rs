//! Many workers pick up one job at once: `begin_attempt` is the gate, and concurrent calls on
//! one job see at most one success (docs/reference.md § 1.1 begin_attempt). The others are refused
//! with IJ002 (an attempt is in flight) — never a second attempt, never another error.

use pg_intent_tests::*;
use std::time::Duration;

const CONNECTIONS: usize = 32;

/// Every answer is the one attempt or IJ002; exactly one attempt exists afterwards.
async fn assert_one_attempt(
    c: &Client,
    job_id: Uuid,
    answers: Vec<Result<Begun, SqlError>>,
    attempt_no: i32,
) -> Begun {
    let mut begun = Vec::new();
    for answer in answers {
        match answer {
            Ok(b) => begun.push(b),
            Err(err) => {
                assert_eq!(err.code, "IJ002", "{err:?}");
                assert!(err.detail().contains("started"));
                assert!(!err.hint().is_empty());
            }
        }
    }
    assert_eq!(begun.len(), 1, "exactly one begin succeeds: {begun:?}");
    let b = begun.pop().unwrap();
    assert_eq!(b.attempt_no, attempt_no);
    assert_eq!(b.attempt_id, attempt_id_of(job_id, i64::from(attempt_no)));
    let attempts = attempt_rows(c, job_id).await;
    assert_eq!(attempts.len(), attempt_no as usize);
    let open: Vec<&AttemptRow> = attempts.iter().filter(|a| a.state == "started").collect();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].id, b.attempt_id);
    let job = job_row(c, job_id).await;
    assert_eq!(
        (job.state.as_str(), job.attempt_count),
        ("running", attempt_no)
    );
    b
}

async fn begin_all(
    clients: &[std::sync::Arc<Client>],
    job_id: Uuid,
) -> Vec<Result<Begun, SqlError>> {
    stampede(clients, |i, c| async move {
        let worker = format!("worker-{i}");
        c.query_one(
            "SELECT attempt_id, attempt_no, version FROM intent.begin_attempt($1, NULL, '1 minute', $2)",
            &[&job_id, &worker],
        )
        .await
        .map(|row| Begun {
            attempt_id: row.get(0),
            attempt_no: row.get(1),
            version: row.get(2),
        })
        .map_err(|e| SqlError::from_error(&e))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_begins_at_once_give_one_attempt() {
    let db = Cluster::shared().fresh_db("concurrent_begin").await;
    let c = db.connect().await;
    let clients = db.connect_many(CONNECTIONS, "concurrent_begin").await;
    for round in 0..8 {
        let s = submit(
            &c,
            "quinn",
            &format!("job-{round}"),
            "p",
            &json!({"round": round}),
        )
        .await
        .unwrap();
        let answers = begin_all(&clients, s.job_id).await;
        assert_one_attempt(&c, s.job_id, answers, 1).await;
    }
}

/// After each attempt fails definitely, the gate opens again: each round of 32 concurrent
/// begins gets exactly the next attempt number, until max_attempts (IJ006 for everyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_reopening_of_the_gate_lets_exactly_one_through() {
    let db = Cluster::shared().fresh_db("concurrent_begin_rounds").await;
    let c = db.connect().await;
    let clients = db
        .connect_many(CONNECTIONS, "concurrent_begin_rounds")
        .await;
    let s = submit_full(&c, "quinn", "retry", "p", &json!({}), None, 4)
        .await
        .unwrap();
    for n in 1..=3 {
        let b = assert_one_attempt(&c, s.job_id, begin_all(&clients, s.job_id).await, n).await;
        // Alternate the ways the gate opens: a definite failure, an abandon.
        if n % 2 == 1 {
            assert_eq!(
                fail(&c, b.attempt_id, b.version, &json!({"status": 503}), true)
                    .await
                    .unwrap(),
                "pending"
            );
        } else {
            abandon(&c, b.attempt_id, "worker lost").await.unwrap();
        }
    }
    let b = assert_one_attempt(&c, s.job_id, begin_all(&clients, s.job_id).await, 4).await;
    abandon(&c, b.attempt_id, "worker lost").await.unwrap();
    for answer in begin_all(&clients, s.job_id).await {
        assert_eq!(answer.expect_err("no attempts left").code, "IJ006");
    }
    assert_eq!(attempt_rows(&c, s.job_id).await.len(), 4);
}

/// The deterministic version: the job row is locked while all 32 begins arrive; they queue on
/// it (seen in pg_stat_activity) and, released together, exactly one gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn begins_queued_on_a_locked_job_give_one_attempt() {
    let db = Cluster::shared().fresh_db("concurrent_begin_queued").await;
    let c = db.connect().await;
    let holder = db.connect().await;
    let app = "concurrent_begin_queued_worker";
    let clients = db.connect_many(CONNECTIONS, app).await;
    let s = submit(&c, "quinn", "queued", "p", &json!({}))
        .await
        .unwrap();

    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .query(
            "SELECT 1 FROM intent.jobs WHERE id = $1 FOR UPDATE",
            &[&s.job_id],
        )
        .await
        .unwrap();
    let pending = {
        let clients = clients.clone();
        let job_id = s.job_id;
        tokio::spawn(async move { begin_all(&clients, job_id).await })
    };
    wait_for_lock_waiters(&c, app, CONNECTIONS as i64, Duration::from_secs(60)).await;
    holder.batch_execute("COMMIT").await.unwrap();
    assert_one_attempt(&c, s.job_id, pending.await.unwrap(), 1).await;
}
