//! The worker process's loop: claim attempts when woken, run each through [`Worker`]'s
//! protocol, stop gracefully.
//!
//! The database is the queue. [`crate::claim_attempts`] hands out the next attempts of claimable
//! jobs, disjoint between any number of claimers; `NOTIFY intent_claimable` says when there is
//! new work. A [`Runner`] listens on that channel on a connection of its own, claims up to its
//! free concurrency, and polls only as a fallback and at the next retry time it knows of.
//!
//! It also keeps the tables bounded: every [`Runner::purge_every`] (a minute, with jitter) it
//! removes finished jobs past the retention (`intent.purge()`, `intent.retention`: 7 days by
//! default), one bounded batch per call, with a pause between batches while a backlog lasts.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Socket};
use uuid::Uuid;

use crate::calls::{claim_attempts, next_retry_in, purge_expired};
use crate::error::Error;
use crate::records::ClaimedAttempt;
use crate::report::Reconnect;
use crate::settings::WorkerSettings;
use crate::types::{ClaimOptions, Completion, JobState};
use crate::worker::{Run, WorkError, Worker};

/// The channel pg_intent notifies when a job becomes claimable at once (payload: its provider).
pub const CLAIMABLE_CHANNEL: &str = "intent_claimable";

/// The reason recorded on an attempt a [`Runner`] marks `unknown` when it shuts down.
pub const SHUTDOWN_REASON: &str = "worker shut down";

/// The most jobs one `claim_attempts` call may claim.
const MAX_CLAIM: usize = 1000;

/// How soon to try again after a claim failed (or sooner, at the poll).
const ERROR_RETRY: Duration = Duration::from_secs(1);

/// How long the runner waits, after the grace period, for its attempts to be marked `unknown`.
const MARK_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a runner purges by default ([`Runner::purge_every`]).
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

/// The most jobs one purge call of a runner removes by default ([`Runner::purge_batch`]).
pub const DEFAULT_PURGE_BATCH: u32 = 500;

/// The pause between two batches of one purge by default ([`Runner::purge_pause`]).
pub const DEFAULT_PURGE_PAUSE: Duration = Duration::from_millis(500);

pub use crate::exec::{BoxError, Connections};

/// How an attempt run by a [`Runner`] ended (see [`Event::Finished`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// The work produced a result and `complete_attempt` answered.
    Completed(Completion),
    /// The work reported a definite failure and `fail_attempt` answered.
    Failed {
        /// Whether it was reported as retryable.
        retryable: bool,
        /// The job's state after it.
        job_state: JobState,
    },
    /// The timeout fired or the work said the outcome is unknown: the attempt was marked
    /// `unknown`.
    Unknown {
        /// The reason recorded.
        reason: String,
    },
    /// The runner shut down before the work ended: the attempt was marked `unknown` with
    /// [`SHUTDOWN_REASON`].
    ShutDown,
    /// A heartbeat said the attempt is no longer started; the work was stopped.
    Stopped,
}

/// What a [`Runner`] reports while it runs (see [`Runner::on_event`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// The runner listens on [`CLAIMABLE_CHANNEL`] (again, after a reconnect).
    Listening,
    /// The listening connection failed or ended; the runner reconnects and polls meanwhile.
    ListenLost {
        /// Why.
        error: BoxError,
    },
    /// An attempt was claimed; its work starts.
    Claimed {
        /// The attempt.
        attempt_id: Uuid,
        /// The job's provider.
        provider: String,
    },
    /// An attempt ended and its outcome was reported.
    Finished {
        /// The attempt.
        attempt_id: Uuid,
        /// The job's provider.
        provider: String,
        /// How it ended.
        finish: Finish,
    },
    /// A claim failed (or no connection for it); the runner tries again shortly.
    ClaimFailed {
        /// Why.
        error: BoxError,
    },
    /// Reading the next retry time failed. Without `SELECT` on `intent.jobs` (`42501`) the
    /// runner stops asking and relies on its poll.
    RetryTimeFailed {
        /// Why.
        error: BoxError,
    },
    /// A claimed attempt could not be run or reported (no connection for it, the work
    /// panicked, or its report failed on fresh connections for as long as the worker tries):
    /// it stays `started`, its lease runs out and it counts as `unknown`, for a reconciler to
    /// resolve. It is never retried behind its back. An outcome that could not be reported is
    /// in the error ([`Error::Unreported`], downcast it), never dropped.
    AttemptFailed {
        /// The attempt.
        attempt_id: Uuid,
        /// Why.
        error: BoxError,
    },
    /// A purge batch removed finished jobs past the retention ([`Runner::purge_every`]).
    Purged {
        /// How many jobs this batch removed.
        jobs: u64,
    },
    /// A purge failed; the runner tries again at the next period. Without `EXECUTE` on
    /// `intent.purge_expired` (`42501`: the runner's role is not in `intent_app`) or against a
    /// pg_intent older than 0.5.0, which has no such function (`42883`), it says so once and
    /// stops purging for the rest of the run: schedule `intent.purge()` with pg_cron instead
    /// (docs/scheduling.md), or turn the runner's purge off ([`Runner::purge`]).
    PurgeFailed {
        /// Why.
        error: BoxError,
    },
}

