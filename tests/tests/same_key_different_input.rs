//! Failure point 2, the same key with a different input: a client reuses an idempotency key
//! for another intent (or a bug changes the params between retries).
//!
//! rule 1 (README): the same key with another fingerprint `(provider, params, contract)` is a
//! conflict, never a silent reuse: `IJ001`, whose DETAIL names exactly the fields that differ,
//! with a HINT; and a refusal changes nothing.

use pg_intent_tests::*;
use std::time::Duration;

/// A fingerprint variant: bit 1 changes the provider, bit 2 the params, bit 4 the contract.
#[derive(Debug, Clone)]
struct Variant {
    mask: u8,
    provider: &'static str,
    params: Value,
    contract: Option<&'static str>,
}

fn variant(mask: u8) -> Variant {
    Variant {
        mask,
        provider: if mask & 1 == 0 {
            "gpu-east"
        } else {
            "gpu-west"
        },
        params: if mask & 2 == 0 {
            json!({"prompt": "a cat", "size": [512, 512], "opts": {"seed": 7}})
        } else {
            json!({"prompt": "a cat", "size": [512, 512], "opts": {"seed": 8}})
        },
        contract: if mask & 4 == 0 {
            None
        } else {
            Some("image-v1")
        },
    }
}

/// The DETAIL the protocol documents for two fingerprints: the differing fields, in the order
/// provider, params, contract.
fn expected_detail(job_id: Uuid, a: u8, b: u8) -> String {
    let diff = a ^ b;
    let fields: Vec<&str> = [(1, "provider"), (2, "params"), (4, "contract")]
        .into_iter()
        .filter(|(bit, _)| diff & bit != 0)
        .map(|(_, f)| f)
        .collect();
    assert!(!fields.is_empty());
    format!(
        "Job {job_id} exists with a different {}.",
        fields.join(", ")
    )
}

async fn submit_variant(
    c: &Client,
    owner: &str,
    key: &str,
    v: &Variant,
) -> Result<Submitted, tokio_postgres::Error> {
    submit_full(c, owner, key, v.provider, &v.params, v.contract, 3).await
}

