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
use crate::state::{AttemptState, lapsed_sql, live_sql, past_deadline_sql};
use pgrx::Uuid;
use pgrx::datum::Interval;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The caller's own timeout fired: started → unknown, and the job with it.
static MARK_UNKNOWN: Statement = Statement {
    name: "MarkUnknown",
    // `a` holds the rows as updated (state unknown), so the deadline alone says whether the
    // lease had run out as well.
    sql: concat!(
        "WITH a AS (
              UPDATE intent.attempts SET state = 'unknown'
               WHERE id = $1 AND state = 'started'
              RETURNING id, job_id, owner_id, deadline),
          j AS (
              UPDATE intent.jobs SET state = 'unknown', updated_at = $3
               WHERE id = (SELECT job_id FROM a) AND state = 'running')
          INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'timeout',
                 jsonb_build_object('cause', 'caller_timeout', 'reason', $2::text, 'deadline', a.deadline,
                                    'lease_expired', ",
        past_deadline_sql!("a"),
        ")
            FROM a"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
};

/// Extends a live lease (the job row is locked first), judged and extended at the call's
/// instant ($3): a lease that lapsed before it is not revived. Only a started attempt within its lease,
/// whose job is still running, can be extended: anything else tells the worker to stop.
static HEARTBEAT: Statement = Statement {
    name: "Heartbeat",
    sql: concat!(
        "UPDATE intent.attempts a
             SET deadline = greatest(a.deadline, $3 + coalesce($2, a.lease))
           WHERE a.id = $1 AND ",
        live_sql!("a", "$3"),
        "
             AND EXISTS (SELECT 1 FROM intent.jobs j WHERE j.id = a.job_id AND j.state = 'running')
          RETURNING 1"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::INTERVALOID, pg_sys::TIMESTAMPTZOID],
};

/// Attempts whose lease ran out, for sweep. Cross-job by nature: maintenance only.
static LAPSED_ATTEMPTS: Statement = Statement {
    name: "LapsedAttempts",
    sql: concat!(
        "SELECT id, job_id FROM intent.attempts WHERE ",
        lapsed_sql!(),
        " ORDER BY deadline"
    ),
    args: &[],
};

/// [`LAPSED_ATTEMPTS`] in the distributed mode: the policies run on the workers, which do not
/// know the session's binding, so a bound session's owner ($1) is named here.
static LAPSED_ATTEMPTS_DIST: Statement = Statement {
    name: "LapsedAttemptsDist",
    sql: concat!(
        "SELECT id, job_id FROM intent.attempts WHERE ",
        lapsed_sql!(),
        " AND ($1::text IS NULL OR owner_id::text = $1::text) ORDER BY deadline"
    ),
    args: &[pg_sys::TEXTOID],
};

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
            if crate::dist::distributed() {
                crate::dist::mark_unknown(client, attempt_id, reason);
            } else {
                plans::run(
                    client,
                    &MARK_UNKNOWN,
                    &[attempt_id.into(), reason.into(), crate::clock::now().into()],
                );
            }
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
        Ok(plans::first(if crate::dist::distributed() {
            let job_id = crate::dist::job_of(attempt_id);
            plans::run(
                client,
                &crate::dist::HEARTBEAT,
                &[
                    attempt_id.into(),
                    extend.into(),
                    job_id.into(),
                    crate::clock::now().into(),
                ],
            )
        } else {
            plans::run(
                client,
                &HEARTBEAT,
                &[attempt_id.into(), extend.into(), crate::clock::now().into()],
            )
        })
        .is_some())
    })
}

crate::entry::sql_function!(sweep, sweep_entry);

/// `intent.sweep()` → bigint.
fn sweep_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    Ok(value(fcinfo, Some(sweep())))
}

fn sweep() -> i64 {
    Spi::connect_mut(|client| {
        let owner = crate::dist::distributed().then(crate::owner::bound_owner);
        let lapsed_rows = match &owner {
            Some(owner) => plans::run(client, &LAPSED_ATTEMPTS_DIST, &[owner.as_deref().into()]),
            None => plans::run(client, &LAPSED_ATTEMPTS, &[]),
        };
        let lapsed: Vec<(Uuid, Uuid)> = lapsed_rows
            .map(|row| {
                let id = |n| row.get::<Uuid>(n).ok().flatten().expect("ids are NOT NULL");
                (id(1), id(2))
            })
            .collect();
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
