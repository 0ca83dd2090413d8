//! One function per SQL function of the API (docs/reference.md § 1), plus the table reads a
//! reconciler needs.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::{Context, Error};
use crate::exec::{Call, Executor, InTransaction};
use crate::records::{AttemptRecord, ClaimedAttempt, JobRecord};
use crate::types::{
    Attempt, BeginOptions, ClaimOptions, Completion, JobState, NewJob, Submitted, Validation,
};
use crate::wire::{IntervalArg, IntervalValue, JsonArg, RawJson};

/// The longest `reason` the server accepts, in characters.
pub use pg_intent_protocol::limits::MAX_REASON_CHARS;

async fn query_one<E: Executor + ?Sized>(
    db: &E,
    call: Call,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    cx: Context<'_>,
) -> Result<Row, Error> {
    let stmt = db
        .prepare_call(call)
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    db.client()
        .query_one(&stmt, params)
        .await
        .map_err(|e| Error::from_pg(e, cx))
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, idx: usize) -> Result<T, Error> {
    row.try_get(idx).map_err(|source| Error::Decode { source })
}

/// A reason the server will take: `None` for an empty one, cut to [`MAX_REASON_CHARS`].
fn reason(reason: Option<&str>) -> Option<&str> {
    let r = reason.filter(|r| !r.is_empty())?;
    Some(match r.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => &r[..cut],
        None => r,
    })
}

/// `intent.submit_job`: one job per intent.
///
/// A new `(owner_id, idempotency_key)` creates the job (`created == true`); the same key with
/// the same provider, params and contract returns the existing job and writes nothing; the same
/// key with another fingerprint is [`Error::IdempotencyConflict`]. Run it with a
/// [`crate::Transaction`] to create the job atomically with your own writes.
///
/// `R` is the type of the job's result, present once the job has succeeded.
pub async fn submit_job<R: DeserializeOwned>(
    db: &(impl Executor + ?Sized),
    job: &NewJob<'_, impl Serialize + ?Sized>,
) -> Result<Submitted<R>, Error> {
    let params = JsonArg::new(job.params)?;
    let max_attempts = i32::from(job.max_attempts);
    let cx = Context::job(Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(
        job.owner_id,
        job.idempotency_key,
    )));
    let row = query_one(
        db,
        Call::SubmitJob,
        &[
            &job.owner_id,
            &job.idempotency_key,
            &job.provider,
            &params,
            &job.contract,
            &max_attempts,
        ],
        cx,
    )
    .await?;
    Ok(Submitted {
        job_id: get(&row, 0)?,
        created: get(&row, 1)?,
        state: get::<&str>(&row, 2)?.parse()?,
        version: get(&row, 3)?,
        result: get::<Option<RawJson>>(&row, 4)?
            .map(|r| r.decode())
            .transpose()?,
    })
}

/// `intent.begin_attempt`: the gate. Hands out the attempt and its fencing token.
///
/// Refused with [`Error::AttemptInFlight`], [`Error::OutcomeUnknown`], [`Error::JobFinished`],
/// [`Error::ProviderNotCertified`], [`Error::AttemptsExhausted`] or [`Error::NotFound`].
pub async fn begin_attempt(
    db: &(impl Executor + ?Sized),
    job_id: Uuid,
    options: BeginOptions<'_>,
) -> Result<Attempt, Error> {
    let lease = IntervalArg::new(options.lease);
    let cx = Context {
        provider: options.provider,
        ..Context::job(job_id)
    };
    let row = query_one(
        db,
        Call::BeginAttempt,
        &[&job_id, &options.provider, &lease, &options.worker],
        cx,
    )
    .await?;
    let attempt_no: i32 = get(&row, 1)?;
    Ok(Attempt {
        id: get(&row, 0)?,
        attempt_no: u16::try_from(attempt_no).unwrap_or(0),
        version: get(&row, 2)?,
        deadline: get(&row, 3)?,
        lease: options.lease,
        provider: options.provider.map(str::to_string),
    })
}

