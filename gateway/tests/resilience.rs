//! The gateway when things go wrong: the database stops answering, refuses for a moment or is
//! slow; the client is slow or sends too much; the process is told to stop. Real HTTP over
//! loopback, a real cluster, and for the signals the gateway binary as a real process.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{TestDb, eventually, gateway_db};
use pg_intent_gateway::{Config, Gateway, Outcome, Task, WorkerConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
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
    c.http.header_timeout = Duration::from_millis(600);
    c.http.body_timeout = Duration::from_millis(600);
}

fn no_provider(_: Task) -> std::future::Ready<Outcome> {
    panic!("no worker in this test")
}

/// A gateway (no worker) on 127.0.0.1 in front of `database` (a connection string).
struct Gw {
    base: String,
    addr: String,
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
        addr,
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

/// The pids of the `gateway` role's backends waiting for a lock (on the locked jobs) in
/// `intent.submit_job` — a request's, not the worker's claims or heartbeats — once there are `n`.
async fn gateway_backends_waiting(db: &TestDb, n: usize) -> Vec<i32> {
    let c = db.connect().await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = c
            .query(
                "SELECT pid FROM pg_stat_activity
                  WHERE usename = 'gateway' AND datname = current_database()
                    AND wait_event_type = 'Lock' AND query LIKE '%intent.submit_job(%'",
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
    let gw = std::sync::Arc::new(gw);
    let post = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.post("terminated", &json!({"prompt": "a cat"})).await })
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

// ---------------------------------------------------------------------------------------------
// Slow and oversized requests.

/// Reads one HTTP/1.1 response: its status, its head, its body (by Content-Length). `None`
/// when the connection closes first.
async fn read_response(
    stream: &mut (impl tokio::io::AsyncBufRead + Unpin),
) -> Option<(u16, String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match stream.read_line(&mut line).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((status, head, body))
}

/// Whether the peer closes the connection (EOF or reset) within `within`; whatever it sends
/// before (a `408`) is read and skipped.
async fn closed_within(read: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, read.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// A request head, `\r\n\r\n` included, with the test's Idempotency-Key and Content-Type.
fn head(authorization: Option<&str>, framing: &str) -> String {
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    format!(
        "POST /jobs HTTP/1.1\r\nHost: gw\r\n{auth}Idempotency-Key: \"raw\"\r\n\
         Content-Type: application/json\r\n{framing}\r\n"
    )
}

/// A client that sends its request head one byte every 50 ms is cut off after the header
/// timeout; nothing waits on it for longer, and the gateway serves others meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_loris_head_is_cut_off_after_the_header_timeout() {
    let (gw, _db) = on_db(config(), 2).await;
    let (mut read, mut write) = TcpStream::connect(&gw.addr).await.unwrap().into_split();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let head = format!(
            "POST /jobs HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {ALICE}\r\n{}",
            "X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(20)
        );
        for b in head.bytes() {
            if write.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let page = gw.get("/problems/unavailable").await;
    assert_eq!(page.status, 200, "the gateway serves others meanwhile");
    assert!(
        closed_within(&mut read, Duration::from_millis(600 + 2000)).await,
        "the connection is still open after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    trickle.abort();
}

/// A body that stops arriving: `408` once the body timeout has passed, and the connection
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_408_after_the_body_timeout() {
    let (gw, db) = on_db(config(), 2).await;
    let (read, mut write) = TcpStream::connect(&gw.addr).await.unwrap().into_split();
    let started = Instant::now();
    write
        .write_all(head(Some(&format!("Bearer {ALICE}")), "Content-Length: 40\r\n").as_bytes())
        .await
        .unwrap();
    write.write_all(br#"{"prompt": "#).await.unwrap();
    let mut read = BufReader::new(read);
    let (status, head, body) =
        tokio::time::timeout(Duration::from_millis(600 + 2000), read_response(&mut read))
            .await
            .unwrap_or_else(|_| panic!("no answer after {:?}", started.elapsed()))
            .expect("an answer, not a closed connection");
    assert_eq!(status, 408, "{head}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["type"], "/problems/request-timeout", "{body}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(closed_within(&mut read, Duration::from_secs(2)).await);
    drop(write);
    assert_eq!(job_count(&db).await, 0);
}

/// Sends `head` and then up to `bytes` of body (as `chunk` pieces), and waits for the answer,
/// which must come before the client has sent everything it announced.
async fn answer_before_the_body_ends(
    addr: &str,
    head: String,
    chunk: Vec<u8>,
    pieces: usize,
) -> (u16, String, Value) {
    let (read, mut write) = TcpStream::connect(addr).await.unwrap().into_split();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    let writer = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for _ in 0..pieces {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
            counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
        }
        // Everything sent but the end of the body: hold the connection open.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(write);
    });
    let mut read = BufReader::new(read);
    let answer = tokio::time::timeout(Duration::from_secs(5), read_response(&mut read))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer after {} bytes of body",
                sent.load(std::sync::atomic::Ordering::SeqCst)
            )
        })
        .expect("an answer, not a closed connection");
    writer.abort();
    let (status, head, body) = answer;
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, head, body)
}

