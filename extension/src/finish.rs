//! `complete_attempt` and `fail_attempt`: the outcome slot, decided by compare-and-swap.
//!
//! The job row is locked first, so the compare-and-swap is never racing; it is still written
//! as docs/protocol.md § complete_attempt states it (`WHERE version = $v AND completed_by IS NULL`) so that the rule is
//! visible in the statement a DBA reads, and holds even for a caller that bypassed the lock.

use crate::contract::{self, Violation};
use crate::entry::{arg, enum_value, result_type};
use crate::input;
use crate::job::{self, Attempt, Job};
use crate::jsonb::Jsonb;
use crate::refusal::Answer;
use crate::state::{AttemptState, JobState};
use crate::store::{self, Presented};
use pg_intent_protocol::Completion;
use pgrx::Uuid;
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

crate::entry::sql_function!(complete_attempt, complete_attempt);

/// `intent.complete_attempt(attempt_id, version, result)` → `intent.completion`.
fn complete_attempt(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let completion = complete(arg(fcinfo, 0), arg(fcinfo, 1), arg(fcinfo, 2))?;
    Ok(enum_value(result_type(fcinfo), completion.as_str()))
}

fn complete(
    attempt_id: Option<Uuid>,
    version: Option<i64>,
    result: Option<Jsonb>,
) -> Answer<Completion> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let version = input::required("version", version)?;
    let result = input::result(result)?;

    Spi::connect_mut(|client| {
        let (mut job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        attempt.check_version(version)?;
        match attempt.state {
            // Asked again: the same answer, and nothing changes.
            AttemptState::Succeeded => return Ok(Completion::Won),
            AttemptState::Discarded => return Ok(Completion::Lost),
            AttemptState::Failed if attempt.error_kind.as_deref() == Some(contract::VIOLATION) => {
                return Ok(Completion::Rejected);
            }
            AttemptState::Failed => {
                store::log_result_after_failure(client, attempt_id, job.id, result, version);
                return Ok(Completion::Lost);
            }
            AttemptState::Started | AttemptState::Unknown | AttemptState::Abandoned => {}
        }
        // started, unknown or abandoned: this result really happened and may win.
        if attempt.is_lapsed()
            && job::settle_lapsed(client, attempt_id, "complete_attempt")
            && job.state == JobState::Running
        {
            job.state = JobState::Unknown;
        }
        let state_before = attempt.effective_state();
        if let Some(name) = &job.contract
            && let Some(Err(violation)) = contract::validate(client, name, result)
        {
            reject(client, &job, &attempt, name, &violation, result)?;
            return Ok(Completion::Rejected);
        }
        let won = store::get().complete(
            client,
            &Presented {
                attempt_id,
                job_id: job.id,
                result,
                version,
                attempt_state: state_before.as_str(),
            },
        );
        Ok(if won {
            Completion::Won
        } else {
            Completion::Lost
        })
    })
}

crate::entry::sql_function!(fail_attempt, fail_attempt);

/// `intent.fail_attempt(attempt_id, version, error, retryable, retry_after)` →
/// `intent.job_state`.
fn fail_attempt(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let state = fail(
        arg(fcinfo, 0),
        arg(fcinfo, 1),
        arg(fcinfo, 2),
        arg(fcinfo, 3),
        // retry_after (0.3.0): absent from the 0.2.0 declaration.
        crate::store::compat::arg_if_declared(fcinfo, 4),
    )?;
    Ok(enum_value(result_type(fcinfo), state.as_str()))
}

fn fail(
    attempt_id: Option<Uuid>,
    version: Option<i64>,
    error: Option<Jsonb>,
    retryable: Option<bool>,
    retry_after: Option<Interval>,
) -> Answer<JobState> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let version = input::required("version", version)?;
    let error = input::document("error", error)?;
    let retryable = input::required("retryable", retryable)?;
    let retry_after = input::retry_after(retry_after)?;

    Spi::connect_mut(|client| {
        let (job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        attempt.check_version(version)?;
        match attempt.state {
            // Reported again: nothing changes.
            AttemptState::Failed => return Ok(effective_state(client, &job)),
            // Its outcome was already recorded; a contradicting failure is logged, not applied.
            AttemptState::Succeeded | AttemptState::Discarded => {
                log_late_failure(client, &job, &attempt, error);
                return Ok(effective_state(client, &job));
            }
            AttemptState::Started | AttemptState::Unknown | AttemptState::Abandoned => {}
        }
        if job.is_terminal() {
            store::fail_attempt(client, attempt_id, error, None);
            log_late_failure(client, &job, &attempt, error);
            return Ok(job.state);
        }
        settle_failure(
            client,
            &job,
            &attempt,
            error,
            None,
            Retry {
                retryable,
                after: retry_after,
            },
        )
    })
}

/// A result that broke the contract: the attempt fails with the validation errors (its result
/// kept on its row), the violation is logged, and the job goes on as after a retryable failure.
fn reject(
    client: &mut SpiClient<'_>,
    job: &Job,
    attempt: &Attempt,
    contract: &str,
    violation: &Violation,
    result: Jsonb,
) -> Answer<()> {
    let error = violation.to_error(contract).to_string();
    let error = store::log_violation(client, attempt.id, job.id, &error, job.state.as_str());
    if job.is_terminal() {
        store::fail_attempt(client, attempt.id, error, Some(result));
        return Ok(());
    }
    let retry = Retry {
        retryable: true,
        after: None,
    };
    settle_failure(client, job, attempt, error, Some(result), retry).map(|_| ())
}

/// Whether a failure may be retried, and after how long (None: the default backoff).
#[derive(Clone, Copy)]
struct Retry {
    retryable: bool,
    after: Option<Interval>,
}

/// A definite failure of an attempt of an open job: records it and moves the job. Returns the
/// job's state afterwards.
fn settle_failure(
    client: &mut SpiClient<'_>,
    job: &Job,
    attempt: &Attempt,
    error: Jsonb,
    result: Option<Jsonb>,
    retry: Retry,
) -> Answer<JobState> {
    let was_open = attempt.state.is_open();
    store::fail_attempt(client, attempt.id, error, result);
    // An abandoned attempt failing leaves the open attempt, if any, in charge of the job.
    let other_open = !was_open && job::open_attempt(client, job.id).is_some();
    let exhausted = job.attempt_count >= job.max_attempts;
    if !retry.retryable || (exhausted && !other_open) {
        return Ok(
            if store::fail_job(client, attempt.id, job.id, error, attempt.version_read) {
                JobState::Failed
            } else {
                effective_state(client, job)
            },
        );
    }
    if !other_open {
        if store::reopen_job(client, job.id, retry.after, crate::claim::backoff_settings)?
            == Some(true)
        {
            crate::claim::notify_claimable(&job.provider);
        }
        return Ok(JobState::Pending);
    }
    Ok(effective_state(client, job))
}

fn log_late_failure(client: &mut SpiClient<'_>, job: &Job, attempt: &Attempt, error: Jsonb) {
    store::log_late_failure(client, attempt.id, job.id, error, attempt.state.as_str());
}

/// The job's state as the protocol defines it: a running job whose open attempt ran out of
/// lease is unknown.
fn effective_state(client: &mut SpiClient<'_>, job: &Job) -> JobState {
    let lapsed = job.state == JobState::Running
        && job::open_attempt(client, job.id).is_some_and(|open| open.lapsed);
    crate::state::effective_job(job.state, lapsed)
}
