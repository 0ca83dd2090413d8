//! Pickup latency: from the submitting commit to the claim, with `NOTIFY` and with polling.
//!
//! pgbench cannot measure this (it needs a listener and a submitter that wait for each other),
//! so this program does: one connection submits jobs one at a time (each `submit_job` in its own
//! transaction, committed when the call returns), and a [`Runner`] claims them: once a
//! `LISTEN`ing runner that claims when notified (its poll set to a minute, so that only the
//! notification wakes it), once a runner without `LISTEN` that polls every `PICKUP_POLL_MS`.
//! Each job is submitted only after the previous one was claimed, after a random pause (up to
//! one poll interval when polling, so submits fall anywhere in the poll cycle), on a provider of
//! its own so that no other job is in the way.
//!
//! The latency is taken on one clock, in this process: from the return of `submit_job` (the
//! commit is done) to the moment the runner hands the claimed attempt to its work (the claim has
//! returned). The server's view is printed too: `attempts.started_at − jobs.created_at`, both
//! `statement_timestamp()` on one server, which also counts the submit statement itself and its
//! commit.
//!
//! Run: `cargo bench -p pg_intent_client --bench pickup` (its own throwaway cluster; env
//! `PG_INTENT_PG_BIN`), or `python3 benches/run.py --workers`, which runs it on its cluster by
//! setting `PICKUP_DB` to a connection string. Env: `PICKUP_JOBS` (jobs per mode, default 200),
//! `PICKUP_POLL_MS` (default 100). The last line is `PICKUP_JSON {…}`, for run.py.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_intent_client::runner::Event;
use pg_intent_client::{
    self as intent, ClaimedAttempt, Executor, NewJob, Runner, Submitted, WorkError,
};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use uuid::Uuid;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small xorshift: pauses need to be spread, not unpredictable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 { 0 } else { self.0 % n }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p / 100.0 * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)]
}

struct Figures {
    /// Client-side latencies, ms, sorted.
    client: Vec<f64>,
    /// Server-side latencies (started_at − created_at), ms, sorted.
    server: Vec<f64>,
}

/// Submits `jobs` jobs one after the other and measures how long each waits for a runner's
/// claim; `poll` None: the runner listens.
async fn measure(
    config: &tokio_postgres::Config,
    label: &str,
    poll: Option<Duration>,
    jobs: usize,
    max_pause: Duration,
) -> Figures {
    const WARMUP: usize = 5;
    let connect = || async {
        let (client, conn) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        intent::Connection::new(client)
    };
    let submitter = connect().await;
    // The submitting session notifies (intent.notify is off by default); the polling worker
    // below does not listen, so the notification changes nothing for it.
    submitter
        .batch_execute("SET intent.notify = on")
        .await
        .expect("SET intent.notify");
    let worker_db = Arc::new(connect().await);
    let run_id = Uuid::new_v4().simple().to_string();
    let provider = format!("pickup-{label}-{}", &run_id[..8]);

    let mut runner = Runner::new(worker_db, Duration::from_secs(30))
        .provider(provider.clone())
        .watch_retries(false)
        .name(format!("pickup-{label}"));
    let listening = Arc::new(Notify::new());
    runner = match poll {
        Some(every) => {
            listening.notify_one();
            runner.poll_every(every)
        }
        None => {
            let l = listening.clone();
            runner
                .listen(config.clone())
                .poll_every(Duration::from_secs(60))
                .on_event(move |e| {
                    if matches!(e, Event::Listening) {
                        l.notify_one();
                    }
                })
        }
    };

    let (claimed_tx, mut claimed_rx) = mpsc::unbounded_channel::<(Uuid, Instant)>();
    let work = move |c: ClaimedAttempt| {
        let at = Instant::now();
        let _ = claimed_tx.send((c.job_id(), at));
        async move { Ok::<Value, WorkError<String>>(json!({"image": "blob://cat.png"})) }
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let params = json!({"prompt": "a cat in a hat", "size": 512});

    let submit = async {
        listening.notified().await;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id()));
        let mut client = Vec::with_capacity(jobs);
        let wait = poll.unwrap_or(Duration::ZERO) * 2 + Duration::from_secs(10);
        for i in 0..WARMUP + jobs {
            let pause = rng.below(max_pause.as_micros() as u64);
            tokio::time::sleep(Duration::from_micros(pause)).await;
            let key = format!("{run_id}-{i}");
            let s: Submitted<Value> =
                intent::submit_job(&submitter, &NewJob::new("pickup", &key, &provider, &params))
                    .await
                    .expect("submit_job");
            let committed = Instant::now();
            let (job_id, at) = tokio::time::timeout(wait, claimed_rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{label}: job {i} not claimed within {wait:?}"))
                .expect("the runner's work");
            assert_eq!(job_id, s.job_id, "{label}: claimed another job");
            if i >= WARMUP {
                client.push(at.saturating_duration_since(committed).as_secs_f64() * 1000.0);
            }
        }
        let _ = stop_tx.send(());
        client
    };
    let (summary, mut client) = tokio::join!(
        runner.run(work, async {
            let _ = stop_rx.await;
        }),
        submit
    );
    assert_eq!(
        summary.claimed as usize,
        WARMUP + jobs,
        "{label}: {summary:?}"
    );

    let rows = submitter
        .client()
        .query(
            "SELECT extract(epoch FROM a.started_at - j.created_at)::float8 * 1000
               FROM intent.jobs j JOIN intent.attempts a ON a.job_id = j.id
              WHERE j.provider = $1
              ORDER BY j.created_at OFFSET $2",
            &[&provider, &(WARMUP as i64)],
        )
        .await
        .expect("server timestamps");
    let mut server: Vec<f64> = rows.iter().map(|r| r.get(0)).collect();
    client.sort_by(f64::total_cmp);
    server.sort_by(f64::total_cmp);
    Figures { client, server }
}

