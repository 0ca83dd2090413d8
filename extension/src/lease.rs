//! Leases and timeouts: `mark_unknown`, `heartbeat`, `sweep`.
//!
//! A timeout makes an attempt unknown, never failed: the provider may still be working. A
//! started attempt past its deadline already counts as unknown everywhere; these calls only make
//! the tables say so.

use crate::entry::{arg, value, void};
use crate::input;
use crate::job;
use crate::plans::{self, Statement};
use crate::refusal::Answer;
use crate::state::AttemptState;
use crate::store;
use pgrx::Uuid;
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Sweep never waits for a busy job: whoever holds it will apply the deadline rule anyway.
static TRY_LOCK_JOB: Statement = Statement {
    name: "TryLockJob",
    sql: "SELECT 1 FROM intent.jobs WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED",
    args: &[pg_sys::UUIDOID],
};

crate::entry::sql_function!(mark_unknown, mark_unknown_entry);

/// `intent.mark_unknown(attempt_id, reason)` → void.
fn mark_unknown_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    mark_unknown(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(void())
}

fn mark_unknown(attempt_id: Option<Uuid>, reason: Option<&str>) -> Answer<()> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let reason = input::reason(reason, false)?;
    Spi::connect_mut(|client| {
        let (_job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        // Already unknown, or already finished (the result beat the timer): nothing to do.
        if attempt.state == AttemptState::Started {
            store::get().mark_unknown(client, attempt_id, reason);
        }
        Ok(())
    })
}

crate::entry::sql_function!(heartbeat, heartbeat_entry);

/// `intent.heartbeat(attempt_id, extend)` → boolean.
fn heartbeat_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let alive = heartbeat(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(value(fcinfo, Some(alive)))
}

fn heartbeat(attempt_id: Option<Uuid>, extend: Option<Interval>) -> Answer<bool> {
    let attempt_id = input::required("attempt_id", attempt_id)?;
    let extend = match extend {
        None => None,
        some => Some(input::lease("extend", some)?),
    };
    Spi::connect_mut(|client| {
        // The job row first, as every call does: locking the attempt first would let a heartbeat
        // and a completion of the same job wait for each other (a deadlock).
        let (_job, attempt) = job::lock_for_attempt(client, attempt_id)?;
        if attempt.is_lapsed() {
            // A lapsed lease is never revived: the attempt is unknown now, for good.
            job::settle_lapsed(client, attempt_id, "heartbeat");
            return Ok(false);
        }
        Ok(store::heartbeat(client, attempt_id, extend))
    })
}

crate::entry::sql_function!(sweep, sweep_entry);

/// `intent.sweep()` → bigint.
fn sweep_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    Ok(value(fcinfo, Some(sweep())))
}

fn sweep() -> i64 {
    Spi::connect_mut(|client| {
        let lapsed = store::lapsed_attempts(client);
        let mut settled = 0;
        for (attempt_id, job_id) in lapsed {
            if plans::first(plans::run(client, &TRY_LOCK_JOB, &[job_id.into()])).is_some()
                && job::settle_lapsed(client, attempt_id, "sweep")
            {
                settled += 1;
            }
        }
        settled
    })
}
