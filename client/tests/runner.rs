//! The Runner against a real server: many runners over one queue, a worker killed mid-attempt,
//! backoff, NOTIFY wake-ups and graceful shutdown. Every runner has its own connections (a
//! pool and a listening connection of its own).

mod db;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use db::TestDb;
use pg_intent_client::runner::{Connections, Event, Finish, Summary};
use pg_intent_client::{
    self as intent, AttemptState, ClaimOptions, ClaimedAttempt, JobState, NewJob, Runner,
    Submitted, Uuid, WorkError,
};
use pg_intent_cluster::eventually;
use serde_json::{Value, json};
use tokio::sync::watch;

type Work = Result<Value, WorkError<Value>>;

/// A pool of its own for one runner.
fn pool(t: &TestDb, size: usize) -> deadpool_postgres::Pool {
    let config: tokio_postgres::Config = t.conn_str().parse().unwrap();
    deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
        config,
        tokio_postgres::NoTls,
    ))
    .max_size(size)
    .build()
    .unwrap()
}

/// What the runners reported: every error, and how many times they started listening.
#[derive(Clone, Default)]
struct Events {
    problems: Arc<Mutex<Vec<String>>>,
    listening: Arc<AtomicUsize>,
    claimed: Arc<AtomicUsize>,
    finished: Arc<Mutex<Vec<(Uuid, Finish)>>>,
}

impl Events {
    fn hook(&self) -> impl Fn(Event) + Send + Sync + 'static {
        let me = self.clone();
        move |event| match event {
            Event::Listening => {
                me.listening.fetch_add(1, Ordering::SeqCst);
            }
            Event::Claimed { .. } => {
                me.claimed.fetch_add(1, Ordering::SeqCst);
            }
            Event::Finished {
                attempt_id, finish, ..
            } => me.finished.lock().unwrap().push((attempt_id, finish)),
            other => me.problems.lock().unwrap().push(format!("{other:?}")),
        }
    }

    fn problems(&self) -> Vec<String> {
        self.problems.lock().unwrap().clone()
    }

    async fn wait_listening(&self, n: usize) {
        assert!(
            eventually(Duration::from_secs(10), || async {
                self.listening.load(Ordering::SeqCst) >= n
            })
            .await,
            "the runners never listened"
        );
    }
}

/// A shutdown signal shared by several runners.
fn signal() -> (watch::Sender<bool>, impl Fn() -> ShutdownFut) {
    let (tx, rx) = watch::channel(false);
    let make = move || {
        let mut rx = rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|s| *s).await;
        }) as ShutdownFut
    };
    (tx, make)
}

/// Runs `runner` on a task with work that succeeds at once, until `stop` is sent `true`.
fn run_succeeding<C: Connections>(
    runner: Runner<C>,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<Summary>) {
    let (stop, until) = signal();
    let shutdown = until();
    let handle = tokio::spawn(async move {
        runner
            .run(
                |_: ClaimedAttempt| std::future::ready(Ok::<_, WorkError<Value>>(json!({}))),
                shutdown,
            )
            .await
    });
    (stop, handle)
}

type ShutdownFut = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

async fn submit(db: &intent::Connection, key: &str, provider: &str, params: Value) -> Uuid {
    let s: Submitted<Value> = intent::submit_job(db, &NewJob::new("owner", key, provider, &params))
        .await
        .unwrap();
    s.job_id
}

async fn job_state(db: &intent::Connection, job: Uuid) -> JobState {
    intent::get_job(db, job).await.unwrap().unwrap().state
}

fn total(summaries: &[Summary]) -> Summary {
    let mut t = Summary::default();
    for s in summaries {
        t.claimed += s.claimed;
        t.completed += s.completed;
        t.failed += s.failed;
        t.unknown += s.unknown;
        t.shut_down += s.shut_down;
        t.stopped += s.stopped;
        t.errors += s.errors;
        t.claims += s.claims;
    }
    t
}

