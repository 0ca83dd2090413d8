//! A worker never loses an outcome it holds (issue 17, reproduction 1): its connection is
//! terminated mid-attempt by the server (`pg_terminate_backend`, as a failover or a DBA does),
//! and the heartbeats go on and the result is reported on a fresh connection — or, with nowhere
//! to reconnect, returned in the error with the attempt, to be reported later. Real server,
//! real connections.

mod db;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use db::TestDb;
use pg_intent_client::runner::{Event, Finish};
use pg_intent_client::{
    self as intent, AttemptState, Call, Completion, Connection, Connections, Error, Executor,
    JobState, NewJob, Outcome, Reconnect, Reported, Run, Runner, Submitted, WorkError, Worker,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_postgres::Statement;

const LEASE: Duration = Duration::from_millis(600);

async fn job(db: &Connection, key: &str) -> uuid::Uuid {
    job_with(db, key, None).await
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

// What an attacker's review of the first version found (kept as regression tests): a
// connection gone dark, a read-only server after a failover, an outcome that does not
// serialize, an absurd retry delay.

async fn job_with(db: &Connection, key: &str, contract: Option<&str>) -> uuid::Uuid {
    let params = json!({"k": key});
    let mut new = NewJob::new("owner", key, "gpu-a", &params);
    if let Some(c) = contract {
        new = new.contract(c);
    }
    let s: Submitted<Value> = intent::submit_job(db, &new).await.unwrap();
    s.job_id
}

/// A TCP proxy to the cluster; once `dark` is set it forwards nothing more, in either direction,
/// and closes nothing: the network path went dark (no RST, no FIN), as in a failover that moved
/// the address, a partition, or a NAT that dropped the flow.
async fn proxy(target: u16) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dark = Arc::new(AtomicBool::new(false));
    let d = dark.clone();
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else {
                return;
            };
            let d = d.clone();
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                    return;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                let _ = tokio::join!(pump(ri, wo, d.clone()), pump(ro, wi, d));
            });
        }
    });
    (port, dark)
}

async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    dark: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if dark.load(Ordering::SeqCst) {
            // Swallow everything from now on; keep both sockets open.
            loop {
                if matches!(r.read(&mut buf).await, Ok(0) | Err(_)) {
                    std::future::pending::<()>().await;
                }
            }
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn via(t: &TestDb, port: u16) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname(&t.name);
    config
}

async fn connect_to(config: &tokio_postgres::Config) -> Connection {
    config.connection().await.unwrap()
}

/// Review finding 1a (on the first version): `report_for` bounded nothing when a try never answers. The worker's connection goes
/// dark after the work produced its result; a fresh connection (direct) is available. The
/// documentation: retried "for up to report_for", then Error::Unreported. Observed then: the report
/// waited on the dark connection forever (until TCP gives up: ~15 min with unacked data, hours
/// with keepalives), the fresh connection is never tried, and nothing is returned or logged.
#[tokio::test]
async fn a_report_on_a_dark_connection_returns_within_report_for() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let (port, dark) = proxy(t.cluster.port()).await;
    let db = connect_to(&via(&t, port)).await;
    let j = job(&admin, "dark-report").await;
    let worker = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .report_for(Duration::from_secs(1))
        .reconnect(reconnect(&t));
    let started = Instant::now();
    let run = tokio::time::timeout(
        Duration::from_secs(8),
        worker.run(j, None, |_| {
            let dark = dark.clone();
            async move {
                dark.store(true, Ordering::SeqCst);
                Ok::<_, WorkError<Value>>(json!({"kept": "in hand"}))
            }
        }),
    )
    .await;
    let job = intent::get_job(&admin, j).await.unwrap().unwrap();
    assert!(
        run.is_ok(),
        "report_for(1s), a fresh connection available: still no answer after {:?} \
         (job state {}); the result is held by a future nobody can see",
        started.elapsed(),
        job.state
    );
}

/// Review finding 1b (on the first version): heartbeats move to a fresh connection only when the old one says it is broken. A
/// dark connection never says so: the heartbeat waits forever, the lease lapses and the attempt
/// counts as unknown although a fresh connection was available all along.
#[tokio::test]
async fn heartbeats_move_off_a_dark_connection() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let (port, dark) = proxy(t.cluster.port()).await;
    let db = connect_to(&via(&t, port)).await;
    let j = job(&admin, "dark-heartbeat").await;
    let worker = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .report_for(Duration::from_secs(1))
        .reconnect(reconnect(&t));
    let admin = &admin;
    let _ = tokio::time::timeout(
        Duration::from_secs(6),
        worker.run(j, None, |attempt| {
            let dark = dark.clone();
            async move {
                dark.store(true, Ordering::SeqCst);
                tokio::time::sleep(LEASE * 4).await;
                let alive: bool = admin
                    .query_one(
                        "SELECT deadline > statement_timestamp() FROM intent.attempts WHERE id = $1",
                        &[&attempt.id()],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert!(
                    alive,
                    "four leases after the connection went dark the lease has lapsed: the \
                     heartbeats never moved to the fresh connection"
                );
                Ok::<_, WorkError<Value>>(json!({"n": 1}))
            }
        }),
    )
    .await;
}

