//! A claim skips the jobs other transactions hold and goes on to the next ones
//! (docs/reference.md § 1.5: `FOR NO KEY UPDATE SKIP LOCKED`): a session that keeps the oldest
//! claimable jobs locked — a tenant's open transaction, a slow caller — does not starve every
//! other worker's claims. In the distributed mode the claim reads its candidates without locks
//! and takes them one by one (`extension/src/store/shards.rs`), so this binary is in the
//! conformance suite: each target checks it.

use pg_intent_tests::*;

/// The jobs one `claim_attempts` of provider gpu-h begins, at most `max_jobs`, in its order.
async fn claim(c: &Client, max_jobs: i32) -> Vec<Uuid> {
    claim_jobs(c, "gpu-h", max_jobs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_goes_past_the_jobs_another_transaction_holds() {
    let db = Cluster::shared().fresh_db("claim_contention").await;
    let c = db.connect().await;
    // The oldest claimable jobs: many more than a claim's first page of candidates.
    let mut held = Vec::new();
    for n in 0..12 {
        let s = submit(&c, "alice", &format!("held-{n}"), "gpu-h", &json!({}))
            .await
            .unwrap();
        held.push(s.job_id);
    }
    let newer = submit(&c, "dave", "newer", "gpu-h", &json!({}))
        .await
        .unwrap();

    // Another transaction holds every one of the older jobs (each begin_attempt locks its job).
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    for job in &held {
        begin(&holder, *job, None, "1 hour").await.unwrap();
    }

    assert_eq!(
        claim(&c, 1).await,
        vec![newer.job_id],
        "the claim takes the newer job, past the 12 another transaction holds"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();

    // Released, the older jobs are claimable again, oldest first: at once for another worker;
    // for this one, which has claimed past them, once intent.claim_rescan has passed
    // (tests/tests/claim_start.rs).
    let other = db.connect().await;
    assert_eq!(claim(&other, 2).await, held[..2].to_vec());
}
