//! An HTTP gateway in front of pg_intent: the `Idempotency-Key` header
//! (draft-ietf-httpapi-idempotency-key-header) mapped straight onto `intent.submit_job`, and a
//! worker that runs the attempts.
//!
//! | request | answer |
//! |---|---|
//! | no or unknown `Authorization: Bearer …` | `401`, before the body is read |
//! | two `Authorization` (or `Content-Type`) headers | `400` problem `header-repeated` |
//! | no `Idempotency-Key` | `400` problem `idempotency-key-missing` |
//! | a key that is not one quoted string of 1–255 characters | `400` problem `idempotency-key-malformed` |
//! | a new key | `201 Created`, `Location: /jobs/{job_id}` |
//! | the same key and body, job finished | `200 OK`, the stored outcome, `Idempotent-Replayed: true` |
//! | the same key and body, job pending or running | `409` problem `request-in-flight`, `Retry-After` |
//! | the same key and body, outcome unknown | `409` problem `outcome-unknown`, `Retry-After` |
//! | the same key, another body or provider | `422` problem `idempotency-key-reused` (`IJ001`) |
//! | a body over [`HttpConfig::max_body_bytes`] | `413` problem `payload-too-large` |
//! | a body slower than [`HttpConfig::body_timeout`] | `408` problem `request-timeout` |
//! | a head over [`HttpConfig::max_head_bytes`] | `431`, the connection closed |
//! | the database unreachable, too slow ([`DatabaseConfig`]) or transient (57P01, 57014, 08…) | `503` problem `unavailable`, `Retry-After` |
//!
//! The owner of a job is the authenticated caller, never something the body says; the job is
//! `(owner, key)`, so two callers may use the same key. Bodies are compared as `jsonb` (key order
//! and whitespace do not matter). Errors are `application/problem+json` with the SQLSTATE.
//!
//! The gateway is stateless: every decision above is the database's, so any number of gateway
//! processes can serve the same keys, and two identical requests at once get one `201` and one
//! `409` (or `200`), never two `201`s.

pub mod key;
pub mod problem;
mod reconciler;
mod worker;
mod write_timeout;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
    Timeouts,
};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pg_intent_client::pg_intent_protocol::sqlstate;
use pg_intent_client::{self as intent, Attempt, JobState, NewJob, Submitted, WorkError};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::key::KeyError;
use crate::problem::{Kind, Problem};
pub use crate::reconciler::{FakeProvider, ReconcilerConfig};

/// The smallest [`HttpConfig::max_head_bytes`] (hyper's smallest buffer): 8 KiB.
pub const MIN_HEAD_BYTES: usize = 8 * 1024;

/// The response header that marks a replay: the stored outcome of an earlier request with the
/// same key, not a new execution (the name Stripe's API made common).
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How the worker runs attempts.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Written to `intent.attempts.worker`.
    pub name: String,
    /// How many attempts run at once.
    pub concurrency: usize,
    /// The gateway's own timeout for one provider call: when it fires the attempt becomes
    /// `unknown` (never `failed`).
    pub timeout: Duration,
    /// The lease of each attempt; heartbeats extend it while the provider works.
    pub lease: Duration,
    /// How often to claim when nothing woke the worker: a fallback, since a job created by
    /// this process wakes it at once, and so does `NOTIFY intent_claimable` with `listen`.
    pub poll_every: Duration,
    /// The connection to `LISTEN` on for `intent_claimable` (its own, outside the pool);
    /// `None`: no `LISTEN`, only this process's own jobs wake the worker, and the poll.
    pub listen: Option<tokio_postgres::Config>,
    /// On shutdown, how long running attempts may still finish before they are marked
    /// `unknown`.
    pub grace: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            name: "gateway".into(),
            concurrency: 4,
            timeout: Duration::from_secs(60),
            lease: Duration::from_secs(15),
            poll_every: Duration::from_secs(1),
            listen: None,
            grace: Duration::from_secs(20),
        }
    }
}

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bearer token → owner. A static map is enough for an example; a real gateway verifies a
    /// signed token and takes the owner from its subject.
    pub tokens: HashMap<String, String>,
    /// The provider of `POST /jobs`.
    pub default_provider: String,
    /// The providers `POST /providers/{provider}/jobs` accepts.
    pub providers: Vec<String>,
    /// Binds each request's transaction to its owner (`SET LOCAL intent.owner_id`), so that
    /// the database itself keeps owners apart. Needs `GRANT SET ON PARAMETER intent.owner_id`
    /// to the gateway's role.
    pub bind_owner: bool,
    /// `max_attempts` of new jobs.
    pub max_attempts: u16,
    /// `Retry-After` of a `409` while the job is pending or running, in seconds.
    pub in_flight_retry_after: u32,
    /// `Retry-After` of a `409` while the outcome is unknown, in seconds.
    pub unknown_retry_after: u32,
    /// `Retry-After` of a `503` (the database unreachable, too slow, or asking for a retry
    /// later), in seconds. Default 2.
    pub unavailable_retry_after: u32,
    /// How long the gateway waits for its database.
    pub database: DatabaseConfig,
    /// How long, and how much, the gateway reads of a request.
    pub http: HttpConfig,
    /// The worker.
    pub worker: WorkerConfig,
    /// The reconciler ([`Gateway::spawn_reconciler_until`]).
    pub reconciler: ReconcilerConfig,
}