fn chunk(n: usize) -> Vec<u8> {
    let mut c = format!("{n:x}\r\n").into_bytes();
    c.extend(std::iter::repeat_n(b' ', n));
    c.extend_from_slice(b"\r\n");
    c
}

/// A huge body from a caller who is not authenticated is never read: `401` as soon as the
/// head is in, while the client is still sending (with a Content-Length of 100 MiB, and
/// chunked), and the gateway takes nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_body_without_valid_credentials_is_401_before_it_is_read() {
    let (gw, db) = on_db(config(), 2).await;
    let hundred_mib = "Content-Length: 104857600\r\n";
    let chunked = "Transfer-Encoding: chunked\r\n";
    for (auth, framing, piece) in [
        (Some("Bearer nobody"), hundred_mib, vec![b' '; 64 * 1024]),
        (None, hundred_mib, vec![b' '; 64 * 1024]),
        (Some("Bearer nobody"), chunked, chunk(64 * 1024)),
        (Some("Basic YWxpY2U6eA=="), chunked, chunk(64 * 1024)),
    ] {
        let (status, head, body) =
            answer_before_the_body_ends(&gw.addr, head(auth, framing), piece, 16).await;
        assert_eq!(status, 401, "{auth:?} {framing:?}: {head}{body}");
        assert_eq!(body["type"], "/problems/unauthorized", "{body}");
        assert!(
            head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
    }
    assert_eq!(job_count(&db).await, 0);
}

/// An authenticated body over the size limit: `413` at once when its Content-Length says so,
/// and as soon as the limit is passed when it is chunked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_413() {
    let mut cfg = config();
    cfg.http.max_body_bytes = 256 * 1024;
    let (gw, db) = on_db(cfg, 2).await;
    let alice = format!("Bearer {ALICE}");
    for (framing, piece, pieces) in [
        ("Content-Length: 104857600\r\n", vec![b' '; 64 * 1024], 2),
        ("Transfer-Encoding: chunked\r\n", chunk(64 * 1024), 8),
    ] {
        let (status, head, body) =
            answer_before_the_body_ends(&gw.addr, self::head(Some(&alice), framing), piece, pieces)
                .await;
        assert_eq!(status, 413, "{framing:?}: {head}{body}");
        assert_eq!(body["type"], "/problems/payload-too-large", "{body}");
    }
    // At the limit: read, and refused by nobody.
    let mut body = br#"{"pad": ""#.to_vec();
    body.resize(256 * 1024 - 2, b' ');
    body.extend_from_slice(br#""}"#);
    let res = gw
        .http
        .post(format!("{}/jobs", gw.base))
        .header("authorization", &alice)
        .header("idempotency-key", "\"at-the-limit\"")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(job_count(&db).await, 1);
}

