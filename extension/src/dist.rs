//! The distributed mode (Citus, `intent.distribute()`, docs/scale-out.md): whether this
//! database's `intent.jobs` is a distributed table, known per backend.
//!
//! On a single node the answer is false and every call runs its single-node statements
//! unchanged; the only cost is reading a cached boolean. The answer is computed once per
//! backend — without SQL: a syscache probe for the extension `citus` (absent: false, nothing
//! else is read) and, when Citus is there, a scan of its catalog `pg_dist_partition` (a row per
//! distributed table) for `intent.jobs` — and computed again only after a relcache
//! invalidation of `intent.jobs` (Citus sends one when it distributes the table, and an
//! aborted transaction undoes its own).
//!
//! In the distributed mode the calls differ where Citus cannot run the single-node statement
//! as one task on one shard (each place says why): a statement with data-modifying CTEs is
//! split into single-shard statements run one after the other in the call's transaction (the
//! job row is locked first, as always, so nothing interleaves); a statement on
//! `intent.attempts` names the attempt's job id too, the distribution column; and owner
//! isolation is checked by the call on the coordinator, since the policies run on the workers,
//! where the session's binding is not known.

use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    /// None: not computed since the last invalidation.
    static DISTRIBUTED: Cell<Option<bool>> = const { Cell::new(None) };
    /// The oid of `intent.jobs` the answer was computed for.
    static JOBS: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
}

/// `intent.force_distributed_statements`: the conformance suite's switch (tests/README.md), which
/// runs the distributed mode's statements on a single node so that every suite — the model
/// check included — covers them without a Citus cluster. It can only turn the distributed
/// statements on: on a single node both modes keep the same contract, so a superuser who sets
/// it changes nothing a caller can observe but speed.
static FORCE: pgrx::guc::GucSetting<bool> = pgrx::guc::GucSetting::<bool>::new(false);

/// Registers the invalidation callback and the switch; called from `_PG_init` (no SQL, no
/// catalog access).
pub fn register() {
    pgrx::guc::GucRegistry::define_bool_guc(
        c"intent.force_distributed_statements",
        c"Runs the distributed mode's statements on a single node (for the conformance suite).",
        c"Off: the distributed statements run only where intent.jobs is distributed by Citus. On: they run everywhere. The answers are the same either way; the single-node statements are faster.",
        &FORCE,
        pgrx::guc::GucContext::Suset,
        pgrx::guc::GucFlags::default(),
    );
    // SAFETY: registers a callback that only resets a cached value.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
}

unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == JOBS.get() {
        DISTRIBUTED.set(None);
    }
}

/// Whether `intent.jobs` is distributed by Citus in this database (or the distributed statements
/// are forced on).
pub fn distributed() -> bool {
    FORCE.get() || on_citus()
}

/// Whether `intent.jobs` really is distributed by Citus (what the switch does not change).
pub fn on_citus() -> bool {
    if let Some(d) = DISTRIBUTED.get() {
        return d;
    }
    // SAFETY: a read of the transaction state; catalog reads only inside a transaction (every
    // API call runs in one).
    if !unsafe { pg_sys::IsTransactionState() } {
        return false;
    }
    let d = unsafe { compute() };
    DISTRIBUTED.set(Some(d));
    d
}