/// What a [`Runner::run`] did, returned when it has shut down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Attempts claimed.
    pub claimed: u64,
    /// Attempts completed (won, lost or rejected).
    pub completed: u64,
    /// Attempts failed definitely.
    pub failed: u64,
    /// Attempts marked `unknown` by a timeout or the work.
    pub unknown: u64,
    /// Attempts marked `unknown` because the runner shut down.
    pub shut_down: u64,
    /// Attempts stopped by a heartbeat.
    pub stopped: u64,
    /// Attempts left `started` by an error ([`Event::AttemptFailed`]).
    pub errors: u64,
    /// `claim_attempts` calls made.
    pub claims: u64,
    /// Finished jobs removed by the runner's purges.
    pub purged: u64,
}

type Poller = Box<
    dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> + Send,
>;
type ListenFuture =
    Pin<Box<dyn Future<Output = Result<(Client, Poller), tokio_postgres::Error>> + Send>>;
type ListenConnect = Arc<dyn Fn() -> ListenFuture + Send + Sync>;
type EventHook = Arc<dyn Fn(Event) + Send + Sync>;

/// Runs the attempts of claimable jobs, any number of runners in any number of processes.
///
/// * **Wakes on `NOTIFY`**: with [`Runner::listen`], it `LISTEN`s on [`CLAIMABLE_CHANNEL`] on a
///   dedicated connection and claims when a job of its providers becomes claimable. It polls
///   only as a fallback ([`Runner::poll_every`], default 5 seconds) and at the next retry time
///   it knows of: a delay its own work asked for, or (with `SELECT` on `intent.jobs`) the
///   earliest `retry_at` ahead. [`Runner::waker`] wakes it from within the process.
/// * **Claims what it can run**: up to its free concurrency ([`Runner::concurrency`]), within
///   per-provider limits ([`Runner::limit`]), only for its providers ([`Runner::provider`]; none
///   named: any).
/// * **Runs each attempt by the protocol**, as [`Worker`] does: heartbeats while the work runs,
///   the caller's timeout → `unknown` (never `failed`), the report with the attempt's own
///   version, the work stopped when a heartbeat says so.
/// * **Keeps the tables bounded**: every minute ([`Runner::purge_every`]) it purges finished
///   jobs past the database's retention (`intent.retention`, 7 days by default), in bounded
///   batches with a pause between them, on a task of its own; [`Runner::purge`]`(false)` turns
///   it off. After a purge the same key creates a new job.
/// * **Shuts down gracefully**: when the `shutdown` future of [`Runner::run`] resolves, it stops
///   claiming, lets running attempts finish within the grace period ([`Runner::grace`]), then
///   marks the rest `unknown` with the reason [`SHUTDOWN_REASON`] — never `failed`: their
///   providers may have done the work. Dropping the `run` future instead (a killed task) stops
///   everything at once; the attempts it ran stay `started` and lapse to `unknown` with their
///   lease.
///
/// ```no_run
/// use std::time::Duration;
/// use pg_intent_client::{ClaimedAttempt, Runner, WorkError};
///
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "host=localhost user=worker dbname=app";
/// let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(
///     url.parse()?,
///     tokio_postgres::NoTls,
/// ))
/// .max_size(9)
/// .build()?;
/// let runner = Runner::new(pool, Duration::from_secs(120))
///     .listen(url.parse()?)
///     .provider("gpu-a")
///     .concurrency(8)
///     .lease(Duration::from_secs(30))
///     .grace(Duration::from_secs(20))
///     .name("gpu-box-7");
/// // Any future ends the run: a signal (tokio::signal::ctrl_c), a channel, a timer.
/// let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let summary = runner
///     .run(
///         |claimed: ClaimedAttempt| async move {
///             // Call the provider with claimed.params, and
///             // ProviderKeys::key_for(claimed.attempt.id()) as its idempotency key.
///             Ok::<_, WorkError<String>>(serde_json::json!({"url": "s3://bucket/fox.png"}))
///         },
///         async {
///             let _ = stopped.await;
///         },
///     )
///     .await;
/// println!("{summary:?}");
/// # Ok(()) }
/// ```
pub struct Runner<C> {
    db: Arc<C>,
    listen: Option<ListenConnect>,
    providers: Vec<String>,
    limits: Vec<(String, usize)>,
    concurrency: usize,
    poll_every: Duration,
    watch_retries: bool,
    /// What each attempt runs with: the settings a [`Worker`] has.
    settings: WorkerSettings,
    grace: Duration,
    wake: Arc<Notify>,
    on_event: Option<EventHook>,
    /// How it purges.
    purge: PurgeSettings,
}