/// How long a request waits for the database before it is answered `503` + `Retry-After`.
/// Each bound holds whatever the server does, so no request hangs on a database that stopped
/// answering.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// How long a request waits for a free connection of the pool (deadpool's `wait`).
    /// Default 2 s. The worker's own connections wait as long as it takes: a claimed attempt
    /// must get one to heartbeat and report.
    pub wait_timeout: Duration,
    /// How long opening a connection may take: the TCP connect (tokio-postgres'
    /// `connect_timeout`, unless the connection string sets one) and the whole startup with
    /// authentication (deadpool's `create`). Default 5 s. Applies to the worker's too.
    pub connect_timeout: Duration,
    /// How long recycling a pooled connection may take (deadpool's `recycle`). Default 2 s.
    pub recycle_timeout: Duration,
    /// `SET LOCAL statement_timeout` of each request's transaction: the server cancels a
    /// statement that runs (or waits for a lock) longer, `57014`. Default 5 s; zero leaves the
    /// server's setting. Per transaction, so the worker's connections of the same pool are not
    /// bound by it.
    pub statement_timeout: Duration,
    /// The gateway's own bound on a request's whole transaction, for a server that stopped
    /// answering (where `statement_timeout` cannot fire): past it the connection is closed,
    /// never handed to another request. Default 10 s; keep it above `statement_timeout`.
    pub transaction_timeout: Duration,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            wait_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            recycle_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            transaction_timeout: Duration::from_secs(10),
        }
    }
}

/// How the gateway reads requests.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// How long a connection may take to send a request's head (the request line and the
    /// headers), and how long a kept-alive connection may stay idle: past it the connection
    /// is closed (hyper's `header_read_timeout`). Default 10 s.
    pub header_timeout: Duration,
    /// How long the body of a `POST` may take to arrive once the head is in: past it, `408`
    /// and the connection is closed. Default 30 s.
    pub body_timeout: Duration,
    /// The largest body the gateway reads: a larger `Content-Length` is `413` at once, a
    /// chunked body as soon as it passes the limit. Default 2 MiB (the database stores params
    /// up to 1 MiB and says `22023` beyond).
    pub max_body_bytes: usize,
    /// The largest request head (request line and headers) the gateway reads: a larger one is
    /// answered `431` and the connection closed. It also caps each connection's read and write
    /// buffers (hyper's `max_buf_size`, ~400 KiB by default), which is what an unauthenticated
    /// connection can make the gateway hold. Default 32 KiB; at least 8 KiB (hyper's minimum:
    /// a smaller value counts as 8 KiB).
    pub max_head_bytes: usize,
    /// How long a write to a connection may stay pending without any progress (the client
    /// reads nothing, and the socket buffers are full): past it the connection is closed.
    /// Default 30 s; zero: no limit. A client that reads slowly but steadily is not cut off:
    /// [`HttpConfig::max_connections`] bounds how many can.
    pub write_timeout: Duration,
    /// How many connections are served at once. Beyond it the gateway accepts no more until
    /// one closes: new connections wait in the kernel's listen backlog (and are refused by the
    /// kernel once it is full). Each connection is bounded by the timeouts above, so the slots
    /// come back. Default 1024; at least 1.
    pub max_connections: usize,
    /// On shutdown, how long requests in flight may still finish; then their connections are
    /// closed. Default 20 s.
    pub drain_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_body_bytes: 2 * 1024 * 1024,
            max_head_bytes: 32 * 1024,
            write_timeout: Duration::from_secs(30),
            max_connections: 1024,
            drain_timeout: Duration::from_secs(20),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tokens: HashMap::new(),
            default_provider: "gpu-a".into(),
            providers: vec!["gpu-a".into()],
            bind_owner: true,
            max_attempts: 3,
            in_flight_retry_after: 1,
            unknown_retry_after: 30,
            unavailable_retry_after: problem::UNAVAILABLE_RETRY_AFTER,
            database: DatabaseConfig::default(),
            http: HttpConfig::default(),
            worker: WorkerConfig::default(),
            reconciler: ReconcilerConfig::default(),
        }
    }
}