/// 8 runners × 2 = 16 attempts at once over 10,000 jobs on two providers, one runner limited
/// to one `gpu-b` attempt at a time; every tenth job fails retryably (no delay) on its first
/// attempt. Every job succeeds, every attempt number of every job is begun exactly once, no
/// claimer sees an error, no attempt is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_workers_run_ten_thousand_jobs_each_attempt_begun_once() {
    const JOBS: i32 = 10_000;
    const RUNNERS: usize = 8;
    let t = TestDb::new().await;
    let db = t.conn().await;
    // NOTIFY is off by default (its commit lock costs concurrent submitters): on for the
    // submitting session of these tests, which measure what it wakes.
    db.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let seen: Arc<Mutex<HashMap<Uuid, Vec<u16>>>> = Arc::default();
    let b_now = Arc::new(AtomicUsize::new(0));
    let b_max = Arc::new(AtomicUsize::new(0));
    let (stop, until) = signal();

    let mut handles = Vec::new();
    for r in 0..RUNNERS {
        let mut runner = Runner::new(pool(&t, 3), Duration::from_secs(60))
            .listen(t.conn_str().parse().unwrap())
            .providers(["gpu-a", "gpu-b"])
            .concurrency(2)
            .lease(Duration::from_secs(20))
            // Only NOTIFY and the runners' own backlog find the work: a missed wake-up would
            // stall the test, not hide behind a poll.
            .poll_every(Duration::from_secs(3600))
            .name(format!("runner-{r}"))
            .on_event(events.hook());
        let limited = r == 0;
        if limited {
            runner = runner.limit("gpu-b", 1);
        }
        let (seen, b_now, b_max) = (seen.clone(), b_now.clone(), b_max.clone());
        let shutdown = until();
        handles.push(tokio::spawn(async move {
            runner
                .run(
                    move |c: ClaimedAttempt| {
                        let (seen, b_now, b_max) = (seen.clone(), b_now.clone(), b_max.clone());
                        async move {
                            seen.lock()
                                .unwrap()
                                .entry(c.job_id())
                                .or_default()
                                .push(c.attempt.attempt_no());
                            let counted = limited && c.provider == "gpu-b";
                            if counted {
                                let now = b_now.fetch_add(1, Ordering::SeqCst) + 1;
                                b_max.fetch_max(now, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            if counted {
                                b_now.fetch_sub(1, Ordering::SeqCst);
                            }
                            let n = c.params["n"].as_i64().unwrap();
                            if n % 10 == 0 && c.attempt.attempt_no() == 1 {
                                return Err(WorkError::retryable_after(
                                    json!({"status": 429}),
                                    Duration::ZERO,
                                ));
                            }
                            Ok::<_, WorkError<Value>>(json!({"n": n}))
                        }
                    },
                    shutdown,
                )
                .await
        }));
    }
    events.wait_listening(RUNNERS).await;

    // Submitted while the runners listen, in ten transactions: each commit wakes them.
    let started = std::time::Instant::now();
    for from in (1..=JOBS).step_by(1000) {
        db.execute(
            "SELECT count(*) FROM generate_series($1::int, $2::int) g, \
                 LATERAL intent.submit_job('owner', 'k' || g, \
                     CASE WHEN g % 2 = 0 THEN 'gpu-a' ELSE 'gpu-b' END, \
                     jsonb_build_object('n', g), NULL, 3)",
            &[&from, &(from + 999)],
        )
        .await
        .unwrap();
    }
    let all_done = eventually(Duration::from_secs(100), || async {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM intent.jobs WHERE state = 'succeeded'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n == i64::from(JOBS)
    })
    .await;
    eprintln!("10,000 jobs (11,000 attempts) in {:?}", started.elapsed());
    let _ = stop.send(true);
    let mut summaries = Vec::new();
    for h in handles {
        summaries.push(h.await.unwrap());
    }
    assert!(all_done, "not every job finished: {:?}", total(&summaries));

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), JOBS as usize);
    let n_of: HashMap<Uuid, i32> = (1..=JOBS)
        .map(|n| (intent::job_id("owner", &format!("k{n}")).unwrap(), n))
        .collect();
    for (job, attempts) in seen.iter() {
        let mut attempts = attempts.clone();
        attempts.sort_unstable();
        let want: &[u16] = if n_of[job] % 10 == 0 { &[1, 2] } else { &[1] };
        assert_eq!(attempts, want, "job {job}: attempts begun");
    }

    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE state <> 'succeeded' OR attempt_count <> \
                 CASE WHEN (params->>'n')::int % 10 = 0 THEN 2 ELSE 1 END), \
                 (SELECT count(*) FROM intent.attempts), \
                 (SELECT count(*) FROM intent.attempts WHERE state IN ('started', 'unknown')) \
             FROM intent.jobs",
            &[],
        )
        .await
        .unwrap();
    let (wrong, attempts, open): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(wrong, 0, "jobs not succeeded with the attempts expected");
    assert_eq!(attempts, 11_000);
    assert_eq!(open, 0, "attempts left open");

    assert_eq!(events.problems(), Vec::<String>::new());
    let sum = total(&summaries);
    assert_eq!(
        (
            sum.claimed,
            sum.completed,
            sum.failed,
            sum.unknown,
            sum.shut_down,
            sum.errors
        ),
        (11_000, 10_000, 1_000, 0, 0, 0),
        "{sum:?}"
    );
    assert!(
        b_max.load(Ordering::SeqCst) <= 1,
        "the gpu-b limit was exceeded"
    );
    eprintln!("{sum:?}");
}