/// How a [`Runner`] purges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PurgeSettings {
    /// Whether it purges at all ([`Runner::purge`]; the others only set how).
    on: bool,
    every: Duration,
    batch: u32,
    pause: Duration,
}

impl Default for PurgeSettings {
    fn default() -> Self {
        PurgeSettings {
            on: true,
            every: DEFAULT_PURGE_EVERY,
            batch: DEFAULT_PURGE_BATCH,
            pause: DEFAULT_PURGE_PAUSE,
        }
    }
}

impl<C> std::fmt::Debug for Runner<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("listens", &self.listen.is_some())
            .field("providers", &self.providers)
            .field("limits", &self.limits)
            .field("concurrency", &self.concurrency)
            .field("poll_every", &self.poll_every)
            .field("watch_retries", &self.watch_retries)
            .field("settings", &self.settings)
            .field("grace", &self.grace)
            .field("purge", &self.purge)
            .finish_non_exhaustive()
    }
}

/// What the listener task tells the loop.
enum Wake {
    Listening,
    Notified(String),
    Lost(BoxError),
}

/// What an attempt's task hands back.
#[derive(Default)]
struct Ended {
    /// A delay the work asked for before the job's next attempt.
    retry_in: Option<Duration>,
    /// The job returns to `pending` after a delay the runner does not know (the default
    /// backoff): read the next retry time.
    retry_later: bool,
}

/// Everything an attempt's task needs, shared.
struct Shared<C, F> {
    db: Arc<C>,
    work: F,
    settings: WorkerSettings,
    on_event: Option<EventHook>,
    summary: Mutex<Summary>,
}

impl<C, F> Shared<C, F> {
    fn emit(&self, event: Event) {
        if let Some(hook) = &self.on_event {
            hook(event);
        }
    }