/// What the worker hands the provider: the attempt (its id is the provider-side idempotency
/// key, so a reconciler can later ask the provider what became of it), the provider, and the
/// job's params.
#[derive(Debug, Clone)]
pub struct Task {
    /// The attempt.
    pub attempt: Attempt,
    /// The provider to call.
    pub provider: String,
    /// The job's params (the request body).
    pub params: Value,
}

/// How a provider call ends: a result, a definite failure, or an unknown outcome.
pub type Outcome = Result<Value, WorkError<Value>>;

/// A boxed provider call.
pub type BoxOutcome = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Calls a provider. Any `Fn(Task) -> impl Future<Output = Outcome>` is one.
pub trait Provider: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, task: Task) -> BoxOutcome;
}

impl<F, Fut> Provider for F
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn call(&self, task: Task) -> BoxOutcome {
        Box::pin(self(task))
    }
}

/// A stand-in for a GPU provider, driven by the params:
/// `"work_ms"` how long it works (default 200), `"simulate"`: `"hang"` never answers (the
/// worker's timeout makes the attempt `unknown`), `"fail"` refuses for good (a definite
/// failure), `"busy"` is rate-limited on the first attempt (a retryable failure).
pub async fn fake_provider(task: Task) -> Outcome {
    let work = Duration::from_millis(task.params["work_ms"].as_u64().unwrap_or(200));
    tokio::time::sleep(work).await;
    match task.params["simulate"].as_str() {
        Some("hang") => std::future::pending().await,
        Some("fail") => Err(WorkError::permanent(json!({
            "provider": task.provider, "status": 400, "message": "prompt refused"
        }))),
        Some("busy") if task.attempt.attempt_no() == 1 => Err(WorkError::retryable(json!({
            "provider": task.provider, "status": 429, "message": "rate limited"
        }))),
        _ => Ok(json!({
            "image": format!("blob://images/{}.png", task.attempt.id()),
            "provider": task.provider,
            "attempt_no": task.attempt.attempt_no(),
        })),
    }
}

/// A deadpool pool for `config` (a tokio-postgres connection string or URL), with the default
/// [`DatabaseConfig`]'s timeouts.
pub fn pool(config: &str, max_size: usize) -> Result<Pool, Box<dyn std::error::Error>> {
    pool_with(config, max_size, &DatabaseConfig::default())
}

/// A deadpool pool for `config` with the connect and recycle timeouts of `db` (on the tokio
/// runtime, which deadpool needs for timeouts). Its own wait timeout is none: that is the
/// worker's, which must not give up on a connection for an attempt it has claimed; requests
/// wait at most [`DatabaseConfig::wait_timeout`].
pub fn pool_with(
    config: &str,
    max_size: usize,
    db: &DatabaseConfig,
) -> Result<Pool, Box<dyn std::error::Error>> {
    let mut pg: tokio_postgres::Config = config.parse()?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(db.connect_timeout);
    }
    let manager = Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(None)
        .create_timeout(Some(db.connect_timeout))
        .recycle_timeout(Some(db.recycle_timeout))
        .build()?)
}

/// Where a job is: `/jobs/{job_id}`.
pub fn job_location(job_id: Uuid) -> String {
    format!("/jobs/{job_id}")
}

/// The gateway: cheap to clone, shared by the handlers and the worker.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    config: Config,
    provider: Arc<dyn Provider>,
    /// Wakes the worker when a job is created.
    wake: Arc<tokio::sync::Notify>,
}

impl Gateway {
    /// A gateway on `pool` whose worker calls `provider`.
    pub fn new(pool: Pool, config: Config, provider: impl Provider) -> Gateway {
        Gateway {
            inner: Arc::new(Inner {
                pool,
                config,
                provider: Arc::new(provider),
                wake: Arc::new(tokio::sync::Notify::new()),
            }),
        }
    }

