//! The seam between the protocol and its storage: the steps every transition is made of.
//!
//! The call modules (`submit.rs`, `begin.rs`, `finish.rs`, `lease.rs`, `decisions.rs`,
//! `claim.rs`, `purge.rs`) decide: which transition, in which order, refused or not. They do not
//! know how the tables are stored. They take the steps from [`get`]:
//!
//! - [`node::Node`], a single node: steps combined into one statement where the benchmarks
//!   show it pays (begin, complete, claim: `docs/benchmarks.md`), the replay lookup done with a
//!   direct index fetch (`direct.rs`);
//! - [`shards::Shards`], the distributed mode (Citus, `docs/scale-out.md`): every step a
//!   statement on one shard, routed by the job id, run one after the other in the call's
//!   transaction after the job row is locked, and owner isolation applied by the statement,
//!   since the policies run on the workers, where the session's binding is not known.
//!
//! Steps that are one statement on one job in both modes are written once, below, and used by
//! both ([`read_attempt`], [`heartbeat`], [`fail_attempt`], [`fail_job`], [`reopen_job`], the
//! late events…). Every statement of either mode is built from the fragments of `rules.rs`, so
//! each rule (the backoff, the compare-and-swap, each event's detail…) is written once. The
//! conformance suite (tests/README.md) runs every suite against each mode: the single node, the
//! distributed statements forced on a single node (`intent.force_distributed_statements`), and
//! a real Citus cluster. Catalogs older than the library are `compat.rs`'s concern alone.

pub mod compat;
mod direct;
mod node;
pub mod rules;
mod shards;

use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::state::{JobState, lapsed_sql, live_sql};
use pgrx::Uuid;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::{SpiClient, SpiTupleTable};
use rules::backoff_sql;

/// The steps whose statements differ between the storage modes.
pub trait Store: Sync {
    /// Locks the job row (`FOR NO KEY UPDATE`) and reads it: state, version, provider,
    /// contract, max_attempts, attempt_count, owner_id, completed_by (in that order). None
    /// when there is no such job for this session.
    fn lock_job<'c>(&self, client: &mut SpiClient<'c>, job_id: Uuid) -> Option<SpiTupleTable<'c>>;

    /// Starts an attempt and marks its job running; returns its deadline.
    fn start_attempt(
        &self,
        client: &mut SpiClient<'_>,
        new: &NewAttempt<'_>,
    ) -> TimestampWithTimeZone;

    /// A started attempt past its deadline becomes unknown, its running job too, and the
    /// timeout is logged. Whether it changed anything.
    fn settle_lapsed(&self, client: &mut SpiClient<'_>, attempt_id: Uuid, noticed_by: &str)
    -> bool;

    /// The caller's timeout fired for a started attempt: unknown, its job too, logged.
    fn mark_unknown(&self, client: &mut SpiClient<'_>, attempt_id: Uuid, reason: Option<&str>);

    /// An open attempt is abandoned: its job is claimable at once, the decision logged.
    fn abandon(&self, client: &mut SpiClient<'_>, abandoned: &Abandoned<'_>);

    /// An open job is cancelled, logged with its open attempt. Whether it was.
    fn cancel(
        &self,
        client: &mut SpiClient<'_>,
        job_id: Uuid,
        reason: Option<&str>,
        previous_state: &str,
    ) -> bool;

    /// The compare-and-swap of a result, the attempt's own outcome, and the logged race when
    /// it lost. Whether it won.
    fn complete(&self, client: &mut SpiClient<'_>, presented: &Presented<'_>) -> bool;

    /// The job of this intent's id, compared with it; None when there is none (or it belongs
    /// to an owner this session is not bound to).
    fn find_job(&self, client: &mut SpiClient<'_>, intent: &Intent<'_>) -> Option<Found>;

    /// The first version a new job of this id may hand out (`rules::first_version`).
    fn first_version(&self, client: &mut SpiClient<'_>, job_id: Uuid) -> i64;

    /// Begins the next attempt of up to `ask.max_jobs` claimable jobs, longest-waiting first,
    /// skipping those another transaction holds.
    fn claim(&self, client: &mut SpiClient<'_>, ask: &ClaimAsk) -> Vec<Claimed>;

    /// Removes one batch of finished jobs past the retention, with their attempts and events,
    /// leaving each key's tombstone. How many.
    fn purge(&self, client: &mut SpiClient<'_>, retention: Interval, batch_size: i32) -> i64;
}

/// The storage mode of this database: [`shards::Shards`] where `intent.jobs` is distributed
/// by Citus (or the distributed statements are forced on), else [`node::Node`].
pub fn get() -> &'static dyn Store {
    if crate::dist::distributed() {
        &shards::Shards
    } else {
        &node::Node
    }
}

/// An attempt to start.
pub struct NewAttempt<'a> {
    pub attempt_id: Uuid,
    pub job_id: Uuid,
    pub owner_id: &'a str,
    pub attempt_no: i32,
    pub provider: &'a str,
    pub version: i64,
    pub worker: Option<&'a str>,
    pub lease: Interval,
}

/// An attempt an operator stops waiting for.
pub struct Abandoned<'a> {
    pub attempt_id: Uuid,
    pub reason: Option<&'a str>,
    pub previous_state: &'a str,
    pub lease_expired: bool,
}

/// A result presented for an attempt of a locked job.
pub struct Presented<'a> {
    pub attempt_id: Uuid,
    pub job_id: Uuid,
    pub result: Jsonb,
    pub version: i64,
    /// The attempt's state when the result came (the deadline rule applied).
    pub attempt_state: &'a str,
}

