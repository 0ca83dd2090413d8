//! `begin_attempt`: the gate. No new attempt while the last one's outcome is open.

use crate::contract;
use crate::entry::{arg, one_row};
use crate::input;
use crate::job::{self, Job};
use crate::refusal::{self, Answer, Refusal};
use crate::state::AttemptState;
use crate::store::{self, NewAttempt};
use pg_intent_protocol::Facts;
use pgrx::IntoDatum;
use pgrx::Uuid;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;

struct Begun {
    attempt_id: Uuid,
    attempt_no: i32,
    version: i64,
    deadline: TimestampWithTimeZone,
}

crate::entry::sql_function!(begin_attempt, begin_attempt);

/// `intent.begin_attempt(job_id, provider, lease, worker)`.
fn begin_attempt(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let b = begin(
        arg(fcinfo, 0),
        arg(fcinfo, 1),
        arg(fcinfo, 2),
        arg(fcinfo, 3),
    )?;
    Ok(one_row(fcinfo, |_| {
        vec![
            b.attempt_id.into_datum(),
            b.attempt_no.into_datum(),
            b.version.into_datum(),
            b.deadline.into_datum(),
        ]
    }))
}

fn begin(
    job_id: Option<Uuid>,
    provider: Option<&str>,
    lease: Option<Interval>,
    worker: Option<&str>,
) -> Answer<Begun> {
    let job_id = input::required("job_id", job_id)?;
    let provider = input::optional_name("provider", provider)?;
    let lease = input::lease("lease", lease)?;
    let worker = input::optional_name("worker", worker)?;

    Spi::connect_mut(|client| {
        let job = job::lock(client, job_id)?;
        if job.is_terminal() {
            return Err(job.finished_refusal());
        }
        if let Some(open) = job::open_attempt(client, job_id) {
            return Err(gate_refusal(&job, &open));
        }
        if job.attempt_count >= job.max_attempts {
            return Err(Refusal::attempts_exhausted(format!(
                "job {job_id} has used all {} of its attempts",
                job.max_attempts
            ))
            .detail(format!(
                "Job {job_id} has already made {} of its {} allowed attempts (max_attempts).",
                job.attempt_count, job.max_attempts
            ))
            .facts(Facts {
                attempt_count: Some(job.attempt_count),
                max_attempts: Some(job.max_attempts),
                ..refusal::job_facts(job_id)
            })
            .hint("An abandoned attempt may still return and win; otherwise cancel the job, or submit the intent under a new idempotency key."));
        }
        let provider = provider.unwrap_or(&job.provider);
        if provider != job.provider {
            contract::check_certified(client, &job, provider)?;
        }
        let attempt_no = job.attempt_count + 1;
        let attempt_id = Uuid::from_bytes(
            pg_intent_protocol::attempt_id(*job_id.as_bytes(), i64::from(attempt_no))
                .expect("attempt_no is within 1..=max_attempts <= 65535"),
        );
        let deadline = store::get().start_attempt(
            client,
            &NewAttempt {
                attempt_id,
                job_id,
                owner_id: &job.owner_id,
                attempt_no,
                provider,
                version: job.version,
                worker,
                lease,
            },
        );
        Ok(Begun {
            attempt_id,
            attempt_no,
            version: job.version,
            deadline,
        })
    })
}

/// IJ002 while the open attempt is started and within its lease, IJ003 once its outcome is
/// unknown (marked so, or past its deadline: a timeout is unknown, never failed).
fn gate_refusal(job: &Job, open: &job::OpenAttempt) -> Refusal {
    let worker = match &open.worker {
        Some(w) => format!(", worker {w}"),
        None => String::new(),
    };
    let facts = refusal::attempt_facts(job.id, open.id, open.effective_state());
    if open.effective_state() == AttemptState::Started {
        return Refusal::attempt_in_flight(format!(
            "job {} already has an attempt in flight",
            job.id
        ))
        .detail(format!(
            "Attempt {} (no. {}{worker}) is started and its lease runs until {}.",
            open.id, open.attempt_no, open.deadline
        ))
        .facts(facts)
        .hint("Wait for its outcome. If it never reports, its lease runs out and it becomes unknown; it is never retried behind its back.");
    }
    let why = if open.state == AttemptState::Unknown {
        "its outcome is unknown".to_string()
    } else {
        format!("its lease ran out at {} without an outcome", open.deadline)
    };
    Refusal::outcome_unknown(format!(
        "job {} has an attempt whose outcome is unknown",
        job.id
    ))
    .detail(format!("Attempt {} (no. {}{worker}): {why}.", open.id, open.attempt_no))
    .facts(facts)
    .hint("Find out what the provider did: report it with intent.complete_attempt() or intent.fail_attempt(), or stop waiting with intent.abandon_attempt(attempt_id, reason).")
}