    /// The routes: `POST /jobs`, `POST /providers/{provider}/jobs`, `GET /jobs/{job_id}`,
    /// `GET /problems/{slug}`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/jobs", post(create))
            .route("/providers/{provider}/jobs", post(create_on))
            .route("/jobs/{job_id}", get(show))
            .route("/problems/{slug}", get(explain))
            .with_state(self.clone())
    }

    /// Serves the routes on `listener` (HTTP/1.1) until `shutdown` resolves, then stops
    /// accepting, lets the requests in flight finish within [`HttpConfig::drain_timeout`]
    /// (idle kept-alive connections are closed at once) and returns.
    ///
    /// A connection that takes longer than [`HttpConfig::header_timeout`] to send a request
    /// head, or stays idle that long, is closed; so is one whose head is larger than
    /// [`HttpConfig::max_head_bytes`] (after a `431`), and one that reads none of its answers
    /// for [`HttpConfig::write_timeout`]. At most [`HttpConfig::max_connections`] are served at
    /// once: beyond it the listener accepts no more until one closes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let http = self.config().http.clone();
        let router = self.router();
        let mut builder = hyper::server::conn::http1::Builder::new();
        let head = http.max_head_bytes.max(MIN_HEAD_BYTES);
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(http.header_timeout)
            // Both: the head limit answers 431, the buffer limit caps what a connection holds.
            .max_header_size(head)
            .max_buf_size(head);
        let slots = Arc::new(tokio::sync::Semaphore::new(
            http.max_connections
                .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        ));
        // Dropped on shutdown: every connection is then told to finish its request and close.
        let (draining, drain) = tokio::sync::watch::channel(());
        let mut connections = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            // A slot first: at the limit, nothing more is accepted until a connection closes.
            let slot = tokio::select! {
                biased;
                () = &mut shutdown => break,
                slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let stream = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: do not spin.
                        log(&format!("accept: {e}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let conn = builder.serve_connection(
                hyper_util::rt::TokioIo::new(write_timeout::WriteTimeout::new(
                    stream,
                    http.write_timeout,
                )),
                hyper_util::service::TowerToHyperService::new(router.clone()),
            );
            let mut drain = drain.clone();
            connections.spawn(async move {
                let _slot = slot;
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = drain.changed() => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
            while connections.try_join_next().is_some() {}
        }
        drop(listener);
        drop(draining);
        let drained = tokio::time::timeout(http.drain_timeout, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            log(&format!(
                "{} connection(s) still busy after {:?}: closed",
                connections.len(),
                http.drain_timeout
            ));
            connections.shutdown().await;
        }
        Ok(())
    }

    /// Starts the worker: a [`pg_intent_client::Runner`] that claims the attempts of claimable
    /// jobs and runs them. Abort the handle to stop it at once (its attempts stay `started` and
    /// lapse with their lease); [`Gateway::spawn_worker_until`] stops it gracefully.
    pub fn spawn_worker(&self) -> tokio::task::JoinHandle<()> {
        self.spawn_worker_until(std::future::pending())
    }

    /// Starts the worker until `shutdown` resolves: then it stops claiming, lets running
    /// attempts finish within [`WorkerConfig::grace`] and marks the rest `unknown`.
    pub fn spawn_worker_until(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let gw = self.clone();
        tokio::spawn(async move { gw.work(shutdown).await })
    }

    fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The owner named by the request's bearer token: from the headers alone, before any of
    /// the body is read.
    fn owner(&self, headers: &HeaderMap) -> Result<String, Problem> {
        let unauthorized = |why: &str| Problem::new(Kind::Unauthorized, why);
        let value = single(headers, &AUTHORIZATION)?
            .ok_or_else(|| unauthorized("The request has no Authorization header."))?
            .to_str()
            .map_err(|_| unauthorized("The Authorization header is not ASCII."))?;
        let (scheme, token) = value
            .split_once(' ')
            .ok_or_else(|| unauthorized("Authorization must be `Bearer <token>`."))?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(unauthorized("Authorization must be `Bearer <token>`."));
        }
        self.config()
            .tokens
            .get(token.trim())
            .cloned()
            .ok_or_else(|| unauthorized("The bearer token is not known."))
    }

    /// The answer to a problem: a `503` carries the configured `Retry-After`.
    fn answer(&self, mut p: Problem) -> Response {
        if p.kind == Kind::Unavailable {
            p.retry_after = Some(self.config().unavailable_retry_after);
        }
        p.into_response()
    }

    /// `POST`: one job per (owner, Idempotency-Key). `provider` is `None` for the default one.
    async fn submit(&self, provider: Option<String>, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        // Whether the client may still be sending a body nobody will read.
        let unread = !body.is_end_stream();
        let (mut res, body_read) = match self.try_submit(&parts.headers, provider, body).await {
            Ok(res) => (res, true),
            Err((p, body_read)) => (self.answer(p), body_read),
        };
        if unread && !body_read {
            // Answered without the body: hyper closes the connection rather than read the
            // rest; say so.
            res.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }

    /// The answer, or the problem and whether the body was read whole.
    async fn try_submit(
        &self,
        headers: &HeaderMap,
        provider: Option<String>,
        body: Body,
    ) -> Result<Response, (Problem, bool)> {
        let unread = |p: Problem| (p, false);
        // Everything the head decides, before any of the body is read.
        let owner = self.owner(headers).map_err(unread)?;
        let provider = match provider {
            None => self.config().default_provider.clone(),
            Some(p) if self.config().providers.contains(&p) => p,
            Some(p) => {
                return Err(unread(Problem::new(
                    Kind::NotFound,
                    format!("There is no provider {p:?}."),
                )));
            }
        };
        let key = key::idempotency_key(headers)
            .map_err(|e| match e {
                KeyError::Missing => Problem::new(
                    Kind::KeyMissing,
                    "This operation is idempotent and requires an Idempotency-Key header.",
                ),
                KeyError::Malformed(why) => Problem::new(Kind::KeyMalformed, why),
            })
            .map_err(unread)?;
        if !is_json(single(headers, &CONTENT_TYPE).map_err(unread)?) {
            return Err(unread(Problem::new(
                Kind::UnsupportedMediaType,
                "The body must be sent as Content-Type: application/json.",
            )));
        }
        let body = self.read_body(headers, body).await?;
        let read = |p: Problem| (p, true);
        let params: Value = serde_json::from_slice(&body)
            .map_err(|e| Problem::new(Kind::InvalidRequest, format!("The body is not JSON: {e}.")))
            .map_err(read)?;

        let conn = self.connection().await.map_err(read)?;
        let (job, error) = self
            .bounded(conn, async |conn| {
                let tx = self.begin(conn, &owner).await?;
                let job: Submitted<Value> = intent::submit_job(
                    &tx,
                    &NewJob::new(&owner, &key, &provider, &params)
                        .max_attempts(self.config().max_attempts),
                )
                .await?;
                // A failed job's error is not part of submit_job's answer: read it with the
                // row.
                let error = if job.state == JobState::Failed {
                    intent::get_job(&tx, job.job_id)
                        .await?
                        .and_then(|j| j.error)
                } else {
                    None
                };
                tx.commit().await.map_err(db_problem)?;
                Ok((job, error))
            })
            .await
            .map_err(read)?;

        if job.created {
            self.inner.wake.notify_one();
            let mut res = (
                StatusCode::CREATED,
                axum::Json(representation(job.job_id, job.state, None, None)),
            )
                .into_response();
            set_location(&mut res, job.job_id);
            return Ok(res);
        }
        match job.state {
            JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
                let mut res = (
                    StatusCode::OK,
                    axum::Json(representation(job.job_id, job.state, job.result, error)),
                )
                    .into_response();
                set_location(&mut res, job.job_id);
                res.headers_mut()
                    .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                Ok(res)
            }
            JobState::Pending | JobState::Running => Err(read(Problem::new(
                Kind::InFlight,
                format!(
                    "Job {} of this Idempotency-Key is {}: the first request is still being processed.",
                    job.job_id, job.state
                ),
            )
            .job(job.job_id)
            .with("state", job.state.as_str())
            .retry_after(self.config().in_flight_retry_after))),
            JobState::Unknown => Err(read(Problem::new(
                Kind::OutcomeUnknown,
                format!(
                    "Job {}: the provider did not answer in time and may still have done the work; it is being reconciled.",
                    job.job_id
                ),
            )
            .job(job.job_id)
            .with("state", job.state.as_str())
            .retry_after(self.config().unknown_retry_after))),
        }
    }

    /// The body, at most [`HttpConfig::max_body_bytes`] of it, within
    /// [`HttpConfig::body_timeout`]. A problem is never answered after the whole body.
    async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, (Problem, bool)> {
        let http = &self.config().http;
        let too_large = || {
            Problem::new(
                Kind::PayloadTooLarge,
                format!(
                    "The body is larger than the {} bytes this gateway reads.",
                    http.max_body_bytes
                ),
            )
        };
        let length = single(headers, &CONTENT_LENGTH)
            .map_err(|p| (p, false))?
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if length.is_some_and(|n| n > http.max_body_bytes as u64) {
            return Err((too_large(), false));
        }
        let limited = Limited::new(body, http.max_body_bytes);
        match tokio::time::timeout(http.body_timeout, limited.collect()).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) if e.is::<LengthLimitError>() => Err((too_large(), false)),
            // The client went away or sent a broken body: nobody reads this answer.
            Ok(Err(e)) => Err((
                Problem::new(
                    Kind::InvalidRequest,
                    format!("The body could not be read: {e}."),
                ),
                false,
            )),
            Err(_) => Err((
                Problem::new(
                    Kind::RequestTimeout,
                    format!(
                        "The body did not arrive within {:?}; nothing was written.",
                        http.body_timeout
                    ),
                ),
                false,
            )),
        }
    }

    /// `GET /jobs/{job_id}`: the job, if it is the caller's.
    async fn try_show(&self, headers: &HeaderMap, job_id: &str) -> Result<Response, Problem> {
        let owner = self.owner(headers)?;
        let not_found = || Problem::new(Kind::NotFound, format!("There is no job {job_id}."));
        let job_id = Uuid::parse_str(job_id).map_err(|_| not_found())?;
        let conn = self.connection().await?;
        let job = self
            .bounded(conn, async |conn| {
                let tx = self.begin(conn, &owner).await?;
                let job = intent::get_job(&tx, job_id).await?;
                tx.commit().await.map_err(db_problem)?;
                Ok(job)
            })
            .await?;
        // Bound, the database shows no other owner's job; unbound, this check is the only one.
        let job = job.filter(|j| j.owner_id == owner).ok_or_else(not_found)?;
        Ok(axum::Json(representation(job.id, job.state, job.result, job.error)).into_response())
    }

    /// A connection of the pool for a request, within the wait, connect and recycle timeouts.
    async fn connection(&self) -> Result<Object, Problem> {
        let db = &self.config().database;
        let timeouts = Timeouts {
            wait: Some(db.wait_timeout),
            create: Some(db.connect_timeout),
            recycle: Some(db.recycle_timeout),
        };
        let got = match self.inner.pool.timeout_get(&timeouts).await {
            // A pool built without a runtime cannot time out by itself.
            Err(PoolError::NoRuntimeSpecified) => {
                let bound = db.wait_timeout + db.connect_timeout + db.recycle_timeout;
                tokio::time::timeout(bound, self.inner.pool.get())
                    .await
                    .unwrap_or(Err(PoolError::Timeout(TimeoutType::Wait)))
            }
            got => got,
        };
        got.map_err(|e| {
            log(&format!("no database connection: {e}"));
            let detail = match e {
                PoolError::Timeout(TimeoutType::Wait) => format!(
                    "No database connection was free within {:?}.",
                    db.wait_timeout
                ),
                PoolError::Timeout(TimeoutType::Create) => format!(
                    "The database did not accept a connection within {:?}.",
                    db.connect_timeout
                ),
                PoolError::Timeout(TimeoutType::Recycle) => format!(
                    "A database connection could not be checked within {:?}.",
                    db.recycle_timeout
                ),
                _ => "The database cannot be reached.".to_string(),
            };
            Problem::new(Kind::Unavailable, detail)
        })
    }

    /// Runs a request's transaction on `conn` within [`DatabaseConfig::transaction_timeout`].
    /// Past it the connection is taken out of the pool and closed: it may be stuck in the
    /// middle of a statement, and must not serve another request. So is a connection whose
    /// transaction ended in a `503`.
    async fn bounded<T>(
        &self,
        mut conn: Object,
        work: impl AsyncFnOnce(&mut Object) -> Result<T, Problem>,
    ) -> Result<T, Problem> {
        let limit = self.config().database.transaction_timeout;
        match tokio::time::timeout(limit, work(&mut conn)).await {
            Ok(Err(p)) if p.kind == Kind::Unavailable => {
                // The connection may be the broken one (its backend terminated, the server
                // restarting): the retry must not get it back from the pool before its
                // closing is noticed. A new one costs a connect.
                drop(Object::take(conn));
                Err(p)
            }
            Ok(done) => done,
            Err(_) => {
                drop(Object::take(conn));
                log(&format!(
                    "the database did not answer within {limit:?}: connection closed"
                ));
                Err(Problem::new(
                    Kind::Unavailable,
                    format!("The database did not answer within {limit:?}."),
                ))
            }
        }
    }

    /// Begins a request's transaction: its statement timeout, and its owner binding.
    async fn begin<'c>(
        &self,
        conn: &'c mut Object,
        owner: &str,
    ) -> Result<deadpool_postgres::Transaction<'c>, Problem> {
        let tx = conn.transaction().await.map_err(db_problem)?;
        let timeout = self.config().database.statement_timeout;
        if !timeout.is_zero() {
            // SET LOCAL: it ends with the transaction, and the pooled connection (which the
            // worker may use next) keeps the server's setting.
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {}",
                timeout.as_millis().max(1)
            ))
            .await
            .map_err(db_problem)?;
        }
        if self.config().bind_owner {
            intent::bind_owner(&tx, owner).await?;
        }
        Ok(tx)
    }
}