    fn count(&self, f: impl FnOnce(&mut Summary)) {
        f(&mut self.summary.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

impl<C: Connections> Runner<C> {
    /// A runner on `db` whose work times out after `timeout` (the caller's own timeout: when it
    /// fires the attempt becomes `unknown`). Defaults: any provider, concurrency 1, no
    /// `LISTEN` (polling every 5 seconds), a 30-second lease, a 30-second grace period, a purge
    /// every minute (see [`Runner::purge_every`]).
    pub fn new(db: C, timeout: Duration) -> Self {
        Runner {
            db: Arc::new(db),
            listen: None,
            providers: Vec::new(),
            limits: Vec::new(),
            concurrency: 1,
            poll_every: Duration::from_secs(5),
            watch_retries: true,
            settings: WorkerSettings::new(timeout),
            grace: Duration::from_secs(30),
            wake: Arc::new(Notify::new()),
            on_event: None,
            purge: PurgeSettings::default(),
        }
    }

    /// `LISTEN`s on [`CLAIMABLE_CHANNEL`] on a connection of its own made from `config` (without
    /// TLS), reconnecting when it drops.
    pub fn listen(self, config: tokio_postgres::Config) -> Self {
        self.listen_tls(config, tokio_postgres::NoTls)
    }

    /// [`Runner::listen`] with a TLS connector.
    pub fn listen_tls<T>(mut self, config: tokio_postgres::Config, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.listen = Some(Arc::new(move || {
            let config = config.clone();
            let tls = tls.clone();
            Box::pin(async move {
                let (client, mut conn) = config.connect(tls).await?;
                let poller: Poller = Box::new(move |cx| conn.poll_message(cx));
                Ok((client, poller))
            })
        }));
        self
    }

    /// Claims jobs of `provider` (may be called for several). With none named, any provider.
    pub fn provider(mut self, provider: impl Into<String>) -> Self {
        let provider = provider.into();
        if !self.providers.contains(&provider) {
            self.providers.push(provider);
        }
        self
    }

    /// Claims jobs of each of `providers`.
    pub fn providers<I, S>(self, providers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        providers.into_iter().fold(self, Runner::provider)
    }

    /// Runs at most `max` attempts of `provider` at once (at least 1), and makes it one of the
    /// runner's providers (so a runner with a limit claims only the providers it names).
    pub fn limit(mut self, provider: impl Into<String>, max: usize) -> Self {
        let provider = provider.into();
        self.limits.retain(|(p, _)| *p != provider);
        self.limits.push((provider.clone(), max.max(1)));
        self.provider(provider)
    }

    /// How many attempts run at once (at least 1; default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How often to claim when nothing woke the runner (default 5 seconds).
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll_every = every.max(Duration::from_millis(1));
        self
    }

    /// Whether to read the earliest retry time ahead from `intent.jobs` when the queue is empty,
    /// and claim then (default on; needs `SELECT` on `intent.jobs`, else it turns itself off).
    pub fn watch_retries(mut self, on: bool) -> Self {
        self.watch_retries = on;
        self
    }

    /// The lease of each attempt claimed (heartbeats extend it by as much).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How often to heartbeat (default: a third of the lease).
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.settings.heartbeat_every = Some(every);
        self
    }

    /// Names the worker in `intent.attempts`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = Some(name.into());
        self
    }

    /// How long running attempts may still finish after shutdown is asked for (default 30
    /// seconds); then the rest are marked `unknown`.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Wakes the runner with this [`Notify`] too (see [`Runner::waker`]).
    pub fn wake_on(mut self, notify: Arc<Notify>) -> Self {
        self.wake = notify;
        self
    }

    /// A handle that wakes the runner to claim at once (`notify_one`): for a process that
    /// submits jobs itself, even without `LISTEN`.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// How often to purge finished jobs past the retention (default every minute; each period
    /// is drawn within ±20% of it, so that runners started together spread their purges).
    ///
    /// A purge calls `intent.purge_expired()`, which takes no retention: the database's setting decides:
    /// `intent.retention` (7 days by default, `never` to keep finished jobs for ever;
    /// docs/reference.md § 7). Each call removes at most [`Runner::purge_batch`] jobs, on a
    /// connection taken for that call only; while a batch comes back full the purge goes on
    /// after [`Runner::purge_pause`], so a backlog is worked off without holding the database
    /// or the runner's connections. Concurrent purges (many runners) skip each other's jobs
    /// (`SKIP LOCKED`) and never touch an unfinished job, so claims never wait for them.
    /// It needs `EXECUTE` on `intent.purge_expired` (`intent_app`, the role a runner has
    /// anyway); without it the runner says so once ([`Event::PurgeFailed`]) and stops purging.
    pub fn purge_every(mut self, every: Duration) -> Self {
        self.purge.every = every.max(Duration::from_millis(10));
        self
    }

    /// The most jobs one purge call removes (1 to 100,000; default 500).
    pub fn purge_batch(mut self, jobs: u32) -> Self {
        self.purge.batch = jobs.clamp(1, pg_intent_protocol::limits::MAX_PURGE_BATCH as u32);
        self
    }

    /// The pause between two batches of one purge while batches come back full (default half a
    /// second).
    pub fn purge_pause(mut self, pause: Duration) -> Self {
        self.purge.pause = pause;
        self
    }

    /// Whether the runner purges at all (default on; [`Runner::purge_every`] and the others
    /// only say how). Off: schedule `intent.purge()` elsewhere (pg_cron, docs/scheduling.md),
    /// or finished jobs are kept for ever.
    pub fn purge(mut self, on: bool) -> Self {
        self.purge.on = on;
        self
    }