/// One submit's intent, as the replay lookup needs it.
#[derive(Clone, Copy)]
pub struct Intent<'a> {
    pub job_id: Uuid,
    pub owner_id: &'a str,
    pub key: &'a str,
    pub provider: &'a str,
    pub params: Jsonb,
    pub contract: Option<&'a str>,
}

/// How an existing job of a key compares with the intent submitted again.
pub struct Comparison {
    /// The job's (owner_id, idempotency_key) is the submitted one (not another key whose id
    /// collides with it).
    pub same_key: bool,
    pub same_provider: bool,
    pub same_params: bool,
    pub same_contract: bool,
}

/// What `submit_job` needs to know about an existing job.
pub struct Found {
    pub comparison: Comparison,
    pub state: JobState,
    pub version: i64,
    pub result: Option<Jsonb>,
}

/// A claim's request (its inputs checked).
pub struct ClaimAsk {
    pub providers: Option<Vec<String>>,
    pub worker: Option<String>,
    pub lease: Interval,
    pub max_jobs: i32,
    /// Where the queue is read from (crate::claim_start): jobs claimable since before it are
    /// not looked at. None: the whole queue.
    pub start: Option<TimestampWithTimeZone>,
}

/// One claimed attempt, copied out of SPI's memory.
pub struct Claimed {
    pub job_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    pub version: i64,
    pub deadline: TimestampWithTimeZone,
    pub provider: String,
    pub params: Jsonb,
    pub contract: Option<String>,
    /// Since when it was claimable (its `retry_at` before the claim; `coalesce(retry_at, updated_at)` on an older catalog, store::compat).
    pub since: TimestampWithTimeZone,
}

/// The job an attempt id names (its last two bytes zeroed); the attempt id itself when it
/// names none, which then matches no row.
pub fn job_of(attempt_id: Uuid) -> Uuid {
    pg_intent_protocol::job_of(*attempt_id.as_bytes())
        .map(Uuid::from_bytes)
        .unwrap_or(attempt_id)
}

// --- The steps that are the same statement in every mode ------------------------------------
//
// Each names the job id (the distribution column) beside the attempt id, so that Citus routes
// it to one shard; on a single node the primary key finds the row and the job id is a filter
// on it.

static READ_ATTEMPT: Statement = Statement {
    name: "ReadAttempt",
    sql: concat!(
        "SELECT state::text, version_read, error->>'kind', ",
        lapsed_sql!(),
        " FROM intent.attempts WHERE id = $1 AND job_id = $2"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

/// The attempt: state, version_read, error kind, lapsed (in that order); None when there is
/// none.
pub fn read_attempt<'c>(client: &mut SpiClient<'c>, attempt_id: Uuid) -> Option<SpiTupleTable<'c>> {
    plans::first(plans::run(
        client,
        &READ_ATTEMPT,
        &[attempt_id.into(), job_of(attempt_id).into()],
    ))
}