/// The one value of a header that must appear at most once: two `Authorization` headers
/// leave the caller ambiguous, so the request is refused rather than the first one believed.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, Problem> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    let more = values.count();
    if more > 0 {
        return Err(Problem::new(
            Kind::HeaderRepeated,
            format!(
                "The request has {} {name} headers; send exactly one.",
                more + 1
            ),
        ));
    }
    Ok(first)
}

/// The JSON of a job.
fn representation(
    job_id: Uuid,
    state: JobState,
    result: Option<Value>,
    error: Option<Value>,
) -> Value {
    let mut v = json!({"job_id": job_id, "state": state.as_str()});
    if let Some(r) = result {
        v["result"] = r;
    }
    if let Some(e) = error {
        v["error"] = e;
    }
    v
}

fn set_location(res: &mut Response, job_id: Uuid) {
    if let Ok(v) = HeaderValue::try_from(job_location(job_id)) {
        res.headers_mut().insert(LOCATION, v);
    }
}

/// `application/json` or any `+json` media type.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A tokio-postgres error outside the client's calls (BEGIN, SET LOCAL, COMMIT): `503` for a
/// transient SQLSTATE or when the server said nothing (the connection broke), `500` else.
fn db_problem(e: tokio_postgres::Error) -> Problem {
    let kind = match e.code() {
        Some(code) if sqlstate::http_status(code.code()) != 503 => Kind::Internal,
        _ => Kind::Unavailable,
    };
    let p = Problem::new(kind, kind.title());
    match e.code() {
        Some(code) => p.with("sqlstate", code.code()),
        None => p,
    }
}