    /// Calls `hook` with each [`Event`] (from the runner's tasks: keep it quick).
    pub fn on_event(mut self, hook: impl Fn(Event) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(hook));
        self
    }

    /// Claims and runs attempts with `work` until `shutdown` resolves, then shuts down
    /// gracefully (see the type's documentation) and returns what it did.
    ///
    /// `work` is given each claimed attempt — its [`crate::Attempt`] (the provider's
    /// idempotency key: [`crate::ProviderKeys::key_for`] of [`crate::Attempt::id`]), the job's
    /// provider, params and contract — and answers as the work of [`Worker::run`] does: a result, a definite failure (with
    /// a retry delay: [`WorkError::retryable_after`]), or an unknown outcome. Errors on the way
    /// (a claim, a report) are reported as [`Event`]s and the runner carries on.
    pub async fn run<T, E, F, Fut, S>(&self, work: F, shutdown: S) -> Summary
    where
        T: Serialize + Send + Sync + 'static,
        E: Serialize + Send + Sync + 'static,
        F: Fn(ClaimedAttempt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, WorkError<E>>> + Send + 'static,
        S: Future<Output = ()>,
    {
        let shared = Arc::new(Shared {
            db: self.db.clone(),
            work,
            settings: self.settings.clone(),
            on_event: self.on_event.clone(),
            summary: Mutex::new(Summary::default()),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let global = Arc::new(Semaphore::new(self.concurrency));
        let limits: Vec<(String, Arc<Semaphore>)> = self
            .limits
            .iter()
            .map(|(p, n)| (p.clone(), Arc::new(Semaphore::new(*n))))
            .collect();
        let unlimited: Vec<&str> = self
            .providers
            .iter()
            .filter(|p| !self.limits.iter().any(|(l, _)| l == *p))
            .map(String::as_str)
            .collect();
        let claim_unlimited = self.providers.is_empty() || !unlimited.is_empty();
        let all: Vec<&str> = self.providers.iter().map(String::as_str).collect();

        let (wake_tx, mut wake_rx) = mpsc::unbounded_channel();
        // Declared after the channels and before the tasks: dropped (aborted) first.
        let mut listener = JoinSet::new();
        if let Some(connect) = &self.listen {
            listener.spawn(listen_loop(connect.clone(), wake_tx.clone()));
        }
        let mut tasks: JoinSet<Ended> = JoinSet::new();
        let mut watch_retries = self.watch_retries;
        // The purge: a task of its own, so that a batch never delays a claim.
        let (purge_stop, purge_stopped) = watch::channel(false);
        let purger = self.purge.on.then(|| {
            tokio::spawn(purge_loop(
                shared.clone(),
                self.purge,
                purge_stopped.clone(),
            ))
        });

        let mut more = true; // claim at the next turn
        let mut read_retry = false; // read the next retry time at the next turn
        let mut backlog = false; // the last claim may have left work behind
        let mut next_poll = Instant::now() + self.poll_every;
        let mut next_retry: Option<Instant> = None;
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            if more {
                more = false;
                if global.available_permits() == 0 {
                    backlog = true;
                } else {
                    match self
                        .claim_round(
                            &shared,
                            &global,
                            &limits,
                            claim_unlimited.then_some(unlimited.as_slice()),
                            &stop_rx,
                            &mut tasks,
                        )
                        .await
                    {
                        Ok(left) => {
                            backlog = left;
                            next_poll = Instant::now() + self.poll_every;
                            if !left && watch_retries {
                                let providers = (!all.is_empty()).then_some(all.as_slice());
                                match self.next_retry(providers).await {
                                    Ok(Some(d)) => {
                                        // A little late rather than early: the claim checks
                                        // the time on the server.
                                        let at = Instant::now() + d + Duration::from_millis(5);
                                        next_retry = Some(next_retry.map_or(at, |r| r.min(at)));
                                    }
                                    Ok(None) => {}
                                    Err(error) => {
                                        let code =
                                            error.downcast_ref::<Error>().and_then(Error::code);
                                        if code == Some("42501") {
                                            watch_retries = false;
                                        }
                                        shared.emit(Event::RetryTimeFailed { error });
                                    }
                                }
                            }
                        }
                        Err(error) => {
                            shared.emit(Event::ClaimFailed { error });
                            next_poll = Instant::now() + self.poll_every.min(ERROR_RETRY);
                        }
                    }
                }
            }
            if std::mem::take(&mut read_retry) && watch_retries {
                let providers = (!all.is_empty()).then_some(all.as_slice());
                match self.next_retry(providers).await {
                    Ok(Some(d)) => next_retry = Some(earliest(next_retry, d)),
                    Ok(None) => {}
                    Err(error) => {
                        let code = error.downcast_ref::<Error>().and_then(Error::code);
                        if code == Some("42501") {
                            watch_retries = false;
                        }
                        shared.emit(Event::RetryTimeFailed { error });
                    }
                }
            }
            let wake_at = next_retry.map_or(next_poll, |r| r.min(next_poll));
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(w) = wake_rx.recv() => {
                    let mut w = Some(w);
                    while let Some(msg) = w {
                        match msg {
                            Wake::Listening => {
                                shared.emit(Event::Listening);
                                more = true;
                            }
                            Wake::Notified(provider) => {
                                if self.providers.is_empty() || self.providers.contains(&provider) {
                                    more = true;
                                }
                            }
                            Wake::Lost(error) => shared.emit(Event::ListenLost { error }),
                        }
                        w = wake_rx.try_recv().ok();
                    }
                }
                () = self.wake.notified() => more = true,
                Some(ended) = tasks.join_next(), if !tasks.is_empty() => {
                    let ended = self.ended(&shared, ended);
                    if let Some(d) = ended.retry_in {
                        next_retry = Some(earliest(next_retry, d));
                    }
                    read_retry |= ended.retry_later;
                    more = backlog;
                }
                () = tokio::time::sleep_until(wake_at) => {
                    more = true;
                    if next_retry.is_some_and(|r| r <= Instant::now()) {
                        next_retry = None;
                    }
                    next_poll = Instant::now() + self.poll_every;
                }
            }
        }

        // Shutting down: no more claims, no more purges (a batch under way ends first: it is
        // one short statement); the running attempts have the grace period to finish.
        listener.abort_all();
        let _ = purge_stop.send(true);
        if let Some(purger) = purger {
            let abort = purger.abort_handle();
            if tokio::time::timeout(MARK_TIMEOUT, purger).await.is_err() {
                abort.abort();
            }
        }
        let grace_end = Instant::now() + self.grace;
        while let Ok(Some(ended)) = tokio::time::timeout_at(grace_end, tasks.join_next()).await {
            self.ended(&shared, ended);
        }
        if !tasks.is_empty() {
            // The rest stop their work and mark their attempts unknown.
            let _ = stop_tx.send(true);
            let mark_end = Instant::now() + MARK_TIMEOUT;
            while let Ok(Some(ended)) = tokio::time::timeout_at(mark_end, tasks.join_next()).await {
                self.ended(&shared, ended);
            }
            let left = tasks.len() as u64;
            tasks.abort_all();
            shared.count(|s| s.errors += left);
        }
        let summary = shared.summary.lock().unwrap_or_else(|p| p.into_inner());
        summary.clone()
    }

    async fn next_retry(&self, providers: Option<&[&str]>) -> Result<Option<Duration>, BoxError> {
        let conn = self.db.connection().await?;
        Ok(next_retry_in(&conn, providers).await?)
    }

    /// Records an attempt's task's end.
    fn ended<F>(
        &self,
        shared: &Shared<C, F>,
        ended: Result<Ended, tokio::task::JoinError>,
    ) -> Ended {
        match ended {
            Ok(e) => e,
            Err(join) => {
                // The work panicked (the attempt id is lost with the task): its attempt
                // stays started and lapses to unknown.
                shared.count(|s| s.errors += 1);
                if join.is_panic() {
                    shared.emit(Event::AttemptFailed {
                        attempt_id: Uuid::nil(),
                        error: "the work panicked".into(),
                    });
                }
                Ended::default()
            }
        }
    }

    /// One round of claims: the limited providers each on their own (so that a claim never
    /// takes more of a provider than its limit allows), then the others together. Returns
    /// whether work may have been left behind (a claim answered all it was asked for, or a
    /// provider was at its limit).
    async fn claim_round<T, E, F, Fut>(
        &self,
        shared: &Arc<Shared<C, F>>,
        global: &Arc<Semaphore>,
        limits: &[(String, Arc<Semaphore>)],
        unlimited: Option<&[&str]>,
        stop: &watch::Receiver<bool>,
        tasks: &mut JoinSet<Ended>,
    ) -> Result<bool, BoxError>
    where
        T: Serialize + Send + Sync + 'static,
        E: Serialize + Send + Sync + 'static,
        F: Fn(ClaimedAttempt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, WorkError<E>>> + Send + 'static,
    {
        let conn = self.db.connection().await?;
        let mut left = false;
        let options = ClaimOptions {
            providers: None,
            worker: self.settings.name.as_deref(),
            lease: self.settings.lease,
            max_jobs: 1,
        };
        for (provider, sem) in limits {
            let n = global
                .available_permits()
                .min(sem.available_permits())
                .min(MAX_CLAIM);
            if n == 0 {
                left = true;
                continue;
            }
            let one = [provider.as_str()];
            let options = ClaimOptions {
                providers: Some(&one),
                max_jobs: n as u16,
                ..options
            };
            let claimed = claim_attempts(&conn, &options).await?;
            shared.count(|s| s.claims += 1);
            left |= claimed.len() >= n;
            for c in claimed {
                let permits = (
                    global.clone().try_acquire_owned().ok(),
                    sem.clone().try_acquire_owned().ok(),
                );
                spawn_attempt(shared, c, permits, stop, tasks);
            }
        }
        if let Some(providers) = unlimited {
            let n = global.available_permits().min(MAX_CLAIM);
            if n == 0 {
                return Ok(true);
            }
            let options = ClaimOptions {
                providers: (!providers.is_empty()).then_some(providers),
                max_jobs: n as u16,
                ..options
            };
            let claimed = claim_attempts(&conn, &options).await?;
            shared.count(|s| s.claims += 1);
            left |= claimed.len() >= n;
            for c in claimed {
                let permits = (global.clone().try_acquire_owned().ok(), None);
                spawn_attempt(shared, c, permits, stop, tasks);
            }
        }
        Ok(left)
    }
}

/// The earlier of `at` and `d` from now, a little late rather than early: the claim compares
/// with the server's clock.
fn earliest(at: Option<Instant>, d: Duration) -> Instant {
    let then = Instant::now() + d + Duration::from_millis(5);
    at.map_or(then, |at| at.min(then))
}

fn spawn_attempt<C, T, E, F, Fut>(
    shared: &Arc<Shared<C, F>>,
    claimed: ClaimedAttempt,
    permits: (Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>),
    stop: &watch::Receiver<bool>,
    tasks: &mut JoinSet<Ended>,
) where
    C: Connections,
    T: Serialize + Send + Sync + 'static,
    E: Serialize + Send + Sync + 'static,
    F: Fn(ClaimedAttempt) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, WorkError<E>>> + Send + 'static,
{
    shared.count(|s| s.claimed += 1);
    shared.emit(Event::Claimed {
        attempt_id: claimed.attempt.id(),
        provider: claimed.provider.clone(),
    });
    let shared = shared.clone();
    let mut stop = stop.clone();
    tasks.spawn(async move {
        let _permits = permits;
        let attempt_id = claimed.attempt.id();
        let provider = claimed.provider.clone();
        let conn = match shared.db.connection().await {
            Ok(conn) => conn,
            Err(error) => {
                shared.count(|s| s.errors += 1);
                shared.emit(Event::AttemptFailed { attempt_id, error });
                return Ended::default();
            }
        };
        // A broken connection is replaced from the runner's own: the heartbeats go on and the
        // outcome is reported, never dropped.
        let worker = Worker::with_settings(&conn, shared.settings.clone())
            .reconnect(Reconnect::shared(shared.db.clone()));
        let interrupt = async move {
            if stop.wait_for(|s| *s).await.is_err() {
                // The runner is gone without a shutdown (it is being dropped): no report.
                std::future::pending::<()>().await;
            }
            SHUTDOWN_REASON.to_string()
        };
        let mut ended = Ended::default();
        let retry_in = Arc::new(Mutex::new(None));
        let asked = retry_in.clone();
        let work = &shared.work;
        let attempt = claimed.attempt.clone();
        let run = worker
            .drive_until(
                attempt,
                move |_| {
                    let fut = work(claimed);
                    async move {
                        let r = fut.await;
                        if let Err(WorkError::Failed {
                            retryable: true,
                            retry_after: Some(d),
                            ..
                        }) = &r
                        {
                            *asked.lock().unwrap_or_else(|p| p.into_inner()) = Some(*d);
                        }
                        r
                    }
                },
                interrupt,
            )
            .await;
        let finish = match run {
            Ok(Run::Completed { completion, .. }) => {
                shared.count(|s| s.completed += 1);
                Finish::Completed(completion)
            }
            Ok(Run::Failed {
                retryable,
                job_state,
                ..
            }) => {
                shared.count(|s| s.failed += 1);
                let asked = retry_in.lock().unwrap_or_else(|p| p.into_inner()).take();
                if job_state == JobState::Pending {
                    ended = Ended {
                        retry_in: asked,
                        retry_later: asked.is_none(),
                    };
                }
                Finish::Failed {
                    retryable,
                    job_state,
                }
            }
            Ok(Run::Unknown { reason, .. }) if reason == SHUTDOWN_REASON => {
                shared.count(|s| s.shut_down += 1);
                Finish::ShutDown
            }
            Ok(Run::Unknown { reason, .. }) => {
                shared.count(|s| s.unknown += 1);
                Finish::Unknown { reason }
            }
            Ok(Run::Stopped { .. }) => {
                shared.count(|s| s.stopped += 1);
                Finish::Stopped
            }
            Err(error) => {
                shared.count(|s| s.errors += 1);
                shared.emit(Event::AttemptFailed {
                    attempt_id,
                    error: error.into(),
                });
                return Ended::default();
            }
        };
        shared.emit(Event::Finished {
            attempt_id,
            provider,
            finish,
        });
        ended
    });
}

/// A random fraction in [0, 1), different in each runner (no random-number crate needed: the
/// standard library seeds each `RandomState` afresh).
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// `every` within ±20%.
fn jittered(every: Duration) -> Duration {
    every.mul_f64(0.8 + 0.4 * random_fraction())
}

/// Purges every period until told to stop: batches while they come back full, with a pause
/// between them; a connection per batch, given back at once.
async fn purge_loop<C: Connections, F>(
    shared: Arc<Shared<C, F>>,
    settings: PurgeSettings,
    mut stop: watch::Receiver<bool>,
) {
    // The first purge within the first period (not at start: runners started together spread).
    let mut wait = settings.every.mul_f64(random_fraction());
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = jittered(settings.every);
        loop {
            let batch = async {
                let conn = shared.db.connection().await?;
                let n = purge_expired(&conn, settings.batch).await?;
                Ok::<u64, BoxError>(n)
            };
            let n = match batch.await {
                Ok(n) => n,
                Err(error) => {
                    // No right to purge, or no intent.purge_expired (a library older than
                    // 0.5.0): asking again every period would only repeat the error.
                    let denied = matches!(
                        error.downcast_ref::<Error>().and_then(Error::code),
                        Some("42501" | "42883")
                    );
                    shared.emit(Event::PurgeFailed { error });
                    if denied {
                        return;
                    }
                    break;
                }
            };
            if n > 0 {
                shared.count(|s| s.purged += n);
                shared.emit(Event::Purged { jobs: n });
            }
            if n < u64::from(settings.batch) {
                break;
            }
            // A backlog: the next batch after a pause, so that it never holds the database.
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(settings.pause) => {}
            }
        }
    }
}

