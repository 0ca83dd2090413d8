//! Retries: a retryable failure reopens its job, and the job waits before a claim may take it —
//! the caller's `retry_after`, or the default backoff: `intent.retry_backoff` doubled for each
//! failed attempt of the job but the first, at most `intent.retry_backoff_max`
//! (docs/reference.md § 1.5). The rule is written once for every storage mode
//! (`extension/src/store/rules.rs`, `backoff_sql!`); this binary is in the conformance suite, so
//! each target checks it.

use pg_intent_tests::*;

/// The job's retry delay (retry_at − updated_at) in seconds, and its state.
async fn delay(c: &Client, job_id: Uuid) -> (String, f64) {
    let row = c
        .query_one(
            "SELECT state::text, extract(epoch FROM retry_at - updated_at)::float8
               FROM intent.jobs WHERE id = $1",
            &[&job_id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// How many attempts a claim of `provider` begins now.
async fn claimable(c: &Client, provider: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM intent.claim_attempts(ARRAY[$1::text], 'retries-worker', '1 minute', 10)",
        &[&provider],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_backoff_doubles_per_failed_attempt_up_to_its_maximum() {
    let db = Cluster::shared().fresh_db("retries_backoff").await;
    let c = db.connect().await;
    c.batch_execute(
        "SET intent.retry_backoff = '10 seconds'; SET intent.retry_backoff_max = '25 seconds'",
    )
    .await
    .unwrap();
    let s = submit_full(&c, "rita", "backoff", "gpu-r", &json!({}), None, 5)
        .await
        .unwrap();
    // 10 s after the first failure, then doubled (20 s), then capped at 25 s.
    for (n, expected) in [(1, 10.0), (2, 20.0), (3, 25.0), (4, 25.0)] {
        let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
        assert_eq!(a.attempt_no, n);
        let state = fail(
            &c,
            a.attempt_id,
            a.version,
            &json!({"kind": "rate_limited"}),
            true,
        )
        .await
        .unwrap();
        assert_eq!(
            state, "pending",
            "attempt {n}: a retryable failure reopens the job"
        );
        assert_eq!(
            delay(&c, s.job_id).await,
            ("pending".to_string(), expected),
            "after failed attempt {n}"
        );
        assert_eq!(
            claimable(&c, "gpu-r").await,
            0,
            "not claimable before its retry time"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_overrides_the_backoff_and_zero_is_claimable_at_once() {
    let db = Cluster::shared().fresh_db("retries_after").await;
    let c = db.connect().await;
    let s = submit_full(&c, "rita", "after", "gpu-s", &json!({}), None, 3)
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    let state: String = c
        .query_one(
            "SELECT intent.fail_attempt($1, $2, '{\"kind\": \"busy\"}', true, interval '3 seconds')::text",
            &[&a.attempt_id, &a.version],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "pending");
    assert_eq!(delay(&c, s.job_id).await, ("pending".to_string(), 3.0));
    assert_eq!(claimable(&c, "gpu-s").await, 0);

    let b = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    c.query_one(
        "SELECT intent.fail_attempt($1, $2, '{\"kind\": \"busy\"}', true, interval '0')::text",
        &[&b.attempt_id, &b.version],
    )
    .await
    .unwrap();
    assert_eq!(delay(&c, s.job_id).await, ("pending".to_string(), 0.0));
    assert_eq!(claimable(&c, "gpu-s").await, 1, "claimable at once");
}