pub(crate) fn log(line: &str) {
    eprintln!("pg_intent_gateway: {line}");
}

async fn create(State(gw): State<Gateway>, req: Request) -> Response {
    gw.submit(None, req).await
}

async fn create_on(
    State(gw): State<Gateway>,
    Path(provider): Path<String>,
    req: Request,
) -> Response {
    gw.submit(Some(provider), req).await
}

async fn show(
    State(gw): State<Gateway>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match gw.try_show(&headers, &job_id).await {
        Ok(res) => res,
        Err(p) => gw.answer(p),
    }
}

async fn explain(Path(slug): Path<String>) -> Response {
    match Kind::from_slug(&slug) {
        Some(kind) => (
            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!(
                "{} ({})\n\n{}\n",
                kind.title(),
                kind.status(),
                kind.explanation()
            ),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        let mut h = HeaderMap::new();
        assert!(!is_json(h.get(CONTENT_TYPE)));
        for (ct, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/jsonx", false),
        ] {
            h.insert(CONTENT_TYPE, ct.parse().unwrap());
            assert_eq!(is_json(h.get(CONTENT_TYPE)), ok, "{ct}");
        }
    }

    #[test]
    fn every_problem_has_a_page() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_slug(kind.slug()), Some(kind));
            assert!(!kind.explanation().is_empty());
        }
    }
}