/// `intent.complete_attempt`: reports the attempt's result with its own fencing token.
///
/// [`Completion::Won`]: this result is the job's. [`Completion::Lost`]: the outcome was already
/// decided; the result is kept on the attempt. [`Completion::Rejected`]: it broke the job's
/// contract. Asking again returns the same answer.
pub async fn complete_attempt(
    db: &(impl Executor + ?Sized),
    attempt: &Attempt,
    result: &(impl Serialize + ?Sized),
) -> Result<Completion, Error> {
    let result = JsonArg::new(result)?;
    let row = query_one(
        db,
        Call::CompleteAttempt,
        &[&attempt.id, &attempt.version, &result],
        Context::attempt(attempt.id),
    )
    .await?;
    Ok(get::<&str>(&row, 0)?.parse()?)
}

/// `intent.fail_attempt`: a definite failure — the provider said that nothing happened.
///
/// Never report a timeout here: that is [`mark_unknown`]. Returns the job's state: `pending` if
/// `retryable` and attempts remain, else `failed`. A retryable failure waits for the default
/// backoff (settings `intent.retry_backoff`, `intent.retry_backoff_max`) before
/// [`claim_attempts`] takes the job again; [`fail_attempt_after`] chooses the delay.
pub async fn fail_attempt(
    db: &(impl Executor + ?Sized),
    attempt: &Attempt,
    error: &(impl Serialize + ?Sized),
    retryable: bool,
) -> Result<JobState, Error> {
    fail_attempt_after(db, attempt, error, retryable, None).await
}

/// `intent.fail_attempt` with its `retry_after`: like [`fail_attempt`], and when the job returns
/// to `pending`, [`claim_attempts`] does not take it before `retry_after` has passed (`None`:
/// the default backoff; zero: at once, and `NOTIFY intent_claimable` wakes the workers).
///
/// `retry_after` is at most 30 days ([`Error::InvalidInput`] otherwise). It gates claims only:
/// [`begin_attempt`] may begin the next attempt at any time.
pub async fn fail_attempt_after(
    db: &(impl Executor + ?Sized),
    attempt: &Attempt,
    error: &(impl Serialize + ?Sized),
    retryable: bool,
    retry_after: Option<Duration>,
) -> Result<JobState, Error> {
    let error = JsonArg::new(error)?;
    let retry_after = retry_after.map(IntervalArg::new);
    let row = query_one(
        db,
        Call::FailAttempt,
        &[
            &attempt.id,
            &attempt.version,
            &error,
            &retryable,
            &retry_after,
        ],
        Context::attempt(attempt.id),
    )
    .await?;
    Ok(get::<&str>(&row, 0)?.parse()?)
}

/// `intent.claim_attempts`: begins the next attempt of up to `options.max_jobs` jobs that may
/// begin one now (pending, attempts left, retry time passed, provider in `options.providers`),
/// longest-waiting first, each on the job's own provider.
///
/// Concurrent claimers get disjoint jobs and never wait for each other (`SKIP LOCKED`): a claim
/// answers fewer attempts, or none. Each attempt is as [`begin_attempt`] would have begun it:
/// heartbeat it and report it with its own [`Attempt`] (or let [`crate::Runner`] do all that).
/// Run it outside a transaction, or in a READ COMMITTED one.
pub async fn claim_attempts(
    db: &(impl Executor + ?Sized),
    options: &ClaimOptions<'_>,
) -> Result<Vec<ClaimedAttempt>, Error> {
    let lease = IntervalArg::new(options.lease);
    let max_jobs = i32::from(options.max_jobs);
    let cx = Context::default();
    let stmt = db
        .prepare_call(Call::ClaimAttempts)
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    let rows = db
        .client()
        .query(
            &stmt,
            &[&options.providers, &options.worker, &lease, &max_jobs],
        )
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    // The claim is committed with the caller's transaction whatever happens here: one row this
    // client cannot read must not cost the others their attempts. A row whose params do not
    // decode (e.g. nested deeper than serde_json's limit) is reported as a definite, retryable
    // failure at once: no provider was called, so nothing happened, and after max_attempts the
    // job fails instead of coming back forever.
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let attempt_no: i32 = get(row, 2)?;
        let provider: String = get(row, 5)?;
        let attempt = Attempt {
            id: get(row, 1)?,
            attempt_no: u16::try_from(attempt_no).unwrap_or(0),
            version: get(row, 3)?,
            deadline: get(row, 4)?,
            lease: options.lease,
            provider: Some(provider.clone()),
        };
        match decode_value(row, 6) {
            Ok(params) => claimed.push(ClaimedAttempt {
                attempt,
                provider,
                params: params.unwrap_or_default(),
                contract: get(row, 7)?,
            }),
            Err(e) => {
                let error = serde_json::json!({
                    "kind": "undecodable_params",
                    "message": e.to_string(),
                });
                fail_attempt(db, &attempt, &error, true).await?;
            }
        }
    }
    Ok(claimed)
}