/// Review finding 1c (on the first version): a Runner shutting down while a report hangs aborts the task after MARK_TIMEOUT;
/// the result it held is dropped without an Event, without Error::Unreported, without the log
/// line. The documentation: "An outcome that could not be reported is in the error
/// ([`Error::Unreported`], downcast it), never dropped."
#[tokio::test]
async fn a_runner_never_drops_an_outcome_it_could_not_report() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let (port, dark) = proxy(t.cluster.port()).await;
    let j = job(&admin, "dark-runner").await;
    let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
        via(&t, port),
        tokio_postgres::NoTls,
    ))
    .max_size(4)
    .build()
    .unwrap();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = events.clone();
    let done = Arc::new(tokio::sync::Notify::new());
    let stop = done.clone();
    let runner = Runner::new(pool, Duration::from_secs(30))
        .lease(LEASE)
        .grace(Duration::from_millis(500))
        .poll_every(Duration::from_millis(100))
        .on_event(move |e| seen.lock().unwrap().push(format!("{e:?}")));
    let started = Instant::now();
    let summary = runner
        .run(
            move |_claimed| {
                let (dark, done) = (dark.clone(), done.clone());
                async move {
                    dark.store(true, Ordering::SeqCst);
                    done.notify_one();
                    Ok::<_, WorkError<Value>>(json!({"caption": "the only copy"}))
                }
            },
            async move { stop.notified().await },
        )
        .await;
    let events = events.lock().unwrap().clone();
    let job = intent::get_job(&admin, j).await.unwrap().unwrap();
    eprintln!(
        "after {:?}: {summary:?}; job {}; events: {events:#?}",
        started.elapsed(),
        job.state
    );
    assert!(
        events.iter().any(|e| e.contains("the only copy")),
        "the result was reported nowhere and kept nowhere (summary {summary:?}, job {})",
        job.state
    );
}

/// Review finding 2 (on the first version): the lease lapses while the worker retries its report: heartbeats stop when the work
/// ends. A report that fails for a reason of its own (here `statement_timeout` during the
/// contract's validation — a slow checker, or a result that is slow to validate) is retried for
/// report_for (default five minutes) while heartbeats, which would succeed, are not sent: the
/// attempt counts as `unknown` after one lease, with a result in hand. Each retry also runs the
/// whole validation again, holding the job's row lock until the timeout.
#[tokio::test]
async fn the_lease_is_kept_while_a_report_is_retried() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    admin
        .batch_execute(
            "CREATE SCHEMA app;
             CREATE FUNCTION app.slow(r jsonb) RETURNS boolean
               LANGUAGE plpgsql STABLE AS $$ BEGIN PERFORM pg_sleep(1); RETURN true; END $$;
             DO $$ BEGIN
               IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'intent_owner') THEN
                 GRANT USAGE ON SCHEMA app TO intent_owner;
                 GRANT EXECUTE ON FUNCTION app.slow(jsonb) TO intent_owner;
               END IF;
             END $$;",
        )
        .await
        .unwrap();
    intent::define_contract(&admin, "slow-v1", &json!({}), Some("app.slow(jsonb)"))
        .await
        .unwrap();
    let j = job_with(&admin, "slow-report", Some("slow-v1")).await;
    let db = t.conn().await;
    db.batch_execute("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let err = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .report_for(Duration::from_secs(30))
        .run(j, None, |_| async {
            Ok::<_, WorkError<Value>>(json!({"n": 1}))
        })
        .await
        .expect_err("every try times out in validation");
    let Error::Unreported(u) = &err else {
        panic!("{err:?}")
    };
    eprintln!(
        "tries: {} (each ran the whole validation until statement_timeout); last error: {}",
        u.tries(),
        u.error()
    );
    assert_eq!(
        u.tries(),
        3,
        "a statement timeout that repeats is the report's own: three tries, not five minutes"
    );
    // Heartbeats went on between the tries: the lease was extended past the first deadline.
    let rec = intent::get_attempt(&admin, u.attempt().id())
        .await
        .unwrap()
        .unwrap();
    assert!(
        rec.deadline > u.attempt().deadline(),
        "the lease was kept while the report was retried ({:?} ≤ {:?})",
        rec.deadline,
        u.attempt().deadline()
    );
}

