//! Out-of-band decisions: `abandon_attempt` (an operator stops waiting for an attempt),
//! `cancel_job` (the owner withdraws the intent), and `record_reconciliation` (a reconciler
//! records how it decided an attempt whose outcome was unknown, and on what evidence).

use crate::entry::{arg, value, void};
use crate::input;
use crate::job;
use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::refusal::Answer;
use crate::refusal::Refusal;
use crate::state::AttemptState;
use crate::store::{self, Abandoned};
use pgrx::Uuid;
use pgrx::pg_sys;
use pgrx::prelude::*;

crate::entry::sql_function!(abandon_attempt, abandon_attempt);

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
            // The gate opens, but the attempt is not forgotten: if it returns, the
            // compare-and-swap decides. The job is claimable at once (no retry time).
            store::get().abandon(
                client,
                &Abandoned {
                    attempt_id,
                    reason,
                    previous_state: attempt.state.as_str(),
                    lease_expired: attempt.is_lapsed(),
                },
            );
        }
        Ok(())
    })
}

/// The reconciliation already recorded for an attempt, if any (one per attempt).
static FIND_RECONCILED: Statement = Statement {
    name: "FindReconciled",
    sql: "SELECT id FROM intent.events
           WHERE job_id = $1 AND attempt_id = $2 AND kind = 'reconciled'
           ORDER BY id LIMIT 1",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

/// Whether the attempt was ever unknown: its `timeout` event (mark_unknown, or a lapsed lease
/// persisted). Only such an attempt has anything to reconcile.
static WAS_UNKNOWN: Statement = Statement {
    name: "WasUnknown",
    sql: "SELECT 1 FROM intent.events
           WHERE job_id = $1 AND attempt_id = $2 AND kind = 'timeout'
           LIMIT 1",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

/// The decisions a reconciliation may record, each with the attempt states it can have left.
/// `completed` covers every answer of `complete_attempt`: won (succeeded), lost (discarded)
/// and rejected by the contract (failed).
const RECONCILED: &[(&str, &[AttemptState])] = &[
    (
        "completed",
        &[
            AttemptState::Succeeded,
            AttemptState::Discarded,
            AttemptState::Failed,
        ],
    ),
    ("failed", &[AttemptState::Failed]),
    ("abandoned", &[AttemptState::Abandoned]),
];

crate::entry::sql_function!(record_reconciliation, record_reconciliation);

/// `intent.record_reconciliation(attempt_id, decision, evidence)` → bigint (the event id).
fn record_reconciliation(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let id = reconciled(arg(fcinfo, 0), arg(fcinfo, 1), arg(fcinfo, 2))?;
    Ok(value(fcinfo, Some(id)))
}

fn reconciled(
    attempt_id: Option<Uuid>,
    decision: Option<&str>,
    evidence: Option<Jsonb>,
) -> Answer<i64> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let decision = input::required("decision", decision)?;
    let evidence = input::document("evidence", evidence)?;
    let Some((decision, left)) = RECONCILED.iter().find(|(d, _)| *d == decision) else {
        let shown: String = decision.chars().take(100).collect();
        return Err(Refusal::bad_input(format!(
            "decision must be completed, failed or abandoned, not {shown:?}"
        ))
        .detail(format!(
            "decision is {shown:?} ({} characters); attempt {attempt_id} was not looked at.",
            decision.chars().count()
        ))
        .hint("Record only what was decided; an attempt left as it was needs no record."));
    };
    Spi::connect_mut(|client| {
        // The job's row lock orders this after the decision's own call, and the binding's
        // policies hide another owner's attempt (IJ007).
        let (job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        if let Some(row) = plans::first(plans::run(
            client,
            &FIND_RECONCILED,
            &[job.id.into(), attempt_id.into()],
        )) {
            // Recorded already: a reconciliation is recorded once, and repeating it is safe.
            return Ok(plans::must::<i64>(&row, 1));
        }
        if plans::first(plans::run(
            client,
            &WAS_UNKNOWN,
            &[job.id.into(), attempt_id.into()],
        ))
        .is_none()
        {
            return Err(Refusal::bad_input(format!(
                "attempt {attempt_id} was never unknown: there is nothing to reconcile"
            ))
            .detail(format!(
                "Attempt {attempt_id} has no timeout event: its outcome was reported by its worker, not reconciled."
            ))
            .hint("Record a reconciliation only for an attempt whose outcome was unknown (mark_unknown, or a lease that ran out)."));
        }
        let state = attempt.effective_state();
        // A failed attempt was completed only when its result broke the contract.
        let shows_decision = left.contains(&state)
            && (state != AttemptState::Failed
                || *decision != "completed"
                || attempt.error_kind.as_deref() == Some(crate::contract::VIOLATION));
        if !shows_decision {
            let message = if state.is_open() {
                format!("attempt {attempt_id} is still {state}: decide it first, then record how")
            } else {
                format!(
                    "attempt {attempt_id} is {state}: it was not {decision} by a reconciliation"
                )
            };
            return Err(Refusal::bad_input(message)
                .detail(format!(
                    "Attempt {attempt_id} is {state}; recording {decision:?} needs it {}.",
                    if *decision == "completed" {
                        "succeeded, discarded, or failed by its contract (a rejected result)".to_string()
                    } else {
                        left.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                    }
                ))
                .hint("Call complete_attempt, fail_attempt or abandon_attempt first, in the same transaction."));
        }
        let recorded = store::record_reconciled(
            client,
            job.id,
            &job.owner_id,
            attempt_id,
            decision,
            state.as_str(),
            evidence,
        );
        if let Some(id) = recorded {
            return Ok(id);
        }
        // Another transaction recorded it meanwhile (and committed: ON CONFLICT waited for
        // it): its record stands, and is the answer.
        let row = plans::first(plans::run(
            client,
            &FIND_RECONCILED,
            &[job.id.into(), attempt_id.into()],
        ))
        .expect("the conflicting reconciliation is committed");
        Ok(plans::must::<i64>(&row, 1))
    })
}

crate::entry::sql_function!(cancel_job, cancel_job);

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
        // version + 1 makes every attempt still out there lose its compare-and-swap.
        Ok(store::get().cancel(client, job_id, reason, job.state.as_str()))
    })
}