fn main() {
    let jobs = env("PICKUP_JOBS", 200) as usize;
    let poll_ms = env("PICKUP_POLL_MS", 100);
    let own_cluster = match std::env::var("PICKUP_DB") {
        Ok(_) => None,
        Err(_) => Some(pg_intent_cluster::Cluster::start()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let conn_str = match &own_cluster {
        Some(cluster) => rt.block_on(cluster.fresh_db_copied("pickup")).conn_str(),
        None => std::env::var("PICKUP_DB").expect("PICKUP_DB"),
    };
    let config: tokio_postgres::Config = conn_str.parse().expect("a connection string");
    let poll = Duration::from_millis(poll_ms);

    let notify = rt.block_on(measure(
        &config,
        "notify",
        None,
        jobs,
        Duration::from_millis(5),
    ));
    let polled = rt.block_on(measure(&config, "poll", Some(poll), jobs, poll));

    println!(
        "pickup latency, submit commit → claim, {jobs} jobs each (ms; server: started_at − created_at)"
    );
    let mut out = serde_json::Map::new();
    for (name, f) in [
        ("LISTEN + claim on NOTIFY".to_string(), &notify),
        (format!("polling every {poll_ms} ms"), &polled),
    ] {
        println!(
            "{name:<28} p50 {:>7.2}  p99 {:>7.2}  max {:>7.2}   server p50 {:>7.2}  p99 {:>7.2}",
            pct(&f.client, 50.0),
            pct(&f.client, 99.0),
            pct(&f.client, 100.0),
            pct(&f.server, 50.0),
            pct(&f.server, 99.0),
        );
        let key = if name.starts_with("LISTEN") {
            "notify"
        } else {
            "poll"
        };
        out.insert(
            key.into(),
            json!({
                "p50": pct(&f.client, 50.0), "p99": pct(&f.client, 99.0), "max": pct(&f.client, 100.0),
                "server_p50": pct(&f.server, 50.0), "server_p99": pct(&f.server, 99.0),
            }),
        );
    }
    out.insert("jobs".into(), json!(jobs));
    out.insert("poll_ms".into(), json!(poll_ms));
    println!("PICKUP_JSON {}", Value::Object(out));
    drop(own_cluster);
}
