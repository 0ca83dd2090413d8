//! The gateway against a real cluster, over real HTTP on loopback: one fresh database per test,
//! the gateway connected as its own non-superuser role (`gateway`, a member of
//! `intent_operator` allowed to bind owners), and reqwest as the client.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestDb, eventually, gateway_db};
use pg_intent_gateway::{
    Config, FakeProvider, Gateway, Outcome, Provider, ReconcilerConfig, Task, WorkerConfig,
    fake_provider,
};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};
use uuid::Uuid;

const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";

/// A gateway serving one fresh database on 127.0.0.1, with or without its worker.
struct Gw {
    base: String,
    gateway: Gateway,
    db: TestDb,
    http: reqwest::Client,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn config() -> Config {
    Config {
        tokens: HashMap::from([
            (ALICE.to_string(), "alice".to_string()),
            (BOB.to_string(), "bob".to_string()),
        ]),
        default_provider: "gpu-a".into(),
        providers: vec!["gpu-a".into(), "gpu-b".into()],
        worker: WorkerConfig {
            name: "gw-test".into(),
            concurrency: 8,
            timeout: Duration::from_secs(20),
            lease: Duration::from_secs(5),
            poll_every: Duration::from_millis(100),
            ..WorkerConfig::default()
        },
        ..Config::default()
    }
}

async fn start(mut config: Config, provider: impl Provider, worker: bool) -> Gw {
    let db = gateway_db().await;
    let conn_str = db.cluster.conn_str_as(&db.name, "gateway");
    config.worker.listen = Some(conn_str.parse().unwrap());
    let pool = pg_intent_gateway::pool(&conn_str, 32).unwrap();
    let gateway = Gateway::new(pool, config, provider);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut tasks = Vec::new();
    let server = gateway.clone();
    tasks.push(tokio::spawn(async move {
        server
            .serve(listener, std::future::pending())
            .await
            .unwrap()
    }));
    if worker {
        tasks.push(gateway.spawn_worker());
    }
    Gw {
        base,
        gateway,
        db,
        http: reqwest::Client::new(),
        tasks,
    }
}

/// A response, read whole.
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

    /// The problem type of an application/problem+json answer.
    #[track_caller]
    fn problem(&self) -> &str {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        assert_eq!(self.body["status"], self.status, "{self:?}");
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
        self.body["type"].as_str().expect("a type")
    }

