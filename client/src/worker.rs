//! The protocol for workers, encoded once: begin, heartbeat while the provider works, time out
//! into `unknown` (never `failed`), report with the attempt's own version, stop when told to.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use uuid::Uuid;

use crate::calls::{begin_attempt, heartbeat};
use crate::error::{Error, Unreported};
use crate::exec::Executor;
use crate::report::{Link, Reconnect, Reported, breaks_connection};
use crate::settings::WorkerSettings;
use crate::types::{Attempt, BeginOptions, Completion, JobState, Outcome};

/// How long a report made after an interrupt (a shutdown) is retried at most.
const INTERRUPTED_REPORT_FOR: Duration = Duration::from_secs(5);

/// How many tries of a report may end in a statement timeout or cancel (`57014`) before it is
/// taken as the report's own (a contract checker slower than the timeout), not a passing one.
const MAX_CANCELLED_TRIES: u32 = 3;

/// The first and the longest wait between two tries of a report.
const REPORT_RETRY_FIRST: Duration = Duration::from_millis(50);
const REPORT_RETRY_MAX: Duration = Duration::from_secs(5);

/// How the work of an attempt can end other than with a result.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkError<E> {
    /// A definite failure: the provider said that nothing happened (an HTTP 4xx before any work,
    /// a refusal). Reported with `fail_attempt`.
    Failed {
        /// What the provider said, stored as `jsonb`.
        error: E,
        /// Whether another attempt may follow (the job returns to `pending`).
        retryable: bool,
        /// How long until a claim may take the job again, when it returns to `pending`
        /// (`None`: the default backoff; see [`crate::fail_attempt_after`]).
        retry_after: Option<Duration>,
    },
    /// The outcome cannot be known (the connection dropped after the request was sent, the
    /// provider answered 5xx mid-job…): the provider may still be working. Reported with
    /// `mark_unknown`, exactly like a timeout.
    Unknown {
        /// Why, for `intent.events`.
        reason: String,
    },
}

impl<E> WorkError<E> {
    /// A definite failure after which another attempt may follow.
    pub fn retryable(error: E) -> Self {
        WorkError::Failed {
            error,
            retryable: true,
            retry_after: None,
        }
    }

    /// A definite failure after which another attempt may follow, claimed no sooner than
    /// `retry_after` from now (a provider's `Retry-After`; zero: at once).
    pub fn retryable_after(error: E, retry_after: Duration) -> Self {
        WorkError::Failed {
            error,
            retryable: true,
            retry_after: Some(retry_after),
        }
    }

    /// A definite failure that ends the job.
    pub fn permanent(error: E) -> Self {
        WorkError::Failed {
            error,
            retryable: false,
            retry_after: None,
        }
    }

    /// An outcome that cannot be known.
    pub fn unknown(reason: impl Into<String>) -> Self {
        WorkError::Unknown {
            reason: reason.into(),
        }
    }
}

/// How one attempt run by [`Worker::run`] ended. Every variant has been reported to the
/// database before it is returned.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Run<T, E> {
    /// The work produced a result and `complete_attempt` answered.
    Completed {
        /// The attempt.
        attempt: Attempt,
        /// `Won`: the result is the job's. `Lost`: another outcome stood first (read the job for
        /// it). `Rejected`: it broke the contract.
        completion: Completion,
        /// The result the work produced.
        result: T,
    },
    /// The work reported a definite failure and `fail_attempt` answered.
    Failed {
        /// The attempt.
        attempt: Attempt,
        /// The failure the work reported.
        error: E,
        /// Whether it was reported as retryable.
        retryable: bool,
        /// The job's state after it: `pending` when another attempt may begin.
        job_state: JobState,
    },
    /// The caller's timeout fired (or the work said the outcome is unknown, or
    /// [`Worker::drive_until`]'s interrupt came first): the attempt was marked `unknown`, never
    /// `failed`. No attempt may begin until it is reconciled:
    /// completed or failed from what the provider did, or abandoned.
    Unknown {
        /// The attempt.
        attempt: Attempt,
        /// The reason recorded.
        reason: String,
    },
    /// A heartbeat said the attempt is no longer started (abandoned, its job cancelled or
    /// finished, or its lease lapsed): the work was stopped and nothing was reported.
    Stopped {
        /// The attempt.
        attempt: Attempt,
    },
}

