//! Issue 17, reproduction 1, through the gateway: the backend of the worker's attempt is
//! terminated while the provider works (as a database failover, or a DBA's
//! `pg_terminate_backend`, does). The worker's heartbeats and its report move to fresh
//! connections from the pool, and the job ends `succeeded` with the provider's result — not
//! `started`, then `unknown`, answered `409 outcome-unknown` for ever.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{eventually, gateway_db};
use pg_intent_gateway::{Config, Gateway, WorkerConfig, fake_provider};
use serde_json::{Value, json};

const TOKEN: &str = "alice-token";

#[tokio::test]
async fn a_killed_backend_mid_attempt_does_not_lose_the_result() {
    let db = gateway_db().await;
    let conn_str = db.cluster.conn_str_as(&db.name, "gateway");
    let config = Config {
        tokens: HashMap::from([(TOKEN.to_string(), "alice".to_string())]),
        default_provider: "gpu-a".into(),
        providers: vec!["gpu-a".into()],
        worker: WorkerConfig {
            name: "gw-reconnect".into(),
            concurrency: 2,
            timeout: Duration::from_secs(30),
            // Shorter than the time the connection is dead and the work goes on (3 s):
            // without heartbeats on a fresh connection the attempt would lapse to unknown.
            // Long enough that a loaded machine reconnects within it (900 ms lapsed once in a
            // full run on 2 busy cores: the heartbeat then found the lease gone).
            lease: Duration::from_millis(1500),
            poll_every: Duration::from_millis(100),
            ..WorkerConfig::default()
        },
        ..Config::default()
    };
    let pool = pg_intent_gateway::pool(&conn_str, 8).unwrap();
    let gateway = Gateway::new(pool, config, fake_provider);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = gateway.clone();
    let serve = tokio::spawn(async move {
        server
            .serve(listener, std::future::pending())
            .await
            .unwrap()
    });
    let worker = gateway.spawn_worker();
    let http = reqwest::Client::new();
    let admin = db.connect().await;

    let res = http
        .post(format!("{base}/jobs"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("idempotency-key", "\"killed-1\"")
        .header("content-type", "application/json")
        .body(json!({"prompt": "a fox", "work_ms": 3000}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let job_id: uuid::Uuid = res.json::<Value>().await.unwrap()["job_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // The attempt begins; then every backend of the gateway's role is terminated.
    assert!(
        eventually(Duration::from_secs(10), || async {
            admin
                .query_one(
                    "SELECT count(*) FROM intent.attempts WHERE job_id = $1 AND state = 'started'",
                    &[&job_id],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        })
        .await,
        "the worker began an attempt"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity \
             WHERE usename = 'gateway' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 1, "the worker's connections were terminated");

    // The result lands: the job succeeds, by its first attempt, and GET serves it.
    assert!(
        eventually(Duration::from_secs(20), || async {
            admin
                .query_one(
                    "SELECT state::text FROM intent.jobs WHERE id = $1",
                    &[&job_id],
                )
                .await
                .unwrap()
                .get::<_, String>(0)
                == "succeeded"
        })
        .await,
        "the job succeeded"
    );
    let attempts: Vec<(i32, String)> = admin
        .query(
            "SELECT attempt_no, state::text FROM intent.attempts WHERE job_id = $1 ORDER BY 1",
            &[&job_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(attempts, vec![(1, "succeeded".to_string())]);
    let timeouts: i64 = admin
        .query_one(
            "SELECT count(*) FROM intent.events WHERE job_id = $1 AND kind = 'timeout'",
            &[&job_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(timeouts, 0, "the lease never lapsed: heartbeats went on");
    let res = http
        .get(format!("{base}/jobs/{job_id}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["state"], "succeeded", "{body}");
    serve.abort();
    worker.abort();
}