/// Two `Authorization` headers (or two `Content-Type`s, or two Idempotency-Keys) are refused:
/// `400`, never the first one silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_headers_are_400() {
    let (gw, db) = on_db(config(), 2).await;
    let alice = format!("Bearer {ALICE}");
    let cases: [(&str, &[(&str, &str)]); 4] = [
        (
            "two Authorization, the first valid",
            &[
                ("authorization", &alice),
                ("authorization", "Bearer nobody"),
            ],
        ),
        (
            "two Authorization, the same",
            &[("authorization", &alice), ("authorization", &alice)],
        ),
        (
            "two Content-Type",
            &[
                ("authorization", &alice),
                ("content-type", "application/json"),
            ],
        ),
        (
            "two Idempotency-Key",
            &[("authorization", &alice), ("idempotency-key", "\"k\"")],
        ),
    ];
    for (what, headers) in cases {
        let mut req = gw
            .http
            .post(format!("{}/jobs", gw.base))
            .header("idempotency-key", "\"k\"")
            .header("content-type", "application/json")
            .body("{}");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let r = read(req.send().await.unwrap()).await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        let expected = if what.contains("Idempotency") {
            "/problems/idempotency-key-malformed"
        } else {
            "/problems/header-repeated"
        };
        assert_eq!(r.body["type"], expected, "{what}: {r:?}");
    }
    // GET too.
    let res = gw
        .http
        .get(format!("{}/jobs/{}", gw.base, Uuid::nil()))
        .header("authorization", &alice)
        .header("authorization", &alice)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(job_count(&db).await, 0);
}

/// No database: a pool to a port nobody listens on (connected lazily, never here).
const NO_DATABASE: &str = "host=127.0.0.1 port=1 user=x dbname=x";

/// Review finding 6: a client that pipelines requests and never reads the answers. Once the
/// socket buffers are full the gateway's writes block; header_timeout covers reading a head
/// only, so nothing covered that write and the connection (its task, its buffers, its
/// descriptor) lived as long as the client liked, unauthenticated (`GET /problems/…` needs no
/// token). The write timeout closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_off() {
    let mut c = config();
    c.http.write_timeout = Duration::from_secs(1);
    let gw = serve(NO_DATABASE, c, 1).await;
    // A small receive window, so that the gateway's send buffer (a few MiB at most) is what
    // fills: the answers below are tens of MiB.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(gw.addr.parse().unwrap()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    const N: usize = 100_000;
    let writer = tokio::spawn(async move {
        let one = b"GET /problems/unauthorized HTTP/1.1\r\nHost: gw\r\n\r\n";
        for _ in 0..N {
            if write.write_all(one).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    // Three write timeouts, five header timeouts: nothing read.
    let stall = Duration::from_secs(3);
    tokio::time::sleep(stall).await;
    let started = Instant::now();
    let (mut answered, mut bytes) = (0, 0usize);
    let mut buf = vec![0; 1 << 16];
    let mut tail = Vec::new();
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), read.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0) | Err(_)) => break true,
            Ok(Ok(n)) => {
                bytes += n;
                tail.extend_from_slice(&buf[..n]);
                answered += String::from_utf8_lossy(&tail)
                    .matches("HTTP/1.1 200")
                    .count();
                // Keep a little in case a status line is split across reads.
                tail.drain(..tail.len().saturating_sub("HTTP/1.1 200".len() - 1));
            }
        }
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    writer.abort();
    let report = format!(
        "{answered} of {N} pipelined requests answered ({} KiB) after a {stall:?} stall, \
         read in {:?}",
        bytes >> 10,
        started.elapsed()
    );
    eprintln!("{report}");
    assert!(closed, "the connection survived the stall: {report}");
    assert!(answered < N / 2, "{report}");
}

/// Review finding 6: unauthenticated memory. Each connection could hold a head of up to hyper's
/// default buffer (about 400 KiB) for header_timeout, and neither connections nor their buffers
/// were capped: 300 sockets that sent 390 KiB of headers and stopped cost the gateway ~115 MiB.
/// Now a head over max_head_bytes (32 KiB) is answered 431 and its connection closed.
///
/// The process's resident size is measured in a process of its own (this test binary again,
/// running this test alone), so that the other tests' allocations do not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_heads_cannot_hold_much_memory() {
    const ALONE: &str = "PG_INTENT_GATEWAY_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let out = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "unauthenticated_heads_cannot_hold_much_memory",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ALONE, "1")
            .output()
            .await
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        assert!(log.contains("1 passed"), "{log}");
        return;
    }
    let mut c = config();
    c.http.header_timeout = Duration::from_secs(10);
    let gw = serve(NO_DATABASE, c, 1).await;
    let rss = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let head = format!(
        "GET /problems/unauthorized HTTP/1.1\r\nHost: gw\r\n{}",
        format!("X-Pad: {}\r\n", "a".repeat(120)).repeat(390 * 1024 / 128)
    );
    let head: &'static [u8] = Box::leak(head.into_bytes().into_boxed_slice());
    let before = rss();
    let mut socks = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(&gw.addr).await.unwrap();
        // The gateway stops reading (and closes) long before the end: the write may fail.
        let _ = tokio::time::timeout(Duration::from_secs(2), s.write_all(head)).await;
        socks.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grown = rss().saturating_sub(before);
    // Each is answered 431 (or reset, which may drop the answer) and closed, at once.
    let mut open = 0;
    for s in &mut socks {
        let mut got = Vec::new();
        let ended = loop {
            let mut buf = [0; 1024];
            match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                Err(_) => break false,
                Ok(Ok(0) | Err(_)) => break true,
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            }
        };
        let status = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || status.starts_with("HTTP/1.1 431"),
            "{status}"
        );
        open += usize::from(!ended);
    }
    eprintln!(
        "{} connections, no token: the process grew by {} MiB",
        socks.len(),
        grown >> 20
    );
    assert_eq!(open, 0, "heads over the limit keep their connections");
    assert!(
        grown < 32 << 20,
        "300 unauthenticated connections hold {} MiB",
        grown >> 20
    );
}

