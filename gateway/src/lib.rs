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

mod config;
mod handlers;
pub mod key;
pub mod problem;
mod reconciler;
mod worker;
mod write_timeout;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use deadpool_postgres::Pool;
use pg_intent_client::{Attempt, WorkError};
use serde_json::{Value, json};
use uuid::Uuid;

pub use crate::config::{
    Config, DatabaseConfig, HttpConfig, MIN_HEAD_BYTES, WorkerConfig, pool, pool_with,
};
pub use crate::handlers::{
    IDEMPOTENCY_KEY_EXPIRED, IDEMPOTENCY_KEY_RETENTION, IDEMPOTENT_REPLAYED,
};
use crate::handlers::{create, create_on, explain, show};
pub use crate::reconciler::{FakeProvider, ReconcilerConfig};

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
    /// The database's retention as last read, and when (`handlers.rs`: `Idempotency-Key-Retention`).
    retention: std::sync::Mutex<Option<(tokio::time::Instant, Option<std::time::Duration>)>>,
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
                retention: std::sync::Mutex::new(None),
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
}

pub(crate) fn log(line: &str) {
    eprintln!("pg_intent_gateway: {line}");
}