/// Extends a live lease, judged and extended at the call's instant ($4): a lease that lapsed
/// before it is not revived. Only a started attempt within its lease, whose job is still
/// running, can be extended.
static HEARTBEAT: Statement = Statement {
    name: "Heartbeat",
    sql: concat!(
        "UPDATE intent.attempts a
             SET deadline = greatest(a.deadline, $4 + coalesce($2, a.lease))
           WHERE a.id = $1 AND a.job_id = $3 AND ",
        live_sql!("a", "$4"),
        "
             AND EXISTS (SELECT 1 FROM intent.jobs j WHERE j.id = $3 AND j.state = 'running')
          RETURNING 1"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::INTERVALOID,
        pg_sys::UUIDOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Whether the lease was extended.
pub fn heartbeat(client: &mut SpiClient<'_>, attempt_id: Uuid, extend: Option<Interval>) -> bool {
    plans::first(plans::run(
        client,
        &HEARTBEAT,
        &[
            attempt_id.into(),
            extend.into(),
            job_of(attempt_id).into(),
            crate::clock::now().into(),
        ],
    ))
    .is_some()
}

/// Records a definite failure on the attempt; a rejected result stays on its own row.
static FAIL_ATTEMPT: Statement = Statement {
    name: "FailAttempt",
    sql: "UPDATE intent.attempts SET state = 'failed', error = $2, result = $3, finished_at = $5
           WHERE id = $1 AND job_id = $4",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::JSONBOID,
        pg_sys::UUIDOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

pub fn fail_attempt(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    error: Jsonb,
    result: Option<Jsonb>,
) {
    plans::run(
        client,
        &FAIL_ATTEMPT,
        &[
            attempt_id.into(),
            error.into(),
            result.into(),
            job_of(attempt_id).into(),
            crate::clock::now().into(),
        ],
    );
}

/// The final failure of the job (`$clear` as in [`rules::win_sql!`]).
macro_rules! fail_job_sql {
    ($clear:expr) => {
        concat!(
            "UPDATE intent.jobs
                 SET state = 'failed', error = $3, completed_by = $1, version = version + 1, ",
            $clear,
            "updated_at = $5
               WHERE id = $2 AND version = $4 AND completed_by IS NULL
                 AND state IN ",
            $crate::state::open_job_states_sql!(),
            " RETURNING 1"
        )
    };
}
pub(crate) use fail_job_sql;

/// The final failure of the job, by the same compare-and-swap as a win.
static FAIL_JOB: Statement = Statement {
    name: "FailJob",
    sql: fail_job_sql!(rules::clear_retry_sql!()),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Whether the job failed (false: its outcome slot was no longer open at that version).
pub fn fail_job(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    error: Jsonb,
    version: i64,
) -> bool {
    plans::first(plans::run(
        client,
        compat::fail_job(&FAIL_JOB),
        &[
            attempt_id.into(),
            job_id.into(),
            error.into(),
            version.into(),
            crate::clock::now().into(),
        ],
    ))
    .is_some()
}

/// The gate opens: the job may take a new attempt, and claim_attempts may begin it once its
/// retry time has come: `$2` after now, or the default backoff (`rules::backoff_sql!`).
/// Answers whether the job is claimable at once, from its own columns (Citus refuses
/// statement_timestamp() in RETURNING; updated_at is the call's instant, $5).
static REOPEN_JOB: Statement = Statement {
    name: "ReopenJob",
    sql: concat!(
        "UPDATE intent.jobs j SET state = 'pending', updated_at = $5,
                 retry_at = $5 + CASE WHEN j.attempt_count < j.max_attempts THEN coalesce($2, ",
        backoff_sql!(),
        ") END
           WHERE j.id = $1 AND j.state IN ('running', 'unknown')
          RETURNING coalesce(j.retry_at <= j.updated_at, false)"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::INTERVALOID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Reopens a running or unknown job after a retryable failure: `after` its retry time (None:
/// the default backoff, whose settings `backoff` reads, in seconds, only when they are used, so
/// that a bad setting fails only the calls that need it). Whether it is claimable at once; None
/// when the job was not running or unknown.
pub fn reopen_job(
    client: &mut SpiClient<'_>,
    job_id: Uuid,
    after: Option<Interval>,
    backoff: impl FnOnce() -> crate::refusal::Answer<(f64, f64)>,
) -> crate::refusal::Answer<Option<bool>> {
    if let Some(statement) = compat::reopen_job() {
        return Ok(plans::first(plans::run(
            client,
            statement,
            &[job_id.into(), crate::clock::now().into()],
        ))
        .map(|row| plans::must(&row, 1)));
    }
    let (first, longest) = match after {
        Some(_) => (0.0, 0.0),
        None => backoff()?,
    };
    Ok(plans::first(plans::run(
        client,
        &REOPEN_JOB,
        &[
            job_id.into(),
            after.into(),
            first.into(),
            longest.into(),
            crate::clock::now().into(),
        ],
    ))
    .map(|row| plans::must(&row, 1)))
}

/// Attempts whose lease ran out, for sweep: every owner's, or a bound session's own (named
/// here as well as by the policies, which in the distributed mode run on the workers, where
/// the binding is not known). Cross-job by nature: maintenance only.
static LAPSED_ATTEMPTS: Statement = Statement {
    name: "LapsedAttempts",
    sql: concat!(
        "SELECT id, job_id FROM intent.attempts WHERE ",
        lapsed_sql!(),
        " AND ($1::text IS NULL OR owner_id::text = $1::text) ORDER BY deadline"
    ),
    args: &[pg_sys::TEXTOID],
};

/// (attempt, job) of every lapsed attempt this session may see, earliest deadline first.
pub fn lapsed_attempts(client: &mut SpiClient<'_>) -> Vec<(Uuid, Uuid)> {
    let owner = crate::owner::bound_owner();
    plans::run(client, &LAPSED_ATTEMPTS, &[owner.as_deref().into()])
        .map(|row| {
            let id = |n| row.get::<Uuid>(n).ok().flatten().expect("ids are NOT NULL");
            (id(1), id(2))
        })
        .collect()
}

/// The job's facts a logged event records, read (the job row is locked) before the event is
/// written: `INSERT … VALUES`, routed by the job id, in every mode.
static JOB_FACTS: Statement = Statement {
    name: "JobFacts",
    sql: "SELECT owner_id::text, state::text, version::int8, completed_by FROM intent.jobs WHERE id = $1",
    args: &[pg_sys::UUIDOID],
};

/// The job's facts an event records: (owner_id, state, version, completed_by).
pub(crate) fn job_facts(
    client: &mut SpiClient<'_>,
    job_id: Uuid,
) -> (String, String, i64, Option<Uuid>) {
    let row = plans::first(plans::run(client, &JOB_FACTS, &[job_id.into()]))
        .expect("the job row is locked by this call");
    (
        plans::must(&row, 1),
        plans::must(&row, 2),
        plans::must(&row, 3),
        plans::get(&row, 4),
    )
}

/// Whether the job's log has an event of this kind for this attempt: a late report asked again
/// gets the same answer and is logged once.
static LOGGED: Statement = Statement {
    name: "Logged",
    sql: "SELECT EXISTS (SELECT 1 FROM intent.events
                          WHERE job_id = $1 AND attempt_id = $2 AND kind = $3)",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::TEXTOID],
};

fn logged(client: &mut SpiClient<'_>, job_id: Uuid, attempt_id: Uuid, kind: &str) -> bool {
    let row = plans::first(plans::run(
        client,
        &LOGGED,
        &[job_id.into(), attempt_id.into(), kind.into()],
    ))
    .expect("SELECT EXISTS returns a row");
    plans::must(&row, 1)
}

/// A result for an attempt that had already failed definitely: it cannot become the job's
/// outcome, and the attempt keeps its recorded failure; the result is kept in the log.
static EVENT_RESULT_AFTER_FAILURE: Statement = Statement {
    name: "EventResultAfterFailure",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          VALUES ($1, $2, $3, 'late_result',
                  jsonb_build_object('attempt_state', 'failed', 'result', $4::jsonb, 'presented_version', $5::int8,
                                     'current_version', $6::int8, 'job_state', $7::text, 'winner', $8::uuid))",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
    ],
};

/// Logs (once) a result presented for an attempt that had failed.
pub fn log_result_after_failure(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    result: Jsonb,
    version: i64,
) {
    if logged(client, job_id, attempt_id, "late_result") {
        return;
    }
    let (owner, state, current, winner) = job_facts(client, job_id);
    plans::run(
        client,
        &EVENT_RESULT_AFTER_FAILURE,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            result.into(),
            version.into(),
            current.into(),
            state.as_str().into(),
            winner.into(),
        ],
    );
}

/// A result that broke the job's contract, logged with the validation errors.
static EVENT_VIOLATION: Statement = Statement {
    name: "EventViolation",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          VALUES ($1, $2, $3, 'contract_violation', $4::jsonb || jsonb_build_object('job_state', $5::text))
          RETURNING detail - 'job_state'",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
    ],
};

/// Logs a contract violation; returns the error as recorded (without the job state).
pub fn log_violation(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    error: &str,
    job_state: &str,
) -> Jsonb {
    let (owner, _, _, _) = job_facts(client, job_id);
    let row = plans::first(plans::run(
        client,
        &EVENT_VIOLATION,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            error.into(),
            job_state.into(),
        ],
    ))
    .expect("INSERT … RETURNING returns the row");
    plans::must(&row, 1)
}

/// A failure that arrived after the job's outcome was decided.
static EVENT_LATE_FAILURE: Statement = Statement {
    name: "EventLateFailure",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          VALUES ($1, $2, $3, 'late_failure',
                  jsonb_build_object('error', $4::jsonb, 'attempt_state', $5::text, 'job_state', $6::text,
                                     'winner', $7::uuid, 'current_version', $8::int8))",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::INT8OID,
    ],
};

/// Logs (once) a failure reported after the attempt's or the job's outcome was recorded.
pub fn log_late_failure(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    error: Jsonb,
    attempt_state: &str,
) {
    if logged(client, job_id, attempt_id, "late_failure") {
        return;
    }
    let (owner, state, current, winner) = job_facts(client, job_id);
    plans::run(
        client,
        &EVENT_LATE_FAILURE,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            error.into(),
            attempt_state.into(),
            state.as_str().into(),
            winner.into(),
            current.into(),
        ],
    );
}

