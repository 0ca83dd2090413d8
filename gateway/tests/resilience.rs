//! The gateway when things go wrong: the database stops answering, refuses for a moment or is
//! slow. Real HTTP over loopback and a real cluster.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{TestDb, eventually, gateway_db};
use pg_intent_gateway::{Config, Gateway, Outcome, Task, WorkerConfig};
use serde_json::{Value, json};
use uuid::Uuid;

const ALICE: &str = "alice-token";

fn config() -> Config {
    let mut c = Config {
        tokens: HashMap::from([(ALICE.to_string(), "alice".to_string())]),
        default_provider: "gpu-a".into(),
        providers: vec!["gpu-a".into()],
        worker: WorkerConfig {
            name: "gw-resilience".into(),
            ..WorkerConfig::default()
        },
        ..Config::default()
    };
    tuned(&mut c);
    c
}

/// The timeouts of these tests: short, so that each failure shows within a second or two.
fn tuned(c: &mut Config) {
    c.unavailable_retry_after = 3;
    c.database.wait_timeout = Duration::from_millis(300);
    c.database.connect_timeout = Duration::from_millis(700);
    c.database.recycle_timeout = Duration::from_millis(500);
    c.database.statement_timeout = Duration::from_millis(800);
    c.database.transaction_timeout = Duration::from_millis(2500);
}

fn no_provider(_: Task) -> std::future::Ready<Outcome> {
    panic!("no worker in this test")
}

/// A gateway (no worker) on 127.0.0.1 in front of `database` (a connection string).
struct Gw {
    base: String,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(database: &str, config: Config, max_size: usize) -> Gw {
    let pool = pg_intent_gateway::pool_with(database, max_size, &config.database).unwrap();
    let gateway = Gateway::new(pool, config, no_provider);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        gateway
            .serve(listener, std::future::pending())
            .await
            .unwrap()
    });
    Gw {
        base: format!("http://{addr}"),
        // Every request of these tests is answered well within this, or the test fails.
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        server,
    }
}

/// A gateway on a fresh database of the test cluster, as the `gateway` role.
async fn on_db(config: Config, max_size: usize) -> (Gw, TestDb) {
    let db = gateway_db().await;
    let gw = serve(
        &db.cluster.conn_str_as(&db.name, "gateway"),
        config,
        max_size,
    )
    .await;
    (gw, db)
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem+json `503` with the configured `Retry-After`.
    #[track_caller]
    fn assert_unavailable(&self) {
        assert_eq!(self.status, 503, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        assert_eq!(self.body["type"], "/problems/unavailable", "{self:?}");
        assert_eq!(self.body["status"], 503, "{self:?}");
        assert_eq!(self.header("retry-after"), Some("3"), "{self:?}");
    }
}

impl Gw {
    async fn post(&self, key: &str, body: &Value) -> Resp {
        let res = self
            .http
            .post(format!("{}/jobs", self.base))
            .header("authorization", format!("Bearer {ALICE}"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap())
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /jobs {key:?}: {e}"));
        read(res).await
    }

    async fn get(&self, path: &str) -> Resp {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {ALICE}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        read(res).await
    }
}

async fn read(res: reqwest::Response) -> Resp {
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = res.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Resp {
        status,
        headers,
        body,
    }
}

/// A superuser session that holds `LOCK TABLE intent.jobs` until `release`: every statement
/// of the gateway that touches the jobs waits behind it.
struct JobsLocked {
    client: tokio_postgres::Client,
}

impl JobsLocked {
    async fn take(db: &TestDb) -> JobsLocked {
        let client = db.connect().await;
        client
            .batch_execute("BEGIN; LOCK TABLE intent.jobs IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        JobsLocked { client }
    }

    async fn release(self) {
        self.client.batch_execute("COMMIT").await.unwrap();
    }
}

/// The pids of the `gateway` role's backends waiting for a lock (on the locked jobs), once
/// there are `n`.
async fn gateway_backends_waiting(db: &TestDb, n: usize) -> Vec<i32> {
    let c = db.connect().await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = c
            .query(
                "SELECT pid FROM pg_stat_activity
                  WHERE usename = 'gateway' AND datname = current_database()
                    AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(
            Instant::now() < end,
            "no {n} gateway backends waiting for the lock: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn job_count(db: &TestDb) -> i64 {
    db.connect()
        .await
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0)
}

// ---------------------------------------------------------------------------------------------
// The database fails: 503 + Retry-After, never 500.

/// `pg_terminate_backend` of the gateway's backend in the middle of `submit_job` (57P01
/// admin_shutdown): the request is answered 503 with Retry-After, and the retry with the same
/// key creates the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_is_503_with_retry_after() {
    let (gw, db) = on_db(config(), 4).await;
    let lock = JobsLocked::take(&db).await;
    let post = {
        let gw_http = gw.http.clone();
        let base = gw.base.clone();
        tokio::spawn(async move {
            let res = gw_http
                .post(format!("{base}/jobs"))
                .header("authorization", format!("Bearer {ALICE}"))
                .header("idempotency-key", "\"terminated\"")
                .header("content-type", "application/json")
                .body(r#"{"prompt": "a cat"}"#)
                .send()
                .await
                .unwrap();
            read(res).await
        })
    };
    let pids = gateway_backends_waiting(&db, 1).await;
    let killed: bool = db
        .connect()
        .await
        .query_one("SELECT pg_terminate_backend($1)", &[&pids[0]])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    let r = post.await.unwrap();
    r.assert_unavailable();
    assert_eq!(r.body["sqlstate"], "57P01", "{r:?}");
    lock.release().await;

    // The retry, on a new connection of the pool: the job.
    let r = gw.post("terminated", &json!({"prompt": "a cat"})).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(job_count(&db).await, 1);
}

/// A statement that waits longer than the statement timeout (a lock another session holds on
/// the jobs) is cancelled by the server (57014): 503. Meanwhile the pool's only connection is
/// taken, and a second request gives up waiting for one after the pool's wait timeout: 503 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_timeout_and_the_pool_wait_timeout_are_503() {
    let (gw, db) = on_db(config(), 1).await;
    let lock = JobsLocked::take(&db).await;
    let gw = std::sync::Arc::new(gw);
    let started = Instant::now();
    let slow = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.post("slow", &json!({"prompt": "a cat"})).await })
    };
    gateway_backends_waiting(&db, 1).await;

    // The only connection is busy: no connection within the wait timeout.
    let waited = Instant::now();
    let r = gw.post("second", &json!({"prompt": "a dog"})).await;
    r.assert_unavailable();
    assert!(r.body.get("sqlstate").is_none(), "{r:?}");
    assert!(
        waited.elapsed() < Duration::from_millis(300 + 1500),
        "the pool wait took {:?}",
        waited.elapsed()
    );

    let r = slow.await.unwrap();
    r.assert_unavailable();
    assert_eq!(r.body["sqlstate"], "57014", "{r:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(800 + 2000),
        "the statement timeout fired after {took:?}"
    );
    lock.release().await;

    // The retry, on a new connection (the gateway closes one whose transaction ended in 503).
    let r = gw.post("slow", &json!({"prompt": "a cat"})).await;
    assert_eq!(r.status, 201, "{r:?}");
}

