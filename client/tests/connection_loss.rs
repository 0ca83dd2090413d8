//! A worker never loses an outcome it holds (issue 17, reproduction 1): its connection is
//! terminated mid-attempt by the server (`pg_terminate_backend`, as a failover or a DBA does),
//! and the heartbeats go on and the result is reported on a fresh connection — or, with nowhere
//! to reconnect, returned in the error with the attempt, to be reported later. Real server,
//! real connections.

mod db;

use std::sync::Arc;
use std::time::Duration;

use db::TestDb;
use pg_intent_client::runner::{Event, Finish};
use pg_intent_client::{
    self as intent, AttemptState, Call, Completion, Connection, Error, Executor, JobState, NewJob,
    Outcome, Reconnect, Reported, Run, Runner, Submitted, WorkError, Worker,
};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_postgres::Statement;

const LEASE: Duration = Duration::from_millis(600);

async fn job(db: &Connection, key: &str) -> uuid::Uuid {
    let s: Submitted<Value> =
        intent::submit_job(db, &NewJob::new("owner", key, "gpu-a", &json!({"k": key})))
            .await
            .unwrap();
    s.job_id
}

async fn pid(db: &Connection) -> i32 {
    db.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Terminates a backend the way an operator (or a failover) does, and waits until it is gone.
async fn terminate(admin: &Connection, pid: i32) {
    let done: bool = admin
        .query_one("SELECT pg_terminate_backend($1, 5000)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(done, "backend {pid} terminated");
}

fn reconnect(t: &TestDb) -> Reconnect {
    let config = t.cluster.config(&t.name);
    Reconnect::using(config)
}

#[tokio::test]
async fn a_result_in_hand_is_reported_on_a_fresh_connection() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    let j = job(&admin, "killed-mid-attempt").await;
    let backend = pid(&db).await;
    let worker = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .reconnect(reconnect(&t));
    let run = worker
        .run(j, None, |attempt| {
            let admin = &admin;
            async move {
                terminate(admin, backend).await;
                // Three leases after the connection died: heartbeats on a fresh connection kept
                // the attempt alive (without them it would count as unknown by now).
                tokio::time::sleep(LEASE * 3).await;
                let rec = intent::get_attempt(admin, attempt.id())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(rec.state, AttemptState::Started);
                let alive: bool = admin
                    .query_one(
                        "SELECT deadline > statement_timestamp() FROM intent.attempts WHERE id = $1",
                        &[&attempt.id()],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert!(alive, "the heartbeats went on after the connection died");
                Ok::<_, WorkError<Value>>(json!({"url": "s3://fox.png"}))
            }
        })
        .await
        .expect("the result is reported on a fresh connection");
    let Run::Completed {
        attempt,
        completion,
        ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert!(db.is_closed(), "the worker's own connection is gone");
    let job = intent::get_job(&admin, j).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.completed_by, Some(attempt.id()));
    assert_eq!(job.result, Some(json!({"url": "s3://fox.png"})));
}

#[tokio::test]
async fn with_nowhere_to_reconnect_the_result_is_returned_in_the_error() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    let j = job(&admin, "nowhere").await;
    let backend = pid(&db).await;
    let err = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .run(j, None, |_| {
            let admin = &admin;
            async move {
                terminate(admin, backend).await;
                Ok::<_, WorkError<Value>>(json!({"caption": "kept"}))
            }
        })
        .await
        .expect_err("the connection is gone");
    let Error::Unreported(unreported) = err else {
        panic!("{err:?}")
    };
    assert!(
        unreported.error().is_transient(),
        "{:?}",
        unreported.error()
    );
    assert!(
        unreported.to_string().contains(r#"{"caption":"kept"}"#),
        "{unreported}"
    );
    let Outcome::Completed { result } = unreported.outcome() else {
        panic!("{:?}", unreported.outcome())
    };
    assert_eq!(
        serde_json::from_str::<Value>(result.get()).unwrap(),
        json!({"caption": "kept"})
    );
    // Meanwhile the attempt is started, then unknown: the gate stays closed.
    let rec = intent::get_attempt(&admin, unreported.attempt().id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, AttemptState::Started);
    // Reported later, on another connection, with the attempt's own version: it wins.
    assert_eq!(
        unreported.report(&admin).await.unwrap(),
        Reported::Completed(Completion::Won)
    );
    let job = intent::get_job(&admin, j).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result, Some(json!({"caption": "kept"})));
}

#[tokio::test]
async fn a_report_refused_for_a_passing_reason_is_made_again() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    db.batch_execute("SET lock_timeout = '100ms'")
        .await
        .unwrap();
    let j = job(&admin, "locked").await;
    let locker = Arc::new(t.conn().await);
    let held = Arc::new(Notify::new());
    let run = Worker::new(&db, Duration::from_secs(30))
        .lease(Duration::from_secs(5))
        .run(j, None, |_| {
            let (locker, held) = (locker.clone(), held.clone());
            async move {
                // Another session holds the job's row: the report waits for its lock, times
                // out (55P03), and is made again until the lock is released, a second later.
                locker.batch_execute("BEGIN").await.unwrap();
                locker
                    .execute("SELECT 1 FROM intent.jobs WHERE id = $1 FOR UPDATE", &[&j])
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    locker.batch_execute("COMMIT").await.unwrap();
                    held.notify_one();
                });
                Ok::<_, WorkError<Value>>(json!({"n": 1}))
            }
        })
        .await
        .expect("the report lands once the lock is released");
    assert!(
        matches!(
            run,
            Run::Completed {
                completion: Completion::Won,
                ..
            }
        ),
        "{run:?}"
    );
    // Without the retry the report would have failed with 55P03 after 100 ms.
    held.notified().await;
}

