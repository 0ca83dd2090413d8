//! Shared fixtures: databases filled the way a real one is.

use crate::*;
use std::collections::BTreeSet;

/// What [`every_state`] made, for tests that go on with it.
#[derive(Debug, Clone)]
pub struct EveryState {
    /// A running job and its started attempt (lease one hour).
    pub running: Submitted,
    pub running_attempt: Begun,
    /// The first attempt of the job that won: its result was rejected by the contract.
    pub rejected_attempt: Begun,
}

/// Fills the database `c` is connected to (as a superuser) with a job in every state, every
/// kind of attempt and event, contracts (one with a checker), certifications current and
/// revoked, and a purged key. Asserts that every job state and event kind is there.
pub async fn every_state(c: &Client) -> EveryState {
    c.batch_execute(
        "CREATE FUNCTION public.has_n(r jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE
             AS $$ SELECT r ? 'n' $$;
         SELECT intent.define_contract('shape', '{\"type\": \"object\"}', 'public.has_n(jsonb)');
         SELECT intent.define_contract('loose', '{}');
         SELECT intent.certify_provider('backup', 'shape', '{\"suite\": \"passed\"}');
         SELECT intent.certify_provider('spare', 'shape', '{\"suite\": \"passed\"}');
         SELECT intent.revoke_certification('spare', 'shape', 'failed re-test');",
    )
    .await
    .unwrap();
    // A job in every state, with every kind of attempt and event.
    submit(c, "alice", "pending", "gpu", &json!({"p": 1}))
        .await
        .unwrap();
    let running = submit(c, "alice", "running", "gpu", &json!({}))
        .await
        .unwrap();
    let running_attempt = begin(c, running.job_id, None, "1 hour").await.unwrap();
    let unknown = submit(c, "bob", "unknown", "gpu", &json!({}))
        .await
        .unwrap();
    let u = begin(c, unknown.job_id, None, "1 hour").await.unwrap();
    mark_unknown(c, u.attempt_id, Some("timeout"))
        .await
        .unwrap();
    let won = submit_full(c, "alice", "won", "gpu", &json!({}), Some("shape"), 5)
        .await
        .unwrap();
    let w1 = begin(c, won.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(c, w1.attempt_id, 1, &json!({"x": 1}))
            .await
            .unwrap(),
        "rejected"
    );
    let w2 = begin(c, won.job_id, None, "1 hour").await.unwrap();
    lapse_lease(c, w2.attempt_id).await.unwrap();
    assert_eq!(sweep(c).await.unwrap(), 1);
    abandon(c, w2.attempt_id, "reconciler").await.unwrap();
    let w3 = begin(c, won.job_id, Some("backup"), "1 hour")
        .await
        .unwrap();
    assert_eq!(
        complete(c, w3.attempt_id, 1, &json!({"n": 3}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(c, w2.attempt_id, 1, &json!({"n": 2}))
            .await
            .unwrap(),
        "lost"
    );
    fail(c, w2.attempt_id, 1, &json!({"late": true}), true)
        .await
        .unwrap();
    let failed = submit_full(c, "bob", "failed", "gpu", &json!({}), Some("loose"), 1)
        .await
        .unwrap();
    let f1 = begin(c, failed.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        fail(c, f1.attempt_id, 1, &json!({"status": 400}), true)
            .await
            .unwrap(),
        "failed"
    );
    let cancelled = submit(c, "carol", "cancelled", "gpu", &json!({}))
        .await
        .unwrap();
    begin(c, cancelled.job_id, None, "1 hour").await.unwrap();
    assert!(
        cancel(c, cancelled.job_id, Some("withdrawn"))
            .await
            .unwrap()
    );
    // A purged job leaves its id and last version in intent.retired_keys.
    let purged = submit(c, "dave", "purged", "gpu", &json!({}))
        .await
        .unwrap();
    let purged_attempt = begin(c, purged.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(c, purged_attempt.attempt_id, 1, &json!({"n": 1}))
            .await
            .unwrap(),
        "won"
    );
    age_job(c, purged.job_id, 400).await.unwrap();
    let n: i64 = c
        .query_one("SELECT intent.purge('1 day', 10)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let states: BTreeSet<String> = c
        .query("SELECT DISTINCT state::text FROM intent.jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states.len(), 6, "a job in every state: {states:?}");
    let kinds: BTreeSet<String> = c
        .query("SELECT DISTINCT kind FROM intent.events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kinds.len(), 6, "every kind of event: {kinds:?}");
    EveryState {
        running,
        running_attempt,
        rejected_attempt: w1,
    }
}
