//! What every call on an existing job does first: lock the job row, read the attempt concerned,
//! and apply the deadline rule.
//!
//! Every call that changes a job locks its row (`FOR NO KEY UPDATE`) before reading anything
//! else, always in that order (job, then attempt), so concurrent calls on one job serialize and
//! cannot deadlock each other. The attempt is read in a separate statement after the lock is
//! held: under READ COMMITTED that statement's fresh snapshot sees whatever the previous lock
//! holder committed.

use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal, no_such_attempt, no_such_job};
use crate::state::{self, AttemptState, JobState, lapsed_sql, open_attempt_states_sql};
use crate::store;
use pgrx::Uuid;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;

/// The open attempt, locked FOR SHARE. Under READ COMMITTED the job lock already orders every
/// change to it, so this never waits; but under REPEATABLE READ and SERIALIZABLE the
/// transaction's snapshot may predate a heartbeat that extended its lease, and locking a row
/// updated after the snapshot raises 40001 instead of answering from the stale deadline (IJ003
/// where IJ002 is right). Not KEY SHARE: that lock is compatible with the heartbeat's update,
/// which changes no key, and would be granted on the stale row version.
static OPEN_ATTEMPT: Statement = Statement {
    name: "OpenAttempt",
    sql: concat!(
        "SELECT id, attempt_no, state::text, ",
        lapsed_sql!(),
        ", deadline::text, worker
           FROM intent.attempts WHERE job_id = $1 AND state IN ",
        open_attempt_states_sql!(),
        " FOR SHARE"
    ),
    args: &[pg_sys::UUIDOID],
};

/// The job row, read under its row lock.
pub struct Job {
    pub id: Uuid,
    pub state: JobState,
    pub version: i64,
    pub provider: String,
    pub contract: Option<String>,
    pub max_attempts: i32,
    pub attempt_count: i32,
    pub owner_id: String,
    pub completed_by: Option<Uuid>,
}

impl Job {
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }

    /// The IJ004 refusal for this (terminal) job.
    pub fn finished_refusal(&self) -> Refusal {
        let by = match self.completed_by {
            Some(a) => format!(", decided by attempt {a}"),
            None => String::new(),
        };
        Refusal::job_finished(format!("job {} is {}", self.id, self.state))
            .detail(format!("Job {} is {} (version {}{by}).", self.id, self.state, self.version))
            .facts(crate::refusal::job_state_facts(self.id, self.state, self.version))
            .hint("A finished job never runs again: read its outcome from intent.jobs (or resubmit the same intent), and use a new idempotency key for a new intent.")
    }
}

/// Locks the job row, or refuses with IJ007.
pub fn lock(client: &mut SpiClient<'_>, job_id: Uuid) -> Answer<Job> {
    let row = store::get()
        .lock_job(client, job_id)
        .ok_or_else(|| no_such_job(job_id))?;
    Ok(Job {
        id: job_id,
        state: state::read(&row, 1),
        version: plans::must(&row, 2),
        provider: plans::must(&row, 3),
        contract: plans::get(&row, 4),
        max_attempts: plans::must(&row, 5),
        attempt_count: plans::must(&row, 6),
        owner_id: plans::must(&row, 7),
        completed_by: plans::get(&row, 8),
    })
}

/// Locks the job an attempt id names, or refuses with IJ007 for either.
pub fn lock_for_attempt(client: &mut SpiClient<'_>, attempt_id: Uuid) -> Answer<(Job, Attempt)> {
    let job_id = match pg_intent_protocol::job_of(*attempt_id.as_bytes()) {
        Ok(bytes) => Uuid::from_bytes(bytes),
        Err(_) => return Err(no_such_attempt(attempt_id)),
    };
    let job = lock(client, job_id).map_err(|_| no_such_attempt(attempt_id))?;
    let attempt = read_attempt(client, attempt_id)?;
    Ok((job, attempt))
}

/// An attempt as a call on it needs to see it.
pub struct Attempt {
    pub id: Uuid,
    pub state: AttemptState,
    pub version_read: i64,
    pub error_kind: Option<String>,
    /// Started and past its deadline (the deadline rule).
    pub lapsed: bool,
}

impl Attempt {
    /// Started and past its deadline: counts as unknown everywhere.
    pub fn is_lapsed(&self) -> bool {
        self.lapsed
    }

    /// The state as the protocol sees it (the deadline rule applied).
    pub fn effective_state(&self) -> AttemptState {
        state::effective_attempt(self.state, self.lapsed)
    }

    /// Refuses a version other than the one begin_attempt handed this attempt.
    pub fn check_version(&self, version: i64) -> Answer<()> {
        if version == self.version_read {
            return Ok(());
        }
        Err(Refusal::bad_input(format!(
            "version {version} is not the version attempt {} was given",
            self.id
        ))
        .detail(format!(
            "Attempt {} began with version {}; the call presented {version}.",
            self.id, self.version_read
        ))
        .hint("Present the version that intent.begin_attempt() returned for this attempt."))
    }
}

pub fn read_attempt(client: &mut SpiClient<'_>, attempt_id: Uuid) -> Answer<Attempt> {
    let row = store::read_attempt(client, attempt_id).ok_or_else(|| no_such_attempt(attempt_id))?;
    Ok(Attempt {
        id: attempt_id,
        state: state::read(&row, 1),
        version_read: plans::must(&row, 2),
        error_kind: plans::get(&row, 3),
        lapsed: plans::must(&row, 4),
    })
}

/// The open (started or unknown) attempt of a job, if any.
pub struct OpenAttempt {
    pub id: Uuid,
    pub attempt_no: i32,
    pub state: AttemptState,
    /// Started and past its deadline (the deadline rule).
    pub lapsed: bool,
    pub deadline: String,
    pub worker: Option<String>,
}

impl OpenAttempt {
    /// The state as the protocol sees it (the deadline rule applied).
    pub fn effective_state(&self) -> AttemptState {
        state::effective_attempt(self.state, self.lapsed)
    }
}

pub fn open_attempt(client: &mut SpiClient<'_>, job_id: Uuid) -> Option<OpenAttempt> {
    let row = plans::first(plans::run(client, &OPEN_ATTEMPT, &[job_id.into()]))?;
    Some(OpenAttempt {
        id: plans::must(&row, 1),
        attempt_no: plans::must(&row, 2),
        state: state::read(&row, 3),
        lapsed: plans::must(&row, 4),
        deadline: plans::must(&row, 5),
        worker: plans::get(&row, 6),
    })
}

/// Applies the deadline rule to one attempt (its job row must be locked): a started attempt
/// past its deadline becomes unknown, for good. Returns whether it changed anything.
pub fn settle_lapsed(client: &mut SpiClient<'_>, attempt_id: Uuid, noticed_by: &str) -> bool {
    store::get().settle_lapsed(client, attempt_id, noticed_by)
}

/// Applies the deadline rule to a running job (its row locked): if its open attempt ran out of
/// lease, persists that attempt as unknown and updates `job.state` to match.
pub fn settle_open_attempt(client: &mut SpiClient<'_>, job: &mut Job, noticed_by: &str) {
    if job.state == JobState::Running
        && let Some(open) = open_attempt(client, job.id)
        && open.lapsed
        && settle_lapsed(client, open.id, noticed_by)
    {
        job.state = JobState::Unknown;
    }
}