/// The answer of [`Worker::run_failover`].
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Failover<T, E> {
    /// An attempt produced a result and `complete_attempt` answered `won` or `lost` (a
    /// `rejected` result moves on to the next provider, like a retryable failure).
    Completed {
        /// The attempt (see [`Attempt::provider`]).
        attempt: Attempt,
        /// `Won`, or `Lost` when another outcome stood first.
        completion: Completion,
        /// The result the work produced.
        result: T,
    },
    /// A definite failure ended the job (not retryable, or no attempt left).
    Failed {
        /// The last attempt.
        attempt: Attempt,
        /// Its failure.
        error: E,
        /// The job's state (`failed`).
        job_state: JobState,
    },
    /// Outcome unknown, reconcile first: an attempt (this run's, after its timeout, or an
    /// earlier one) may still be working. No further attempt was begun, on any provider.
    ReconcileFirst {
        /// The attempt whose outcome is unknown (when known).
        attempt_id: Option<Uuid>,
        /// Why it is unknown, when this run marked it so.
        reason: Option<String>,
    },
    /// Another attempt is started and within its lease: wait for it.
    InFlight {
        /// The attempt in flight (when known).
        attempt_id: Option<Uuid>,
    },
    /// A heartbeat said the attempt is no longer started; the work was stopped.
    Stopped {
        /// The attempt.
        attempt: Attempt,
    },
    /// The job had already finished when an attempt was to begin.
    JobFinished {
        /// Its terminal state (when known).
        state: Option<JobState>,
    },
    /// No provider is left: each failed definitely (and retryably), returned a result the
    /// job's contract rejected, or was not certified for the contract; or the job has used all
    /// its attempts.
    Exhausted {
        /// The definite failures, by provider, in order.
        failures: Vec<(String, E)>,
        /// The results the contract rejected, by provider, in order.
        rejected: Vec<(String, T)>,
        /// The providers the gate refused as not certified.
        not_certified: Vec<String>,
        /// Whether `max_attempts` was reached.
        attempts_exhausted: bool,
    },
}

/// Runs attempts by the protocol.
///
/// Give it a connection that is *not* inside a transaction: heartbeats must commit to extend
/// the lease. Its calls run on that one connection, concurrently with nothing but the worker's
/// own heartbeats.
///
/// ```no_run
/// # async fn f(db: &pg_intent_client::Connection, job_id: uuid::Uuid) -> Result<(), pg_intent_client::Error> {
/// use std::time::Duration;
/// use pg_intent_client::{Run, WorkError, Worker};
///
/// let worker = Worker::new(db, Duration::from_secs(120)).lease(Duration::from_secs(30)).name("gpu-box-7");
/// let run = worker
///     .run(job_id, None, |attempt| async move {
///         // Call the provider here, passing ProviderKeys::key_for(attempt.id()) as its
///         // idempotency key.
///         Ok::<_, WorkError<String>>(serde_json::json!({"url": "s3://bucket/fox.png"}))
///     })
///     .await?;
/// match run {
///     Run::Completed { completion, .. } => println!("{completion}"),
///     Run::Failed { job_state, .. } => println!("failed; job is {job_state}"),
///     Run::Unknown { attempt, .. } => println!("{} needs reconciling", attempt.id()),
///     Run::Stopped { .. } => println!("told to stop"),
/// }
/// # Ok(()) }
/// ```
pub struct Worker<'a, D: ?Sized> {
    db: &'a D,
    settings: WorkerSettings,
    reconnect: Option<Reconnect>,
}

impl<D: ?Sized> Clone for Worker<'_, D> {
    fn clone(&self) -> Self {
        Worker {
            db: self.db,
            settings: self.settings.clone(),
            reconnect: self.reconnect.clone(),
        }
    }
}

