//! A thin, typed, async client for pg_intent: one durable job per intent, every retry and
//! failover an attempt under it, exactly one winner — enforced inside PostgreSQL.
//!
//! This crate makes the safe path the easy one for Rust services: no SQL strings, no parsing of
//! error messages.
//!
//! * **One function per SQL function**, typed end to end: [`submit_job`], [`begin_attempt`],
//!   [`claim_attempts`], [`complete_attempt`], [`fail_attempt`] (and [`fail_attempt_after`],
//!   with its retry delay), [`mark_unknown`], [`heartbeat`],
//!   [`abandon_attempt`], [`cancel_job`], [`sweep`], [`purge`] and [`purge_expired`] (and [`retention`], the setting
//!   it uses), [`validate_result`], and for
//!   administrators [`define_contract`], [`certify_provider`], [`revoke_certification`]. Ids
//!   are [`Uuid`]s, states are enums ([`JobState`], [`AttemptState`], [`Completion`]), params
//!   and results are any `Serialize` / `DeserializeOwned`. The fencing token is inside the
//!   [`Attempt`] handle that [`begin_attempt`] returns, so a caller cannot present the wrong one.
//! * **Errors by SQLSTATE**: [`Error`] has a variant per `IJ0xx` code and for bad input
//!   (`22023`), with the DETAIL's facts as fields; other database errors and connection errors
//!   are kept apart, with the SQLSTATE at [`Error::code`].
//! * **Runs where you already are**: every call takes an [`Executor`] — a [`Connection`] (a
//!   `tokio_postgres::Client` with its statement cache), its [`Transaction`] (submit a job in the
//!   same transaction as the business write that needs it), a pooled `deadpool_postgres::Object`
//!   or its transaction, or a bare client or transaction with a [`StatementCache`] beside it.
//!   Statements are prepared once per connection (see below).
//! * **The protocol, encoded**: [`Worker`] begins an attempt, heartbeats while the provider
//!   works, marks the attempt unknown (never failed) when your timeout fires, reports with the
//!   right version and stops when a heartbeat says so. It never drops an outcome it holds: when
//!   its connection breaks, heartbeats and the report move to a fresh one ([`Reconnect`]), and
//!   a report that cannot land comes back as [`Error::Unreported`] with the result in it. [`Worker::run_failover`] tries the next
//!   provider only when the gate allows and answers [`Failover::ReconcileFirst`] instead of
//!   starting a second attempt while an outcome is unknown.
//! * **A worker process in a few lines**: [`Runner`] `LISTEN`s for `NOTIFY intent_claimable`,
//!   claims attempts up to its free concurrency ([`claim_attempts`]: disjoint between any number
//!   of runners), runs each as [`Worker`] does, waits for retry times, and shuts down without
//!   ever failing an attempt it did not finish ([`runner`]).
//! * **Certification by evidence**: the contract-test harness, the crate `pg_intent_harness`
//!   (`harness/`), runs a contract's test suite through the real round trip (render the
//!   prompt, call the provider, parse) against any provider — an OpenAI-compatible API with its
//!   `openai` feature — has the database judge every output ([`validate_result`]), and calls
//!   [`certify_provider`] with the evidence only when every run of every case passed.
//! * **Ids before the database**: [`job_id`] and [`attempt_id`] compute the derived ids of
//!   docs/reference.md § 1.4 (from [`pg_intent_protocol`]), so a load balancer or a log line
//!   can name a job first.
//!
//! # Connections, transactions and pools
//!
//! tokio-postgres caches nothing by itself, and a prepared [`tokio_postgres::Statement`] is only
//! valid on the connection that prepared it, so the statement cache lives *with the connection*:
//!
//! | you hold | pass | statements live in |
//! |---|---|---|
//! | a `tokio_postgres::Client` | wrap it once: [`Connection::new`] (it derefs to the client) | the [`Connection`] |
//! | a transaction on it | [`Connection::transaction`] → [`Transaction`] | its [`Connection`] |
//! | a pooled `deadpool_postgres::Object` (feature `deadpool`, on by default) | the object, or its `deadpool_postgres::Transaction` | deadpool's own per-connection cache |
//! | a bare client or transaction you cannot wrap | [`StatementCache::on`] | a [`StatementCache`] you keep beside that connection |
//!
//! Each statement is prepared the first time it is needed on a connection and reused for the
//! connection's lifetime; concurrent first uses share one preparation. Preparing is not
//! transactional in PostgreSQL, so a statement prepared inside a transaction that rolls back
//! stays usable. To run the calls on anything else (another pool), implement [`Executor`].
//! Behind PgBouncer in transaction pooling mode, named prepared statements need its
//! prepared-statement support (`max_prepared_statements`, PgBouncer 1.21 or later).
//!
//! A call made with a transaction runs inside it: a job submitted there becomes visible only
//! when the transaction commits. A gateway serving many owners on pooled connections binds each
//! request's transaction to its owner with [`bind_owner`]. The [`Worker`] needs a connection
//! outside any transaction, since its heartbeats must commit to extend the lease.
//!
//! Tables are read by [`get_job`], [`get_attempt`] and [`unknown_attempts`] (a reconciler's work
//! list); they need `SELECT` on `intent.jobs` / `intent.attempts` (an operator's role).
//!
//! * **Reconciliation by asking the provider**: a [`Reconciler`] takes each `unknown` attempt,
//!   asks its provider what became of the request sent under the attempt id (a
//!   [`StatusLookup`]), and completes, fails (retryable), leaves or — after an age you choose —
//!   abandons it, as docs/runbook.md § 2 says, each decision once however many reconcilers run
//!   ([`reconciler`]).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use pg_intent_client::{self as intent, Completion, Connection, NewJob, Run, Submitted, WorkError, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize)]
//! struct Prompt<'a> { text: &'a str }
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Image { url: String }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let (client, conn) = tokio_postgres::connect("host=localhost user=app dbname=app", tokio_postgres::NoTls).await?;
//! tokio::spawn(conn);
//! let mut db = Connection::new(client);
//!
//! // The API handler: the order and its job commit together, or not at all.
//! let tx = db.transaction().await?;
//! tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&"order-1"]).await?;
//! let prompt = Prompt { text: "a red fox" };
//! let job: Submitted<Image> =
//!     intent::submit_job(&tx, &NewJob::new("alice", "order-1", "gpu-a", &prompt)).await?;
//! tx.commit().await?;
//! if let Some(image) = job.result {
//!     println!("already done: {}", image.url); // a replay of a finished intent
//! }
//!
//! // The worker: heartbeats, timeout → unknown, the right version, all handled.
//! let worker = Worker::new(&db, Duration::from_secs(60)).lease(Duration::from_secs(15));
//! match worker
//!     .run(job.job_id, None, |attempt| async move {
//!         // call the provider with attempt.id() as its idempotency key …
//!         Ok::<_, WorkError<String>>(Image { url: format!("s3://images/{}.png", attempt.id()) })
//!     })
//!     .await
//! {
//!     Ok(Run::Completed { completion: Completion::Won, .. }) => println!("done"),
//!     Ok(Run::Unknown { attempt, .. }) => println!("{} timed out: reconcile it", attempt.id()),
//!     Ok(other) => println!("{other:?}"),
//!     Err(intent::Error::OutcomeUnknown { attempt_id, .. }) => {
//!         println!("an earlier attempt {attempt_id:?} must be reconciled first")
//!     }
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! See `examples/` for a submitting service and a reconciler (a [`Reconciler`] on a stand-in
//! provider); the harness's `examples/` has a worker whose provider failures are the harness's,
//! and the failover demo (`failover_demo`: a failover refused, a provider certified by the
//! harness, the failover allowed).
#![warn(missing_docs)]

mod calls;
mod error;
mod exec;
mod ids;
pub mod provider_keys;
pub mod reconciler;
mod records;
mod report;
pub mod runner;
mod settings;
mod types;
mod wire;
mod worker;

pub use calls::{
    MAX_REASON_CHARS, abandon_attempt, begin_attempt, bind_owner, cancel_job, certify_provider,
    claim_attempts, complete_attempt, define_contract, fail_attempt, fail_attempt_after,
    get_attempt, get_job, heartbeat, mark_unknown, next_retry_in, purge, purge_expired,
    record_reconciliation, retention, revoke_certification, submit_job, sweep, unknown_attempts,
    validate_result,
};
pub use error::{Error, Unreported};
pub use exec::{
    Cached, Call, Connection, Connections, Executor, InTransaction, StatementCache, Transaction,
};
pub use ids::{attempt_id, attempt_no_of, job_id, job_of};
pub use provider_keys::ProviderKeys;
pub use reconciler::{Reconciler, StatusLookup};
pub use records::{AttemptRecord, ClaimedAttempt, JobRecord};
pub use report::{Reconnect, Reported};
pub use runner::Runner;
pub use settings::DEFAULT_REPORT_FOR;
pub use types::{
    Attempt, AttemptState, BeginOptions, ClaimOptions, Completion, DEFAULT_LEASE,
    DEFAULT_MAX_ATTEMPTS, FingerprintField, JobState, NewJob, Outcome, Submitted, UnknownLabel,
    Validation,
};
pub use worker::{Failover, Run, WorkError, Worker};

pub use pg_intent_protocol;
/// The shared crate's name until 0.2.0.
#[deprecated(note = "the crate is pg_intent_protocol now")]
pub use pg_intent_protocol as pg_intent_id;
pub use pg_intent_protocol::{IdError, MAX_ATTEMPT_NO, MAX_NAME_CHARS};
pub use uuid::Uuid;

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles only if the futures can be spawned on a multi-threaded runtime and the error
    /// fits `Box<dyn Error + Send + Sync>`.
    #[allow(dead_code)]
    fn futures_are_send(db: &Connection, attempt: &Attempt, id: Uuid) {
        fn send<T: Send>(_: T) {}
        fn send_sync_static<T: Send + Sync + 'static>() {}
        send_sync_static::<Error>();
        let params = serde_json::json!({});
        send(submit_job::<serde_json::Value>(
            db,
            &NewJob::new("o", "k", "p", &params),
        ));
        send(complete_attempt(db, attempt, &params));
        let worker = Worker::new(db, std::time::Duration::from_secs(1));
        send(worker.run(id, None, |_| async { Ok::<_, WorkError<()>>(()) }));
        send(worker.run_failover(id, &["p"], |_| async { Ok::<_, WorkError<()>>(()) }));
    }

    #[cfg(feature = "deadpool")]
    #[allow(dead_code)]
    fn pooled_futures_are_send(
        obj: &deadpool_postgres::Object,
        pool: deadpool_postgres::Pool,
        id: Uuid,
    ) {
        fn send<T: Send>(_: T) {}
        send(sweep(obj));
        send(purge(obj, None, 100));
        send(purge_expired(obj, 100));
        send(retention(obj));
        let worker = Worker::new(obj, std::time::Duration::from_secs(1));
        send(worker.run(id, None, |_| async { Ok::<_, WorkError<()>>(()) }));
        let runner = Runner::new(pool, std::time::Duration::from_secs(1));
        send(runner.run(
            |_| async { Ok::<_, WorkError<()>>(()) },
            std::future::pending(),
        ));
    }

    /// The id test vectors of docs/reference.md § 1.4, through the client's typed API.
    #[test]
    fn spec_vectors() {
        let vectors = [
            ("alice", "click-1", "62ccd04c-f6e5-82dd-aeee-a9dac8090000"),
            ("bob", "click-1", "7f0bee31-33f4-8d37-a75f-6be579b60000"),
            (
                "tenant-42",
                "order-2026-11-30-0001",
                "7a4ffde0-bffb-854b-acd8-945a08ef0000",
            ),
            ("ö", "ключ", "3978066c-a3db-84e2-8d3c-9400b3c00000"),
        ];
        for (owner, key, want) in vectors {
            assert_eq!(job_id(owner, key).unwrap().to_string(), want);
            let job = NewJob::new(owner, key, "p", &());
            assert_eq!(job.job_id().unwrap().to_string(), want);
        }
        let job = job_id("alice", "click-1").unwrap();
        let a1 = attempt_id(job, 1).unwrap();
        assert_eq!(a1.to_string(), "62ccd04c-f6e5-82dd-aeee-a9dac8090001");
        assert_eq!(
            attempt_id(job, 2).unwrap().to_string(),
            "62ccd04c-f6e5-82dd-aeee-a9dac8090002"
        );
        assert_eq!(job_of(a1).unwrap(), job);
        assert_eq!(attempt_no_of(a1), 1);
        assert_eq!(attempt_no_of(job), 0);
        assert_eq!(attempt_id(job, 0), Err(IdError::AttemptNo(0)));
        assert_eq!(job_id("", "k"), Err(IdError::OwnerLength(0)));
    }
}