/// A head within max_head_bytes is served; one over it is answered 431.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_max_head_bytes_is_431() {
    let gw = serve(NO_DATABASE, config(), 1).await;
    for (pad, status) in [(20 * 1024, 200), (40 * 1024, 431)] {
        let mut s = BufReader::new(TcpStream::connect(&gw.addr).await.unwrap());
        let head = format!(
            "GET /problems/unauthorized HTTP/1.1\r\nHost: gw\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(pad)
        );
        let _ = s.get_mut().write_all(head.as_bytes()).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), read_response(&mut s))
            .await
            .unwrap();
        assert_eq!(answer.map(|a| a.0), Some(status), "a {pad}-byte header");
    }
}

/// At most max_connections are served at once; the next waits until one closes, then is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_wait_for_a_free_one() {
    let mut c = config();
    c.http.max_connections = 2;
    c.http.header_timeout = Duration::from_secs(10);
    let gw = serve(NO_DATABASE, c, 1).await;
    let idle = [
        TcpStream::connect(&gw.addr).await.unwrap(),
        TcpStream::connect(&gw.addr).await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = BufReader::new(TcpStream::connect(&gw.addr).await.unwrap());
    third
        .get_mut()
        .write_all(b"GET /problems/unauthorized HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(700), read_response(&mut third))
            .await
            .is_err(),
        "a third connection was served beside two"
    );
    let [first, _second] = idle;
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(3), read_response(&mut third))
        .await
        .expect("served once a slot is free");
    assert_eq!(answer.map(|a| a.0), Some(200));
}

// ---------------------------------------------------------------------------------------------
// SIGTERM and SIGINT: the gateway binary as a real process.

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// The shutdown grace of the process in the signal tests.
const GRACE: Duration = Duration::from_secs(3);

