//! Client call throughput ÷ raw tokio-postgres prepared call throughput, same SQL, one run.
//!
//! Starts its own throwaway cluster. For each call measured, the raw side prepares the very SQL
//! the client runs, binds the same values and decodes the same columns; the client side goes
//! through the typed API (statement cache, serde, error classification). Both run on the same
//! connection, sequentially (one call in flight, as a request handler would), in alternating
//! rounds so that drift on a shared machine hits both sides alike. Target: ratio ≥ 0.90.
//!
//! Run: `cargo bench -p pg_intent_client` (env `BENCH_CALLS` = calls per round, default 1500;
//! `BENCH_ROUNDS`, default 8).

use std::time::{Duration, Instant};

use pg_intent_client::{self as intent, BeginOptions, Call, JobState, NewJob, Submitted};
use serde_json::{Value, json};
use tokio_postgres::types::{IsNull, Json, ToSql, Type, to_sql_checked};
use uuid::Uuid;

/// A NULL `interval`, as a raw caller would have to write one (tokio-postgres has no interval
/// type).
#[derive(Debug)]
struct NullInterval;

impl ToSql for NullInterval {
    fn to_sql(
        &self,
        _: &Type,
        _: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        Ok(IsNull::Yes)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }

    to_sql_checked!();
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Side {
    calls: usize,
    time: Duration,
}

impl Side {
    fn per_sec(&self) -> f64 {
        self.calls as f64 / self.time.as_secs_f64()
    }
}

/// Runs `raw` and `client` calls interleaved one by one (the order flipping on every pair), so
/// that whatever else the machine is doing hits both sides alike; each call is timed on its own.
/// Returns (raw, client, median over rounds of the per-round throughput ratio).
async fn compare<R, C, RF, CF>(
    rounds: usize,
    calls: usize,
    mut raw: R,
    mut client: C,
) -> (Side, Side, f64)
where
    R: FnMut() -> RF,
    RF: std::future::Future<Output = ()>,
    C: FnMut() -> CF,
    CF: std::future::Future<Output = ()>,
{
    // Warm up both paths (and the statement caches).
    for _ in 0..calls / 5 {
        raw().await;
        client().await;
    }
    let mut r = Side {
        calls: 0,
        time: Duration::ZERO,
    };
    let mut c = Side {
        calls: 0,
        time: Duration::ZERO,
    };
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let (mut rt, mut ct) = (Duration::ZERO, Duration::ZERO);
        for i in 0..calls {
            for is_raw in if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            } {
                let t0 = Instant::now();
                if is_raw {
                    raw().await;
                    rt += t0.elapsed();
                } else {
                    client().await;
                    ct += t0.elapsed();
                }
            }
        }
        r.calls += calls;
        r.time += rt;
        c.calls += calls;
        c.time += ct;
        ratios.push(rt.as_secs_f64() / ct.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    (r, c, median)
}

fn report(name: &str, raw: &Side, client: &Side, median: f64) -> f64 {
    let ratio = client.per_sec() / raw.per_sec();
    println!(
        "{name:<24} raw {:>8.0} calls/s   client {:>8.0} calls/s   ratio {ratio:.3} (median of rounds {median:.3})",
        raw.per_sec(),
        client.per_sec()
    );
    ratio
}

fn main() {
    let rounds = env("BENCH_ROUNDS", 8);
    let calls = env("BENCH_CALLS", 1500);
    let cluster = pg_intent_cluster::Cluster::start_with(pg_intent_cluster::FAST);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let ratios = rt.block_on(async {
        let fresh = cluster.fresh_db_copied("bench").await;
        let db = intent::Connection::new(fresh.connect().await);
        let params = json!({"prompt": "a red fox in the snow", "size": [1024, 1024], "steps": 30});
        let first: Submitted<Value> =
            intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &params))
                .await
                .expect("submit");

        // 1. submit_job, replayed (the double-click path; read-only).
        let raw_submit = db
            .prepare_typed(Call::SubmitJob.sql(), Call::SubmitJob.param_types())
            .await
            .expect("prepare");
        let (r, c, m) = compare(
            rounds,
            calls,
            || async {
                let row = db
                    .query_one(
                        &raw_submit,
                        &[
                            &"alice",
                            &"click-1",
                            &"gpu-a",
                            &Json(&params),
                            &None::<&str>,
                            &3i32,
                        ],
                    )
                    .await
                    .expect("raw submit");
                let job_id: Uuid = row.get(0);
                let created: bool = row.get(1);
                let state: &str = row.get(2);
                let _version: i64 = row.get(3);
                let result: Option<Json<Value>> = row.get(4);
                assert!(
                    job_id == first.job_id && !created && state == "pending" && result.is_none()
                );
            },
            || async {
                let s: Submitted<Value> =
                    intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &params))
                        .await
                        .expect("client submit");
                assert!(s.job_id == first.job_id && !s.created && s.state == JobState::Pending);
            },
        )
        .await;
        let submit = report("submit_job (replay)", &r, &c, m);

        // 2. heartbeat of a running attempt (a write: the deadline moves).
        let attempt = intent::begin_attempt(
            &db,
            first.job_id,
            BeginOptions::new().lease(Duration::from_secs(3600)),
        )
        .await
        .expect("begin");
        let raw_heartbeat = db
            .prepare_typed(Call::Heartbeat.sql(), Call::Heartbeat.param_types())
            .await
            .expect("prepare");
        let id = attempt.id();
        let (r, c, m) = compare(
            rounds,
            calls,
            || async {
                let row = db
                    .query_one(&raw_heartbeat, &[&id, &NullInterval])
                    .await
                    .expect("raw heartbeat");
                assert!(row.get::<_, bool>(0));
            },
            || async {
                assert!(
                    intent::heartbeat(&db, id, None)
                        .await
                        .expect("client heartbeat")
                );
            },
        )
        .await;
        let heartbeat = report("heartbeat", &r, &c, m);
        vec![submit, heartbeat]
    });
    let worst = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "client / raw throughput: worst {worst:.3} (target >= 0.90): {}",
        if worst >= 0.90 { "met" } else { "NOT met" }
    );
    drop(cluster);
}
