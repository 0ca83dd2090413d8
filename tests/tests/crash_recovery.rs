//! The server dies mid-flight (SIGKILL of the postmaster, an immediate or a fast shutdown) and
//! comes back: what was committed stands, what was not is gone, and the protocol carries on —
//! an attempt that was in flight still blocks, an uncommitted submit can simply be repeated.
//! This binary uses a cluster of its own (not the shared one) because it stops and kills it.

use pg_intent_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_state_survives_crashes_and_restarts() {
    let cluster = Cluster::start();
    let dir = cluster.dir().to_path_buf();
    let db = cluster.fresh_db("crash").await;

    let c = db.connect().await;
    let s = submit(&c, "sam", "committed", "p", &json!({"n": 1}))
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    // A submit whose transaction is still open when the server dies.
    let open_tx = db.connect().await;
    open_tx.batch_execute("BEGIN").await.unwrap();
    assert!(
        submit(&open_tx, "sam", "uncommitted", "p", &json!({}))
            .await
            .unwrap()
            .created
    );

    let started = cluster.postmaster_start_time().await;
    let pid = cluster.postmaster_pid().expect("running");
    cluster.kill_postmaster();
    assert!(
        cluster.postmaster_pid().is_none(),
        "postmaster {pid} is gone"
    );
    assert!(
        c.query_one("SELECT 1", &[]).await.is_err(),
        "the old connection died with it"
    );
    cluster.restart();
    assert!(
        cluster.postmaster_start_time().await > started,
        "a new postmaster"
    );

    let c = db.connect().await;
    let job = job_row(&c, s.job_id).await;
    assert_eq!(
        (job.state.as_str(), job.version, job.attempt_count),
        ("running", 1, 1)
    );
    assert_eq!(attempt_row(&c, a.attempt_id).await.state, "started");
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ002");
    let again = submit(&c, "sam", "uncommitted", "p", &json!({}))
        .await
        .unwrap();
    assert!(
        again.created,
        "the uncommitted submit vanished with the crash; repeating it creates the job"
    );

    // An immediate shutdown (no checkpoint) and a fast one: the outcome is durable.
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"ok": 1}))
            .await
            .unwrap(),
        "won"
    );
    cluster.stop(StopMode::Immediate);
    cluster.restart();
    let c = db.connect().await;
    assert_eq!(job_row(&c, s.job_id).await.state, "succeeded");
    cluster.stop(StopMode::Fast);
    cluster.restart();
    let c = db.connect().await;
    let replay = submit(&c, "sam", "committed", "p", &json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(
        (replay.state.as_str(), replay.version, replay.result),
        ("succeeded", 2, Some(json!({"ok": 1})))
    );

    drop(c);
    drop(db);
    drop(cluster);
    assert!(!dir.exists(), "Drop removes the cluster's directory");
}
