//! Batches that share keys, submitted concurrently in opposite orders, never deadlock: each
//! batch inserts its new keys in job-id order whatever the order of its arrays, so two batches
//! meet their common keys in the same order and one waits for the other (docs/protocol.md
//! § Concurrency, § submit_job: concurrent identical calls all get the same job; here, whole batches of them).

use pg_intent_tests::*;
use std::sync::Arc;

const KEYS: usize = 400;
const ROUNDS: usize = 12;

async fn batch(c: Arc<Client>, keys: Vec<String>) -> Result<Vec<(String, bool)>, SqlError> {
    let n = keys.len();
    let owners = vec!["alice".to_string(); n];
    let providers = vec!["gpu".to_string(); n];
    let params: Vec<Value> = keys.iter().map(|k| json!({"k": k})).collect();
    c.batch_execute("BEGIN").await.unwrap();
    let rows = c
        .query(
            "SELECT job_id::text, created, sqlstate FROM intent.submit_jobs($1, $2, $3, $4)",
            &[&owners, &keys, &providers, &params],
        )
        .await;
    match rows {
        Ok(rows) => {
            // Hold the inserted keys a moment, as a transaction that goes on would.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            c.batch_execute("COMMIT").await.unwrap();
            Ok(rows
                .iter()
                .map(|r| {
                    assert_eq!(r.get::<_, Option<String>>(2), None, "no intent refused");
                    (r.get(0), r.get(1))
                })
                .collect())
        }
        Err(e) => {
            let e = SqlError::from_error(&e);
            c.batch_execute("ROLLBACK").await.unwrap();
            Err(e)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_sharing_keys_in_opposite_orders_never_deadlock() {
    let db = Cluster::shared().fresh_db("batch_order").await;
    let clients = db.connect_many(4, "batch_order").await;
    for round in 0..ROUNDS {
        let keys: Vec<String> = (0..KEYS).map(|i| format!("r{round}-k{i}")).collect();
        let mut reversed = keys.clone();
        reversed.reverse();
        // Every other connection gets the keys backwards; two of them a shuffled half too.
        let orders = [
            keys.clone(),
            reversed.clone(),
            keys[KEYS / 2..].to_vec(),
            reversed[KEYS / 3..].to_vec(),
        ];
        let answers = stampede(&clients, |i, c| batch(c, orders[i].clone())).await;
        let mut created = std::collections::BTreeMap::<String, usize>::new();
        for (i, a) in answers.into_iter().enumerate() {
            let rows = a.unwrap_or_else(|e| panic!("round {round}, batch {i}: {e:?}"));
            for (id, c) in rows {
                *created.entry(id).or_default() += usize::from(c);
            }
        }
        assert_eq!(created.len(), KEYS, "round {round}: one job per key");
        assert!(
            created.values().all(|&n| n == 1),
            "round {round}: each created exactly once"
        );
    }
}
