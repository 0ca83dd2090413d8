//! Claim order a caller cannot choose (issue 24 § 4), on a real server with real connections.
//!
//! - The times a call writes (the queue's order key `retry_at`, a lease's
//!   `started_at` and `deadline`) are the clock when the call writes, not the start of the
//!   caller's statement: a tenant that keeps one statement open (a `DO` block that sleeps, then
//!   submits) does not place its job ahead of jobs other owners committed meanwhile.
//! - One instant per call: every time a call writes is the same value.
//! - A claim by a session bound to one owner takes that owner's jobs only, in queue order, and
//!   concurrent bound claims take disjoint jobs (`SKIP LOCKED`).
//! - A job's outcome is a HOT update: the claim indexes read no column it changes.

use pg_intent_tests::*;
use std::time::Duration;

/// The jobs a claim began, in the order it answered them.
async fn claim(c: &Client, max_jobs: i32) -> Vec<Uuid> {
    claim_jobs(c, "gpu-q", max_jobs).await
}

/// The issue's reproduction: session T's statement opens, sleeps 3 s, then submits; meanwhile
/// another owner submits and commits. A claim must take the other owner's job first: it has
/// waited longer in the queue. On 0.4.0 the tenant's job carried its statement's start time and
/// was claimed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_held_open_does_not_put_its_job_ahead() {
    let db = Cluster::shared().fresh_db("claim_order_do").await;
    let tenant = db.connect().await;
    let other = db.connect().await;
    let worker = db.connect().await;

    let held = tokio::spawn(async move {
        tenant
            .batch_execute(
                "DO $$ BEGIN
                     PERFORM pg_sleep(3);
                     PERFORM intent.submit_job('tenant', 'k', 'gpu-q', '{}');
                 END $$",
            )
            .await
            .unwrap();
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let others = submit(&other, "other", "k", "gpu-q", &json!({}))
        .await
        .unwrap();
    held.await.unwrap();
    let tenants = job_id_of("tenant", "k");

    assert_eq!(
        claim(&worker, 1).await,
        vec![others.job_id],
        "the other owner's job, committed while the tenant's statement slept, is claimed first"
    );
    assert_eq!(claim(&worker, 1).await, vec![tenants]);
    let keys: Vec<(Uuid, bool)> = worker
        .query(
            "SELECT id, created_at > (SELECT created_at FROM intent.jobs WHERE owner_id = 'other')
               FROM intent.jobs WHERE owner_id = 'tenant'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        keys,
        vec![(tenants, true)],
        "the tenant's job is dated when it was written, after the other owner's"
    );
}

/// The same for the other times a call writes: a begin_attempt and a fail_attempt at the end
/// of a statement that slept date the lease and the retry time when they write, and every time
/// one call writes is one instant (submit: created_at = updated_at; begin and claim:
/// started_at = the job's updated_at, deadline = started_at + lease; a retry: retry_at =
/// updated_at + retry_after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_retry_times_are_dated_when_written_one_instant_per_call() {
    let db = Cluster::shared().fresh_db("claim_order_times").await;
    let c = db.connect().await;
    let s = submit(&c, "alice", "times", "gpu-q", &json!({}))
        .await
        .unwrap();
    let same: bool = c
        .query_one(
            "SELECT created_at = updated_at FROM intent.jobs WHERE id = $1",
            &[&s.job_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(same, "submit_job: created_at = updated_at");

    // begin_attempt after a 2 s sleep in the same statement.
    let slept: bool = {
        c.batch_execute(&format!(
            "CREATE TEMP TABLE t AS SELECT clock_timestamp() AS before;
             DO $$ BEGIN
                 PERFORM pg_sleep(2);
                 PERFORM intent.begin_attempt('{}', lease => '10 seconds');
             END $$",
            s.job_id
        ))
        .await
        .unwrap();
        c.query_one(
            "SELECT a.started_at >= t.before + interval '2 seconds'
                    AND a.deadline = a.started_at + interval '10 seconds'
                    AND j.updated_at = a.started_at
               FROM intent.attempts a JOIN intent.jobs j ON j.id = a.job_id, t
              WHERE a.job_id = $1",
            &[&s.job_id],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert!(
        slept,
        "begin_attempt: the lease starts when it is written, and the job's time is the same instant"
    );

    // fail_attempt (retryable, retry_after 1 minute) after a 2 s sleep.
    let attempt = attempt_id_of(s.job_id, 1);
    c.batch_execute(&format!(
        "UPDATE t SET before = clock_timestamp();
         DO $$ BEGIN
             PERFORM pg_sleep(2);
             PERFORM intent.fail_attempt('{attempt}', 1, '{{}}', retryable => true, retry_after => '1 minute');
         END $$"
    ))
    .await
    .unwrap();
    let retry: bool = c
        .query_one(
            "SELECT j.updated_at >= t.before + interval '2 seconds'
                    AND j.retry_at = j.updated_at + interval '1 minute'
                    AND a.finished_at = j.updated_at
               FROM intent.jobs j JOIN intent.attempts a ON a.job_id = j.id, t
              WHERE j.id = $1",
            &[&s.job_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        retry,
        "fail_attempt: the retry time counts from when it is written, one instant for the call"
    );

    // A claim: its leases start at one instant, which is the jobs' updated_at.
    for k in 0..3 {
        submit(&c, "alice", &format!("claim-{k}"), "gpu-q", &json!({}))
            .await
            .unwrap();
    }
    assert_eq!(claim(&c, 3).await.len(), 3);
    let one: i64 = c
        .query_one(
            "SELECT count(DISTINCT (a.started_at, a.deadline - a.started_at, j.updated_at = a.started_at))
               FROM intent.attempts a JOIN intent.jobs j ON j.id = a.job_id
              WHERE j.idempotency_key LIKE 'claim-%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(one, 1, "one claim, one instant");
}

/// A session bound to owner `a` claims a's jobs only, oldest first, while older jobs of owner
/// `b` wait; two bound sessions claiming at once take disjoint jobs; b's bound claim then takes
/// b's jobs in their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_claim_takes_its_owners_jobs_only_in_order_and_disjoint() {
    let db = Cluster::shared().fresh_db("claim_order_bound").await;
    let admin = db.connect().await;
    let mut of_a = Vec::new();
    let mut of_b = Vec::new();
    for k in 0..12 {
        // b's job first each time: b's queue is older than a's throughout.
        of_b.push(
            submit(&admin, "b", &format!("k{k}"), "gpu-q", &json!({}))
                .await
                .unwrap()
                .job_id,
        );
        of_a.push(
            submit(&admin, "a", &format!("k{k}"), "gpu-q", &json!({}))
                .await
                .unwrap()
                .job_id,
        );
    }
    let bound = |owner: &'static str| {
        let db = &db;
        async move {
            let c = db.connect().await;
            c.batch_execute(&format!("SET intent.owner_id = '{owner}'"))
                .await
                .unwrap();
            c
        }
    };
    let a1 = bound("a").await;
    let a2 = bound("a").await;
    a1.batch_execute("BEGIN").await.unwrap();
    a2.batch_execute("BEGIN").await.unwrap();
    let first = claim(&a1, 3).await;
    let second = claim(&a2, 3).await;
    assert_eq!(first, of_a[0..3], "a's three oldest, in order");
    assert_eq!(
        second,
        of_a[3..6],
        "the next three: the first claim's jobs are locked, and skipped"
    );
    a1.batch_execute("COMMIT").await.unwrap();
    a2.batch_execute("COMMIT").await.unwrap();
    assert_eq!(claim(&a1, 100).await, of_a[6..12], "the rest of a's queue");
    assert_eq!(
        claim(&a1, 100).await,
        Vec::<Uuid>::new(),
        "a's queue is empty"
    );

    let b = bound("b").await;
    assert_eq!(claim(&b, 100).await, of_b, "b's jobs, untouched, in order");
}

/// The plan of a bound claim, as `auto_explain` shows it: an ordered scan of its owner's part
/// of `jobs_claimable_since_by_owner`, never `jobs_claimable` (the walk through every owner's queue)
/// nor a bitmap scan of the owner's part (a sort of the owner's whole queue),
/// even when the statistics say that an owner holds half the table (two other owners, 20,000
/// pending jobs), and on every call (planned once, generically, not per call). No timing is
/// asserted: the cost is in benches/run.py --bound-claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_claim_scans_its_owners_part_of_the_index_only() {
    let db = Cluster::shared().fresh_db("claim_order_plan").await;
    let admin = db.connect().await;
    admin
        .batch_execute(
            "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
             SELECT intent.job_id('o-' || (g % 2), 'k-' || g), 'o-' || (g % 2), 'k-' || g, 'gpu-q', '{}', now()
               FROM generate_series(1, 20000) g;
             ANALYZE intent.jobs;",
        )
        .await
        .unwrap();
    let (bound, notices) =
        pg_intent_tests::roles::connect_role_with(&db, "postgres", Some("-c intent.owner_id=a"))
            .await
            .unwrap();
    bound
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_level = notice;",
        )
        .await
        .unwrap();
    for call in 0..8 {
        notices.clear();
        assert_eq!(claim(&bound, 1).await, Vec::<Uuid>::new(), "a has no job");
        let plans = notices.all().join("\n");
        assert!(
            plans.contains("Index Scan using jobs_claimable_since_by_owner on jobs"),
            "call {call}: {plans}"
        );
        assert!(
            !plans.contains("using jobs_claimable_since on")
                && !plans.contains("Bitmap Heap Scan on jobs"),
            "call {call}: not the walk of every owner's queue, nor a sort of the owner's: {plans}"
        );
    }
}

/// The bound claim's kept plan, made while `intent.jobs` is nearly empty, then used after other
/// owners' jobs fill it (no ANALYZE in between): it still reads none of their rows — no
/// sequential scan of the table to join the claimed rows back (found by the review of #24).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_claims_kept_plan_reads_no_other_owners_rows_as_the_table_grows() {
    let db = Cluster::shared().fresh_db("claim_order_kept_plan").await;
    let admin = db.connect().await;
    admin
        .batch_execute(
            "ALTER TABLE intent.jobs SET (autovacuum_enabled = off);
             INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
             SELECT intent.job_id('a', 'k-' || g), 'a', 'k-' || g, 'gpu-q', '{}', now()
               FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let (bound, notices) =
        pg_intent_tests::roles::connect_role_with(&db, "postgres", Some("-c intent.owner_id=a"))
            .await
            .unwrap();
    bound
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_level = notice;",
        )
        .await
        .unwrap();
    assert_eq!(claim(&bound, 1).await.len(), 1, "the plan is made and kept");
    admin
        .batch_execute(
            "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, retry_at)
             SELECT intent.job_id('b', 'k-' || g), 'b', 'k-' || g, 'gpu-q', '{}', now()
               FROM generate_series(1, 50000) g;",
        )
        .await
        .unwrap();
    for call in 0..3 {
        notices.clear();
        assert_eq!(claim(&bound, 1).await.len(), 1, "call {call}");
        let plans = notices.all().join("\n");
        assert!(
            plans.contains("Index Scan using jobs_claimable_since_by_owner on jobs"),
            "call {call}: {plans}"
        );
        assert!(
            !plans.contains("Seq Scan on jobs") && !plans.contains("Rows Removed by Filter: 50000"),
            "call {call}: the kept plan reads every owner's rows: {plans}"
        );
    }
}

/// A job's outcome is a HOT update (issue 30 § 2): the claim indexes read `retry_at` alone,
/// which the claim cleared, so the win changes no column an index of `intent.jobs` reads and,
/// on a page with room (fillfactor 90), writes no index entry. The claim itself leaves the
/// queue, which no update can do HOT. Counted in the transaction (`pg_stat_get_xact_*`), so
/// nothing depends on when statistics are flushed. A claim index keyed on a column the outcome
/// changes (`updated_at`, `state`) makes it fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_outcome_is_a_hot_update() {
    let db = Cluster::shared().fresh_db("claim_order_hot").await;
    let c = db.connect().await;
    c.batch_execute("BEGIN").await.unwrap();
    let job = submit(&c, "hot", "k", "gpu-h", &json!({}))
        .await
        .unwrap()
        .job_id;
    let a = begin(&c, job, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"r": 1}))
            .await
            .unwrap(),
        "won"
    );
    let row = c
        .query_one(
            "SELECT pg_stat_get_xact_tuples_updated('intent.jobs'::regclass),
                    pg_stat_get_xact_tuples_hot_updated('intent.jobs'::regclass)",
            &[],
        )
        .await
        .unwrap();
    let (updated, hot): (i64, i64) = (row.get(0), row.get(1));
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        (updated, hot),
        (2, 1),
        "the begin leaves the queue; the win is HOT"
    );
}
