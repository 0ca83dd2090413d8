//! Contracts, certifications and certified failover through the client; and binding a
//! transaction to one owner.
//!
//! These need an extension with contracts and certified failover (docs/reference.md § 1.3,
//! `intent.define_contract` …) and
//! owner isolation (`intent.bound_owner`); on an older installed build each test says so on
//! stderr and returns. `PG_INTENT_PG_BIN` runs them against a packaged build.

mod db;

use std::time::{Duration, SystemTime};

use db::TestDb;
use pg_intent_client::{
    self as intent, AttemptState, BeginOptions, Completion, Connection, Error, Failover, JobState,
    NewJob, Submitted, WorkError, Worker,
};
use serde_json::{Value, json};

async fn has_contracts(db: &Connection) -> bool {
    let yes: bool = db
        .query_one(
            "SELECT to_regproc('intent.define_contract') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if !yes {
        eprintln!("skipped: the installed pg_intent has no contracts (intent.define_contract)");
    }
    yes
}

fn image_schema() -> Value {
    json!({
        "type": "object",
        "required": ["url"],
        "properties": {"url": {"type": "string", "pattern": "^s3://"}}
    })
}

#[tokio::test]
async fn define_and_redefine_a_contract() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    if !has_contracts(&db).await {
        return;
    }
    assert_eq!(
        intent::define_contract(&db, "images-v1", &image_schema(), None)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        intent::define_contract(&db, "images-v1", &image_schema(), None)
            .await
            .unwrap(),
        1,
        "the same definition keeps the version"
    );
    assert_eq!(
        intent::define_contract(&db, "images-v1", &json!({"type": "object"}), None)
            .await
            .unwrap(),
        2
    );
    // Not a JSON Schema: bad input.
    let err = intent::define_contract(&db, "broken", &json!({"type": 12}), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    // A checker that does not exist is an error, never "no checker".
    let err = intent::define_contract(&db, "c", &json!({}), Some("app.nope(jsonb)"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
}

#[tokio::test]
async fn results_that_break_the_contract_are_rejected() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    if !has_contracts(&db).await {
        return;
    }
    db.batch_execute(
        "CREATE SCHEMA app;
         CREATE FUNCTION app.not_a_placeholder(r jsonb) RETURNS boolean
           LANGUAGE sql STABLE AS $$ SELECT r->>'url' <> 's3://placeholder.png' $$;
         -- Checkers run as the extension's owner role, where there is one.
         DO $$ BEGIN
           IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'intent_owner') THEN
             GRANT USAGE ON SCHEMA app TO intent_owner;
             GRANT EXECUTE ON FUNCTION app.not_a_placeholder(jsonb) TO intent_owner;
           END IF;
         END $$;",
    )
    .await
    .unwrap();
    intent::define_contract(
        &db,
        "images-v1",
        &image_schema(),
        Some("app.not_a_placeholder(jsonb)"),
    )
    .await
    .unwrap();
    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "c-1", "gpu-a", &json!({})).contract("images-v1"),
    )
    .await
    .unwrap();
    for bad in [
        json!({"link": "http://x"}),
        json!({"url": "s3://placeholder.png"}),
    ] {
        let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        assert_eq!(
            intent::complete_attempt(&db, &a, &bad).await.unwrap(),
            Completion::Rejected
        );
        // Asked again: the same answer.
        assert_eq!(
            intent::complete_attempt(&db, &a, &bad).await.unwrap(),
            Completion::Rejected
        );
        let rec = intent::get_attempt(&db, a.id()).await.unwrap().unwrap();
        assert_eq!(rec.state, AttemptState::Failed);
        assert_eq!(
            rec.error.as_ref().and_then(|e| e.get("kind")),
            Some(&json!("contract_violation")),
            "{:?}",
            rec.error
        );
    }
    let job = intent::get_job(&db, s.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending);
    let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
        .await
        .unwrap();
    assert_eq!(
        intent::complete_attempt(&db, &a, &json!({"url": "s3://fox.png"}))
            .await
            .unwrap(),
        Completion::Won
    );
}

