//! Callers under REPEATABLE READ and SERIALIZABLE (docs/protocol.md § Concurrency; § submit_job): a concurrent insert of
//! the same key may surface as SQLSTATE 40001 — "retry the transaction" — but never as a wrong
//! answer: never another job id, never another error, never two `created = true` that both
//! commit. After the 40001s are retried, exactly one job exists.

use pg_intent_tests::*;
use std::sync::Arc;
use tokio::sync::Barrier;

const CONNECTIONS: usize = 32;

/// What one caller's transaction did, try by try.
#[derive(Debug, Default)]
struct Story {
    /// Tries that failed with 40001 (at the submit or at COMMIT) and were retried.
    retries: usize,
    /// The try that committed: its answer.
    committed: Option<Submitted>,
    /// Whether the first try failed with 40001.
    first_try_failed: bool,
}

/// One caller: `BEGIN ISOLATION LEVEL <level>`, optionally take the snapshot early (a read of
/// intent.jobs), wait for everyone, submit, read the job back, COMMIT — retrying on 40001.
async fn caller(
    c: Arc<Client>,
    level: &'static str,
    early_snapshot: bool,
    barrier: Arc<Barrier>,
    owner: String,
    key: String,
) -> Story {
    let mut story = Story::default();
    let params = json!({"amount": 1299, "currency": "EUR"});
    for try_no in 0.. {
        assert!(try_no < 100, "40001 forever: {story:?}");
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        if early_snapshot {
            c.query(
                "SELECT count(*) FROM intent.jobs WHERE owner_id = $1",
                &[&owner],
            )
            .await
            .unwrap();
        }
        if try_no == 0 {
            barrier.wait().await;
        }
        let outcome = async {
            let s = submit(&c, &owner, &key, "payments", &params).await?;
            // Inside the same transaction the caller can read the job it was given.
            let row = c
                .query_one(
                    "SELECT count(*) FROM intent.jobs WHERE id = $1",
                    &[&s.job_id],
                )
                .await?;
            assert_eq!(
                row.get::<_, i64>(0),
                1,
                "the answer is visible to its own transaction"
            );
            c.batch_execute("COMMIT").await?;
            Ok::<_, tokio_postgres::Error>(s)
        }
        .await;
        match outcome {
            Ok(s) => {
                story.committed = Some(s);
                return story;
            }
            Err(e) => {
                let err = SqlError::from_error(&e);
                assert_eq!(
                    err.code, "40001",
                    "under {level} the only error is a serialization failure: {err:?}"
                );
                c.batch_execute("ROLLBACK").await.unwrap();
                story.retries += 1;
                story.first_try_failed |= try_no == 0;
            }
        }
    }
    unreachable!()
}

