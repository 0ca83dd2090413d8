//! The gateway's settings ([`Config`]: the worker, the database, HTTP, the reconciler, the
//! bearer tokens) and the pool they make.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use crate::problem;
use crate::reconciler::ReconcilerConfig;

/// The smallest [`HttpConfig::max_head_bytes`] (hyper's smallest buffer): 8 KiB.
pub const MIN_HEAD_BYTES: usize = 8 * 1024;

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
    /// How often the worker purges finished jobs past the database's retention
    /// (`intent.retention`, 7 days by default): the client's `Runner::purge_every`. `None`: it
    /// does not purge (pg_cron does, docs/scheduling.md, or nothing is ever removed).
    pub purge_every: Option<Duration>,
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
            purge_every: Some(pg_intent_client::runner::DEFAULT_PURGE_EVERY),
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
    /// The reconciler
    /// ([`Gateway::spawn_reconciler_until`](crate::Gateway::spawn_reconciler_until)).
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