/// How long until the earliest retry time still ahead among the claimable jobs of `providers`
/// (`None`: any provider); `None` when no job waits for one. Reads `intent.jobs` (needs
/// `SELECT` on it, an operator's right): a worker sleeps until then instead of polling.
pub async fn next_retry_in(
    db: &(impl Executor + ?Sized),
    providers: Option<&[&str]>,
) -> Result<Option<Duration>, Error> {
    let row = query_one(db, Call::NextRetryIn, &[&providers], Context::default()).await?;
    let secs: Option<f64> = get(&row, 0)?;
    Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

/// `intent.mark_unknown`: the caller's own timeout fired. A started attempt becomes `unknown`,
/// and so does its job; no effect on an attempt that is not started.
///
/// A `reason` longer than [`MAX_REASON_CHARS`] is cut; an empty one is sent as NULL.
pub async fn mark_unknown(
    db: &(impl Executor + ?Sized),
    attempt_id: Uuid,
    why: Option<&str>,
) -> Result<(), Error> {
    query_one(
        db,
        Call::MarkUnknown,
        &[&attempt_id, &reason(why)],
        Context::attempt(attempt_id),
    )
    .await?;
    Ok(())
}

/// `intent.heartbeat`: extends a started attempt's lease (by `extend`, or by its own lease).
///
/// `false` when the attempt is no longer started, its lease already ran out, or its job ended:
/// stop the work.
pub async fn heartbeat(
    db: &(impl Executor + ?Sized),
    attempt_id: Uuid,
    extend: Option<Duration>,
) -> Result<bool, Error> {
    let extend = extend.map(IntervalArg::new);
    let row = query_one(
        db,
        Call::Heartbeat,
        &[&attempt_id, &extend],
        Context::attempt(attempt_id),
    )
    .await?;
    get(&row, 0)
}

/// `intent.abandon_attempt`: the out-of-band decision not to wait for a started or unknown
/// attempt. The job returns to `pending`; if the attempt returns later, the compare-and-swap
/// decides.
///
/// `reason` is required (1–1000 characters; a longer one is cut, an empty one is refused).
pub async fn abandon_attempt(
    db: &(impl Executor + ?Sized),
    attempt_id: Uuid,
    why: &str,
) -> Result<(), Error> {
    let why = if why.is_empty() {
        Some(why)
    } else {
        reason(Some(why))
    };
    query_one(
        db,
        Call::AbandonAttempt,
        &[&attempt_id, &why],
        Context::attempt(attempt_id),
    )
    .await?;
    Ok(())
}

/// `intent.record_reconciliation` (pg_intent 0.4.0 on): records how an attempt whose outcome
/// was unknown was decided — `"completed"`, `"failed"` or `"abandoned"` — and on what
/// `evidence`, as a `reconciled` event; call it after the decision's own call, in the same
/// transaction. Returns the event's id; an attempt has one reconciliation, and recording it
/// again returns the first. A decision the attempt's state does not show, or an attempt still
/// open, is refused ([`Error::InvalidInput`]). [`crate::Reconciler`] calls it for every
/// decision.
pub async fn record_reconciliation(
    db: &(impl Executor + ?Sized),
    attempt_id: Uuid,
    decision: &str,
    evidence: &(impl Serialize + ?Sized),
) -> Result<i64, Error> {
    let evidence = JsonArg::new(evidence)?;
    let row = query_one(
        db,
        Call::RecordReconciliation,
        &[&attempt_id, &decision, &evidence],
        Context::attempt(attempt_id),
    )
    .await?;
    get(&row, 0)
}

/// `intent.cancel_job`: the owner withdraws the intent. `false` if the job had already finished.
pub async fn cancel_job(
    db: &(impl Executor + ?Sized),
    job_id: Uuid,
    why: Option<&str>,
) -> Result<bool, Error> {
    let row = query_one(
        db,
        Call::CancelJob,
        &[&job_id, &reason(why)],
        Context::job(job_id),
    )
    .await?;
    get(&row, 0)
}

/// `intent.sweep`: persists started → unknown for every attempt past its deadline; returns how
/// many.
pub async fn sweep(db: &(impl Executor + ?Sized)) -> Result<u64, Error> {
    let row = query_one(db, Call::Sweep, &[], Context::default()).await?;
    let n: i64 = get(&row, 0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// `intent.purge`: removes up to `batch_size` finished jobs (succeeded, failed, cancelled) older
/// than the retention — `older_than`, or with `None` the setting `intent.retention` (7 days by
/// default; `never` keeps them, and the call removes nothing) — with their attempts and events,
/// oldest first, skipping jobs another transaction holds; returns how many it removed. After a
/// purge the same key creates a new job. An operator's call (`intent_operator`); a `Runner`
/// makes it on a schedule ([`crate::Runner::purge_every`]).
pub async fn purge(
    db: &(impl Executor + ?Sized),
    older_than: Option<Duration>,
    batch_size: u32,
) -> Result<u64, Error> {
    let older_than = older_than.map(IntervalArg::new);
    let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
    let row = query_one(
        db,
        Call::Purge,
        &[&older_than, &batch_size],
        Context::default(),
    )
    .await?;
    let n: i64 = get(&row, 0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// `intent.purge_expired`: [`purge`] by the database's retention only (`intent.retention`),
/// which an application's role (`intent_app`) may call — it cannot choose a shorter retention
/// than the one the database publishes. What a [`crate::Runner`] calls (pg_intent 0.5.0 on).
pub async fn purge_expired(db: &(impl Executor + ?Sized), batch_size: u32) -> Result<u64, Error> {
    let batch_size = i32::try_from(batch_size).unwrap_or(i32::MAX);
    let row = query_one(db, Call::PurgeExpired, &[&batch_size], Context::default()).await?;
    let n: i64 = get(&row, 0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How long finished jobs — and so their idempotency keys — are kept: the setting
/// `intent.retention` of this session (the view `intent.settings`, which works before the
/// library is loaded; pg_intent 0.5.0 on). `None`: `never`, kept for ever. A key submitted again
/// after its job was purged creates a new job. Months count as 30 days.
pub async fn retention(db: &(impl Executor + ?Sized)) -> Result<Option<Duration>, Error> {
    let row = query_one(db, Call::Retention, &[], Context::default()).await?;
    let seconds: Option<f64> = get(&row, 0)?;
    Ok(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

/// `intent.define_contract`: defines what a job's result must satisfy — a JSON Schema (draft
/// 2020-12) and optionally a checker, a SQL function `(jsonb) → boolean` named by its signature
/// (e.g. `"app.image_is_usable(jsonb)"`). Returns the contract's version: the same definition
/// again keeps it, another one bumps it (and retires certifications earned on the old one).
///
/// An administrator's call (the checker runs with the extension owner's rights).
pub async fn define_contract(
    db: &(impl Executor + ?Sized),
    name: &str,
    output_schema: &(impl Serialize + ?Sized),
    checker: Option<&str>,
) -> Result<i32, Error> {
    let schema = JsonArg::new(output_schema)?;
    let row = query_one(
        db,
        Call::DefineContract,
        &[&name, &schema, &checker],
        Context::default(),
    )
    .await?;
    get(&row, 0)
}

/// `intent.certify_provider`: records that `provider` passed the contract's tests (`evidence`:
/// inputs, pass/fail per case, settings), valid for `valid_for` (the SQL default is 30 days).
/// Returns when the certification expires. While it is current, a job with that contract may
/// fail over to the provider.
pub async fn certify_provider(
    db: &(impl Executor + ?Sized),
    provider: &str,
    contract: &str,
    evidence: &(impl Serialize + ?Sized),
    valid_for: Duration,
) -> Result<SystemTime, Error> {
    let evidence = JsonArg::new(evidence)?;
    let valid_for = IntervalArg::new(valid_for);
    let row = query_one(
        db,
        Call::CertifyProvider,
        &[&provider, &contract, &evidence, &valid_for],
        Context {
            provider: Some(provider),
            ..Context::default()
        },
    )
    .await?;
    get(&row, 0)
}

/// `intent.revoke_certification`: withdraws a provider's current certification for a contract;
/// new failovers to it are refused. `false` when there was none.
pub async fn revoke_certification(
    db: &(impl Executor + ?Sized),
    provider: &str,
    contract: &str,
    why: &str,
) -> Result<bool, Error> {
    let why = if why.is_empty() {
        Some(why)
    } else {
        reason(Some(why))
    };
    let row = query_one(
        db,
        Call::RevokeCertification,
        &[&provider, &contract, &why],
        Context {
            provider: Some(provider),
            ..Context::default()
        },
    )
    .await?;
    get(&row, 0)
}

/// `intent.validate_result`: checks `result` against a contract — its JSON Schema, then its
/// checker — as `complete_attempt` would, without writing anything. The database decides, so
/// a contract test and a completion can never disagree.
///
/// An undefined contract is [`Error::InvalidInput`]. Callable by `intent_app`.
pub async fn validate_result(
    db: &(impl Executor + ?Sized),
    contract: &str,
    result: &(impl Serialize + ?Sized),
) -> Result<Validation, Error> {
    let result = JsonArg::new(result)?;
    let row = query_one(
        db,
        Call::ValidateResult,
        &[&contract, &result],
        Context::default(),
    )
    .await?;
    let errors = match decode_value(&row, 1)? {
        Some(serde_json::Value::Array(errors)) => errors,
        Some(serde_json::Value::Null) | None => Vec::new(),
        Some(other) => vec![other],
    };
    Ok(Validation {
        valid: get(&row, 0)?,
        errors,
    })
}

/// Binds the current transaction to one owner (`SET LOCAL intent.owner_id`): until it ends,
/// every call sees and acts on that owner's jobs only — another owner's job is
/// [`Error::NotFound`], and [`submit_job`] for another owner is refused (`42501`).
///
/// For a trusted gateway that serves many owners over pooled connections: call it first in
/// each request's transaction. The setting ends with the transaction, so the pooled connection
/// goes back unbound. It takes a transaction only ([`InTransaction`]): outside one, `SET LOCAL`
/// would last for one statement and the next query would run unbound, as the gateway's role —
/// so binding a plain connection does not compile:
///
/// ```compile_fail
/// # async fn f(db: &mut pg_intent_client::Connection) -> Result<(), Box<dyn std::error::Error>> {
/// pg_intent_client::bind_owner(&*db, "alice").await?; // a connection, not a transaction
/// # Ok(()) }
/// ```
///
/// ```no_run
/// # async fn f(db: &mut pg_intent_client::Connection) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = db.transaction().await?;
/// pg_intent_client::bind_owner(&tx, "alice").await?; // bound until commit or rollback
/// # Ok(()) }
/// ```
///
/// Only superusers and roles granted `SET ON PARAMETER intent.owner_id` may bind (else `42501`).
pub async fn bind_owner(db: &(impl InTransaction + ?Sized), owner_id: &str) -> Result<(), Error> {
    query_one(db, Call::BindOwner, &[&owner_id], Context::default()).await?;
    Ok(())
}

fn decode_value(row: &Row, idx: usize) -> Result<Option<serde_json::Value>, Error> {
    get::<Option<RawJson>>(row, idx)?
        .map(|r| r.decode())
        .transpose()
}

/// Reads a job's row from `intent.jobs` (needs `SELECT` on the table). `None` if there is none.
pub async fn get_job(
    db: &(impl Executor + ?Sized),
    job_id: Uuid,
) -> Result<Option<JobRecord>, Error> {
    let cx = Context::job(job_id);
    let stmt = db
        .prepare_call(Call::GetJob)
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    let Some(row) = db
        .client()
        .query_opt(&stmt, &[&job_id])
        .await
        .map_err(|e| Error::from_pg(e, cx))?
    else {
        return Ok(None);
    };
    Ok(Some(JobRecord {
        id: get(&row, 0)?,
        owner_id: get(&row, 1)?,
        idempotency_key: get(&row, 2)?,
        provider: get(&row, 3)?,
        params: decode_value(&row, 4)?.unwrap_or_default(),
        contract: get(&row, 5)?,
        state: get::<&str>(&row, 6)?.parse()?,
        version: get(&row, 7)?,
        completed_by: get(&row, 8)?,
        result: decode_value(&row, 9)?,
        error: decode_value(&row, 10)?,
        max_attempts: get(&row, 11)?,
        attempt_count: get(&row, 12)?,
        created_at: get(&row, 13)?,
        updated_at: get(&row, 14)?,
    }))
}

pub(crate) fn attempt_record(row: &Row) -> Result<AttemptRecord, Error> {
    Ok(AttemptRecord {
        id: get(row, 0)?,
        job_id: get(row, 1)?,
        attempt_no: get(row, 2)?,
        provider: get(row, 3)?,
        state: get::<&str>(row, 4)?.parse()?,
        version_read: get(row, 5)?,
        worker: get(row, 6)?,
        lease: get::<IntervalValue>(row, 7)?.0,
        started_at: get::<SystemTime>(row, 8)?,
        deadline: get::<SystemTime>(row, 9)?,
        finished_at: get(row, 10)?,
        result: decode_value(row, 11)?,
        error: decode_value(row, 12)?,
    })
}

/// Reads an attempt's row from `intent.attempts` (needs `SELECT` on the table). `None` if there
/// is none.
pub async fn get_attempt(
    db: &(impl Executor + ?Sized),
    attempt_id: Uuid,
) -> Result<Option<AttemptRecord>, Error> {
    let cx = Context::attempt(attempt_id);
    let stmt = db
        .prepare_call(Call::GetAttempt)
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    db.client()
        .query_opt(&stmt, &[&attempt_id])
        .await
        .map_err(|e| Error::from_pg(e, cx))?
        .as_ref()
        .map(attempt_record)
        .transpose()
}

/// The attempts whose outcome is `unknown`, oldest first, at most `limit` (needs `SELECT` on
/// `intent.attempts`): the work list of a reconciler.
///
/// A started attempt past its deadline counts as unknown but is only persisted as such by
/// [`sweep`] (or the next call that touches its job): call [`sweep`] first.
pub async fn unknown_attempts(
    db: &(impl Executor + ?Sized),
    limit: u32,
) -> Result<Vec<AttemptRecord>, Error> {
    let cx = Context::default();
    let stmt = db
        .prepare_call(Call::UnknownAttempts)
        .await
        .map_err(|e| Error::from_pg(e, cx))?;
    db.client()
        .query(&stmt, &[&i64::from(limit)])
        .await
        .map_err(|e| Error::from_pg(e, cx))?
        .iter()
        .map(attempt_record)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::reason;

    #[test]
    fn reasons_are_cut_to_what_the_server_takes() {
        assert_eq!(reason(None), None);
        assert_eq!(reason(Some("")), None);
        assert_eq!(reason(Some("timeout")), Some("timeout"));
        let long = "é".repeat(1500);
        assert_eq!(reason(Some(&long)).unwrap().chars().count(), 1000);
    }
}