/// A reconciliation, with the state the decision left the attempt in: `INSERT … VALUES`,
/// routed by its job id (Citus refuses `INSERT … SELECT … FROM intent.attempts` under
/// row-level security). The unique index `events_one_reconciliation` keeps it to one per
/// attempt whatever the callers' isolation: a concurrent second one waits, then writes nothing
/// (READ COMMITTED) or fails with 40001 (REPEATABLE READ, SERIALIZABLE), instead of recording
/// a contradicting decision.
static RECORD_RECONCILED: Statement = Statement {
    name: "RecordReconciled",
    sql: "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          VALUES ($1, $2, $3, 'reconciled',
                  jsonb_build_object('decision', $4::text, 'attempt_state', $5::text,
                                     'evidence', $6::jsonb, 'recorded_by', session_user::text))
          ON CONFLICT (job_id, attempt_id) WHERE kind = 'reconciled' DO NOTHING
          RETURNING id",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
    ],
};

/// A reconciliation's event: its id, or None when another transaction recorded the attempt's
/// reconciliation first.
pub fn record_reconciled(
    client: &mut SpiClient<'_>,
    job_id: Uuid,
    owner_id: &str,
    attempt_id: Uuid,
    decision: &str,
    attempt_state: &str,
    evidence: Jsonb,
) -> Option<i64> {
    plans::first(plans::run(
        client,
        &RECORD_RECONCILED,
        &[
            job_id.into(),
            owner_id.into(),
            attempt_id.into(),
            decision.into(),
            attempt_state.into(),
            evidence.into(),
        ],
    ))
    .map(|row| plans::must(&row, 1))
}