/// Review finding 3 (on the first version): after a failover the fresh connection can land on a read-only server (the old
/// primary demoted to a standby, a reader endpoint, DNS not yet moved): every write is 25006.
/// 25006 is not transient, so the first heartbeat there ends the whole attempt — the work (the
/// provider call in progress) is dropped, nothing is reported, nothing is kept — and a report
/// there is Unreported at once instead of being retried until the primary is back. Simulated
/// with `default_transaction_read_only`, which raises the same SQLSTATE a standby does.
#[tokio::test]
async fn a_read_only_server_after_a_failover_does_not_end_the_attempt() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    let backend: i32 = db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let j = job(&admin, "read-only").await;
    let config = t.cluster.config(&t.name);
    let reconnect = Reconnect::with(move || {
        let config = config.clone();
        async move {
            let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            client
                .batch_execute("SET default_transaction_read_only = on")
                .await?;
            Ok(Connection::new(client))
        }
    });
    let admin = &admin;
    let run = Worker::new(&db, Duration::from_secs(30))
        .lease(LEASE)
        .report_for(Duration::from_secs(2))
        .reconnect(reconnect)
        .run(j, None, |_| async move {
            admin
                .query_one("SELECT pg_terminate_backend($1, 5000)", &[&backend])
                .await
                .unwrap();
            tokio::time::sleep(LEASE * 2).await;
            Ok::<_, WorkError<Value>>(json!({"caption": "done"}))
        })
        .await;
    match run {
        Ok(_) => {}
        Err(Error::Unreported(_)) => {}
        Err(e) => panic!(
            "the work was dropped mid-call and its outcome is neither reported nor kept: {e:?} \
             (sqlstate {:?}, transient: {})",
            e.code(),
            e.is_transient()
        ),
    }
}

/// Review finding 4 (on the first version): a result that cannot be serialized is returned as Error::Serialize and dropped;
/// the attempt is left `started` (not marked unknown) although the work ran. "The client never
/// loses an outcome" does not hold for it.
#[tokio::test]
async fn a_result_that_does_not_serialize_is_not_silently_dropped() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    let j = job(&admin, "unserializable").await;
    let err = Worker::new(&db, Duration::from_secs(30))
        .run(j, None, |_| async {
            let mut m = HashMap::new();
            m.insert((1, 2), "side effect done");
            Ok::<_, WorkError<Value>>(m)
        })
        .await
        .expect_err("a map with tuple keys is not JSON");
    let attempts: Vec<String> = admin
        .query(
            "SELECT state::text FROM intent.attempts WHERE job_id = $1",
            &[&j],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        matches!(err, Error::Unreported(_)) || attempts == ["unknown"],
        "returned {err:?}; attempt states {attempts:?}: the work ran, the attempt was neither \
         marked unknown nor its outcome kept"
    );
}

/// Review finding 7 (on the first version): a provider's Retry-After passed straight into WorkError::retryable_after (the
/// Runner's documented way to pass it on) is not clamped by the client: over 30 days the server
/// refuses the report (22023), the definite failure is Unreported, and the attempt lapses to
/// `unknown` — a job that should be retried waits for a reconciler. Only Failure::into_work_error
/// clamps (MAX_RETRY_AFTER).
#[tokio::test]
async fn an_absurd_retry_after_still_fails_the_attempt() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    let j = job(&admin, "retry-after").await;
    let run = Worker::new(&db, Duration::from_secs(30))
        .run(j, None, |_| async {
            Err::<Value, _>(WorkError::retryable_after(
                json!({"status": 429}),
                Duration::from_secs(10 * 365 * 86_400),
            ))
        })
        .await;
    assert!(
        matches!(run, Ok(pg_intent_client::Run::Failed { .. })),
        "a 429 with Retry-After: 315360000 → {run:?}"
    );
}

/// Held: a savepoint that bound the owner and was rolled back leaves the rest of the
/// transaction bound to no owner (fail closed), not unbound.
#[tokio::test]
async fn a_rolled_back_savepoint_binding_fails_closed() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    let mut tx = db.transaction().await.unwrap();
    {
        let sp = tx.transaction().await.unwrap();
        intent::bind_owner(&sp, "alice").await.unwrap();
        sp.rollback().await.unwrap();
    }
    let bound: Option<String> = tx
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound.as_deref(), Some(""), "bound to no owner");
    tx.rollback().await.unwrap();
    let after: Option<String> = db
        .query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, None, "the pooled connection goes back unbound");
}
