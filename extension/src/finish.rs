//! `complete_attempt` and `fail_attempt`: the outcome slot, decided by compare-and-swap.
//!
//! The job row is locked first, so the compare-and-swap is never racing; it is still written
//! as the SPEC states it (`WHERE version = $v AND completed_by IS NULL`) so that the rule is
//! visible in the statement a DBA reads, and holds even for a caller that bypassed the lock.

use crate::contract::{self, Violation};
use crate::entry::{arg, enum_value, result_type};
use crate::input;
use crate::job::{self, Attempt, Job};
use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::refusal::Answer;
use crate::state::{AttemptState, JobState, open_job_states_sql};
use pg_intent_protocol::Completion;
use pgrx::Uuid;
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// The compare-and-swap, the attempt's own outcome and, when it lost, the logged race.
static COMPLETE: Statement = Statement {
    name: "Complete",
    sql: concat!(
        "WITH won AS (
              UPDATE intent.jobs
                 SET state = 'succeeded', result = $3, completed_by = $1, version = version + 1,
                     updated_at = $6
               WHERE id = $2 AND version = $4 AND completed_by IS NULL
                 AND state IN ",
        open_job_states_sql!(),
        "
              RETURNING version),
          a AS (
              UPDATE intent.attempts
                 SET state = CASE WHEN EXISTS (SELECT 1 FROM won) THEN 'succeeded' ELSE 'discarded' END::intent.attempt_state,
                     result = $3, finished_at = $6
               WHERE id = $1),
          e AS (
              INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
              SELECT j.id, j.owner_id, $1, 'late_result',
                     jsonb_build_object('winner', j.completed_by, 'presented_version', $4,
                                        'current_version', j.version, 'job_state', j.state,
                                        'attempt_state', $5::text)
                FROM intent.jobs j
               WHERE j.id = $2 AND NOT EXISTS (SELECT 1 FROM won))
          SELECT EXISTS (SELECT 1 FROM won)"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// A result for an attempt that had already failed definitely: it cannot become the job's
/// outcome, and the attempt keeps its recorded failure; the result is kept in the log.
static LOG_RESULT_AFTER_FAILURE: Statement = Statement {
    name: "LogResultAfterFailure",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT j.id, j.owner_id, $1, 'late_result',
                 jsonb_build_object('attempt_state', 'failed', 'result', $3, 'presented_version', $4,
                                    'current_version', j.version, 'job_state', j.state, 'winner', j.completed_by)
            FROM intent.jobs j WHERE j.id = $2
             -- Asked again: the same answer, logged once.
             AND NOT EXISTS (SELECT 1 FROM intent.events e
                              WHERE e.job_id = $2 AND e.attempt_id = $1 AND e.kind = 'late_result')",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::JSONBOID, pg_sys::INT8OID],
};

/// Records a definite failure on the attempt; a rejected result stays on its own row.
static FAIL_ATTEMPT: Statement = Statement {
    name: "FailAttempt",
    sql: "UPDATE intent.attempts SET state = 'failed', error = $2, result = $3, finished_at = $4
           WHERE id = $1",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::JSONBOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// A result that broke the job's contract, logged with the validation errors.
static LOG_VIOLATION: Statement = Statement {
    name: "LogViolation",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT j.id, j.owner_id, $1, 'contract_violation', $3::jsonb || jsonb_build_object('job_state', $4::text)
            FROM intent.jobs j WHERE j.id = $2
          RETURNING detail - 'job_state'",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
};

/// The final failure of the job, by the same compare-and-swap as a win.
static FAIL_JOB: Statement = Statement {
    name: "FailJob",
    sql: concat!(
        "UPDATE intent.jobs
             SET state = 'failed', error = $3, completed_by = $1, version = version + 1,
                 updated_at = $5
           WHERE id = $2 AND version = $4 AND completed_by IS NULL
             AND state IN ",
        open_job_states_sql!(),
        " RETURNING state::text"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The gate opens: the job may take a new attempt, and claim_attempts may begin it once its
/// retry time has come: `$2` after now, or the default backoff (intent.retry_backoff doubled
/// for each failed attempt of the job but the first, at most intent.retry_backoff_max; the
/// exponent stops at 30, where any sane maximum has long been reached). Answers whether the job
/// is claimable at once.
static REOPEN_JOB: Statement = Statement {
    name: "ReopenJob",
    // $3 and $4: the settings in seconds, each checked to at most 30 days, so the product is at
    // most 30 days × 2^30 seconds, which a double holds exactly enough, and the delay at most
    // 30 days, which an interval holds.
    sql: "UPDATE intent.jobs j SET state = 'pending', updated_at = $5,
                 retry_at = $5 + coalesce($2, make_interval(secs => least($4,
                     $3 * power(2, least(30, greatest(0, (SELECT count(*) FROM intent.attempts a
                                                           WHERE a.job_id = j.id AND a.state = 'failed') - 1))))))
           WHERE j.id = $1 AND j.state IN ('running', 'unknown')
          RETURNING j.retry_at <= $5",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::INTERVALOID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// [`REOPEN_JOB`] on the catalog of 0.2.0 (no `retry_at`: claimable at once).
static REOPEN_JOB_0_2: Statement = Statement {
    name: "ReopenJob0_2",
    sql: "UPDATE intent.jobs SET state = 'pending', updated_at = $2
           WHERE id = $1 AND state IN ('running', 'unknown')
          RETURNING true",
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

/// A failure that arrived after the job's outcome was decided.
static LOG_LATE_FAILURE: Statement = Statement {
    name: "LogLateFailure",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT j.id, j.owner_id, $1, 'late_failure',
                 jsonb_build_object('error', $3, 'attempt_state', $4::text, 'job_state', j.state,
                                    'winner', j.completed_by, 'current_version', j.version)
            FROM intent.jobs j WHERE j.id = $2
             -- Reported again: logged once.
             AND NOT EXISTS (SELECT 1 FROM intent.events e
                              WHERE e.job_id = $2 AND e.attempt_id = $1 AND e.kind = 'late_failure')",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
    ],
};

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
            AttemptState::Failed if crate::dist::distributed() => {
                crate::dist::log_result_after_failure(client, attempt_id, job.id, result, version);
                return Ok(Completion::Lost);
            }
            AttemptState::Failed => {
                plans::run(
                    client,
                    &LOG_RESULT_AFTER_FAILURE,
                    &[
                        attempt_id.into(),
                        job.id.into(),
                        result.into(),
                        version.into(),
                    ],
                );
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
        if crate::dist::distributed() {
            let won = crate::dist::complete(
                client,
                attempt_id,
                job.id,
                result,
                version,
                state_before.as_str(),
            );
            return Ok(if won {
                Completion::Won
            } else {
                Completion::Lost
            });
        }
        let row = plans::first(plans::run(
            client,
            &COMPLETE,
            &[
                attempt_id.into(),
                job.id.into(),
                result.into(),
                version.into(),
                state_before.as_str().into(),
                crate::clock::now().into(),
            ],
        ))
        .expect("SELECT EXISTS returns a row");
        Ok(if plans::must::<bool>(&row, 1) {
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
        crate::entry::arg_if_declared(fcinfo, 4),
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
            fail_attempt_row(client, attempt_id, error, None);
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
    if crate::dist::distributed() {
        let error =
            crate::dist::log_violation(client, attempt.id, job.id, &error, job.state.as_str());
        if job.is_terminal() {
            fail_attempt_row(client, attempt.id, error, Some(result));
            return Ok(());
        }
        let retry = Retry {
            retryable: true,
            after: None,
        };
        return settle_failure(client, job, attempt, error, Some(result), retry).map(|_| ());
    }
    let logged = plans::first(plans::run(
        client,
        &LOG_VIOLATION,
        &[
            attempt.id.into(),
            job.id.into(),
            error.as_str().into(),
            job.state.as_str().into(),
        ],
    ))
    .expect("INSERT … RETURNING returns the row");
    let error: Jsonb = plans::must(&logged, 1);
    if job.is_terminal() {
        plans::run(
            client,
            &FAIL_ATTEMPT,
            &[
                attempt.id.into(),
                error.into(),
                result.into(),
                crate::clock::now().into(),
            ],
        );
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
    fail_attempt_row(client, attempt.id, error, result);
    // An abandoned attempt failing leaves the open attempt, if any, in charge of the job.
    let other_open = !was_open && job::open_attempt(client, job.id).is_some();
    let exhausted = job.attempt_count >= job.max_attempts;
    if !retry.retryable || (exhausted && !other_open) {
        let row = plans::first(plans::run(
            client,
            if crate::dist::distributed() {
                &crate::dist::FAIL_JOB
            } else {
                &FAIL_JOB
            },
            &[
                attempt.id.into(),
                job.id.into(),
                error.into(),
                attempt.version_read.into(),
                crate::clock::now().into(),
            ],
        ));
        return Ok(match row {
            Some(row) => crate::state::read(&row, 1),
            None => effective_state(client, job),
        });
    }
    if !other_open {
        let reopened = plans::first(if crate::state::catalog_has_retry_at() {
            // Read only when no retry_after was given: a bad setting fails only the calls
            // that need it.
            let (first, longest) = match retry.after {
                Some(_) => (0.0, 0.0),
                None => crate::claim::backoff_settings()?,
            };
            plans::run(
                client,
                if crate::dist::distributed() {
                    &crate::dist::REOPEN_JOB
                } else {
                    &REOPEN_JOB
                },
                &[
                    job.id.into(),
                    retry.after.into(),
                    first.into(),
                    longest.into(),
                    crate::clock::now().into(),
                ],
            )
        } else {
            plans::run(
                client,
                &REOPEN_JOB_0_2,
                &[job.id.into(), crate::clock::now().into()],
            )
        });
        if reopened.is_some_and(|row| plans::must::<bool>(&row, 1)) {
            crate::claim::notify_claimable(&job.provider);
        }
        return Ok(JobState::Pending);
    }
    Ok(effective_state(client, job))
}

fn log_late_failure(
    client: &mut pgrx::spi::SpiClient<'_>,
    job: &Job,
    attempt: &Attempt,
    error: Jsonb,
) {
    if crate::dist::distributed() {
        crate::dist::log_late_failure(client, attempt.id, job.id, error, attempt.state.as_str());
        return;
    }
    plans::run(
        client,
        &LOG_LATE_FAILURE,
        &[
            attempt.id.into(),
            job.id.into(),
            error.into(),
            attempt.state.as_str().into(),
        ],
    );
}

/// The job's state as the SPEC defines it: a running job whose open attempt ran out of lease
/// is unknown.
/// Records a definite failure on the attempt (FAIL_ATTEMPT; distributed, with its job id).
fn fail_attempt_row(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    error: Jsonb,
    result: Option<Jsonb>,
) {
    if crate::dist::distributed() {
        let job_id = crate::dist::job_of(attempt_id);
        plans::run(
            client,
            &crate::dist::FAIL_ATTEMPT,
            &[
                attempt_id.into(),
                error.into(),
                result.into(),
                job_id.into(),
                crate::clock::now().into(),
            ],
        );
    } else {
        plans::run(
            client,
            &FAIL_ATTEMPT,
            &[
                attempt_id.into(),
                error.into(),
                result.into(),
                crate::clock::now().into(),
            ],
        );
    }
}

fn effective_state(client: &mut SpiClient<'_>, job: &Job) -> JobState {
    let lapsed = job.state == JobState::Running
        && job::open_attempt(client, job.id).is_some_and(|open| open.lapsed);
    crate::state::effective_job(job.state, lapsed)
}