/// The gateway binary, serving `db` on a port of its choosing, with its worker.
struct Process {
    child: tokio::process::Child,
    addr: String,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Process {
    async fn start(db: &TestDb) -> Process {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pg_intent_gateway"))
            .env("DATABASE_URL", db.cluster.conn_str_as(&db.name, "gateway"))
            .env("GATEWAY_LISTEN", "127.0.0.1:0")
            .env("GATEWAY_TOKENS", format!("{ALICE}=alice"))
            .env("GATEWAY_PROVIDERS", "gpu-a")
            .env("GATEWAY_GRACE", format!("{}s", GRACE.as_secs()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the gateway binary");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let addr = loop {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("the gateway says where it listens")
                .unwrap()
                .unwrap_or_else(|| panic!("the gateway exited: {}", log.lock().unwrap()));
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(addr) = line.split("listening on ").nth(1) {
                break addr.trim().to_string();
            }
        };
        let collected = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                collected.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Process { child, addr, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

async fn post_to(addr: &str, key: &str, body: &Value) -> Result<Resp, reqwest::Error> {
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/jobs"))
        .header("authorization", format!("Bearer {ALICE}"))
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .timeout(Duration::from_secs(20))
        .send()
        .await?;
    Ok(read(res).await)
}

/// On `sig`, the gateway stops accepting connections, finishes the request in flight, lets the
/// attempt that ends within the grace period finish, marks the other `unknown` with the
/// shutdown reason, and exits 0 — all within the grace period and a margin.
async fn drains_on(sig: &str) {
    let db = gateway_db().await;
    let mut gw = Process::start(&db).await;
    let long = post_to(&gw.addr, "long", &json!({"work_ms": 60_000}))
        .await
        .unwrap();
    let short = post_to(&gw.addr, "short", &json!({"work_ms": 1_200}))
        .await
        .unwrap();
    assert_eq!(
        (long.status, short.status),
        (201, 201),
        "{long:?} {short:?}"
    );
    let (long, short) = (
        long.body["job_id"]
            .as_str()
            .unwrap()
            .parse::<Uuid>()
            .unwrap(),
        short.body["job_id"]
            .as_str()
            .unwrap()
            .parse::<Uuid>()
            .unwrap(),
    );
    let c = db.connect().await;
    let running = eventually(Duration::from_secs(10), || {
        let c = &c;
        async move {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM intent.attempts WHERE state = 'started'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n == 2
        }
    })
    .await;
    assert!(running, "both attempts start: {}", gw.log());

    // A request in flight when the signal comes: it waits for a lock in the database.
    let lock = JobsLocked::take(&db).await;
    let in_flight = {
        let addr = gw.addr.clone();
        tokio::spawn(async move { post_to(&addr, "in-flight", &json!({})).await })
    };
    gateway_backends_waiting(&db, 1).await;
    let pid = gw.child.id().unwrap();
    signal(pid, sig);
    let signalled = Instant::now();

    // No new connections.
    let refused = eventually(Duration::from_secs(5), || {
        let addr = gw.addr.clone();
        async move { TcpStream::connect(&addr).await.is_err() }
    })
    .await;
    assert!(refused, "still accepting after {sig}: {}", gw.log());
    lock.release().await;
    let r = in_flight
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the request in flight was dropped: {e}\n{}", gw.log()));
    assert_eq!(r.status, 201, "{r:?}");

    let status = tokio::time::timeout(GRACE + Duration::from_secs(8), gw.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "still running {:?} after {sig}: {}",
                signalled.elapsed(),
                gw.log()
            )
        })
        .unwrap();
    assert!(
        status.success(),
        "exit status {status:?} after {sig}: {}",
        gw.log()
    );
    let took = signalled.elapsed();
    assert!(
        took >= GRACE - Duration::from_millis(200),
        "exited after {took:?}, before the grace period was over"
    );

    // The short attempt finished within the grace period; the long one is unknown, with the
    // shutdown reason.
    let state = |job: Uuid| {
        let c = &c;
        async move {
            let s: String = c
                .query_one("SELECT state::text FROM intent.jobs WHERE id = $1", &[&job])
                .await
                .unwrap()
                .get(0);
            s
        }
    };
    assert_eq!(state(short).await, "succeeded", "{}", gw.log());
    assert_eq!(state(long).await, "unknown", "{}", gw.log());
    let reason: Option<String> = c
        .query_one(
            "SELECT e.detail->>'reason' FROM intent.events e JOIN intent.attempts a ON a.id = e.attempt_id
              WHERE a.job_id = $1 AND e.kind = 'timeout'",
            &[&long],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        reason.as_deref(),
        Some(pg_intent_client::runner::SHUTDOWN_REASON)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_0() {
    drains_on("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_and_exits_0() {
    drains_on("INT").await;
}

/// Review finding 12: the gateway binds its port before its worker starts. If the bind fails
/// (the port is taken) the process exits non-zero, and it has claimed nothing: it never even
/// connected to the database, whose attempts it would otherwise have left `started` (killed
/// with the process). The "database" here is a listener that counts connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_exits_non_zero_before_the_worker_claims_anything() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let database = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let db_port = database.local_addr().unwrap().port();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    let db = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = database.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(s);
        }
    });
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pg_intent_gateway"))
        .env(
            "DATABASE_URL",
            format!("host=127.0.0.1 port={db_port} user=gateway dbname=app"),
        )
        .env("GATEWAY_LISTEN", taken.local_addr().unwrap().to_string())
        .env("GATEWAY_TOKENS", format!("{ALICE}=alice"))
        .env("GATEWAY_PROVIDERS", "gpu-a")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the gateway binary");
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the gateway exits when its port is taken")
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}: {log}", out.status);
    // Give a worker that was started the time to reach its database.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the worker reached the database before the bind failed: {log}"
    );
    db.abort();
    drop(taken);
}