impl<D: ?Sized> std::fmt::Debug for Worker<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("settings", &self.settings)
            .field("reconnect", &self.reconnect.is_some())
            .finish_non_exhaustive()
    }
}

enum Ended<T, E> {
    Work(Result<T, WorkError<E>>),
    Stop(Result<(), Error>),
    Timeout,
    Interrupted(String),
}

/// The interrupt of [`Worker::drive_until`], awaitable again after it fired.
struct Interrupt<I> {
    pending: Option<Pin<Box<I>>>,
}

impl<I: Future<Output = String>> Interrupt<I> {
    fn fired(&self) -> bool {
        self.pending.is_none()
    }

    /// Resolves when the interrupt fires (never, once it has fired: it is a one-time signal).
    async fn wait(&mut self) -> String {
        match &mut self.pending {
            Some(fut) => {
                let reason = fut.as_mut().await;
                self.pending = None;
                reason
            }
            None => std::future::pending().await,
        }
    }
}

/// The connection an attempt's calls go to: the worker's own, or a fresh one once its own broke.
type Fresh = Mutex<Option<Arc<dyn Link>>>;

impl<'a, D: Executor + ?Sized> Worker<'a, D> {
    /// A worker on `db` whose provider calls time out after `timeout` (the caller's own
    /// timeout: when it fires the attempt becomes `unknown`). Lease: 30 seconds; heartbeats
    /// every third of the lease.
    pub fn new(db: &'a D, timeout: Duration) -> Self {
        Self::with_settings(db, WorkerSettings::new(timeout))
    }

    /// A worker on `db` with `settings` (a [`crate::Runner`]'s, for each attempt it runs).
    pub(crate) fn with_settings(db: &'a D, settings: WorkerSettings) -> Self {
        Worker {
            db,
            settings,
            reconnect: None,
        }
    }

    /// Where to get a fresh connection when the worker's own breaks: heartbeats move to it,
    /// and a report that failed on a broken connection is made again there (with backoff,
    /// for up to [`Worker::report_for`]). Without it, a report is retried on the worker's own
    /// connection only while that connection is open.
    ///
    /// ```no_run
    /// # fn f(db: &pg_intent_client::Connection, pool: deadpool_postgres::Pool) {
    /// use std::time::Duration;
    /// use pg_intent_client::{Reconnect, Worker};
    /// let worker = Worker::new(db, Duration::from_secs(60)).reconnect(Reconnect::using(pool));
    /// # }
    /// ```
    pub fn reconnect(mut self, source: Reconnect) -> Self {
        self.reconnect = Some(source);
        self
    }

    /// How long to keep retrying a report (default five minutes:
    /// [`DEFAULT_REPORT_FOR`](crate::DEFAULT_REPORT_FOR)) before giving up and returning the
    /// outcome in [`Error::Unreported`]. Only errors that may pass ([`Error::is_transient`]) are
    /// retried; any other answer ends the report at once.
    pub fn report_for(mut self, how_long: Duration) -> Self {
        self.settings.report_for = how_long;
        self
    }