/// A worker killed mid-attempt (its task aborted, its connections dropped) leaves the attempt
/// `started`, and `unknown` once its lease has run out; the job stays gated: another runner,
/// polling all the while, never begins another attempt of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_leaves_its_attempt_to_lapse_and_the_job_gated() {
    let t = TestDb::new().await;
    let probe = t.conn().await;
    probe.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let lease = Duration::from_secs(1);

    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let doomed = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .listen(t.conn_str().parse().unwrap())
        .lease(lease)
        .poll_every(Duration::from_millis(50))
        .name("doomed")
        .on_event(events.hook());
    let doomed = tokio::spawn(async move {
        doomed
            .run(
                move |c: ClaimedAttempt| {
                    let _ = started_tx.send(c.attempt.id());
                    std::future::pending::<Work>()
                },
                std::future::pending(),
            )
            .await
    });

    let job = submit(&probe, "killed", "gpu-a", json!({})).await;
    let attempt_id = tokio::time::timeout(Duration::from_secs(10), started_rx.recv())
        .await
        .expect("the doomed runner claimed the job")
        .unwrap();
    doomed.abort();
    assert!(doomed.await.unwrap_err().is_cancelled());
    let rec = intent::get_attempt(&probe, attempt_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, AttemptState::Started);

    // Another runner, polling fast, that would run any attempt of any job.
    let begun: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let (stop, until) = signal();
    let survivor = {
        let begun = begun.clone();
        let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
            .listen(t.conn_str().parse().unwrap())
            .lease(lease)
            .poll_every(Duration::from_millis(50))
            .name("survivor")
            .on_event(events.hook());
        let shutdown = until();
        tokio::spawn(async move {
            runner
                .run(
                    move |c: ClaimedAttempt| {
                        begun.lock().unwrap().push(c.attempt.id());
                        std::future::ready(Ok::<_, WorkError<Value>>(json!({"ok": true})))
                    },
                    shutdown,
                )
                .await
        })
    };

    // After its lease the attempt counts as unknown; sweep persists it.
    assert!(
        eventually(Duration::from_secs(10), || async {
            intent::sweep(&probe).await.unwrap();
            intent::get_attempt(&probe, attempt_id)
                .await
                .unwrap()
                .unwrap()
                .state
                == AttemptState::Unknown
        })
        .await,
        "the attempt never lapsed"
    );
    let rec = intent::get_attempt(&probe, attempt_id)
        .await
        .unwrap()
        .unwrap();
    assert!(SystemTime::now() >= rec.deadline);
    assert_eq!(job_state(&probe, job).await, JobState::Unknown);

    // The survivor is alive (it runs a new job) and has never touched the gated one.
    let other = submit(&probe, "other", "gpu-a", json!({})).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            job_state(&probe, other).await == JobState::Succeeded
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    let summary = survivor.await.unwrap();
    assert_eq!(
        *begun.lock().unwrap(),
        vec![intent::attempt_id(other, 1).unwrap()]
    );
    let rec = intent::get_job(&probe, job).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempt_count), (JobState::Unknown, 1));
    assert_eq!(summary.claimed, 1);
    assert_eq!(events.problems(), Vec::<String>::new());
}