unsafe fn compute() -> bool {
    unsafe {
        // First, so that distributing the table later invalidates a "no" given now.
        let ns = pg_sys::get_namespace_oid(c"intent".as_ptr(), true);
        let jobs = pg_sys::get_relname_relid(c"jobs".as_ptr(), ns);
        JOBS.set(jobs);
        if pg_sys::get_extension_oid(c"citus".as_ptr(), true) == pg_sys::InvalidOid {
            return false;
        }
        let catalog = pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE);
        let partition = pg_sys::get_relname_relid(c"pg_dist_partition".as_ptr(), catalog);
        if jobs == pg_sys::InvalidOid || partition == pg_sys::InvalidOid {
            return false;
        }
        let rel = pg_sys::table_open(partition, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        // pg_dist_partition.logicalrelid (regclass) is its first column.
        pg_sys::ScanKeyInit(
            &mut key,
            1,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(jobs),
        );
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let found = !pg_sys::systable_getnext(scan).is_null();
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// The job an attempt id names (its last two bytes zeroed); the attempt id itself when it
/// names none, which then matches no row.
pub fn job_of(attempt_id: pgrx::Uuid) -> pgrx::Uuid {
    pg_intent_protocol::job_of(*attempt_id.as_bytes())
        .map(pgrx::Uuid::from_bytes)
        .unwrap_or(attempt_id)
}

// --- The statements of the distributed mode -----------------------------------------------
//
// Each is routed by a job id ($ named in each) to one shard: Citus runs it as one task. The
// single-node statement each replaces is named; the split ones run in the order given, in the
// call's transaction, after the call has locked the job row.

use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::state::{lapsed_sql, live_sql, open_attempt_states_sql, open_job_states_sql};
use pgrx::Uuid;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::spi::SpiClient;

/// job.rs READ_ATTEMPT, with the attempt's job id ($2).
pub static READ_ATTEMPT: Statement = Statement {
    name: "ReadAttemptDist",
    sql: concat!(
        "SELECT state::text, version_read, error->>'kind', ",
        lapsed_sql!(),
        " FROM intent.attempts WHERE id = $1 AND job_id = $2"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

/// The job's facts a logged event records, read (the job row is locked) before the event is
/// written: Citus would run `INSERT … SELECT … FROM intent.jobs` through the coordinator.
static JOB_FACTS: Statement = Statement {
    name: "JobFactsDist",
    sql: "SELECT owner_id::text, state::text, version::int8, completed_by FROM intent.jobs WHERE id = $1",
    args: &[pg_sys::UUIDOID],
};

/// Whether the job's log has an event of this kind for this attempt.
static LOGGED: Statement = Statement {
    name: "LoggedDist",
    sql: "SELECT EXISTS (SELECT 1 FROM intent.events
                          WHERE job_id = $1 AND attempt_id = $2 AND kind = $3)",
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::TEXTOID],
};

/// begin.rs START_ATTEMPT, first half: the attempt, at the call's instant ($9).
static INSERT_ATTEMPT: Statement = Statement {
    name: "InsertAttemptDist",
    sql: "INSERT INTO intent.attempts
                 (id, job_id, owner_id, attempt_no, provider, state, version_read, worker, lease, started_at, deadline)
          VALUES ($1, $2, $3, $4, $5, 'started', $6, $7, $8, $9, $9 + $8)
          RETURNING deadline",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// begin.rs START_ATTEMPT, second half: the job runs.
static MARK_RUNNING: Statement = Statement {
    name: "MarkRunningDist",
    sql: "UPDATE intent.jobs SET state = 'running', attempt_count = $2, retry_at = NULL,
                                 updated_at = $3
           WHERE id = $1",
    args: &[pg_sys::UUIDOID, pg_sys::INT4OID, pg_sys::TIMESTAMPTZOID],
};

/// Begins an attempt as begin_attempt's START_ATTEMPT does; returns its deadline.
#[allow(clippy::too_many_arguments)]
pub fn start_attempt(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    owner_id: &str,
    attempt_no: i32,
    provider: &str,
    version: i64,
    worker: Option<&str>,
    lease: Interval,
) -> TimestampWithTimeZone {
    let row = plans::first(plans::run(
        client,
        &INSERT_ATTEMPT,
        &[
            attempt_id.into(),
            job_id.into(),
            owner_id.into(),
            attempt_no.into(),
            provider.into(),
            version.into(),
            worker.into(),
            lease.into(),
            crate::clock::now().into(),
        ],
    ))
    .expect("INSERT … RETURNING returns the row it inserted");
    let deadline = plans::must(&row, 1);
    plans::run(
        client,
        &MARK_RUNNING,
        &[job_id.into(), attempt_no.into(), crate::clock::now().into()],
    );
    deadline
}

/// job.rs SETTLE_LAPSED and lease.rs MARK_UNKNOWN, first part: the attempt becomes unknown
/// (`$3`: only when lapsed).
static ATTEMPT_UNKNOWN: Statement = Statement {
    name: "AttemptUnknownDist",
    sql: concat!(
        "UPDATE intent.attempts SET state = 'unknown'
          WHERE id = $1 AND job_id = $2 AND state = 'started' AND (NOT $3 OR ",
        lapsed_sql!(),
        ")
          RETURNING owner_id::text, deadline"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::BOOLOID],
};

/// Second part: a running job becomes unknown.
static JOB_UNKNOWN: Statement = Statement {
    name: "JobUnknownDist",
    sql: "UPDATE intent.jobs SET state = 'unknown', updated_at = $2
           WHERE id = $1 AND state = 'running'",
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

/// An event's INSERT: VALUES, routed by its job id ($1), detail built on the coordinator as
/// the single-node statement builds it from the same values.
macro_rules! event_statement {
    ($name:ident, $kind:literal, $detail:literal, [$($arg:expr),*]) => {
        Statement {
            name: stringify!($name),
            sql: concat!(
                "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail) VALUES ($1, $2, $3, '",
                $kind,
                "', ",
                $detail,
                ") RETURNING detail"
            ),
            args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::UUIDOID, $($arg),*],
        }
    };
}

static EVENT_LAPSED: Statement = event_statement!(
    EventLapsedDist,
    "timeout",
    "jsonb_build_object('cause', 'lease_expired', 'deadline', $4::timestamptz, 'noticed_by', $5::text)",
    [pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID]
);

static EVENT_CALLER_TIMEOUT: Statement = event_statement!(
    EventCallerTimeoutDist,
    "timeout",
    "jsonb_build_object('cause', 'caller_timeout', 'reason', $4::text, 'deadline', $5::timestamptz, 'lease_expired', $5::timestamptz <= statement_timestamp())",
    [pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID]
);

static EVENT_ABANDONED: Statement = event_statement!(
    EventAbandonedDist,
    "abandoned",
    "jsonb_build_object('reason', $4::text, 'previous_state', $5::text, 'lease_expired', $6::boolean)",
    [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::BOOLOID]
);

static EVENT_CANCELLED: Statement = event_statement!(
    EventCancelledDist,
    "cancelled",
    "jsonb_build_object('reason', $4::text, 'previous_state', $5::text, 'version', $6::int8, 'open_attempt', $7::uuid)",
    [
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::UUIDOID
    ]
);

static EVENT_LOST: Statement = event_statement!(
    EventLostDist,
    "late_result",
    "jsonb_build_object('winner', $4::uuid, 'presented_version', $5::int8, 'current_version', $6::int8, 'job_state', $7::text, 'attempt_state', $8::text)",
    [
        pg_sys::UUIDOID,
        pg_sys::INT8OID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID
    ]
);

static EVENT_RESULT_AFTER_FAILURE: Statement = event_statement!(
    EventResultAfterFailureDist,
    "late_result",
    "jsonb_build_object('attempt_state', 'failed', 'result', $4::jsonb, 'presented_version', $5::int8, 'current_version', $6::int8, 'job_state', $7::text, 'winner', $8::uuid)",
    [
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID
    ]
);

static EVENT_VIOLATION: Statement = Statement {
    name: "EventViolationDist",
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

static EVENT_LATE_FAILURE: Statement = event_statement!(
    EventLateFailureDist,
    "late_failure",
    "jsonb_build_object('error', $4::jsonb, 'attempt_state', $5::text, 'job_state', $6::text, 'winner', $7::uuid, 'current_version', $8::int8)",
    [
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::UUIDOID,
        pg_sys::INT8OID
    ]
);

/// The job's facts an event records: (owner_id, state, version, completed_by).
fn job_facts(client: &mut SpiClient<'_>, job_id: Uuid) -> (String, String, i64, Option<Uuid>) {
    let row = plans::first(plans::run(client, &JOB_FACTS, &[job_id.into()]))
        .expect("the job row is locked by this call");
    (
        plans::must(&row, 1),
        plans::must(&row, 2),
        plans::must(&row, 3),
        plans::get(&row, 4),
    )
}

fn logged(client: &mut SpiClient<'_>, job_id: Uuid, attempt_id: Uuid, kind: &str) -> bool {
    let row = plans::first(plans::run(
        client,
        &LOGGED,
        &[job_id.into(), attempt_id.into(), kind.into()],
    ))
    .expect("SELECT EXISTS returns a row");
    plans::must(&row, 1)
}

/// job.rs `settle_lapsed`: a started attempt past its deadline becomes unknown, its running job
/// too, and the timeout is logged. Whether it changed anything.
pub fn settle_lapsed(client: &mut SpiClient<'_>, attempt_id: Uuid, noticed_by: &str) -> bool {
    let job_id = job_of(attempt_id);
    let Some(row) = plans::first(plans::run(
        client,
        &ATTEMPT_UNKNOWN,
        &[attempt_id.into(), job_id.into(), true.into()],
    )) else {
        return false;
    };
    let owner: String = plans::must(&row, 1);
    let deadline: TimestampWithTimeZone = plans::must(&row, 2);
    plans::run(
        client,
        &JOB_UNKNOWN,
        &[job_id.into(), crate::clock::now().into()],
    );
    plans::run(
        client,
        &EVENT_LAPSED,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            deadline.into(),
            noticed_by.into(),
        ],
    );
    true
}

/// lease.rs MARK_UNKNOWN: the caller's timeout fired for a started attempt.
pub fn mark_unknown(client: &mut SpiClient<'_>, attempt_id: Uuid, reason: Option<&str>) {
    let job_id = job_of(attempt_id);
    let Some(row) = plans::first(plans::run(
        client,
        &ATTEMPT_UNKNOWN,
        &[attempt_id.into(), job_id.into(), false.into()],
    )) else {
        return;
    };
    let owner: String = plans::must(&row, 1);
    let deadline: TimestampWithTimeZone = plans::must(&row, 2);
    plans::run(
        client,
        &JOB_UNKNOWN,
        &[job_id.into(), crate::clock::now().into()],
    );
    plans::run(
        client,
        &EVENT_CALLER_TIMEOUT,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            reason.into(),
            deadline.into(),
        ],
    );
}

/// lease.rs HEARTBEAT, with the job id ($3) on both tables.
pub static HEARTBEAT: Statement = Statement {
    name: "HeartbeatDist",
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

static ABANDON_ATTEMPT: Statement = Statement {
    name: "AbandonAttemptDist",
    sql: concat!(
        "UPDATE intent.attempts SET state = 'abandoned'
          WHERE id = $1 AND job_id = $2 AND state IN ",
        open_attempt_states_sql!(),
        " RETURNING owner_id::text"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

static JOB_PENDING: Statement = Statement {
    name: "JobPendingDist",
    sql: "UPDATE intent.jobs SET state = 'pending', retry_at = NULL, updated_at = $2
           WHERE id = $1 AND state IN ('running', 'unknown')",
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

/// decisions.rs ABANDON.
pub fn abandon(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    reason: Option<&str>,
    previous_state: &str,
    lease_expired: bool,
) {
    let job_id = job_of(attempt_id);
    let Some(row) = plans::first(plans::run(
        client,
        &ABANDON_ATTEMPT,
        &[attempt_id.into(), job_id.into()],
    )) else {
        return;
    };
    let owner: String = plans::must(&row, 1);
    plans::run(
        client,
        &JOB_PENDING,
        &[job_id.into(), crate::clock::now().into()],
    );
    plans::run(
        client,
        &EVENT_ABANDONED,
        &[
            job_id.into(),
            owner.as_str().into(),
            attempt_id.into(),
            reason.into(),
            previous_state.into(),
            lease_expired.into(),
        ],
    );
}

static CANCEL_JOB: Statement = Statement {
    name: "CancelJobDist",
    sql: concat!(
        "UPDATE intent.jobs SET state = 'cancelled', version = version + 1, updated_at = $2
          WHERE id = $1 AND state IN ",
        open_job_states_sql!(),
        " RETURNING owner_id::text, version::int8"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

static OPEN_ATTEMPT_ID: Statement = Statement {
    name: "OpenAttemptIdDist",
    sql: concat!(
        "SELECT id FROM intent.attempts WHERE job_id = $1 AND state IN ",
        open_attempt_states_sql!()
    ),
    args: &[pg_sys::UUIDOID],
};

/// decisions.rs CANCEL; whether the job was cancelled.
pub fn cancel(
    client: &mut SpiClient<'_>,
    job_id: Uuid,
    reason: Option<&str>,
    previous_state: &str,
) -> bool {
    let Some(row) = plans::first(plans::run(
        client,
        &CANCEL_JOB,
        &[job_id.into(), crate::clock::now().into()],
    )) else {
        return false;
    };
    let owner: String = plans::must(&row, 1);
    let version: i64 = plans::must(&row, 2);
    let open: Option<Uuid> = plans::first(plans::run(client, &OPEN_ATTEMPT_ID, &[job_id.into()]))
        .and_then(|row| plans::get(&row, 1));
    plans::run(
        client,
        &EVENT_CANCELLED,
        &[
            job_id.into(),
            owner.as_str().into(),
            None::<Uuid>.into(),
            reason.into(),
            previous_state.into(),
            version.into(),
            open.into(),
        ],
    );
    true
}

static WIN: Statement = Statement {
    name: "WinDist",
    sql: concat!(
        "UPDATE intent.jobs
            SET state = 'succeeded', result = $3, completed_by = $1, version = version + 1,
                updated_at = $5
          WHERE id = $2 AND version = $4 AND completed_by IS NULL AND state IN ",
        open_job_states_sql!(),
        " RETURNING version"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

static ATTEMPT_RETURNED: Statement = Statement {
    name: "AttemptReturnedDist",
    sql: "UPDATE intent.attempts
             SET state = $3::text::intent.attempt_state, result = $4, finished_at = $5
           WHERE id = $1 AND job_id = $2",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// finish.rs COMPLETE: the compare-and-swap, the attempt's own outcome, and the logged race
/// when it lost. Whether it won.
pub fn complete(
    client: &mut SpiClient<'_>,
    attempt_id: Uuid,
    job_id: Uuid,
    result: Jsonb,
    version: i64,
    attempt_state: &str,
) -> bool {
    let won = plans::first(plans::run(
        client,
        &WIN,
        &[
            attempt_id.into(),
            job_id.into(),
            result.into(),
            version.into(),
            crate::clock::now().into(),
        ],
    ))
    .is_some();
    plans::run(
        client,
        &ATTEMPT_RETURNED,
        &[
            attempt_id.into(),
            job_id.into(),
            if won { "succeeded" } else { "discarded" }.into(),
            result.into(),
            crate::clock::now().into(),
        ],
    );
    if !won {
        let (owner, state, current, winner) = job_facts(client, job_id);
        plans::run(
            client,
            &EVENT_LOST,
            &[
                job_id.into(),
                owner.as_str().into(),
                attempt_id.into(),
                winner.into(),
                version.into(),
                current.into(),
                state.as_str().into(),
                attempt_state.into(),
            ],
        );
    }
    won
}

/// finish.rs LOG_RESULT_AFTER_FAILURE (logged once).
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

/// finish.rs LOG_VIOLATION: returns the error as recorded (without the job state).
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

/// finish.rs LOG_LATE_FAILURE (logged once).
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

/// finish.rs FAIL_ATTEMPT, with the job id ($4).
pub static FAIL_ATTEMPT: Statement = Statement {
    name: "FailAttemptDist",
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

/// finish.rs FAIL_JOB, returning no expression Citus would have to evaluate on the worker.
pub static FAIL_JOB: Statement = Statement {
    name: "FailJobDist",
    sql: concat!(
        "UPDATE intent.jobs
             SET state = 'failed', error = $3, completed_by = $1, version = version + 1,
                 updated_at = $5
           WHERE id = $2 AND version = $4 AND completed_by IS NULL
             AND state IN ",
        open_job_states_sql!(),
        " RETURNING 'failed'"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// finish.rs REOPEN_JOB: the attempts counted on the job's shard, and whether the job is
/// claimable at once read from its own columns (Citus refuses statement_timestamp() in
/// RETURNING; updated_at is the call's instant, $5).
pub static REOPEN_JOB: Statement = Statement {
    name: "ReopenJobDist",
    sql: "UPDATE intent.jobs j SET state = 'pending', updated_at = $5,
                 retry_at = $5 + coalesce($2, make_interval(secs => least($4,
                     $3 * power(2, least(30, greatest(0, (SELECT count(*) FROM intent.attempts a
                                                           WHERE a.job_id = $1 AND a.state = 'failed') - 1))))))
           WHERE j.id = $1 AND j.state IN ('running', 'unknown')
          RETURNING j.retry_at <= j.updated_at",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::INTERVALOID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// A reconciliation (decisions.rs `RECORD_RECONCILED`) as `INSERT … VALUES`, routed by its job
/// id: Citus refuses the single-node `INSERT … SELECT … FROM intent.attempts` under row-level
/// security. The owner and the attempt's state are read by the caller (the job row is locked).
static RECORD_RECONCILED: Statement = Statement {
    name: "RecordReconciledDist",
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

/// `record_reconciliation`'s event in the distributed mode: its id, or `None` when another
/// transaction recorded the attempt's reconciliation first (`events_one_reconciliation`).
pub fn record_reconciled(
    client: &mut SpiClient<'_>,
    job_id: Uuid,
    owner_id: &str,
    attempt_id: Uuid,
    decision: &str,
    attempt_state: &str,
    evidence: crate::jsonb::Jsonb,
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