    /// The job named by the answer (201/200 body, or 409/422 problem member).
    fn job_id(&self) -> Uuid {
        self.body["job_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no job_id in {self:?}"))
            .parse()
            .unwrap()
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

impl Gw {
    /// `POST path` with a bearer token, raw Idempotency-Key header lines and a JSON body.
    async fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        keys: &[&[u8]],
        body: &Value,
    ) -> Resp {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap());
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for k in keys {
            req = req.header("idempotency-key", HeaderValue::from_bytes(k).unwrap());
        }
        read(req.send().await.unwrap()).await
    }

    /// `POST /jobs` as `token` with `Idempotency-Key: "<key>"`.
    async fn post(&self, token: &str, key: &str, body: &Value) -> Resp {
        let header = format!("\"{key}\"");
        self.post_raw("/jobs", Some(token), &[header.as_bytes()], body)
            .await
    }

    async fn get(&self, token: &str, path: &str) -> Resp {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        read(res).await
    }

    /// A superuser connection to the test database (sees every owner).
    async fn sql(&self) -> tokio_postgres::Client {
        self.db.connect().await
    }

    async fn job_count(&self) -> i64 {
        self.sql()
            .await
            .query_one("SELECT count(*) FROM intent.jobs", &[])
            .await
            .unwrap()
            .get(0)
    }

    async fn job_state(&self, job_id: Uuid) -> String {
        self.sql()
            .await
            .query_one(
                "SELECT state::text FROM intent.jobs WHERE id = $1",
                &[&job_id],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Waits until the job is in `state` (panics after 20 s).
    async fn wait_for(&self, job_id: Uuid, state: &str) {
        let c = self.sql().await;
        let reached = eventually(Duration::from_secs(20), || {
            let c = &c;
            async move {
                let s: String = c
                    .query_one(
                        "SELECT state::text FROM intent.jobs WHERE id = $1",
                        &[&job_id],
                    )
                    .await
                    .unwrap()
                    .get(0);
                s == state
            }
        })
        .await;
        assert!(
            reached,
            "job {job_id} never became {state} (is {})",
            self.job_state(job_id).await
        );
    }
}

/// A provider that holds every call until released, counting calls.
#[derive(Clone)]
struct Held {
    release: Arc<tokio::sync::Semaphore>,
    calls: Arc<AtomicUsize>,
}

impl Held {
    fn new() -> Held {
        Held {
            release: Arc::new(tokio::sync::Semaphore::new(0)),
            calls: Arc::default(),
        }
    }

    fn provider(&self) -> impl Provider {
        let held = self.clone();
        move |task: Task| {
            let held = held.clone();
            async move {
                held.calls.fetch_add(1, Ordering::SeqCst);
                let _permit = held.release.acquire().await.unwrap();
                fake_provider(task).await
            }
        }
    }

    fn release_all(&self) {
        self.release.add_permits(1000);
    }
}

fn no_provider(_: Task) -> std::future::Ready<Outcome> {
    panic!("no worker in this test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_400_and_writes_nothing() {
    let gw = start(config(), no_provider, false).await;
    let r = gw
        .post_raw("/jobs", Some(ALICE), &[], &json!({"prompt": "a cat"}))
        .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.problem(), "/problems/idempotency-key-missing");
    assert!(
        r.body.get("sqlstate").is_none(),
        "the database was not asked"
    );
    assert_eq!(gw.job_count().await, 0);

    // The problem's type is a page of the gateway that says what to do.
    let page = gw.get(ALICE, "/problems/idempotency-key-missing").await;
    assert_eq!(page.status, 200);
    assert!(page.body.as_str().unwrap().contains("Idempotency-Key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_keys_are_400_and_write_nothing() {
    let gw = start(config(), no_provider, false).await;
    let too_long = format!("\"{}\"", "k".repeat(256));
    let cases: Vec<(&str, Vec<&[u8]>)> = vec![
        ("a bare token", vec![b"click-1"]),
        ("an integer", vec![b"42"]),
        ("a byte sequence", vec![b":Y2xpY2stMQ==:"]),
        ("a boolean", vec![b"?1"]),
        ("an empty string", vec![b"\"\""]),
        ("unterminated", vec![b"\"click-1"]),
        ("a bad escape", vec![b"\"click\\-1\""]),
        ("not ASCII", vec!["\"cl\u{e9}ck\"".as_bytes()]),
        ("a list", vec![b"\"a\", \"b\""]),
        ("two header lines", vec![b"\"a\"", b"\"a\""]),
        ("trailing garbage", vec![b"\"a\" b"]),
        ("256 characters", vec![too_long.as_bytes()]),
    ];
    for (what, keys) in cases {
        let r = gw
            .post_raw("/jobs", Some(ALICE), &keys, &json!({"prompt": "a cat"}))
            .await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        assert_eq!(r.problem(), "/problems/idempotency-key-malformed", "{what}");
    }
    assert_eq!(gw.job_count().await, 0);

    // The longest key, and a key with parameters (ignored, as RFC 9651 asks), are fine.
    let longest = format!("\"{}\"", "k".repeat(255));
    let r = gw
        .post_raw("/jobs", Some(ALICE), &[longest.as_bytes()], &json!({}))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let r = gw
        .post_raw("/jobs", Some(ALICE), &[b"\"p\";v=1;x"], &json!({}))
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.job_id(), pg_intent_client::job_id("alice", "p").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_are_401() {
    let gw = start(config(), no_provider, false).await;
    let body = json!({"prompt": "a cat"});
    for token in [None, Some("nobody")] {
        let r = gw.post_raw("/jobs", token, &[b"\"k\""], &body).await;
        assert_eq!(r.status, 401, "{r:?}");
        assert_eq!(r.problem(), "/problems/unauthorized");
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    }
    assert_eq!(gw.get("nobody", "/jobs/x").await.status, 401);
    assert_eq!(gw.job_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_is_201_and_a_finished_job_replays_200_with_the_stored_result() {
    let gw = start(config(), fake_provider, true).await;
    let r = gw
        .post(
            ALICE,
            "order-1",
            &json!({"prompt": "a cat", "size": 512, "work_ms": 50}),
        )
        .await;
    assert_eq!(r.status, 201, "{r:?}");
    let job = r.job_id();
    assert_eq!(job, pg_intent_client::job_id("alice", "order-1").unwrap());
    let location = format!("/jobs/{job}");
    assert_eq!(r.header("location"), Some(location.as_str()));
    assert_eq!(r.body["state"], "pending");
    assert!(r.header("idempotent-replayed").is_none());

    gw.wait_for(job, "succeeded").await;
    let stored: Value = gw
        .sql()
        .await
        .query_one("SELECT result FROM intent.jobs WHERE id = $1", &[&job])
        .await
        .unwrap()
        .get(0);

    // The same body, keys in another order: the same intent (jsonb equality).
    for _ in 0..2 {
        let r = gw
            .post(
                ALICE,
                "order-1",
                &json!({"work_ms": 50, "size": 512, "prompt": "a cat"}),
            )
            .await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
        assert_eq!(r.header("location"), Some(location.as_str()));
        assert_eq!(r.body["state"], "succeeded");
        assert_eq!(r.body["result"], stored);
    }
    // Location shows the same outcome.
    let shown = gw.get(ALICE, &location).await;
    assert_eq!(shown.status, 200);
    assert_eq!(shown.body["result"], stored);

    // The work ran once.
    let attempts: i64 = gw
        .sql()
        .await
        .query_one(
            "SELECT count(*) FROM intent.attempts WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);
}

/// Fires `n` identical POSTs at the same instant, each on its own connection.
async fn stampede(gw: &Arc<Gw>, key: &str, body: &Value, n: usize) -> Vec<Resp> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (gw, barrier, key, body) =
                (gw.clone(), barrier.clone(), key.to_string(), body.clone());
            tokio::spawn(async move {
                // A client of its own: its own TCP connection.
                let http = reqwest::Client::new();
                let req = http
                    .post(format!("{}/jobs", gw.base))
                    .header("authorization", format!("Bearer {ALICE}"))
                    .header("idempotency-key", format!("\"{key}\""))
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).unwrap());
                barrier.wait().await;
                read(req.send().await.unwrap()).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_posts_at_once_create_one_job_never_two() {
    let held = Held::new();
    let gw = Arc::new(start(config(), held.provider(), true).await);

    // Pairs of identical requests while the provider is held: one 201, one 409.
    for i in 0..10 {
        let key = format!("double-click-{i}");
        let answers = stampede(&gw, &key, &json!({"prompt": "a fox", "i": i}), 2).await;
        let created: Vec<_> = answers.iter().filter(|r| r.status == 201).collect();
        assert_eq!(created.len(), 1, "exactly one 201: {answers:?}");
        for r in &answers {
            assert_eq!(r.job_id(), pg_intent_client::job_id("alice", &key).unwrap());
            if r.status != 201 {
                assert_eq!(r.status, 409, "{r:?}");
                assert_eq!(r.problem(), "/problems/request-in-flight");
                assert_eq!(r.header("retry-after"), Some("1"));
            }
        }
    }
    // Eight at once on one key.
    let answers = stampede(&gw, "burst", &json!({"prompt": "a fox"}), 8).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 409).count(),
        7,
        "{statuses:?}"
    );
    assert_eq!(gw.job_count().await, 11);

    // Released, every job runs exactly once.
    held.release_all();
    for i in 0..10 {
        let job = pg_intent_client::job_id("alice", &format!("double-click-{i}")).unwrap();
        gw.wait_for(job, "succeeded").await;
    }
    gw.wait_for(
        pg_intent_client::job_id("alice", "burst").unwrap(),
        "succeeded",
    )
    .await;
    assert_eq!(
        held.calls.load(Ordering::SeqCst),
        11,
        "one provider call per job"
    );
    let attempts: i64 = gw
        .sql()
        .await
        .query_one("SELECT count(*) FROM intent.attempts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 11);

    // With a provider that answers at once, a racing twin may already see the result: 200.
    for i in 0..5 {
        let key = format!("fast-{i}");
        let answers = stampede(&gw, &key, &json!({"work_ms": 0}), 2).await;
        let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses.iter().filter(|&&s| s == 201).count(),
            1,
            "{statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| [200, 201, 409].contains(s)),
            "{statuses:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_body_or_provider_is_422() {
    let gw = start(config(), no_provider, false).await;
    let first = gw.post(ALICE, "k", &json!({"prompt": "a cat"})).await;
    assert_eq!(first.status, 201);

    let r = gw.post(ALICE, "k", &json!({"prompt": "a dog"})).await;
    assert_eq!(r.status, 422, "{r:?}");
    assert_eq!(r.problem(), "/problems/idempotency-key-reused");
    assert_eq!(r.body["sqlstate"], "IJ001");
    assert_eq!(r.body["differs"], json!(["params"]));
    assert_eq!(r.job_id(), first.job_id());
    assert!(r.body["detail"].as_str().unwrap().contains("params"));

    let r = gw
        .post_raw(
            "/providers/gpu-b/jobs",
            Some(ALICE),
            &[b"\"k\""],
            &json!({"prompt": "a cat"}),
        )
        .await;
    assert_eq!(r.status, 422, "{r:?}");
    assert_eq!(r.body["differs"], json!(["provider"]));

    // The first job is untouched.
    let row = gw
        .sql()
        .await
        .query_one(
            "SELECT provider, params, version FROM intent.jobs WHERE id = $1",
            &[&first.job_id()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "gpu-a");
    assert_eq!(row.get::<_, Value>(1), json!({"prompt": "a cat"}));
    assert_eq!(row.get::<_, i64>(2), 1);

    // An unknown provider is 404, and nothing is written.
    let r = gw
        .post_raw(
            "/providers/gpu-z/jobs",
            Some(ALICE),
            &[b"\"z\""],
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(gw.job_count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_flight_is_409_with_retry_after() {
    // No worker: the job stays pending.
    let gw = start(config(), no_provider, false).await;
    let first = gw.post(ALICE, "k", &json!({"prompt": "a cat"})).await;
    assert_eq!(first.status, 201);
    let r = gw.post(ALICE, "k", &json!({"prompt": "a cat"})).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.problem(), "/problems/request-in-flight");
    assert_eq!(r.body["state"], "pending");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("location"), first.header("location"));
    assert!(r.body.get("sqlstate").is_none());

    // Running: an attempt is begun by someone (another gateway's worker).
    gw.sql()
        .await
        .execute(
            "SELECT intent.begin_attempt($1, lease => '1 minute')",
            &[&first.job_id()],
        )
        .await
        .unwrap();
    let r = gw.post(ALICE, "k", &json!({"prompt": "a cat"})).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.body["state"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_409_until_reconciled() {
    let mut cfg = config();
    cfg.worker.timeout = Duration::from_millis(300);
    cfg.worker.lease = Duration::from_secs(2);
    // The provider never answers the first attempt (a GPU still generating); later ones do.
    let provider = |task: Task| async move {
        if task.attempt.attempt_no() == 1 {
            std::future::pending::<()>().await;
        }
        fake_provider(task).await
    };
    let gw = start(cfg, provider, true).await;
    let body = json!({"prompt": "a cat", "work_ms": 10});
    let r = gw.post(ALICE, "slow", &body).await;
    assert_eq!(r.status, 201);
    let job = r.job_id();
    gw.wait_for(job, "unknown").await;

    let r = gw.post(ALICE, "slow", &body).await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.problem(), "/problems/outcome-unknown");
    assert_eq!(r.body["state"], "unknown");
    assert_eq!(r.header("retry-after"), Some("30"));

    // Nothing retries it behind the operator's back: no second attempt appears.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sql = gw.sql().await;
    let row = sql
        .query_one(
            "SELECT attempt_id, provider, worker, why FROM intent.attempts_to_reconcile WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap();
    let attempt: Uuid = row.get(0);
    assert_eq!(row.get::<_, String>(1), "gpu-a");
    assert_eq!(row.get::<_, String>(2), "gw-test");
    assert_eq!(row.get::<_, String>(3), "unknown");

    // The operator learns the provider has no record of it and abandons it (runbook); the
    // worker then runs a second attempt and the replay returns its result.
    sql.execute(
        "SELECT intent.abandon_attempt($1, 'provider has no record of it')",
        &[&attempt],
    )
    .await
    .unwrap();
    gw.wait_for(job, "succeeded").await;
    let r = gw.post(ALICE, "slow", &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(r.body["result"]["attempt_no"], 2);
}

/// The gateway's reconciler on a schedule: the worker gives up on a slow provider (the attempt
/// becomes unknown, the client gets `409 outcome-unknown`), the provider finishes anyway, and
/// the reconciler asks it and completes the attempt: the client's retry gets the first
/// attempt's result, and no second attempt ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_completes_an_attempt_the_provider_finished_after_the_timeout() {
    let mut cfg = config();
    cfg.worker.timeout = Duration::from_millis(300);
    cfg.reconciler = ReconcilerConfig {
        every: Duration::from_millis(100),
        name: "gw-reconciler".into(),
        ..ReconcilerConfig::default()
    };
    let provider = FakeProvider::new();
    let mut gw = start(cfg, provider.clone(), true).await;
    let body = json!({"prompt": "a slow cat", "work_ms": 1500});
    let r = gw.post(ALICE, "slow-cat", &body).await;
    assert_eq!(r.status, 201);
    let job = r.job_id();
    gw.wait_for(job, "unknown").await;
    let r = gw.post(ALICE, "slow-cat", &body).await;
    assert_eq!(r.problem(), "/problems/outcome-unknown");

    let reconciler = gw
        .gateway
        .spawn_reconciler_until(provider, std::future::pending())
        .expect("the reconciler is on");
    gw.tasks.push(reconciler);
    gw.wait_for(job, "succeeded").await;
    let r = gw.post(ALICE, "slow-cat", &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["result"]["attempt_no"], 1, "{r:?}");
    let sql = gw.sql().await;
    let attempts: i64 = sql
        .query_one(
            "SELECT count(*) FROM intent.attempts WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);

    // Off, it does not start.
    let mut off = config();
    off.reconciler.enabled = false;
    let quiet = start(off, no_provider, false).await;
    assert!(
        quiet
            .gateway
            .spawn_reconciler_until(FakeProvider::new(), std::future::pending())
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_are_kept_apart() {
    let gw = start(config(), no_provider, false).await;
    let body = json!({"prompt": "a cat"});
    let a = gw.post(ALICE, "k", &body).await;
    let b = gw.post(BOB, "k", &body).await;
    assert_eq!(
        (a.status, b.status),
        (201, 201),
        "one key, two owners, two jobs"
    );
    assert_eq!(a.job_id(), pg_intent_client::job_id("alice", "k").unwrap());
    assert_eq!(b.job_id(), pg_intent_client::job_id("bob", "k").unwrap());

    let alices = a.header("location").unwrap().to_string();
    assert_eq!(gw.get(ALICE, &alices).await.status, 200);
    let r = gw.get(BOB, &alices).await;
    assert_eq!(r.status, 404, "bob cannot read alice's job: {r:?}");
    assert_eq!(r.problem(), "/problems/not-found");
    assert_eq!(gw.get(ALICE, "/jobs/not-a-uuid").await.status, 404);

    // Bob's other body on the same key conflicts with his own job only.
    let r = gw.post(BOB, "k", &json!({"prompt": "a dog"})).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.job_id(), b.job_id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_replays_its_failure() {
    let gw = start(config(), fake_provider, true).await;
    let body = json!({"prompt": "forbidden", "simulate": "fail", "work_ms": 10});
    let r = gw.post(ALICE, "bad", &body).await;
    assert_eq!(r.status, 201);
    gw.wait_for(r.job_id(), "failed").await;
    let r = gw.post(ALICE, "bad", &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(r.body["state"], "failed");
    assert_eq!(r.body["error"]["status"], 400);
    assert!(r.body.get("result").is_none());

    // A rate-limited first attempt is retried by the worker; the job then succeeds.
    let body = json!({"prompt": "busy", "simulate": "busy", "work_ms": 10});
    let r = gw.post(ALICE, "busy", &body).await;
    gw.wait_for(r.job_id(), "succeeded").await;
    let r = gw.post(ALICE, "busy", &body).await;
    assert_eq!(r.body["result"]["attempt_no"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_be_json_the_database_can_store() {
    let gw = start(config(), no_provider, false).await;
    let send = |ct: &'static str, body: Vec<u8>| {
        gw.http
            .post(format!("{}/jobs", gw.base))
            .header("authorization", format!("Bearer {ALICE}"))
            .header("idempotency-key", "\"k\"")
            .header("content-type", ct)
            .body(body)
            .send()
    };
    let r = read(send("text/plain", b"{}".to_vec()).await.unwrap()).await;
    assert_eq!(r.status, 415, "{r:?}");
    assert_eq!(r.problem(), "/problems/unsupported-media-type");

    let r = read(
        send("application/json", b"{not json".to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.problem(), "/problems/invalid-request");

    // Over 1 MiB of params: the database refuses (22023), the gateway says 400 with the code.
    let big = serde_json::to_vec(&json!({"blob": "x".repeat(1_100_000)})).unwrap();
    let r = read(send("application/json", big).await.unwrap()).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.body["sqlstate"], "22023");

    // A NUL in a JSON string cannot be stored in jsonb (22P05): 400 too, never 500.
    let r = read(
        send("application/json", br#"{"p": "a\u0000b"}"#.to_vec())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(gw.job_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_owner_binding_owners_are_still_kept_apart() {
    let mut cfg = config();
    cfg.bind_owner = false;
    let gw = start(cfg, no_provider, false).await;
    let a = gw.post(ALICE, "k", &json!({})).await;
    assert_eq!(a.status, 201);
    let alices = a.header("location").unwrap().to_string();
    assert_eq!(gw.get(ALICE, &alices).await.status, 200);
    assert_eq!(gw.get(BOB, &alices).await.status, 404);
}

/// A provider whose result is as large as the request asks (`result_bytes`), full of characters
/// JSON escapes.
async fn large_provider(task: Task) -> Outcome {
    let n = task.params["result_bytes"].as_u64().unwrap_or(10) as usize;
    let mut blob = String::with_capacity(n + 4);
    for c in "\"\\\n\u{1}é🦀 plain".chars().cycle() {
        if blob.len() >= n {
            break;
        }
        blob.push(c);
    }
    Ok(json!({"blob": blob, "attempt_no": task.attempt.attempt_no()}))
}

/// Stored results of every size, up to several megabytes, come back whole through the
/// gateway's replays and its Location: the bytes the database holds, as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_replay_whole() {
    let gw = start(config(), large_provider, true).await;
    for (i, bytes) in [10u64, 300 * 1024, 3 * 1024 * 1024, 9 * 1024 * 1024]
        .into_iter()
        .enumerate()
    {
        let key = format!("large-{i}");
        let body = json!({"result_bytes": bytes});
        let r = gw.post(ALICE, &key, &body).await;
        assert_eq!(r.status, 201, "{r:?}");
        let job = r.job_id();
        gw.wait_for(job, "succeeded").await;
        let stored: Value = gw
            .sql()
            .await
            .query_one("SELECT result FROM intent.jobs WHERE id = $1", &[&job])
            .await
            .unwrap()
            .get(0);
        assert!(stored["blob"].as_str().unwrap().len() as u64 >= bytes);
        for _ in 0..2 {
            let r = gw.post(ALICE, &key, &body).await;
            assert_eq!(r.status, 200, "{bytes} bytes");
            assert!(
                r.body["result"] == stored,
                "{bytes} bytes: the replay differs"
            );
        }
        let shown = gw.get(ALICE, &format!("/jobs/{job}")).await;
        assert!(
            shown.body["result"] == stored,
            "{bytes} bytes: Location differs"
        );
    }
}

/// The gateway publishes how long it keeps a key (`Idempotency-Key-Retention`, seconds: the
/// database's `intent.retention`), and a key sent again after its finished job was purged is a
/// new job, said so on the `201` (`Idempotency-Key-Expired: true`); its worker purges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_is_published_and_a_key_past_it_is_a_new_job_said_so() {
    let mut cfg = config();
    cfg.worker.purge_every = Some(Duration::from_millis(200));
    let gw = start(cfg, fake_provider, true).await;
    let body = json!({"prompt": "a cat", "work_ms": 10});
    let r = gw.post(ALICE, "kept-a-week", &body).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.header("idempotency-key-retention"), Some("604800"));
    assert!(r.header("idempotency-key-expired").is_none());
    let job = r.job_id();
    gw.wait_for(job, "succeeded").await;
    let r = gw.post(ALICE, "kept-a-week", &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("idempotency-key-retention"), Some("604800"));

    // Eight days later (the worker purges within its period).
    gw.sql()
        .await
        .execute(
            "UPDATE intent.jobs SET created_at = created_at - interval '8 days',
                                    updated_at = updated_at - interval '8 days' WHERE id = $1",
            &[&job],
        )
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            gw.job_count().await == 0
        })
        .await,
        "the gateway's worker never purged the job"
    );
    let r = gw.post(ALICE, "kept-a-week", &body).await;
    assert_eq!(r.status, 201, "a new job, not a replay: {r:?}");
    assert_eq!(r.job_id(), job);
    assert_eq!(r.header("idempotency-key-expired"), Some("true"));
    assert!(r.header("idempotent-replayed").is_none());
}