/// An executor whose `complete_attempt` answers a row of the wrong type: a reply the client
/// cannot read, as against a mismatched extension.
struct Mismatched(Connection);

impl Executor for Mismatched {
    fn client(&self) -> &tokio_postgres::Client {
        self.0.client()
    }

    async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
        match call {
            Call::CompleteAttempt => {
                self.0
                    .client()
                    .prepare_typed(
                        "SELECT 42 WHERE $1::uuid IS NOT NULL AND $2::int8 IS NOT NULL \
                         AND $3::jsonb IS NOT NULL",
                        call.param_types(),
                    )
                    .await
            }
            call => self.0.prepare_call(call).await,
        }
    }
}

#[tokio::test]
async fn an_unreadable_reply_is_not_a_connection_error_and_is_not_retried() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = Mismatched(t.conn().await);
    let j = job(&admin, "mismatched").await;
    let err = Worker::new(&db, Duration::from_secs(30))
        .reconnect(reconnect(&t))
        .run(j, None, |_| async {
            Ok::<_, WorkError<Value>>(json!({"n": 1}))
        })
        .await
        .expect_err("the reply cannot be read");
    let Error::Unreported(unreported) = err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(unreported.error(), Error::Decode { .. }),
        "{:?}",
        unreported.error()
    );
    assert!(!unreported.error().is_transient());
    assert_eq!(
        unreported.tries(),
        1,
        "a reply that cannot be read is not retried"
    );
}

#[tokio::test]
async fn a_runner_reports_what_its_attempt_did_after_its_connection_was_killed() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let j = job(&admin, "runner-killed").await;
    let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
        t.cluster.config(&t.name),
        tokio_postgres::NoTls,
    ))
    .max_size(4)
    .build()
    .unwrap();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = events.clone();
    let runner = Runner::new(pool, Duration::from_secs(30))
        .lease(LEASE)
        .poll_every(Duration::from_millis(100))
        .on_event(move |e| {
            if let Event::Finished { finish, .. } = e {
                seen.lock().unwrap().push(finish);
            }
        });
    let done = Arc::new(Notify::new());
    let stop = done.clone();
    let admin = Arc::new(admin);
    let killer = admin.clone();
    let summary = runner
        .run(
            move |claimed| {
                let (admin, done) = (killer.clone(), done.clone());
                async move {
                    // Every connection the runner holds, killed while the provider works.
                    admin
                        .execute(
                            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
                             WHERE datname = current_database() AND pid <> pg_backend_pid() \
                             AND backend_type = 'client backend'",
                            &[],
                        )
                        .await
                        .unwrap();
                    tokio::time::sleep(LEASE * 2).await;
                    done.notify_one();
                    Ok::<_, WorkError<Value>>(json!({"attempt": claimed.attempt.id()}))
                }
            },
            async move { stop.notified().await },
        )
        .await;
    // The shutdown came as the work ended: the grace period let it report.
    assert_eq!(summary.completed, 1, "{summary:?}");
    assert_eq!(summary.errors, 0, "{summary:?}");
    assert_eq!(
        *events.lock().unwrap(),
        vec![Finish::Completed(Completion::Won)]
    );
    let job = intent::get_job(&*admin, j).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
}
