//! Out-of-band decisions: `abandon_attempt` (an operator stops waiting for an attempt) and
//! `cancel_job` (the owner withdraws the intent).

use crate::entry::{arg, value, void};
use crate::input;
use crate::job;
use crate::plans::{self, Name, Statement};
use crate::refusal::Answer;
use crate::state::{open_attempt_states_sql, open_job_states_sql};
use pgrx::Uuid;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The gate opens, but the attempt is not forgotten: if it returns, the compare-and-swap decides.
/// The job is claimable at once (no retry time).
static ABANDON: Statement = Statement {
    name: Name::Abandon,
    sql: concat!(
        "WITH a AS (
              UPDATE intent.attempts SET state = 'abandoned'
               WHERE id = $1 AND state IN ",
        open_attempt_states_sql!(),
        "
              RETURNING id, job_id, owner_id),
          j AS (
              UPDATE intent.jobs SET state = 'pending', retry_at = NULL, updated_at = statement_timestamp()
               WHERE id = (SELECT job_id FROM a) AND state IN ('running', 'unknown'))
          INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'abandoned',
                 jsonb_build_object('reason', $2::text, 'previous_state', $3::text, 'lease_expired', $4::boolean)
            FROM a"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::BOOLOID],
};

/// [`ABANDON`] on the catalog of 0.2.0 (no `retry_at`).
static ABANDON_0_2: Statement = Statement {
    name: Name::Abandon0_2,
    sql: concat!(
        "WITH a AS (
              UPDATE intent.attempts SET state = 'abandoned'
               WHERE id = $1 AND state IN ",
        open_attempt_states_sql!(),
        "
              RETURNING id, job_id, owner_id),
          j AS (
              UPDATE intent.jobs SET state = 'pending', updated_at = statement_timestamp()
               WHERE id = (SELECT job_id FROM a) AND state IN ('running', 'unknown'))
          INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'abandoned',
                 jsonb_build_object('reason', $2::text, 'previous_state', $3::text, 'lease_expired', $4::boolean)
            FROM a"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::BOOLOID],
};

/// version + 1 makes every attempt still out there lose its compare-and-swap.
static CANCEL: Statement = Statement {
    name: Name::Cancel,
    sql: concat!(
        "WITH j AS (
              UPDATE intent.jobs SET state = 'cancelled', version = version + 1, updated_at = statement_timestamp()
               WHERE id = $1 AND state IN ",
        open_job_states_sql!(),
        "
              RETURNING id, owner_id, version)
          INSERT INTO intent.events (job_id, owner_id, kind, detail)
          SELECT j.id, j.owner_id, 'cancelled',
                 jsonb_build_object('reason', $2::text, 'previous_state', $3::text, 'version', j.version,
                                    'open_attempt', (SELECT a.id FROM intent.attempts a
                                                      WHERE a.job_id = j.id AND a.state IN ",
        open_attempt_states_sql!(),
        "))
            FROM j
          RETURNING 1"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
};

crate::entry::sql_function!(
    intent_abandon_attempt,
    pg_finfo_intent_abandon_attempt,
    abandon_attempt,
    c"intent.abandon_attempt"
);

/// `intent.abandon_attempt(attempt_id, reason)` → void.
fn abandon_attempt(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    abandon(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(void())
}

fn abandon(attempt_id: Option<Uuid>, reason: Option<&str>) -> Answer<()> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let reason = input::reason(reason, true)?;
    Spi::connect_mut(|client| {
        let (job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        // Abandoning an attempt that already has an outcome (or was abandoned) changes nothing.
        if attempt.state.is_open() {
            // The job becomes pending (unless it already ended): claimable now, if it has
            // attempts left.
            if !job.is_terminal() && job.attempt_count < job.max_attempts {
                crate::claim::notify_claimable(&job.provider);
            }
            plans::run(
                client,
                if crate::state::catalog_has_retry_at() {
                    &ABANDON
                } else {
                    &ABANDON_0_2
                },
                &[
                    attempt_id.into(),
                    reason.into(),
                    attempt.state.as_str().into(),
                    attempt.is_lapsed().into(),
                ],
            );
        }
        Ok(())
    })
}

crate::entry::sql_function!(
    intent_cancel_job,
    pg_finfo_intent_cancel_job,
    cancel_job,
    c"intent.cancel_job"
);

/// `intent.cancel_job(job_id, reason)` → boolean.
fn cancel_job(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let cancelled = cancel(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(value(fcinfo, Some(cancelled)))
}

fn cancel(job_id: Option<Uuid>, reason: Option<&str>) -> Answer<bool> {
    let job_id = input::required("job_id", job_id)?;
    let reason = input::reason(reason, false)?;
    Spi::connect_mut(|client| {
        let mut job = job::lock(client, job_id)?;
        if job.is_terminal() {
            return Ok(false);
        }
        job::settle_open_attempt(client, &mut job, "cancel_job");
        let cancelled = plans::first(plans::run(
            client,
            &CANCEL,
            &[job_id.into(), reason.into(), job.state.as_str().into()],
        ));
        Ok(cancelled.is_some())
    })
}