/// A backend that stops answering in the middle of a transaction (SIGSTOP: the server's own
/// statement timeout cannot fire) is given up on after the gateway's transaction timeout: 503,
/// and that connection is closed rather than given to the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_stops_answering_is_503_after_the_transaction_timeout() {
    let mut cfg = config();
    cfg.database.statement_timeout = Duration::from_secs(30);
    cfg.database.transaction_timeout = Duration::from_millis(1000);
    let (gw, db) = on_db(cfg, 2).await;
    let lock = JobsLocked::take(&db).await;
    let gw = std::sync::Arc::new(gw);
    let started = Instant::now();
    let stuck = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.post("stuck", &json!({})).await })
    };
    let pid = gateway_backends_waiting(&db, 1).await[0];
    signal(pid as u32, "STOP");
    let r = stuck.await.unwrap();
    signal(pid as u32, "CONT");
    r.assert_unavailable();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1000 + 2000),
        "answered after {took:?}"
    );
    // The gateway closed that connection: once the lock is gone its backend finds the client
    // gone, rolls back and ends (its transaction was never committed).
    lock.release().await;
    let c = db.connect().await;
    let gone = eventually(Duration::from_secs(10), || {
        let c = &c;
        async move {
            c.query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
                .await
                .unwrap()
                .is_none()
        }
    })
    .await;
    assert!(gone, "backend {pid} is still connected");
    assert_eq!(job_count(&db).await, 0);
    let r = gw.post("stuck", &json!({})).await;
    assert_eq!(r.status, 201, "{r:?}");
}

/// A "database" that accepts TCP connections and never says a word: every request is 503
/// within the connect timeout, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_never_answers_is_503_within_the_connect_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket); // open, and silent
        }
    });
    let gw = serve(
        &format!("host=127.0.0.1 port={port} user=gateway dbname=app"),
        config(),
        4,
    )
    .await;
    for _ in 0..2 {
        let started = Instant::now();
        let r = gw.post("k", &json!({"prompt": "a cat"})).await;
        r.assert_unavailable();
        let took = started.elapsed();
        assert!(took < Duration::from_millis(700 + 1500), "took {took:?}");
    }
    let started = Instant::now();
    let r = gw.get(&format!("/jobs/{}", Uuid::nil())).await;
    r.assert_unavailable();
    assert!(started.elapsed() < Duration::from_millis(700 + 1500));
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 3,
        "the gateway did connect"
    );
    holder.abort();
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}