#[tokio::test]
async fn failover_to_a_certified_provider() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    if !has_contracts(&db).await {
        return;
    }
    intent::define_contract(&db, "images-v1", &image_schema(), None)
        .await
        .unwrap();
    let expires = intent::certify_provider(
        &db,
        "gpu-b",
        "images-v1",
        &json!({"cases": 12, "passed": 12}),
        Duration::from_secs(7 * 86_400),
    )
    .await
    .unwrap();
    let now = SystemTime::now();
    assert!(expires > now + Duration::from_secs(6 * 86_400));
    assert!(expires < now + Duration::from_secs(8 * 86_400));

    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "c-2", "gpu-a", &json!({"prompt": "fox"})).contract("images-v1"),
    )
    .await
    .unwrap();
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_millis(300));
    let mut tried = Vec::new();
    let out = worker
        .run_failover(s.job_id, &["gpu-a", "gpu-c", "gpu-b"], |attempt| {
            let provider = attempt.provider().unwrap().to_string();
            tried.push(provider.clone());
            async move {
                if provider == "gpu-a" {
                    Err(WorkError::retryable(json!({"status": 503})))
                } else {
                    Ok(json!({"url": format!("s3://{provider}/fox.png")}))
                }
            }
        })
        .await
        .unwrap();
    // gpu-c holds no certification: the gate refused it and it was skipped.
    assert_eq!(tried, ["gpu-a", "gpu-b"]);
    let Failover::Completed {
        attempt,
        completion,
        ..
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert_eq!(attempt.provider(), Some("gpu-b"));
    let rec = intent::get_attempt(&db, attempt.id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.provider, "gpu-b");
    assert_eq!(rec.attempt_no, 2);

    // Revoked: new failovers to it are refused.
    assert!(
        intent::revoke_certification(&db, "gpu-b", "images-v1", "drifted output")
            .await
            .unwrap()
    );
    assert!(
        !intent::revoke_certification(&db, "gpu-b", "images-v1", "again")
            .await
            .unwrap()
    );
    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "c-3", "gpu-a", &json!({})).contract("images-v1"),
    )
    .await
    .unwrap();
    let err = intent::begin_attempt(&db, s.job_id, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::ProviderNotCertified { provider: Some(p), .. } if p == "gpu-b"),
        "{err:?}"
    );
}

/// A result the contract rejects is a reason to fail over, like a retryable failure.
#[tokio::test]
async fn a_rejected_result_fails_over() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    if !has_contracts(&db).await {
        return;
    }
    intent::define_contract(&db, "images-v1", &image_schema(), None)
        .await
        .unwrap();
    intent::certify_provider(
        &db,
        "gpu-b",
        "images-v1",
        &json!({"ok": true}),
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_millis(300));
    let work = |attempt: intent::Attempt| async move {
        if attempt.provider() == Some("gpu-a") {
            Ok::<_, WorkError<Value>>(json!({"link": "not what the contract wants"}))
        } else {
            Ok(json!({"url": "s3://gpu-b/fox.png"}))
        }
    };

    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "r-1", "gpu-a", &json!({})).contract("images-v1"),
    )
    .await
    .unwrap();
    let out = worker
        .run_failover(s.job_id, &["gpu-a", "gpu-b"], work)
        .await
        .unwrap();
    assert!(
        matches!(&out, Failover::Completed { attempt, completion: Completion::Won, .. } if attempt.provider() == Some("gpu-b")),
        "{out:?}"
    );

    // Only rejections: exhausted, with the rejected results.
    let s: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("alice", "r-2", "gpu-a", &json!({})).contract("images-v1"),
    )
    .await
    .unwrap();
    let out = worker
        .run_failover(s.job_id, &["gpu-a", "gpu-a"], work)
        .await
        .unwrap();
    let Failover::Exhausted {
        rejected, failures, ..
    } = out
    else {
        panic!("{out:?}")
    };
    assert!(failures.is_empty());
    assert_eq!(rejected.len(), 2);
    assert_eq!(
        intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
        JobState::Pending
    );
}

/// A gateway binds each request's transaction to its owner.
#[tokio::test]
async fn a_bound_transaction_sees_one_owner() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    let has_isolation: bool = db
        .query_one("SELECT to_regproc('intent.bound_owner') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    if !has_isolation {
        eprintln!("skipped: the installed pg_intent has no owner isolation (intent.bound_owner)");
        return;
    }
    let bob: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("bob", "k", "gpu-a", &json!({})))
            .await
            .unwrap();

    let tx = db.transaction().await.unwrap();
    intent::bind_owner(&tx, "alice").await.unwrap();
    let mine: Submitted<Value> =
        intent::submit_job(&tx, &NewJob::new("alice", "k", "gpu-a", &json!({})))
            .await
            .unwrap();
    assert!(mine.created);
    // Bob's job does not exist for a transaction bound to alice, even by its id.
    let err = intent::begin_attempt(&tx, bob.job_id, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotFound { id, .. } if *id == bob.job_id),
        "{err:?}"
    );
    tx.rollback().await.unwrap();

    let tx = db.transaction().await.unwrap();
    intent::bind_owner(&tx, "alice").await.unwrap();
    let err = intent::submit_job::<Value>(&tx, &NewJob::new("bob", "k2", "gpu-a", &json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("42501"), "{err:?}");
    assert_eq!(err.http_status(), 403);
    tx.rollback().await.unwrap();

    // The binding ended with the transaction.
    intent::begin_attempt(&db, bob.job_id, BeginOptions::new())
        .await
        .unwrap();
}