/// The first attempt of a job fails retryably with the given delay; the runner completes the
/// second. Returns the job and the gap between the first attempt's end and the second's begin,
/// as the server's clock has them.
async fn fail_then_succeed(
    t: &TestDb,
    runner: Runner<deadpool_postgres::Pool>,
    retry_after: Option<Duration>,
    check_gate: bool,
) -> Duration {
    let probe = t.conn().await;
    probe.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let runner = runner.on_event(events.hook());
    let (stop, until) = signal();
    let shutdown = until();
    let handle = tokio::spawn(async move {
        runner
            .run(
                move |c: ClaimedAttempt| async move {
                    if c.attempt.attempt_no() == 1 {
                        let e = json!({"status": 503});
                        return Err(match retry_after {
                            Some(d) => WorkError::retryable_after(e, d),
                            None => WorkError::retryable(e),
                        });
                    }
                    Ok::<_, WorkError<Value>>(json!({"attempt": c.attempt.attempt_no()}))
                },
                shutdown,
            )
            .await
    });
    events.wait_listening(1).await;
    let job = submit(&probe, "retry", "slow", json!({})).await;

    if check_gate {
        // Pending again, with a retry time ahead: a claim does not take it.
        assert!(
            eventually(Duration::from_secs(10), || async {
                let j = intent::get_job(&probe, job).await.unwrap().unwrap();
                j.state == JobState::Pending && j.attempt_count == 1
            })
            .await
        );
        let providers = ["slow"];
        let claimed = intent::claim_attempts(
            &probe,
            &ClaimOptions::new().providers(&providers).max_jobs(10),
        )
        .await
        .unwrap();
        let still_ahead: bool = probe
            .query_one(
                "SELECT retry_at > now() FROM intent.jobs WHERE id = $1",
                &[&job],
            )
            .await
            .unwrap()
            .get(0);
        if still_ahead {
            assert!(claimed.is_empty(), "claimed before its retry time");
        }
    }

    // Found at its retry time (the runner polls once an hour).
    assert!(
        eventually(Duration::from_secs(20), || async {
            job_state(&probe, job).await == JobState::Succeeded
        })
        .await,
        "the retry was never claimed"
    );
    let _ = stop.send(true);
    let summary = handle.await.unwrap();
    assert_eq!((summary.failed, summary.completed), (1, 1), "{summary:?}");
    assert_eq!(events.problems(), Vec::<String>::new());
    let a1 = intent::get_attempt(&probe, intent::attempt_id(job, 1).unwrap())
        .await
        .unwrap()
        .unwrap();
    let a2 = intent::get_attempt(&probe, intent::attempt_id(job, 2).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a1.state, AttemptState::Failed);
    assert_eq!(a2.state, AttemptState::Succeeded);
    a2.started_at
        .duration_since(a1.finished_at.unwrap())
        .unwrap_or_default()
}

fn slow_runner(t: &TestDb) -> Runner<deadpool_postgres::Pool> {
    Runner::new(pool(t, 2), Duration::from_secs(60))
        .listen(t.conn_str().parse().unwrap())
        .provider("slow")
        .poll_every(Duration::from_secs(3600))
}

/// A retryable failure with `retry_after` is not claimed before its retry time, and is claimed
/// after it — by the runner that failed it, which knows the time (no reading of intent.jobs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_is_claimed_after_its_retry_time_not_before() {
    let t = TestDb::new().await;
    let delay = Duration::from_secs(3);
    let runner = slow_runner(&t).watch_retries(false);
    let gap = fail_then_succeed(&t, runner, Some(delay), true).await;
    assert!(gap >= delay - Duration::from_millis(20), "{gap:?}");
}

/// The default backoff (1 second for the first failure): the runner does not know the delay,
/// reads the next retry time, and claims then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_backoff_is_waited_for_and_found_by_the_retry_time() {
    let t = TestDb::new().await;
    let runner = slow_runner(&t);
    let gap = fail_then_succeed(&t, runner, None, false).await;
    assert!(gap >= Duration::from_millis(980), "{gap:?}");
}