fn assert_conflict(err: &SqlError, job_id: Uuid, mine: u8, theirs: u8) {
    assert_eq!(err.code, "IJ001", "{err:?}");
    assert_eq!(err.severity, "ERROR");
    assert_eq!(err.detail(), expected_detail(job_id, mine, theirs));
    assert!(!err.hint().is_empty());
    assert!(!err.message.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_differing_field_is_named_and_the_job_is_unchanged() {
    let db = Cluster::shared().fresh_db("conflict_fields").await;
    let c = db.connect().await;
    ensure_contract(&c, "image-v1").await;

    // Once with the original on no contract (mask 0), once with it on a contract (mask 4): a
    // NULL contract and a named one differ in both directions.
    for original_mask in [0u8, 4] {
        let (owner, key) = ("dave", format!("render-{original_mask}"));
        let original = variant(original_mask);
        let first = submit_variant(&c, owner, &key, &original).await.unwrap();
        assert!(first.created);
        let raw_before = job_row_raw(&c, first.job_id).await;
        let digest_before = digest(&c).await;

        for mask in 0..8u8 {
            if mask == original_mask {
                continue;
            }
            let err = refusal(
                submit_variant(&c, owner, &key, &variant(mask)).await,
                "IJ001",
            );
            assert_conflict(&err, first.job_id, mask, original_mask);
            assert!(
                err.message.contains(&key) && err.message.contains(owner),
                "the message names the key and the owner: {}",
                err.message
            );
        }
        assert_eq!(
            job_row_raw(&c, first.job_id).await,
            raw_before,
            "the job row is byte-for-byte the same, not even rewritten"
        );
        assert_eq!(digest(&c).await, digest_before, "a refusal writes nothing");

        // The original intent still replays to the same job.
        let again = submit_variant(&c, owner, &key, &original).await.unwrap();
        assert_eq!((again.job_id, again.created), (first.job_id, false));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_jsonb_is_the_same_intent_and_max_attempts_is_not_part_of_it() {
    let db = Cluster::shared().fresh_db("conflict_jsonb").await;
    let c = db.connect().await;
    let sql = "SELECT job_id, created FROM intent.submit_job('erin', 'k', 'p', $1::text::jsonb, NULL, $2)";
    let row = c
        .query_one(sql, &[&r#"{"a": 1, "b": [1, 2], "c": {"x": null}}"#, &3i32])
        .await
        .unwrap();
    let (id, created): (Uuid, bool) = (row.get(0), row.get(1));
    assert!(created);
    let raw = job_row_raw(&c, id).await;

    // Key order, whitespace, 1 vs 1.0, and another max_attempts: the same intent.
    for (text, max_attempts) in [
        (r#"{"c":{"x":null},"b":[1,2],"a":1}"#, 3),
        (
            r#"{  "a" : 1.0 , "b" : [ 1.00, 2 ] , "c" : { "x" : null } }"#,
            3,
        ),
        (r#"{"a": 1, "b": [1, 2], "c": {"x": null}}"#, 9),
    ] {
        let row = c.query_one(sql, &[&text, &max_attempts]).await.unwrap();
        assert_eq!(
            (row.get::<_, Uuid>(0), row.get::<_, bool>(1)),
            (id, false),
            "{text}"
        );
    }
    // But array order, a string for a number, or an extra key are another intent.
    for text in [
        r#"{"a": 1, "b": [2, 1], "c": {"x": null}}"#,
        r#"{"a": "1", "b": [1, 2], "c": {"x": null}}"#,
        r#"{"a": 1, "b": [1, 2], "c": {"x": null}, "d": 0}"#,
        r#"{"a": 1, "b": [1, 2], "c": {}}"#,
    ] {
        let err = expect_error(&c, sql, &[&text, &3i32]).await;
        assert_eq!(err.code, "IJ001", "{text}: {err:?}");
        assert_eq!(
            err.detail(),
            format!("Job {id} exists with a different params.")
        );
    }
    assert_eq!(job_row_raw(&c, id).await, raw);
    assert_eq!(
        job_row(&c, id).await.params,
        json!({"a": 1, "b": [1, 2], "c": {"x": null}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_a_finished_job_leaves_its_outcome_alone() {
    let db = Cluster::shared().fresh_db("conflict_finished").await;
    let c = db.connect().await;
    let original = variant(0);
    let s = submit_variant(&c, "frank", "k1", &original).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"url": "s3://x"}))
            .await
            .unwrap(),
        "won"
    );
    let raw = job_row_raw(&c, s.job_id).await;
    let before = digest(&c).await;
    let err = refusal(
        submit_variant(&c, "frank", "k1", &variant(2)).await,
        "IJ001",
    );
    assert_conflict(&err, s.job_id, 2, 0);
    assert_eq!(job_row_raw(&c, s.job_id).await, raw);
    assert_eq!(digest(&c).await, before);

    // The original intent replays the outcome.
    let again = submit_variant(&c, "frank", "k1", &original).await.unwrap();
    assert_eq!(
        (again.created, again.state.as_str(), again.version),
        (false, "succeeded", 2)
    );
    assert_eq!(again.result, Some(json!({"url": "s3://x"})));
}

/// One original and many conflicting submits at the same instant. Whoever inserts first owns
/// the key; everyone else is answered against *that* fingerprint: a replay if theirs is
/// equal, IJ001 naming exactly the differing fields if not. One row, one `created = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn original_and_conflicting_submits_at_once() {
    const CONNECTIONS: usize = 48;
    let db = Cluster::shared().fresh_db("conflict_race").await;
    let clients = db.connect_many(CONNECTIONS, "conflict_race").await;
    let observer = db.connect().await;
    ensure_contract(&observer, "image-v1").await;

    for round in 0..5 {
        let key = format!("race-{round}");
        let answers = stampede(&clients, |i, c| {
            let key = key.clone();
            let v = variant((i % 8) as u8);
            async move {
                let r = submit_variant(&c, "gina", &key, &v).await;
                (v.mask, r.map_err(|e| SqlError::from_error(&e)))
            }
        })
        .await;
        let job_id = job_id_of("gina", &key);
        let job = job_row(&observer, job_id).await;
        let winner = (0..8u8)
            .find(|m| {
                let v = variant(*m);
                v.provider == job.provider
                    && v.params == job.params
                    && v.contract == job.contract.as_deref()
            })
            .expect("the row holds one of the submitted fingerprints");

        let mut created = 0;
        for (mask, answer) in &answers {
            match answer {
                Ok(s) => {
                    assert_eq!(*mask, winner, "only the owner's fingerprint is answered");
                    assert_eq!(s.job_id, job_id);
                    created += usize::from(s.created);
                }
                Err(err) => {
                    assert_ne!(*mask, winner, "the owner's fingerprint never conflicts");
                    assert_conflict(err, job_id, *mask, winner);
                }
            }
        }
        assert_eq!(created, 1, "exactly one creator");
        let rows: i64 = observer
            .query_one(
                "SELECT count(*) FROM intent.jobs WHERE owner_id = 'gina' AND idempotency_key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1);
        assert_eq!(
            answers.iter().filter(|(_, a)| a.is_err()).count(),
            CONNECTIONS - CONNECTIONS / 8,
            "every other fingerprint is refused"
        );
    }
}

/// The deterministic version: the original's insert is uncommitted while the conflicting
/// submits arrive, so they provably wait on it and then compare against the committed row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_submits_queued_behind_the_original_are_refused_after_it_commits() {
    const WAITERS: usize = 21;
    let db = Cluster::shared().fresh_db("conflict_queued").await;
    let holder = db.connect().await;
    let observer = db.connect().await;
    ensure_contract(&observer, "image-v1").await;
    let app = "conflict_queued_waiter";
    let waiters = db.connect_many(WAITERS, app).await;

    holder.batch_execute("BEGIN").await.unwrap();
    let first = submit_variant(&holder, "hank", "k", &variant(0))
        .await
        .unwrap();
    assert!(first.created);
    let pending = {
        let waiters = waiters.clone();
        tokio::spawn(async move {
            stampede(&waiters, |i, c| {
                let v = variant((i % 7 + 1) as u8);
                async move {
                    (
                        v.mask,
                        submit_variant(&c, "hank", "k", &v)
                            .await
                            .map_err(|e| SqlError::from_error(&e)),
                    )
                }
            })
            .await
        })
    };
    wait_for_lock_waiters(&observer, app, WAITERS as i64, Duration::from_secs(60)).await;
    holder.batch_execute("COMMIT").await.unwrap();
    let raw = job_row_raw(&observer, first.job_id).await;
    for (mask, answer) in pending.await.unwrap() {
        let err = answer.expect_err("a different fingerprint never gets the job");
        assert_conflict(&err, first.job_id, mask, 0);
    }
    assert_eq!(job_row_raw(&observer, first.job_id).await, raw);
    assert_eq!(digest(&observer).await.jobs, 1);
}
