//! Every call of the client against a real cluster, on every kind of executor.

mod db;

use std::time::{Duration, SystemTime};

use db::TestDb;
use pg_intent_client::{
    self as intent, AttemptState, BeginOptions, Completion, Executor, JobState, NewJob,
    StatementCache, Submitted,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Prompt {
    text: String,
    steps: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Image {
    url: String,
}

fn prompt() -> Prompt {
    Prompt {
        text: "a red fox".into(),
        steps: 30,
    }
}

/// How many statements this session has prepared for `sql_fragment`.
async fn prepared(db: &impl Executor, sql_fragment: &str) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%' || $1 || '%' AND NOT from_sql",
            &[&sql_fragment],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn ids_match_the_database() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    for (owner, key) in [
        ("alice", "click-1"),
        ("bob", "click-1"),
        ("tenant-42", "order-2026-11-30-0001"),
        ("ö", "ключ"),
    ] {
        let server: uuid::Uuid = db
            .query_one("SELECT intent.job_id($1, $2)", &[&owner, &key])
            .await
            .unwrap()
            .get(0);
        assert_eq!(intent::job_id(owner, key).unwrap(), server);
        let a7: uuid::Uuid = db
            .query_one("SELECT intent.attempt_id($1, 7)", &[&server])
            .await
            .unwrap()
            .get(0);
        assert_eq!(intent::attempt_id(server, 7).unwrap(), a7);
    }
}

#[tokio::test]
async fn the_whole_life_of_a_job() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let p = prompt();
    let new = NewJob::new("alice", "click-1", "gpu-a", &p).max_attempts(5);

    // submit: created once, then replayed without writing.
    let s: Submitted<Image> = intent::submit_job(&db, &new).await.unwrap();
    assert_eq!(s.job_id, new.job_id().unwrap());
    assert!(s.created);
    assert_eq!(s.state, JobState::Pending);
    assert_eq!(s.result, None);
    let again: Submitted<Image> = intent::submit_job(&db, &new).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.job_id, s.job_id);
    assert_eq!(again.version, s.version);

    // begin: the handle carries the fencing token and the derived id.
    let before = SystemTime::now() - Duration::from_secs(5);
    let a = intent::begin_attempt(
        &db,
        s.job_id,
        BeginOptions::new()
            .lease(Duration::from_secs(60))
            .worker("w-1"),
    )
    .await
    .unwrap();
    assert_eq!(a.attempt_no(), 1);
    assert_eq!(a.id(), intent::attempt_id(s.job_id, 1).unwrap());
    assert_eq!(a.job_id(), s.job_id);
    assert_eq!(a.version(), s.version);
    assert!(a.deadline() > before + Duration::from_secs(60));
    let rec = intent::get_attempt(&db, a.id()).await.unwrap().unwrap();
    assert_eq!(rec.state, AttemptState::Started);
    assert_eq!(rec.worker.as_deref(), Some("w-1"));
    assert_eq!(rec.provider, "gpu-a");
    assert_eq!(rec.lease, Duration::from_secs(60));
    assert_eq!(rec.version_read, a.version());
    assert_eq!(
        intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
        JobState::Running
    );

    // heartbeat: extends (by its own lease, or by `extend`).
    assert!(intent::heartbeat(&db, a.id(), None).await.unwrap());
    assert!(
        intent::heartbeat(&db, a.id(), Some(Duration::from_secs(600)))
            .await
            .unwrap()
    );
    let rec2 = intent::get_attempt(&db, a.id()).await.unwrap().unwrap();
    assert!(rec2.deadline > rec.deadline + Duration::from_secs(500));

    // fail (retryable) → pending; the next attempt gets number 2.
    let state = intent::fail_attempt(&db, &a, &json!({"status": 400}), true)
        .await
        .unwrap();
    assert_eq!(state, JobState::Pending);
    assert!(!intent::heartbeat(&db, a.id(), None).await.unwrap());
    let b = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
        .await
        .unwrap();
    assert_eq!(b.attempt_no(), 2);

    // complete → won; asked again, the same answer.
    let img = Image {
        url: "s3://images/fox.png".into(),
    };
    assert_eq!(
        intent::complete_attempt(&db, &b, &img).await.unwrap(),
        Completion::Won
    );
    assert_eq!(
        intent::complete_attempt(&db, &b, &img).await.unwrap(),
        Completion::Won
    );
    let job = intent::get_job(&db, s.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.completed_by, Some(b.id()));
    assert_eq!(job.result_as::<Image>().unwrap(), Some(img.clone()));
    assert_eq!(job.attempt_count, 2);
    assert_eq!(job.max_attempts, 5);
    assert_eq!(job.params, serde_json::to_value(&p).unwrap());

    // A replay of a finished intent returns its typed result.
    let done: Submitted<Image> = intent::submit_job(&db, &new).await.unwrap();
    assert_eq!(done.state, JobState::Succeeded);
    assert_eq!(done.result, Some(img));
    assert_eq!(done.version, s.version + 1);

    // cancel: false on a finished job.
    assert!(
        !intent::cancel_job(&db, s.job_id, Some("too late"))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn mark_unknown_abandon_cancel_sweep() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let s: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("o", "k", "p", &json!({"a": 1})))
            .await
            .unwrap();

    // mark_unknown: attempt and job become unknown; again: nothing changes.
    let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
        .await
        .unwrap();
    intent::mark_unknown(&db, a.id(), Some("timeout after 30s"))
        .await
        .unwrap();
    intent::mark_unknown(&db, a.id(), None).await.unwrap();
    assert_eq!(
        intent::get_attempt(&db, a.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        AttemptState::Unknown
    );
    assert_eq!(
        intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
        JobState::Unknown
    );
    let unknown = intent::unknown_attempts(&db, 10).await.unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].id, a.id());
    assert_eq!(unknown[0].handle().id(), a.id());
    assert_eq!(unknown[0].handle().version(), a.version());

    // abandon: the job returns to pending.
    intent::abandon_attempt(&db, a.id(), "provider says it never got it")
        .await
        .unwrap();
    assert_eq!(
        intent::get_attempt(&db, a.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        AttemptState::Abandoned
    );
    assert_eq!(
        intent::get_job(&db, s.job_id).await.unwrap().unwrap().state,
        JobState::Pending
    );
    assert!(intent::unknown_attempts(&db, 10).await.unwrap().is_empty());

    // sweep: a lapsed lease becomes unknown when swept.
    let b = intent::begin_attempt(
        &db,
        s.job_id,
        BeginOptions::new().lease(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(intent::sweep(&db).await.unwrap(), 1);
    assert_eq!(intent::sweep(&db).await.unwrap(), 0);
    assert_eq!(
        intent::get_attempt(&db, b.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        AttemptState::Unknown
    );
    assert!(!intent::heartbeat(&db, b.id(), None).await.unwrap());

    // cancel: the job is withdrawn; an attempt still out there loses.
    assert!(intent::cancel_job(&db, s.job_id, None).await.unwrap());
    assert!(!intent::cancel_job(&db, s.job_id, None).await.unwrap());
    assert_eq!(
        intent::complete_attempt(&db, &b, &json!({"late": true}))
            .await
            .unwrap(),
        Completion::Lost
    );
    let job = intent::get_job(&db, s.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.result, None);
    assert_eq!(
        intent::get_attempt(&db, b.id())
            .await
            .unwrap()
            .unwrap()
            .state,
        AttemptState::Discarded
    );
    assert_eq!(
        intent::get_job(&db, intent::job_id("o", "nope").unwrap())
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn fail_without_retry_fails_the_job() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let s: Submitted<Value> = intent::submit_job(&db, &NewJob::new("o", "k", "p", &json!(1)))
        .await
        .unwrap();
    let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
        .await
        .unwrap();
    let state = intent::fail_attempt(&db, &a, &json!({"error": "invalid prompt"}), false)
        .await
        .unwrap();
    assert_eq!(state, JobState::Failed);
    let job = intent::get_job(&db, s.job_id).await.unwrap().unwrap();
    assert_eq!(job.error, Some(json!({"error": "invalid prompt"})));
    assert_eq!(job.completed_by, Some(a.id()));
    // Reported again: nothing changes.
    assert_eq!(
        intent::fail_attempt(&db, &a, &json!({}), false)
            .await
            .unwrap(),
        JobState::Failed
    );
}

/// The job and the business write commit together — or neither does.
#[tokio::test]
async fn submit_in_the_business_transaction() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    db.batch_execute("CREATE TABLE orders (id text PRIMARY KEY)")
        .await
        .unwrap();
    let observer = t.conn().await;

    // Rolled back: no order, no job.
    let params = json!({"order": 1});
    let rolled_back = NewJob::new("alice", "order-1", "gpu-a", &params);
    {
        let tx = db.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
            .await
            .unwrap();
        let s: Submitted<Value> = intent::submit_job(&tx, &rolled_back).await.unwrap();
        assert!(s.created);
        // Not visible outside before the commit.
        assert_eq!(intent::get_job(&observer, s.job_id).await.unwrap(), None);
        tx.rollback().await.unwrap();
    }
    assert_eq!(
        intent::get_job(&observer, rolled_back.job_id().unwrap())
            .await
            .unwrap(),
        None
    );

    // Dropped without commit: rolled back too.
    {
        let tx = db.transaction().await.unwrap();
        let _: Submitted<Value> = intent::submit_job(&tx, &rolled_back).await.unwrap();
    }
    assert_eq!(
        intent::get_job(&observer, rolled_back.job_id().unwrap())
            .await
            .unwrap(),
        None
    );

    // Committed: both.
    let params = json!({"order": 2});
    let committed = NewJob::new("alice", "order-2", "gpu-a", &params);
    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-2')", &[])
        .await
        .unwrap();
    let s: Submitted<Value> = intent::submit_job(&tx, &committed).await.unwrap();
    assert!(
        intent::get_job(&observer, s.job_id)
            .await
            .unwrap()
            .is_none()
    );
    tx.commit().await.unwrap();
    let job = intent::get_job(&observer, s.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending);
    let orders: i64 = observer
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);

    // The statements prepared inside the rolled-back transaction are still there.
    let replay: Submitted<Value> = intent::submit_job(&db, &committed).await.unwrap();
    assert!(!replay.created);
    assert_eq!(prepared(&db, "intent.submit_job").await, 1);
}

/// Statements are prepared once per connection, not per call — whatever the executor.
#[tokio::test]
async fn statements_are_prepared_once_per_connection() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    assert!(db.statements().is_empty());
    for i in 0..20 {
        let key = format!("k{}", i % 3);
        let _: Submitted<Value> =
            intent::submit_job(&db, &NewJob::new("o", &key, "p", &json!(i % 3)))
                .await
                .unwrap();
        intent::sweep(&db).await.unwrap();
    }
    {
        let tx = db.transaction().await.unwrap();
        for _ in 0..5 {
            intent::sweep(&tx).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(db.statements().len(), 2);
    assert_eq!(prepared(&db, "intent.submit_job").await, 1);
    assert_eq!(prepared(&db, "intent.sweep").await, 1);

    // Concurrent first uses on one connection share one preparation.
    let db2 = t.conn().await;
    let calls: Vec<_> = (0..16).map(|_| intent::sweep(&db2)).collect();
    for r in futures_join(calls).await {
        r.unwrap();
    }
    assert_eq!(prepared(&db2, "intent.sweep").await, 1);
}

async fn futures_join<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    // A tiny join_all: poll every future to completion concurrently on this task.
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// A bare tokio-postgres client and transaction, with a cache kept beside them.
#[tokio::test]
async fn bare_client_and_transaction_with_a_cache() {
    let t = TestDb::new().await;
    let mut client = t.client().await;
    let cache = StatementCache::new();
    let params = json!({});
    let new = NewJob::new("o", "bare", "p", &params);
    {
        let tx = client.transaction().await.unwrap();
        let s: Submitted<Value> = intent::submit_job(&cache.on(&tx), &new).await.unwrap();
        assert!(s.created);
        tx.commit().await.unwrap();
    }
    let s: Submitted<Value> = intent::submit_job(&cache.on(&client), &new).await.unwrap();
    assert!(!s.created);
    let a = intent::begin_attempt(&cache.on(&client), s.job_id, BeginOptions::new())
        .await
        .unwrap();
    assert_eq!(
        intent::complete_attempt(&cache.on(&client), &a, &json!("ok"))
            .await
            .unwrap(),
        Completion::Won
    );
    assert_eq!(cache.len(), 3);
    assert_eq!(prepared(&cache.on(&client), "intent.submit_job").await, 1);
}

/// A pooled deadpool-postgres connection, and a transaction on it.
#[cfg(feature = "deadpool")]
#[tokio::test]
async fn deadpool_objects_and_transactions() {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

    let t = TestDb::new().await;
    let cfg: tokio_postgres::Config = t.conn_str().parse().unwrap();
    let mgr = Manager::from_config(
        cfg,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(mgr).max_size(1).build().unwrap();

    let params = json!({"n": 1});
    let new = NewJob::new("alice", "pooled", "gpu-a", &params);
    {
        let mut obj = pool.get().await.unwrap();
        let tx = obj.transaction().await.unwrap();
        let s: Submitted<Value> = intent::submit_job(&tx, &new).await.unwrap();
        assert!(s.created);
        tx.rollback().await.unwrap();
        let tx = obj.transaction().await.unwrap();
        let s: Submitted<Value> = intent::submit_job(&tx, &new).await.unwrap();
        assert!(s.created, "the rolled-back submit left nothing behind");
        tx.commit().await.unwrap();
    }
    for _ in 0..5 {
        let obj = pool.get().await.unwrap();
        let s: Submitted<Value> = intent::submit_job(&obj, &new).await.unwrap();
        assert!(!s.created);
        let wrapper: &deadpool_postgres::ClientWrapper = &obj;
        intent::sweep(wrapper).await.unwrap();
    }
    let obj = pool.get().await.unwrap();
    let a = intent::begin_attempt(&obj, new.job_id().unwrap(), BeginOptions::new())
        .await
        .unwrap();
    assert_eq!(
        intent::complete_attempt(&obj, &a, &json!({"ok": true}))
            .await
            .unwrap(),
        Completion::Won
    );
    // One pooled connection, one preparation of each statement.
    assert_eq!(prepared(&obj, "intent.submit_job").await, 1);
    assert_eq!(prepared(&obj, "intent.sweep").await, 1);
}

/// `Arc<Connection>` and `&&Connection` are executors too.
#[tokio::test]
async fn shared_executors() {
    let t = TestDb::new().await;
    let db = std::sync::Arc::new(t.conn().await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let db = db.clone();
        tasks.spawn(async move {
            let key = format!("k{i}");
            let s: Submitted<Value> =
                intent::submit_job(&db, &NewJob::new("o", &key, "p", &json!(i)))
                    .await
                    .unwrap();
            s.created
        });
    }
    while let Some(created) = tasks.join_next().await {
        assert!(created.unwrap());
    }
    let r = &db;
    assert_eq!(intent::sweep(&r).await.unwrap(), 0);
}

/// A savepoint inside the business transaction: its submit rolls back alone.
#[tokio::test]
async fn savepoints_share_the_statements() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    let (p1, p2) = (json!(1), json!(2));
    let mut tx = db.transaction().await.unwrap();
    let _: Submitted<Value> = intent::submit_job(&tx, &NewJob::new("o", "outer", "p", &p1))
        .await
        .unwrap();
    {
        let sp = tx.transaction().await.unwrap();
        let _: Submitted<Value> = intent::submit_job(&sp, &NewJob::new("o", "inner", "p", &p2))
            .await
            .unwrap();
        sp.rollback().await.unwrap();
    }
    tx.commit().await.unwrap();
    assert!(
        intent::get_job(&db, intent::job_id("o", "outer").unwrap())
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        intent::get_job(&db, intent::job_id("o", "inner").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(prepared(&db, "intent.submit_job").await, 1);
}

/// Results of every size, up to several megabytes and with every kind of character JSON
/// escapes, come back through the client's replay exactly as they were completed.
#[tokio::test]
async fn large_results_round_trip_through_a_replay() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let odd = "\"\\\n\u{1}é🦀 plain";
    for (i, size) in [
        10usize,
        1_500,
        300 * 1024,
        3 * 1024 * 1024,
        12 * 1024 * 1024,
    ]
    .into_iter()
    .enumerate()
    {
        let mut text = String::with_capacity(size + 4);
        for c in odd.chars().cycle() {
            if text.len() >= size {
                break;
            }
            text.push(c);
        }
        let result = json!({"blob": text, "n": i, "nested": [{"k": [1.5, null, true]}]});
        let key = format!("large-{i}");
        let params = json!({"i": i});
        let new = NewJob::new("alice", &key, "gpu-a", &params);
        let s: Submitted<Value> = intent::submit_job(&db, &new).await.unwrap();
        let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
            .await
            .unwrap();
        assert_eq!(
            intent::complete_attempt(&db, &a, &result).await.unwrap(),
            Completion::Won,
            "{size} bytes"
        );
        for _ in 0..2 {
            let replay: Submitted<Value> = intent::submit_job(&db, &new).await.unwrap();
            assert_eq!(replay.state, JobState::Succeeded);
            assert!(
                replay.result.as_ref() == Some(&result),
                "{size} bytes came back different"
            );
        }
    }
}