/// NOTIFY wakes an idle runner whose poll is an hour away; a job submitted with
/// `intent.notify = off` is not picked up until something else wakes it (here its waker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_an_idle_runner_and_without_it_only_the_poll_would() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    // NOTIFY is off by default (its commit lock costs concurrent submitters): on for the
    // submitting session of these tests, which measure what it wakes.
    db.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .listen(t.conn_str().parse().unwrap())
        .poll_every(Duration::from_secs(3600))
        .on_event(events.hook());
    let waker = runner.waker();
    let (stop, handle) = run_succeeding(runner);
    events.wait_listening(1).await;
    // Let the start-up claims pass: the runner is idle now.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let woken = submit(&db, "notified", "gpu-a", json!({})).await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            job_state(&db, woken).await == JobState::Succeeded
        })
        .await,
        "NOTIFY did not wake the runner"
    );

    db.batch_execute("SET intent.notify = off").await.unwrap();
    let quiet = submit(&db, "quiet", "gpu-a", json!({})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(job_state(&db, quiet).await, JobState::Pending);
    waker.notify_one();
    assert!(
        eventually(Duration::from_secs(3), || async {
            job_state(&db, quiet).await == JobState::Succeeded
        })
        .await,
        "the waker did not wake the runner"
    );
    let _ = stop.send(true);
    let summary = handle.await.unwrap();
    assert_eq!(summary.completed, 2);
    assert_eq!(events.problems(), Vec::<String>::new());
}

/// Without LISTEN, the poll finds the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_the_poll_finds_the_work() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    // NOTIFY is off by default (its commit lock costs concurrent submitters): on for the
    // submitting session of these tests, which measure what it wakes.
    db.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .poll_every(Duration::from_millis(300))
        .on_event(events.hook());
    let (stop, handle) = run_succeeding(runner);
    tokio::time::sleep(Duration::from_millis(100)).await;
    db.batch_execute("SET intent.notify = off").await.unwrap();
    let job = submit(&db, "polled", "gpu-a", json!({})).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            job_state(&db, job).await == JobState::Succeeded
        })
        .await
    );
    let _ = stop.send(true);
    assert_eq!(handle.await.unwrap().completed, 1);
    assert_eq!(events.problems(), Vec::<String>::new());
}

/// Shutdown with four attempts in flight: the two that finish within the grace period report
/// their results, the two that do not are marked `unknown` ("worker shut down"), never
/// `failed`; nothing is claimed after the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_attempts_finish_and_marks_the_rest_unknown() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    // NOTIFY is off by default (its commit lock costs concurrent submitters): on for the
    // submitting session of these tests, which measure what it wakes.
    db.batch_execute("SET intent.notify = on").await.unwrap();
    let events = Events::default();
    let grace = Duration::from_millis(1500);
    let runner = Runner::new(pool(&t, 5), Duration::from_secs(60))
        .listen(t.conn_str().parse().unwrap())
        .concurrency(4)
        .lease(Duration::from_secs(2))
        .grace(grace)
        .on_event(events.hook());
    let (stop, until) = signal();
    let shutdown = until();
    let handle = tokio::spawn(async move {
        runner
            .run(
                |c: ClaimedAttempt| async move {
                    match c.params["ms"].as_u64() {
                        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                        None => std::future::pending().await,
                    }
                    Ok::<_, WorkError<Value>>(json!({"done": true}))
                },
                shutdown,
            )
            .await
    });
    events.wait_listening(1).await;
    let quick = [
        submit(&db, "quick-1", "gpu-a", json!({"ms": 500})).await,
        submit(&db, "quick-2", "gpu-a", json!({"ms": 800})).await,
    ];
    let stuck = [
        submit(&db, "stuck-1", "gpu-a", json!({})).await,
        submit(&db, "stuck-2", "gpu-a", json!({})).await,
    ];
    assert!(
        eventually(Duration::from_secs(10), || async {
            events.claimed.load(Ordering::SeqCst) == 4
        })
        .await
    );
    let asked = std::time::Instant::now();
    let _ = stop.send(true);
    let late = submit(&db, "late", "gpu-a", json!({"ms": 1})).await;
    let summary = tokio::time::timeout(grace + Duration::from_secs(10), handle)
        .await
        .expect("the runner shut down")
        .unwrap();
    let took = asked.elapsed();
    eprintln!("shut down in {took:?}");
    assert!(took >= grace, "it did not wait for the grace period");

    for job in quick {
        assert_eq!(job_state(&db, job).await, JobState::Succeeded);
    }
    for job in stuck {
        assert_eq!(job_state(&db, job).await, JobState::Unknown);
        let a = intent::get_attempt(&db, intent::attempt_id(job, 1).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(a.state, AttemptState::Unknown);
        let details: Option<String> = db
            .query_one(
                "SELECT string_agg(detail::text, ' ') FROM intent.events WHERE attempt_id = $1",
                &[&a.id],
            )
            .await
            .unwrap()
            .get(0);
        let details = details.unwrap_or_default();
        assert!(details.contains("worker shut down"), "{details}");
    }
    assert_eq!(job_state(&db, late).await, JobState::Pending);
    assert_eq!(
        (
            summary.claimed,
            summary.completed,
            summary.shut_down,
            summary.errors
        ),
        (4, 2, 2, 0),
        "{summary:?}"
    );
    let finished = events.finished.lock().unwrap().clone();
    assert_eq!(
        finished
            .iter()
            .filter(|(_, f)| *f == Finish::ShutDown)
            .count(),
        2
    );
    assert_eq!(events.problems(), Vec::<String>::new());
}