async fn run(level: &'static str, early_snapshot: bool) {
    let db = Cluster::shared()
        .fresh_db(&format!(
            "isolation_{}_{}",
            level.replace(' ', "_"),
            early_snapshot
        ))
        .await;
    let observer = db.connect().await;
    let clients = db.connect_many(CONNECTIONS, "isolation").await;
    let mut saw_40001 = 0;
    for round in 0..4 {
        let (owner, key) = (format!("tenant-{round}"), format!("pay-{round}"));
        let barrier = Arc::new(Barrier::new(CONNECTIONS));
        let handles: Vec<_> = clients
            .iter()
            .map(|c| {
                tokio::spawn(caller(
                    c.clone(),
                    level,
                    early_snapshot,
                    barrier.clone(),
                    owner.clone(),
                    key.clone(),
                ))
            })
            .collect();
        let mut stories = Vec::new();
        for h in handles {
            stories.push(h.await.expect("caller task"));
        }
        let expected = job_id_of(&owner, &key);
        let committed: Vec<&Submitted> = stories
            .iter()
            .map(|s| s.committed.as_ref().unwrap())
            .collect();
        assert!(
            committed.iter().all(|s| s.job_id == expected),
            "never another job id"
        );
        assert_eq!(
            committed.iter().filter(|s| s.created).count(),
            1,
            "{level}: exactly one committed created = true"
        );
        let rows: i64 = observer
            .query_one(
                "SELECT count(*) FROM intent.jobs WHERE owner_id = $1 AND idempotency_key = $2",
                &[&owner, &key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1);
        let failed_first = stories.iter().filter(|s| s.first_try_failed).count();
        if early_snapshot {
            // Every snapshot was taken before the creator committed, so every other caller
            // meets a row its snapshot cannot see: 40001, then a successful retry.
            assert_eq!(failed_first, CONNECTIONS - 1, "{level}: {stories:?}");
        }
        saw_40001 += stories.iter().map(|s| s.retries).sum::<usize>();
    }
    assert_eq!(digest(&observer).await.jobs, 4);
    eprintln!(
        "{level} (early snapshot: {early_snapshot}): {saw_40001} serialization failures retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeatable_read_with_snapshot_before_the_race() {
    run("REPEATABLE READ", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeatable_read_with_snapshot_at_the_submit() {
    run("REPEATABLE READ", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializable_with_snapshot_before_the_race() {
    run("SERIALIZABLE", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serializable_with_snapshot_at_the_submit() {
    run("SERIALIZABLE", false).await;
}

/// A job committed before the transaction began is simply found, under any isolation level,
/// without an error and without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_job_is_found_under_every_level() {
    let db = Cluster::shared().fresh_db("isolation_existing").await;
    let c = db.connect().await;
    let s = submit(&c, "rae", "k", "p", &json!({})).await.unwrap();
    let before = digest(&c).await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let again = submit(&c, "rae", "k", "p", &json!({})).await.unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        assert_eq!((again.job_id, again.created), (s.job_id, false), "{level}");
    }
    assert_eq!(digest(&c).await, before);
}

/// Under REPEATABLE READ, begin_attempt on a job changed by a concurrent transaction since the
/// snapshot surfaces as 40001 — not as a second attempt and not as a stale answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_begin_after_a_concurrent_begin_is_40001_or_ij002() {
    let db = Cluster::shared().fresh_db("isolation_begin").await;
    let c = db.connect().await;
    let other = db.connect().await;
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let s = submit(&c, "rae", level, "p", &json!({})).await.unwrap();
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        c.query("SELECT count(*) FROM intent.jobs", &[])
            .await
            .unwrap(); // the snapshot
        let first = begin(&other, s.job_id, None, "1 minute").await.unwrap();
        let err = refusal_any(begin(&c, s.job_id, None, "1 minute").await);
        assert!(
            err.code == "40001" || err.code == "IJ002",
            "{level}: {err:?}"
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        let attempts = attempt_rows(&c, s.job_id).await;
        assert_eq!(attempts.len(), 1, "{level}");
        assert_eq!(attempts[0].id, first.attempt_id);
    }
}

fn refusal_any<T: std::fmt::Debug>(r: Result<T, tokio_postgres::Error>) -> SqlError {
    match r {
        Ok(v) => panic!("expected a refusal, got {v:?}"),
        Err(e) => SqlError::from_error(&e),
    }
}

/// A REPEATABLE READ (or SERIALIZABLE) transaction whose snapshot predates a heartbeat must not
/// judge the attempt by the stale deadline. The attempt is in flight (IJ002 is the truth); from
/// the snapshot its lease looks run out (IJ003 would be wrong). The answer is 40001 (retry:
/// then IJ002) or IJ002, never IJ003.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_snapshot_never_calls_a_live_attempt_unknown() {
    let db = Cluster::shared().fresh_db("isolation_stale").await;
    let c = db.connect().await;
    let worker = db.connect().await;
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let key = format!("stale {level}");
        let job = submit(&c, "alice", &key, "gpu", &json!({})).await.unwrap();
        let a = begin(&worker, job.job_id, None, "2 seconds").await.unwrap();
        c.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        // The snapshot: the attempt's deadline is 2 seconds after it began.
        c.query(
            "SELECT deadline FROM intent.attempts WHERE id = $1",
            &[&a.attempt_id],
        )
        .await
        .unwrap();
        // The worker's heartbeat extends the lease by an hour, and commits.
        assert!(
            heartbeat(&worker, a.attempt_id, Some("1 hour"))
                .await
                .unwrap()
        );
        // Past the old deadline, the snapshot's view says the lease ran out.
        tokio::time::sleep(std::time::Duration::from_millis(2300)).await;
        let e = refusal_any(begin(&c, job.job_id, None, "1 minute").await);
        c.batch_execute("ROLLBACK").await.unwrap();
        assert!(
            e.code == "40001" || e.code == "IJ002",
            "{level}: a live attempt was answered {e:?}"
        );
        // Retried, with a fresh snapshot: in flight.
        refusal(begin(&c, job.job_id, None, "1 minute").await, "IJ002");
        assert_eq!(attempt_row(&c, a.attempt_id).await.state, "started");
    }
}
