//! One session switching between bound and unbound must get each mode's answers, whatever it
//! ran before.
//!
//! An unbound session runs pg_intent's statements without the owner isolation policies (they
//! are `owner_id = owner_id` for it, true for every row), a bound one with them, and each kind
//! of plan is cached separately (extension/src/plans.rs). PostgreSQL's own plan cache does not
//! tell the two apart, so a plan built without the policies serving a bound session would let
//! a tenant act on another owner's job. These tests make every statement run in one mode first
//! and then in the other, in the same session, and check the answers.

use pg_intent_tests::roles::*;
use pg_intent_tests::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_never_cross_from_unbound_to_bound_or_back() {
    let db = Cluster::shared().fresh_db("plan_modes").await;
    let admin = db.connect().await;
    let gateway = create_login_role(&admin, "gateway", "IN ROLE intent_app").await;
    admin
        .batch_execute(&format!(
            "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
        ))
        .await
        .unwrap();
    let c = connect_role(&db, &gateway).await;

    for round in 0..3 {
        let key = format!("k{round}");
        // Unbound: the gateway acts for tenant-b directly; every statement gets planned in the
        // unbound mode first (in round 0) or again.
        let theirs = submit(&c, "tenant-b", &key, "gpu", &json!({}))
            .await
            .unwrap();
        let a = begin(&c, theirs.job_id, None, "1 hour").await.unwrap();
        assert!(heartbeat(&c, a.attempt_id, None).await.unwrap());

        // Bound to tenant-a in the same session, one transaction per call (a refusal aborts
        // its transaction): tenant-b's job is not there for it.
        let bind = "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'";
        c.batch_execute(bind).await.unwrap();
        refusal(begin(&c, theirs.job_id, None, "1 hour").await, "IJ007");
        c.batch_execute("ROLLBACK").await.unwrap();
        c.batch_execute(bind).await.unwrap();
        refusal(heartbeat(&c, a.attempt_id, None).await, "IJ007");
        c.batch_execute("ROLLBACK").await.unwrap();
        c.batch_execute(bind).await.unwrap();
        refusal(
            complete(&c, a.attempt_id, a.version, &json!({"r": "stolen"})).await,
            "IJ007",
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        c.batch_execute(bind).await.unwrap();
        refusal(cancel(&c, theirs.job_id, None).await, "IJ007");
        c.batch_execute("ROLLBACK").await.unwrap();
        c.batch_execute(bind).await.unwrap();
        refusal(
            submit(&c, "tenant-b", &key, "gpu", &json!({})).await,
            "42501",
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        c.batch_execute(bind).await.unwrap();
        assert!(
            submit(&c, "tenant-a", &key, "gpu", &json!({}))
                .await
                .unwrap()
                .created
        );
        c.batch_execute("COMMIT").await.unwrap();

        // Unbound again: tenant-b's attempt is still the gateway's to complete.
        assert_eq!(
            complete(&c, a.attempt_id, a.version, &json!({"r": round}))
                .await
                .unwrap(),
            "won"
        );
        let job = job_row(&admin, theirs.job_id).await;
        assert_eq!(
            (job.state.as_str(), job.result),
            ("succeeded", Some(json!({"r": round})))
        );
    }
}