/// Listens on [`CLAIMABLE_CHANNEL`], driving the connection itself to receive the
/// notifications; reconnects when the connection ends.
async fn listen_loop(connect: ListenConnect, tx: mpsc::UnboundedSender<Wake>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let error: BoxError = match connect().await {
            Ok((client, mut poller)) => {
                let tx = &tx;
                let mut drive = std::pin::pin!(std::future::poll_fn(move |cx| {
                    loop {
                        match poller(cx) {
                            Poll::Ready(Some(Ok(AsyncMessage::Notification(n)))) => {
                                let _ = tx.send(Wake::Notified(n.payload().to_owned()));
                            }
                            Poll::Ready(Some(Ok(_))) => {}
                            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(e)),
                            Poll::Ready(None) => return Poll::Ready(None),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                }));
                enum Step {
                    Listened(Result<(), tokio_postgres::Error>),
                    Ended(Option<tokio_postgres::Error>),
                }
                let listen = format!("LISTEN {CLAIMABLE_CHANNEL}");
                let step = tokio::select! {
                    r = client.batch_execute(&listen) => Step::Listened(r),
                    e = &mut drive => Step::Ended(e),
                };
                let ended = match step {
                    Step::Listened(Ok(())) => {
                        let _ = tx.send(Wake::Listening);
                        backoff = Duration::from_millis(100);
                        drive.await
                    }
                    Step::Listened(Err(e)) => Some(e),
                    Step::Ended(e) => e,
                };
                drop(client);
                match ended {
                    Some(e) => e.into(),
                    None => "the listening connection closed".into(),
                }
            }
            Err(e) => e.into(),
        };
        if tx.send(Wake::Lost(error)).is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
