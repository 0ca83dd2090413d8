//! `pg_dump` / `pg_restore` keep every row (pg_extension_config_dump).

use pg_intent_tests::dump;
use pg_intent_tests::fixtures::{self, EveryState};
use pg_intent_tests::*;

/// `pg_dump` (custom format) and `pg_restore` into a fresh database keep every row of jobs,
/// attempts, events, contracts and certifications, byte for byte, and the identity sequences:
/// the next event after the restore gets a new id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_restore_keep_every_row() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db("sec_dump").await;
    let c = db.connect().await;
    let EveryState {
        running,
        running_attempt,
        rejected_attempt: w1,
    } = fixtures::every_state(&c).await;
    let before = dump::table_rows(&c).await;

    let file = cluster.dir().join(format!("{}.dump", db.name));
    dump::dump(cluster, &db.name, &file);
    let restored = format!("{}_restored", db.name);
    c.batch_execute(&format!("CREATE DATABASE \"{restored}\""))
        .await
        .unwrap();
    dump::restore(cluster, &restored, &file);
    let r = cluster.connect(&restored).await;
    let after = dump::table_rows(&r).await;
    for ((table, rows), (_, restored_rows)) in before.iter().zip(&after) {
        assert_eq!(rows, restored_rows, "{table} after dump and restore");
    }
    assert_eq!(before, after);

    // The restored database works: privileges, isolation and the identity sequence.
    let app_may: bool = r
        .query_one(
            "SELECT has_function_privilege('intent_app', 'intent.submit_job(text,text,text,jsonb,text,integer)', 'EXECUTE')
                AND NOT has_function_privilege('public', 'intent.submit_job(text,text,text,jsonb,text,integer)', 'EXECUTE')
                AND NOT has_table_privilege('public', 'intent.jobs', 'SELECT')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(app_may, "grants survive");
    let reused = submit(&r, "dave", "purged", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(
        reused.created && reused.version > 1,
        "the purged key's fencing tokens are remembered: {reused:?}"
    );
    let max_id: i64 = r
        .query_one("SELECT max(id) FROM intent.events", &[])
        .await
        .unwrap()
        .get(0);
    mark_unknown(&r, running_attempt.attempt_id, Some("after restore"))
        .await
        .unwrap();
    let new_id: i64 = r
        .query_one(
            "SELECT max(id) FROM intent.events WHERE attempt_id = $1",
            &[&running_attempt.attempt_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        new_id > max_id,
        "the new event's id {new_id} follows {max_id}"
    );
    assert_eq!(
        job_row(&r, running.job_id).await.state,
        "unknown",
        "the protocol goes on"
    );
    assert_eq!(
        complete(&r, w1.attempt_id, 1, &json!({"x": 1}))
            .await
            .unwrap(),
        "rejected",
        "the contract's checker is restored with it"
    );
    let _ = std::fs::remove_file(&file);
}