// --- purge: bounded by default ---------------------------------------------------------------

/// Makes a job `days` days older (as the superuser the tests connect as).
async fn age(db: &intent::Connection, job: Uuid, days: i32) {
    let n = db
        .execute(
            "UPDATE intent.jobs SET created_at = created_at - make_interval(days => $2),
                                    updated_at = updated_at - make_interval(days => $2)
              WHERE id = $1",
            &[&job, &days],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// A job cancelled by its owner (finished), made `days` days old.
async fn finished(db: &intent::Connection, key: &str, days: i32) -> Uuid {
    let job = submit(db, key, "gpu-a", json!({"k": key})).await;
    assert!(intent::cancel_job(db, job, None).await.unwrap());
    age(db, job, days).await;
    job
}

async fn exists(db: &intent::Connection, job: Uuid) -> bool {
    intent::get_job(db, job).await.unwrap().is_some()
}

/// The purge events a runner reported: how many jobs each batch removed, and when.
#[derive(Clone, Default)]
struct Purges(Arc<Mutex<Vec<(u64, tokio::time::Instant)>>>, Events);

impl Purges {
    fn hook(&self) -> impl Fn(Event) + Send + Sync + 'static {
        let me = self.clone();
        let others = self.1.hook();
        move |event| match event {
            Event::Purged { jobs } => {
                me.0.lock()
                    .unwrap()
                    .push((jobs, tokio::time::Instant::now()))
            }
            other => others(other),
        }
    }

    fn batches(&self) -> Vec<u64> {
        self.0.lock().unwrap().iter().map(|(n, _)| *n).collect()
    }
}

/// A runner purges by default, with the database's retention (7 days unless set): a finished
/// job past it disappears, a finished job within it and an unfinished job however old stay,
/// and the key of the purged job, submitted again, creates a new job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_purges_finished_jobs_past_the_retention_and_nothing_else() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let old = finished(&db, "old", 8).await;
    let recent = finished(&db, "recent", 6).await;
    // Unfinished and very old; of a provider the runner does not claim, so it stays pending.
    let open = submit(&db, "open", "elsewhere", json!({})).await;
    age(&db, open, 400).await;
    let old_version = intent::get_job(&db, old).await.unwrap().unwrap().version;

    let purges = Purges::default();
    // Only the period is set: the batch, the pause and being on at all are the defaults.
    let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .provider("gpu-a")
        .purge_every(Duration::from_millis(200))
        .on_event(purges.hook());
    let (stop, handle) = run_succeeding(runner);
    assert!(
        eventually(Duration::from_secs(10), || async {
            !exists(&db, old).await
        })
        .await,
        "the runner never purged the job finished 8 days ago"
    );
    // A few more periods: nothing else goes.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let _ = stop.send(true);
    let summary = handle.await.unwrap();
    assert_eq!(summary.purged, 1);
    assert_eq!(purges.batches(), vec![1]);
    assert!(exists(&db, recent).await, "within the retention: kept");
    assert!(exists(&db, open).await, "unfinished: kept");
    assert_eq!(job_state(&db, open).await, JobState::Pending);
    assert_eq!(purges.1.problems(), Vec::<String>::new());

    // The purged key again: a new job (not a replay of the cancelled one).
    let again: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("owner", "old", "gpu-a", &json!({"k": "old"})),
    )
    .await
    .unwrap();
    assert!(again.created);
    assert_eq!(again.job_id, old);
    assert_eq!(again.state, JobState::Pending);
    assert!(again.version > old_version);
}

