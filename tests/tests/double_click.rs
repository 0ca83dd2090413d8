//! Failure point 1, the double click: one intent arrives many times at once.
//!
//! rule 1 (README): `UNIQUE (owner_id, idempotency_key)` decides, there is no check-then-insert.
//! Concurrent identical calls all get the same job id, exactly one of them gets
//! `created = true`, and exactly one row exists.

use pg_intent_tests::*;
use std::time::Duration;

const CONNECTIONS: usize = 64;

/// Asserts the answers of one burst of identical submits: one job id (the derived one), exactly
/// one `created = true`, everyone sees version 1.
fn assert_one_creator(answers: &[Submitted], owner: &str, key: &str) {
    let expected = job_id_of(owner, key);
    for a in answers {
        assert_eq!(a.job_id, expected, "every caller names the same job");
        assert_eq!(a.version, 1);
        assert!(a.result.is_none());
    }
    let created = answers.iter().filter(|a| a.created).count();
    assert_eq!(
        created,
        1,
        "exactly one of {} callers creates the job",
        answers.len()
    );
}

async fn rows_for(c: &Client, owner: &str, key: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM intent.jobs WHERE owner_id = $1 AND idempotency_key = $2",
        &[&owner, &key],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_identical_submits_at_the_same_instant_make_one_job() {
    let db = Cluster::shared().fresh_db("double_click").await;
    let clients = db.connect_many(CONNECTIONS, "double_click").await;
    let observer = db.connect().await;
    let params = json!({"prompt": "a cat in a hat", "size": [1024, 1024], "seed": 42, "nested": {"a": [1, 2, {"b": null}]}});

    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        let owner = format!("user-{}", round % 3);
        let key = format!("click-{round}");
        let answers = stampede(&clients, |_, c| {
            let (owner, key, params) = (owner.clone(), key.clone(), params.clone());
            async move { submit(&c, &owner, &key, "gpu-east", &params).await }
        })
        .await;
        let answers: Vec<Submitted> = answers
            .into_iter()
            .map(|a| a.expect("an identical submit never fails"))
            .collect();
        assert_one_creator(&answers, &owner, &key);
        assert!(answers.iter().all(|a| a.state == "pending"));
        assert_eq!(rows_for(&observer, &owner, &key).await, 1);

        let job = job_row(&observer, job_id_of(&owner, &key)).await;
        assert_eq!(job.params, params);
        assert_eq!((job.state.as_str(), job.version), ("pending", 1));
    }
    let d = digest(&observer).await;
    assert_eq!(d.jobs, ROUNDS as i64, "one job per intent, none more");
    assert_eq!(
        (d.attempts, d.events),
        (0, 0),
        "submits start nothing and log nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stampede_over_several_keys_makes_one_job_per_key() {
    let db = Cluster::shared().fresh_db("double_click_keys").await;
    let clients = db.connect_many(CONNECTIONS, "double_click_keys").await;
    let observer = db.connect().await;
    const KEYS: usize = 4;

    for round in 0..3 {
        // Same key under two owners is two intents; four keys interleaved across connections.
        let intent = |i: usize| {
            (
                format!("owner-{}", i % 2),
                format!("r{round}-key-{}", i % KEYS),
            )
        };
        let answers = stampede(&clients, |i, c| {
            let (owner, key) = intent(i);
            async move {
                let s = submit(&c, &owner, &key, "p", &json!({"n": i % KEYS}))
                    .await
                    .expect("submit");
                (owner, key, s)
            }
        })
        .await;
        let mut intents: Vec<(String, String)> = answers
            .iter()
            .map(|(o, k, _)| (o.clone(), k.clone()))
            .collect();
        intents.sort();
        intents.dedup();
        assert_eq!(intents.len(), KEYS, "i%2 and i%4 give four intents");
        for (owner, key) in &intents {
            let mine: Vec<Submitted> = answers
                .iter()
                .filter(|(o, k, _)| o == owner && k == key)
                .map(|(_, _, s)| s.clone())
                .collect();
            assert_eq!(mine.len(), CONNECTIONS / KEYS);
            assert_one_creator(&mine, owner, key);
            assert_eq!(rows_for(&observer, owner, key).await, 1);
        }
    }
    assert_eq!(digest(&observer).await.jobs, 3 * KEYS as i64);
}

/// The deterministic version: the first submit's transaction is still open, so every other
/// submit of the key provably waits on the unique index (we see them waiting in
/// `pg_stat_activity`) and then answers from the committed row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submits_queued_behind_an_uncommitted_insert_all_get_that_job() {
    let db = Cluster::shared().fresh_db("double_click_queued").await;
    let holder = db.connect().await;
    let observer = db.connect().await;
    let app = "double_click_queued_waiter";
    let waiters = db.connect_many(CONNECTIONS - 1, app).await;

    for (round, finish) in ["COMMIT", "ROLLBACK"].into_iter().enumerate() {
        let (owner, key) = ("carol", format!("checkout-{round}"));
        let params = json!({"cart": [round, 2, 3]});
        holder.batch_execute("BEGIN").await.unwrap();
        let first = submit(&holder, owner, &key, "stripe", &params)
            .await
            .unwrap();
        assert!(first.created);

        let pending = {
            let (key, params) = (key.clone(), params.clone());
            let waiters = waiters.clone();
            tokio::spawn(async move {
                stampede(&waiters, |_, c| {
                    let (key, params) = (key.clone(), params.clone());
                    async move { submit(&c, owner, &key, "stripe", &params).await }
                })
                .await
            })
        };
        wait_for_lock_waiters(
            &observer,
            app,
            (CONNECTIONS - 1) as i64,
            Duration::from_secs(60),
        )
        .await;
        holder.batch_execute(finish).await.unwrap();
        let answers: Vec<Submitted> = pending
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.expect("a queued submit never fails"))
            .collect();
        let created = answers.iter().filter(|a| a.created).count();
        if finish == "COMMIT" {
            assert_eq!(created, 0, "the holder created it; everyone else replays");
        } else {
            assert_eq!(
                created, 1,
                "the holder rolled back: exactly one waiter creates the job"
            );
        }
        assert!(answers.iter().all(|a| a.job_id == job_id_of(owner, &key)));
        assert_eq!(rows_for(&observer, owner, &key).await, 1);
    }
}

/// The id is the one every other layer computes before asking the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_id_is_the_derived_one() {
    let db = Cluster::shared().fresh_db("double_click_ids").await;
    let c = db.connect().await;
    for (owner, key, expected) in [
        ("alice", "click-1", "62ccd04c-f6e5-82dd-aeee-a9dac8090000"),
        ("bob", "click-1", "7f0bee31-33f4-8d37-a75f-6be579b60000"),
        (
            "tenant-42",
            "order-2026-11-30-0001",
            "7a4ffde0-bffb-854b-acd8-945a08ef0000",
        ),
        ("ö", "ключ", "3978066c-a3db-84e2-8d3c-9400b3c00000"),
    ] {
        let s = submit(&c, owner, key, "p", &json!({})).await.unwrap();
        assert_eq!(s.job_id.to_string(), expected);
        assert_eq!(s.job_id, job_id_of(owner, key));
    }
}
