//! Reporting an outcome so that it is never lost: the report of what a worker holds
//! ([`Outcome::report`]), what the database answered ([`Reported`]), and where a worker finds a
//! fresh connection when its own broke ([`Reconnect`]). What it returns when it could not report
//! at all, [`crate::Unreported`], is an error (`error.rs`), and the outcome it holds a type of the
//! vocabulary (`types.rs`): this module builds on both, and neither on it.
//!
//! Every report of the protocol may be repeated: `complete_attempt` asked again answers as it
//! did (`won` stays `won`), `fail_attempt` on a `failed` attempt changes nothing, `mark_unknown`
//! on an attempt that is no longer `started` does nothing. So a report whose connection broke —
//! before it was sent, or after it was applied and before the answer came back — is simply made
//! again, on a fresh connection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::calls::{complete_attempt, fail_attempt_after, heartbeat, mark_unknown};
use crate::error::{Error, Unreported};
use crate::exec::Executor;
use crate::exec::{BoxError, Connections};
use crate::types::{Attempt, Completion, JobState, Outcome};

/// The longest retry delay the server takes (`fail_attempt`'s `retry_after`: 30 days).
const MAX_RETRY_AFTER: Duration =
    Duration::from_micros(pg_intent_protocol::limits::MAX_RETRY_AFTER_MICROS as u64);

/// What the database answered to a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// `complete_attempt` answered.
    Completed(Completion),
    /// `fail_attempt` answered with the job's state.
    Failed(JobState),
    /// `mark_unknown` answered.
    Unknown,
}

impl Outcome {
    /// A result, serialized.
    pub fn completed(result: &(impl Serialize + ?Sized)) -> Result<Self, Error> {
        Ok(Outcome::Completed {
            result: serde_json::value::to_raw_value(result).map_err(Error::Serialize)?,
        })
    }

    /// A definite failure, serialized.
    pub fn failed(
        error: &(impl Serialize + ?Sized),
        retryable: bool,
        retry_after: Option<Duration>,
    ) -> Result<Self, Error> {
        Ok(Outcome::Failed {
            error: serde_json::value::to_raw_value(error).map_err(Error::Serialize)?,
            retryable,
            // The server refuses a delay over 30 days; a provider's absurd Retry-After must
            // not turn a definite failure into one that cannot be reported.
            retry_after: retry_after.map(|d| d.min(MAX_RETRY_AFTER)),
        })
    }

    /// Reports it once, on `db`.
    pub async fn report(
        &self,
        db: &(impl Executor + ?Sized),
        attempt: &Attempt,
    ) -> Result<Reported, Error> {
        match self {
            Outcome::Completed { result } => complete_attempt(db, attempt, result)
                .await
                .map(Reported::Completed),
            Outcome::Failed {
                error,
                retryable,
                retry_after,
            } => fail_attempt_after(db, attempt, error, *retryable, *retry_after)
                .await
                .map(Reported::Failed),
            Outcome::Unknown { reason } => mark_unknown(db, attempt.id(), Some(reason))
                .await
                .map(|()| Reported::Unknown),
        }
    }
}

impl Unreported {
    /// Reports the outcome now, once, on `db` (safe to repeat).
    pub async fn report(&self, db: &(impl Executor + ?Sized)) -> Result<Reported, Error> {
        self.outcome().report(db, self.attempt()).await
    }
}

/// A connection a worker reports on, as the worker needs it (object-safe).
pub(crate) trait Link: Send + Sync {
    fn beat(&self, attempt_id: uuid::Uuid) -> BoxFuture<'_, Result<bool, Error>>;
    fn send<'a>(
        &'a self,
        attempt: &'a Attempt,
        outcome: &'a Outcome,
    ) -> BoxFuture<'a, Result<Reported, Error>>;
    fn closed(&self) -> bool;
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl<E: Executor + ?Sized> Link for E {
    fn beat(&self, attempt_id: uuid::Uuid) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(heartbeat(self, attempt_id, None))
    }

    fn send<'a>(
        &'a self,
        attempt: &'a Attempt,
        outcome: &'a Outcome,
    ) -> BoxFuture<'a, Result<Reported, Error>> {
        Box::pin(outcome.report(self, attempt))
    }

    fn closed(&self) -> bool {
        self.client().is_closed()
    }
}

type Connect = dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Link>, BoxError>> + Send + Sync;

/// Where a [`crate::Worker`] gets a fresh connection when its own broke: for the heartbeats of
/// an attempt still running, and for the report of its outcome, which it then retries with
/// backoff until it lands.
///
/// Made from any [`Connections`] — a `deadpool_postgres::Pool`, a `tokio_postgres::Config`
/// (a new connection each time) — or from a connect function. A [`crate::Runner`] gives its
/// workers its own connections.
#[derive(Clone)]
pub struct Reconnect(Arc<Connect>);

impl fmt::Debug for Reconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reconnect")
    }
}

impl Reconnect {
    /// Fresh connections from `source` (a pool, a `tokio_postgres::Config`, …).
    pub fn using<C: Connections>(source: C) -> Self {
        Self::shared(Arc::new(source))
    }

    /// Fresh connections from a source shared with others.
    pub(crate) fn shared<C: Connections>(source: Arc<C>) -> Self {
        Reconnect(Arc::new(move || {
            let source = source.clone();
            Box::pin(async move {
                let conn = source.connection().await?;
                Ok(Arc::new(conn) as Arc<dyn Link>)
            })
        }))
    }

    /// Fresh connections from a connect function.
    ///
    /// ```no_run
    /// # fn f(config: tokio_postgres::Config) {
    /// let reconnect = pg_intent_client::Reconnect::with(move || {
    ///     let config = config.clone();
    ///     async move {
    ///         let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    ///         tokio::spawn(conn);
    ///         Ok(pg_intent_client::Connection::new(client))
    ///     }
    /// });
    /// # }
    /// ```
    pub fn with<F, Fut, E>(connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<E, BoxError>> + Send + 'static,
        E: Executor + 'static,
    {
        Reconnect(Arc::new(move || {
            let fut = connect();
            Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn Link>) })
        }))
    }

    pub(crate) async fn connect(&self) -> Result<Arc<dyn Link>, BoxError> {
        (self.0)().await
    }
}

/// Whether an error says the connection it came on is gone (so a fresh one is needed), not
/// only that the call failed.
/// A read-only server (`25006`: the old primary after a failover, a reader endpoint) counts as
/// broken too: the next connection may reach the new primary.
pub(crate) fn breaks_connection(error: &Error) -> bool {
    match error {
        Error::Connection { .. } | Error::Timeout(_) => true,
        _ => error.code().is_some_and(|c| {
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "25006")
        }),
    }
}