/// A backlog is purged in batches of the configured size with the configured pause between
/// them; `purge(false)` purges nothing; `retention` reads the database's setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_purged_in_bounded_batches_with_a_pause_between_them() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    assert_eq!(
        intent::retention(&db).await.unwrap(),
        Some(Duration::from_secs(7 * 86_400))
    );
    let mut jobs = Vec::new();
    for i in 0..25 {
        jobs.push(finished(&db, &format!("k{i}"), 30).await);
    }

    // Off: nothing is purged, however long it runs.
    let purges = Purges::default();
    let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .provider("gpu-a")
        .purge_every(Duration::from_millis(50))
        .purge(false)
        .on_event(purges.hook());
    let (stop, handle) = run_succeeding(runner);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    assert_eq!(handle.await.unwrap().purged, 0);
    assert!(purges.batches().is_empty());

    let pause = Duration::from_millis(400);
    let purges = Purges::default();
    let runner = Runner::new(pool(&t, 2), Duration::from_secs(60))
        .provider("gpu-a")
        .purge_batch(10)
        .purge_pause(pause)
        .purge_every(Duration::from_millis(100))
        .on_event(purges.hook());
    let (stop, handle) = run_succeeding(runner);
    assert!(
        eventually(Duration::from_secs(10), || async {
            purges.batches().iter().sum::<u64>() == 25
        })
        .await,
        "{:?}",
        purges.batches()
    );
    let _ = stop.send(true);
    assert_eq!(handle.await.unwrap().purged, 25);
    assert_eq!(purges.batches(), vec![10, 10, 5], "batches of at most 10");
    let times: Vec<_> = purges.0.lock().unwrap().iter().map(|(_, t)| *t).collect();
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= pause,
            "a batch came {:?} after the last",
            pair[1] - pair[0]
        );
    }
    for job in jobs {
        assert!(!exists(&db, job).await);
    }
    assert_eq!(purges.1.problems(), Vec::<String>::new());

    // 'never': the runner's purge removes nothing; retention() says None.
    db.batch_execute("SET intent.retention = 'never'")
        .await
        .unwrap();
    assert_eq!(intent::retention(&db).await.unwrap(), None);
}

/// A runner whose role is `intent_app` only purges (`intent.purge_expired`, by the database's
/// retention): a default deployment keeps its tables bounded. With that right revoked (a DBA's
/// choice) it says so once and stops purging; its claims go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_as_intent_app_purges_and_one_that_may_not_says_so_once() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let role = format!("app_{}", std::process::id());
    db.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN IN ROLE intent_app;
           EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    ))
    .await
    .unwrap();
    let old = finished(&db, "old", 30).await;
    for revoked in [false, true] {
        if revoked {
            db.batch_execute(
                "REVOKE EXECUTE ON FUNCTION intent.purge_expired(integer) FROM intent_app",
            )
            .await
            .unwrap();
        }
        let mut config: tokio_postgres::Config = t.conn_str().parse().unwrap();
        config.user(&role);
        let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
            config,
            tokio_postgres::NoTls,
        ))
        .max_size(2)
        .build()
        .unwrap();
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = failures.clone();
        let runner = Runner::new(pool, Duration::from_secs(60))
            .provider("gpu-a")
            .poll_every(Duration::from_millis(100))
            .purge_every(Duration::from_millis(50))
            .on_event(move |e| {
                if let Event::PurgeFailed { error } = e {
                    seen.lock().unwrap().push(error.to_string());
                }
            });
        let (stop, handle) = run_succeeding(runner);
        let job = submit(&db, &format!("work-{revoked}"), "gpu-a", json!({})).await;
        assert!(
            eventually(Duration::from_secs(10), || async {
                job_state(&db, job).await == JobState::Succeeded
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = stop.send(true);
        let summary = handle.await.unwrap();
        assert_eq!(summary.completed, 1);
        let failures = failures.lock().unwrap().clone();
        if revoked {
            assert_eq!(failures.len(), 1, "once, then no more: {failures:?}");
            assert!(failures[0].contains("permission denied"), "{failures:?}");
        } else {
            assert_eq!(failures, Vec::<String>::new(), "intent_app may purge");
            assert!(
                !exists(&db, old).await,
                "the finished job past the retention is gone"
            );
        }
    }
}
