//! Where a claim starts (extension/src/claim_start.rs, docs/reference.md § 1.5): a backend's
//! claims read the claimable queue from the newest job its last claim took, so that they skip
//! what they claimed before (and the row versions an old snapshot keeps of it); a job that
//! becomes claimable behind that point is taken by the next whole read, at most
//! `intent.claim_rescan` later, and at once by a backend that has not claimed past it; a claim
//! that takes nothing keeps its start (an idle worker's polls do not read the whole queue); a
//! claim that does not commit leaves no start. In the conformance suite: every target checks it.

use pg_intent_tests::*;
use std::time::{Duration, Instant};

/// The keys of the jobs one `claim_attempts` of provider gpu-s begins, in its order (owner "u";
/// each key found from its job id, which the protocol crate derives: no read of the tables,
/// which Citus refuses in the claim's transaction).
async fn claim(c: &Client, max_jobs: i32) -> Vec<String> {
    const KEYS: &[&str] = &[
        "late", "young", "late-2", "young-2", "late-3", "young-3", "held", "next", "last", "a",
        "b", "c", "d",
    ];
    claim_jobs(c, "gpu-s", max_jobs)
        .await
        .into_iter()
        .map(|id| {
            KEYS.iter()
                .find(|k| pg_intent_protocol::job_id("u", k).ok() == Some(*id.as_bytes()))
                .map_or_else(|| id.to_string(), |k| k.to_string())
        })
        .collect()
}

/// Claims one job at a time until `key` is taken; how long it took. Panics after `limit`.
async fn claimed_within(c: &Client, key: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if claim(c, 1).await.iter().any(|k| k == key) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{key} not claimed within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A submit of `late` whose transaction stays open, then `young` submitted and committed: once
/// the returned connection commits, `late` is claimable with an older time than `young`.
async fn late_then_young(db: &Db<'_>, su: &Client, late: &str, young: &str) -> Client {
    let c = db.connect().await;
    c.batch_execute("BEGIN").await.unwrap();
    submit(&c, "u", late, "gpu-s", &json!({})).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    submit(su, "u", young, "gpu-s", &json!({})).await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_committed_behind_the_start_is_claimed_within_the_rescan() {
    let db = Cluster::shared().fresh_db("claim_start_late").await;
    let su = db.connect().await;
    let late = late_then_young(&db, &su, "late", "young").await;
    let w = db.connect().await;
    // An hour while the test looks at claims from the start: however slow the machine, no
    // whole read comes between them.
    w.batch_execute("SET intent.claim_rescan = '1h'")
        .await
        .unwrap();
    assert_eq!(claim(&w, 1).await, ["young"]);
    late.batch_execute("COMMIT").await.unwrap();
    // This worker starts where it claimed "young": "late" is behind it, and waits for the
    // whole read; a worker that has not claimed past it takes it at once.
    assert_eq!(
        claim(&w, 1).await,
        Vec::<String>::new(),
        "read from the start"
    );
    let other = db.connect().await;
    assert_eq!(claim(&other, 1).await, ["late"]);
    // Again, for this worker alone, with the rescan: taken once 2 s have passed.
    w.batch_execute("SET intent.claim_rescan = '2s'")
        .await
        .unwrap();
    let late2 = late_then_young(&db, &su, "late-2", "young-2").await;
    // The whole read of the first claim above was at most 2 s ago; wait for a fresh one, so
    // that the time below is measured from a known whole read.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(claim(&w, 1).await, ["young-2"], "a whole read");
    late2.batch_execute("COMMIT").await.unwrap();
    let waited = claimed_within(&w, "late-2", Duration::from_secs(10)).await;
    assert!(
        waited >= Duration::from_millis(1500),
        "taken after {waited:?}: before the rescan, so not from the start"
    );
    // With intent.claim_rescan = 0 every claim reads the whole queue: taken at once.
    let late3 = late_then_young(&db, &su, "late-3", "young-3").await;
    w.batch_execute("SET intent.claim_rescan = 0")
        .await
        .unwrap();
    assert_eq!(claim(&w, 1).await, ["young-3"]);
    late3.batch_execute("COMMIT").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["late-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_released_unchanged_behind_the_start_is_claimed_within_the_rescan() {
    let db = Cluster::shared().fresh_db("claim_start_held").await;
    let su = db.connect().await;
    for key in ["held", "next", "last"] {
        submit(&su, "u", key, "gpu-s", &json!({})).await.unwrap();
    }
    let held: Uuid = su
        .query_one("SELECT intent.job_id('u', 'held')", &[])
        .await
        .unwrap()
        .get(0);
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    begin(&holder, held, None, "1 hour").await.unwrap();
    let w = db.connect().await;
    w.batch_execute("SET intent.claim_rescan = '1h'")
        .await
        .unwrap();
    assert_eq!(claim(&w, 1).await, ["next"], "past the held job");
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        claim(&w, 1).await,
        ["last"],
        "from the start: past the released job"
    );
    w.batch_execute("SET intent.claim_rescan = '1s'")
        .await
        .unwrap();
    claimed_within(&w, "held", Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_does_not_commit_leaves_no_start() {
    let db = Cluster::shared().fresh_db("claim_start_rollback").await;
    let su = db.connect().await;
    for key in ["a", "b", "c", "d"] {
        submit(&su, "u", key, "gpu-s", &json!({})).await.unwrap();
    }
    let w = db.connect().await;
    w.batch_execute("SET intent.claim_rescan = '1h'")
        .await
        .unwrap();
    // A whole read first, committed: the start is "a".
    assert_eq!(claim(&w, 1).await, ["a"]);
    // Rolled back: "b" is claimable again, and the next claim must not start past it.
    w.batch_execute("BEGIN").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["b"]);
    w.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["b"], "after a rollback");
    // A savepoint rolled back: the same within one transaction.
    w.batch_execute("BEGIN; SAVEPOINT s").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["c"]);
    w.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["c"], "after a rolled-back savepoint");
    w.batch_execute("COMMIT").await.unwrap();
    assert_eq!(claim(&w, 1).await, ["d"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_takes_nothing_keeps_its_start() {
    let db = Cluster::shared().fresh_db("claim_start_idle").await;
    let su = db.connect().await;
    let late = late_then_young(&db, &su, "late", "a").await;
    let w = db.connect().await;
    w.batch_execute("SET intent.claim_rescan = '2s'")
        .await
        .unwrap();
    assert_eq!(claim(&w, 1).await, ["a"]);
    // A whole read that finds nothing ("late" is not committed yet)...
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        claim(&w, 1).await,
        Vec::<String>::new(),
        "a whole read, empty"
    );
    w.batch_execute("SET intent.claim_rescan = '1h'")
        .await
        .unwrap();
    late.batch_execute("COMMIT").await.unwrap();
    // ...keeps the start at "a": the polls that follow read from there, not the whole queue,
    // until the rescan.
    assert_eq!(
        claim(&w, 1).await,
        Vec::<String>::new(),
        "read from the start"
    );
    w.batch_execute("SET intent.claim_rescan = '1s'")
        .await
        .unwrap();
    claimed_within(&w, "late", Duration::from_secs(10)).await;
}