    /// How long one report may wait for its answer before its connection is taken as broken
    /// (default: the lease) — a connection whose network path went dark answers nothing and
    /// reports no error for many minutes. The report is then made again on a fresh connection
    /// (repeating it is safe). Heartbeats wait at most the heartbeat interval.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.settings.call_timeout = Some(timeout);
        self
    }

    /// Sets the lease of each attempt (heartbeats extend it by as much).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// Sets how often to heartbeat (default: a third of the lease). Keep it well below the
    /// lease.
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.settings.heartbeat_every = Some(every);
        self
    }

    /// Names the worker in `intent.attempts`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = Some(name.into());
        self
    }

    /// The interval between heartbeats.
    pub fn heartbeat_interval(&self) -> Duration {
        self.settings.heartbeat_interval()
    }

    /// Begins an attempt of `job_id` (on `provider`, `None` for the job's own) and runs `work`
    /// for it: heartbeats while it runs, marks it `unknown` when the timeout fires first, stops
    /// it when a heartbeat says so, and reports its result or failure with the attempt's own
    /// version.
    ///
    /// A refusal of the gate (in flight, unknown, finished, …) is returned as the [`Error`]
    /// before any work starts. The work is dropped — stopped — when the timeout fires or a
    /// heartbeat answers `false`; give the provider [`Attempt::id`] as its idempotency key
    /// (through [`crate::ProviderKeys::key_for`]: keyed, when others share the provider
    /// account) so that a reconciler can ask it later what happened.
    ///
    /// If the connection breaks while the work runs, heartbeats move to a fresh one (with
    /// [`Worker::reconnect`]); a report that fails for a reason that may pass
    /// ([`Error::is_transient`]) is made again, with backoff, for up to
    /// [`Worker::report_for`] (repeating a report is safe). A report that still could not be
    /// made is returned as [`Error::Unreported`], which holds the outcome (the result itself)
    /// and the attempt, and is logged: it is never dropped. Meanwhile the attempt stays
    /// `started`, its lease runs out and it counts as `unknown`, so no other attempt begins
    /// behind its back.
    pub async fn run<T, E, F, Fut>(
        &self,
        job_id: Uuid,
        provider: Option<&str>,
        work: F,
    ) -> Result<Run<T, E>, Error>
    where
        T: Serialize,
        E: Serialize,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let attempt = begin_attempt(self.db, job_id, self.options(provider)).await?;
        self.drive(attempt, work).await
    }

    fn options<'o>(&'o self, provider: Option<&'o str>) -> BeginOptions<'o> {
        BeginOptions {
            provider,
            lease: self.settings.lease,
            worker: self.settings.name.as_deref(),
        }
    }

    /// Runs `work` for an attempt already begun — by [`begin_attempt`], or claimed by
    /// [`crate::claim_attempts`] — exactly as [`Worker::run`] does after its begin: heartbeats,
    /// the timeout → `unknown`, the report with the attempt's own version.
    pub async fn drive<T, E, F, Fut>(&self, attempt: Attempt, work: F) -> Result<Run<T, E>, Error>
    where
        T: Serialize,
        E: Serialize,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        self.drive_until(attempt, work, std::future::pending::<String>())
            .await
    }

    /// Like [`Worker::drive`], and when `interrupt` resolves (to a reason) before the work ends,
    /// the work is dropped and the attempt is marked `unknown` with that reason — as when the
    /// timeout fires, never `failed`: the provider may have done the work. A worker shutting down
    /// uses it. Work that has already ended is reported as usual.
    pub async fn drive_until<T, E, F, Fut, I>(
        &self,
        attempt: Attempt,
        work: F,
        interrupt: I,
    ) -> Result<Run<T, E>, Error>
    where
        T: Serialize,
        E: Serialize,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
        I: Future<Output = String>,
    {
        let mut interrupt = Interrupt {
            pending: Some(Box::pin(interrupt)),
        };
        let fresh: Fresh = Mutex::new(None);
        let ended = {
            let work = work(attempt.clone());
            let keep_alive = self.keep_alive(attempt.id(), &fresh);
            let timer = tokio::time::sleep(self.settings.timeout);
            tokio::pin!(work, keep_alive, timer);
            tokio::select! {
                // A result that is in hand is reported, even if the timer fired as well.
                biased;
                r = &mut work => Ended::Work(r),
                stop = &mut keep_alive => Ended::Stop(stop),
                () = &mut timer => Ended::Timeout,
                reason = interrupt.wait() => Ended::Interrupted(reason),
            }
            // The work future is dropped here: whatever it was doing stops.
        };
        // A result or failure that does not serialize cannot be reported as such; the work ran,
        // so the attempt is marked unknown (never left started) and the error returned.
        let mut unserializable = None;
        let mut serialized = |o: Result<Outcome, Error>| match o {
            Ok(outcome) => Ok(outcome),
            Err(Error::Serialize(e)) => {
                let reason = format!("the work's outcome could not be serialized to JSON: {e}");
                unserializable = Some(e);
                Ok(Outcome::Unknown { reason })
            }
            Err(other) => Err(other),
        };
        let outcome = match &ended {
            Ended::Work(Ok(result)) => serialized(Outcome::completed(result))?,
            Ended::Work(Err(WorkError::Failed {
                error,
                retryable,
                retry_after,
            })) => serialized(Outcome::failed(error, *retryable, *retry_after))?,
            Ended::Work(Err(WorkError::Unknown { reason })) | Ended::Interrupted(reason) => {
                Outcome::Unknown {
                    reason: reason.clone(),
                }
            }
            Ended::Timeout => Outcome::Unknown {
                reason: format!("the caller's timeout of {:?} fired", self.settings.timeout),
            },
            Ended::Stop(_) => {
                return match ended {
                    Ended::Stop(Ok(())) => Ok(Run::Stopped { attempt }),
                    Ended::Stop(Err(e)) => Err(e),
                    _ => unreachable!(),
                };
            }
        };
        let unknown = match &outcome {
            Outcome::Unknown { reason } => Some(reason.clone()),
            _ => None,
        };
        let reported = self
            .report(&attempt, outcome, &fresh, &mut interrupt)
            .await?;
        if let Some(e) = unserializable {
            return Err(Error::Serialize(e));
        }
        Ok(match (ended, reported) {
            (Ended::Work(Ok(result)), Reported::Completed(completion)) => Run::Completed {
                attempt,
                completion,
                result,
            },
            (
                Ended::Work(Err(WorkError::Failed {
                    error, retryable, ..
                })),
                Reported::Failed(job_state),
            ) => Run::Failed {
                attempt,
                error,
                retryable,
                job_state,
            },
            // Each outcome is answered by its own report (Outcome::report): the rest is unknown.
            _ => Run::Unknown {
                attempt,
                reason: unknown.unwrap_or_default(),
            },
        })
    }

    /// The fresh connection, if the worker's own broke and one was made.
    fn fresh(fresh: &Fresh) -> Option<Arc<dyn Link>> {
        fresh.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces a broken connection by a fresh one, when the worker has a [`Reconnect`].
    /// Whether it got one that is open.
    async fn replace(&self, fresh: &Fresh) -> bool {
        let Some(reconnect) = &self.reconnect else {
            return false;
        };
        match reconnect.connect().await {
            Ok(link) if !link.closed() => {
                *fresh.lock().unwrap_or_else(|p| p.into_inner()) = Some(link);
                true
            }
            // A source that hands back the dead connection (one shared connection) cannot help.
            Ok(_) | Err(_) => false,
        }
    }

    /// One heartbeat, on the fresh connection if there is one, else on the worker's own.
    async fn beat(&self, link: Option<&Arc<dyn Link>>, attempt_id: Uuid) -> Result<bool, Error> {
        match link {
            Some(link) => link.beat(attempt_id).await,
            None => heartbeat(self.db, attempt_id, None).await,
        }
    }

    /// One try of a report, on the fresh connection if there is one, else on the worker's own.
    async fn send(
        &self,
        link: Option<&Arc<dyn Link>>,
        attempt: &Attempt,
        outcome: &Outcome,
    ) -> Result<Reported, Error> {
        match link {
            Some(link) => link.send(attempt, outcome).await,
            None => outcome.report(self.db, attempt).await,
        }
    }

    /// Whether the connection the worker's calls go to now is closed.
    fn closed(&self, link: Option<&Arc<dyn Link>>) -> bool {
        match link {
            Some(link) => link.closed(),
            None => self.db.client().is_closed(),
        }
    }

    /// Reports `outcome` until it lands, an answer says it cannot, or [`Worker::report_for`]
    /// (after an interrupt: a few seconds) has passed; then [`Error::Unreported`], which keeps
    /// it. Each try is bounded ([`Worker::call_timeout`]): a connection that stops answering
    /// without closing (a network path gone dark) is taken as broken and replaced. Between
    /// tries the attempt's lease is kept alive, so that it does not lapse while the result is
    /// in hand.
    async fn report<I: Future<Output = String>>(
        &self,
        attempt: &Attempt,
        outcome: Outcome,
        fresh: &Fresh,
        interrupt: &mut Interrupt<I>,
    ) -> Result<Reported, Error> {
        let mut until = Instant::now()
            + if interrupt.fired() {
                self.settings.report_for.min(INTERRUPTED_REPORT_FOR)
            } else {
                self.settings.report_for
            };
        let every = self.heartbeat_interval();
        let mut last_beat = Instant::now();
        let mut delay = REPORT_RETRY_FIRST;
        let mut tries = 0;
        let mut cancelled = 0;
        loop {
            tries += 1;
            let link = Self::fresh(fresh);
            let deadline = until.min(Instant::now() + self.settings.call_timeout());
            let answer = {
                let send = self.send(link.as_ref(), attempt, &outcome);
                tokio::pin!(send);
                let mut deadline = deadline;
                loop {
                    tokio::select! {
                        r = &mut send => break Some(r),
                        () = tokio::time::sleep_until(deadline) => break None,
                        _ = interrupt.wait() => {
                            until = until.min(Instant::now() + INTERRUPTED_REPORT_FOR);
                            deadline = deadline.min(until);
                        }
                    }
                }
            };
            let (error, dark) = match answer {
                Some(Ok(reported)) => return Ok(reported),
                Some(Err(error)) => (error, false),
                None => (
                    Error::Timeout(self.settings.call_timeout().min(self.settings.report_for)),
                    true,
                ),
            };
            if error.code() == Some("57014") {
                cancelled += 1;
            }
            let closed = self.closed(link.as_ref());
            let broken = dark || closed || breaks_connection(&error);
            // A statement timeout that fires again and again is the report's own (a slow
            // contract checker), not a passing one.
            let repeating = cancelled >= MAX_CANCELLED_TRIES;
            let mut give_up = !error.is_transient() || repeating || Instant::now() >= until;
            if !give_up && broken {
                let replaced = matches!(
                    tokio::time::timeout_at(until, self.replace(fresh)).await,
                    Ok(true)
                );
                // A closed connection and no open one in its place: nowhere to report.
                give_up = closed && !replaced;
            }
            if give_up {
                let unreported = Unreported::new(attempt.clone(), outcome, tries, error);
                return Err(Error::Unreported(Box::new(unreported)));
            }
            if last_beat.elapsed() >= every {
                last_beat = Instant::now();
                let link = Self::fresh(fresh);
                let beat = self.beat(link.as_ref(), attempt.id());
                let _ = tokio::time::timeout_at(until.min(Instant::now() + every), beat).await;
            }
            tokio::select! {
                () = tokio::time::sleep(delay.min(until.saturating_duration_since(Instant::now()))) => {}
                // Shutting down: a few more seconds, not the whole report_for.
                _ = interrupt.wait() => until = until.min(Instant::now() + INTERRUPTED_REPORT_FOR),
            }
            delay = (delay * 2).min(REPORT_RETRY_MAX);
        }
    }

    /// Heartbeats until one answers `false` (then `Ok`) or the server refuses one (then `Err`).
    /// An error that may pass is not an answer: the next beat tries again, on a fresh
    /// connection when this one broke (with [`Worker::reconnect`]) — also when a beat gets no
    /// answer within the heartbeat interval (a connection gone dark without closing). A worker
    /// that never gets through is covered by the deadline rule (its attempt lapses to
    /// `unknown`).
    async fn keep_alive(&self, attempt_id: Uuid, fresh: &Fresh) -> Result<(), Error> {
        let every = self.heartbeat_interval();
        loop {
            tokio::time::sleep(every).await;
            let link = Self::fresh(fresh);
            let beat = self.beat(link.as_ref(), attempt_id);
            let broken =
                match tokio::time::timeout(every.min(self.settings.call_timeout()), beat).await {
                    Ok(Ok(true)) => false,
                    Ok(Ok(false)) => return Ok(()),
                    Ok(Err(e)) if e.is_transient() => {
                        self.closed(link.as_ref()) || breaks_connection(&e)
                    }
                    Ok(Err(e)) => return Err(e),
                    // No answer within the interval: the connection went dark.
                    Err(_) => true,
                };
            if broken {
                // Bounded, so that a connection that frees up later is still tried.
                let _ = tokio::time::timeout(every, self.replace(fresh)).await;
            }
        }
    }

    /// Runs the job on the first provider, and on the next one only when the gate allows: after
    /// a definite, retryable failure, a result the job's contract rejected, or when the gate
    /// refuses a provider as not certified.
    ///
    /// An unknown outcome — this run's timeout, or an earlier attempt's — is answered as
    /// [`Failover::ReconcileFirst`], and no second attempt is begun: the first provider may still
    /// be doing the work. Failing over to a provider other than the job's own needs the job to
    /// name a contract the provider is certified for.
    pub async fn run_failover<T, E, F, Fut>(
        &self,
        job_id: Uuid,
        providers: &[&str],
        mut work: F,
    ) -> Result<Failover<T, E>, Error>
    where
        T: Serialize,
        E: Serialize,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut failures = Vec::new();
        let mut rejected = Vec::new();
        let mut not_certified = Vec::new();
        for &provider in providers {
            let attempt = match begin_attempt(self.db, job_id, self.options(Some(provider))).await {
                Ok(attempt) => attempt,
                Err(Error::ProviderNotCertified { .. }) => {
                    not_certified.push(provider.to_string());
                    continue;
                }
                Err(Error::OutcomeUnknown { attempt_id, .. }) => {
                    return Ok(Failover::ReconcileFirst {
                        attempt_id,
                        reason: None,
                    });
                }
                Err(Error::AttemptInFlight { attempt_id, .. }) => {
                    return Ok(Failover::InFlight { attempt_id });
                }
                Err(Error::JobFinished { state, .. }) => {
                    return Ok(Failover::JobFinished { state });
                }
                Err(Error::AttemptsExhausted { .. }) => {
                    return Ok(Failover::Exhausted {
                        failures,
                        rejected,
                        not_certified,
                        attempts_exhausted: true,
                    });
                }
                Err(e) => return Err(e),
            };
            match self.drive(attempt, &mut work).await? {
                Run::Completed {
                    completion: Completion::Rejected,
                    result,
                    ..
                } => {
                    rejected.push((provider.to_string(), result));
                }
                Run::Completed {
                    attempt,
                    completion,
                    result,
                } => {
                    return Ok(Failover::Completed {
                        attempt,
                        completion,
                        result,
                    });
                }
                Run::Failed {
                    error,
                    job_state: JobState::Pending,
                    ..
                } => {
                    failures.push((provider.to_string(), error));
                }
                // A failure reported again (its first answer lost with a connection) answers
                // the job's state of now: another attempt may have begun meanwhile.
                Run::Failed {
                    job_state: JobState::Running,
                    ..
                } => return Ok(Failover::InFlight { attempt_id: None }),
                Run::Failed {
                    job_state: JobState::Unknown,
                    ..
                } => {
                    return Ok(Failover::ReconcileFirst {
                        attempt_id: None,
                        reason: None,
                    });
                }
                Run::Failed {
                    attempt,
                    error,
                    job_state,
                    ..
                } => {
                    return Ok(Failover::Failed {
                        attempt,
                        error,
                        job_state,
                    });
                }
                Run::Unknown { attempt, reason } => {
                    return Ok(Failover::ReconcileFirst {
                        attempt_id: Some(attempt.id()),
                        reason: Some(reason),
                    });
                }
                Run::Stopped { attempt } => return Ok(Failover::Stopped { attempt }),
            }
        }
        Ok(Failover::Exhausted {
            failures,
            rejected,
            not_certified,
            attempts_exhausted: false,
        })
    }
}
