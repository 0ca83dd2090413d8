//! The rules of the protocol as SQL, each written once: every statement of either storage mode
//! (`node.rs`, `shards.rs`, and the steps both share in `mod.rs`) is built from these
//! fragments, so a rule changed here changes for every mode. The deadline rule and the state
//! sets come from the protocol crate (`id/src/state.rs`: `lapsed_sql!`, `open_job_states_sql!`…).
//!
//! Each macro takes the SQL expressions its rule reads (a parameter such as `"$3"`, or a column
//! of the statement such as `"a.deadline"`) and expands to a string literal.

/// The first version a job may hand out: above the last version of a purged job of the same
/// id (its tombstone in `intent.retired_keys`), else 1. A late report from one of the purged
/// job's attempts, whose ids the new job reuses, then presents a version the new job never
/// handed out. [`first_version`] is the same rule for a tombstone read by the caller.
macro_rules! first_version_sql {
    ($retired_version:expr) => {
        concat!("coalesce(", $retired_version, " + 1, 1)")
    };
}
pub(crate) use first_version_sql;

/// [`first_version_sql!`] for a tombstone's version read by the caller (None: no tombstone).
pub fn first_version(retired_version: Option<i64>) -> i64 {
    retired_version.map_or(1, |last| last + 1)
}

/// The default backoff of a retried job: `intent.retry_backoff` (`$3`, seconds) doubled for
/// each failed attempt of the job (`$1`) but the first, at most `intent.retry_backoff_max`
/// (`$4`, seconds); the exponent stops at 30, where any sane maximum has long been reached. `$3`
/// and `$4` are each checked to at most 30 days, so the product is at most 30 days × 2^30
/// seconds, which a double holds exactly enough, and the delay at most 30 days.
macro_rules! backoff_sql {
    () => {
        "make_interval(secs => least($4,
             $3 * power(2, least(30, greatest(0, (SELECT count(*) FROM intent.attempts a
                                                   WHERE a.job_id = $1 AND a.state = 'failed') - 1)))))"
    };
}
pub(crate) use backoff_sql;

/// A job that leaves the claimable queue for good (a win, a final failure, a cancel) has no
/// retry time: `retry_at` is set exactly while a job is claimable (pending, attempts left),
/// so that the claim indexes read that one column and these updates are HOT.
macro_rules! clear_retry_sql {
    () => {
        "retry_at = NULL, "
    };
}
pub(crate) use clear_retry_sql;

/// The compare-and-swap of a result: the job takes it only at the version the attempt was given
/// and only while no outcome is recorded and the job is open; it leaves the claimable queue
/// (a late result can win a pending job). `$1` the attempt, `$2` the job, `$3` the result, `$4`
/// the version, `$6` the call's instant. `$clear`: [`clear_retry_sql!`], or nothing on a catalog
/// without `retry_at` (store::compat).
macro_rules! win_sql {
    () => {
        $crate::store::rules::win_sql!($crate::store::rules::clear_retry_sql!())
    };
    ($clear:expr) => {
        concat!(
            "UPDATE intent.jobs
                SET state = 'succeeded', result = $3, completed_by = $1, version = version + 1, ",
            $clear,
            "updated_at = $6
              WHERE id = $2 AND version = $4 AND completed_by IS NULL AND state IN ",
            $crate::state::open_job_states_sql!(),
            " RETURNING version"
        )
    };
}
pub(crate) use win_sql;

/// An attempt's own outcome once its result was presented: succeeded when it won (`$won`, a
/// boolean expression), else discarded; the result kept on its row. `$1` the attempt, `$3` the
/// result, `$6` the call's instant.
macro_rules! attempt_returned_sql {
    ($won:expr) => {
        concat!(
            "UPDATE intent.attempts
                SET state = CASE WHEN ",
            $won,
            " THEN 'succeeded' ELSE 'discarded' END::intent.attempt_state,
                    result = $3, finished_at = $6
              WHERE id = $1"
        )
    };
}
pub(crate) use attempt_returned_sql;

/// An attempt becomes unknown (`$1`; only while started, and only when `$cond` holds).
macro_rules! attempt_unknown_sql {
    ($cond:expr) => {
        concat!(
            "UPDATE intent.attempts SET state = 'unknown'
              WHERE id = $1 AND state = 'started' AND ",
            $cond
        )
    };
}
pub(crate) use attempt_unknown_sql;

/// A running job whose attempt became unknown becomes unknown too.
macro_rules! job_unknown_sql {
    ($job:expr, $now:expr) => {
        concat!(
            "UPDATE intent.jobs SET state = 'unknown', updated_at = ",
            $now,
            " WHERE id = ",
            $job,
            " AND state = 'running'"
        )
    };
}
pub(crate) use job_unknown_sql;

/// An open attempt (`$1`) is abandoned: the gate opens, the attempt is not forgotten.
macro_rules! attempt_abandoned_sql {
    () => {
        concat!(
            "UPDATE intent.attempts SET state = 'abandoned'
              WHERE id = $1 AND state IN ",
            $crate::state::open_attempt_states_sql!()
        )
    };
}
pub(crate) use attempt_abandoned_sql;

/// A job whose attempt was abandoned is claimable at once (its retry time is now), if it has
/// attempts left.
macro_rules! job_pending_now_sql {
    ($job:expr, $now:expr) => {
        concat!(
            "UPDATE intent.jobs SET state = 'pending',
                    retry_at = CASE WHEN attempt_count < max_attempts THEN ",
            $now,
            "::timestamptz END, updated_at = ",
            $now,
            " WHERE id = ",
            $job,
            " AND state IN ('running', 'unknown')"
        )
    };
}
pub(crate) use job_pending_now_sql;

/// An open job (`$1`) is cancelled: version + 1 makes every attempt still out there lose its
/// compare-and-swap; it leaves the claimable queue. `$clear` as in [`win_sql!`].
macro_rules! cancel_job_sql {
    ($now:expr) => {
        $crate::store::rules::cancel_job_sql!($now, $crate::store::rules::clear_retry_sql!())
    };
    ($now:expr, $clear:expr) => {
        concat!(
            "UPDATE intent.jobs SET state = 'cancelled', version = version + 1, ",
            $clear,
            "updated_at = ",
            $now,
            " WHERE id = $1 AND state IN ",
            $crate::state::open_job_states_sql!()
        )
    };
}
pub(crate) use cancel_job_sql;

/// A new attempt, started at the call's instant: its lease starts then. `$1` its id, `$2` the
/// job, `$3` the owner, `$4` its number, `$5` the provider, `$6` the version it is given, `$7`
/// the worker, `$8` the lease, `$9` the call's instant.
macro_rules! insert_attempt_sql {
    () => {
        "INSERT INTO intent.attempts
                (id, job_id, owner_id, attempt_no, provider, state, version_read, worker, lease, started_at, deadline)
         VALUES ($1, $2, $3, $4, $5, 'started', $6, $7, $8, $9, $9 + $8)
         RETURNING deadline"
    };
}
pub(crate) use insert_attempt_sql;

/// The parameter types of [`insert_attempt_sql!`] and [`job_running_sql!`], in that numbering.
pub const NEW_ATTEMPT_ARGS: &[pgrx::pg_sys::Oid] = &[
    pgrx::pg_sys::UUIDOID,
    pgrx::pg_sys::UUIDOID,
    pgrx::pg_sys::TEXTOID,
    pgrx::pg_sys::INT4OID,
    pgrx::pg_sys::TEXTOID,
    pgrx::pg_sys::INT8OID,
    pgrx::pg_sys::TEXTOID,
    pgrx::pg_sys::INTERVALOID,
    pgrx::pg_sys::TIMESTAMPTZOID,
];

/// The job of a new attempt (`$2`, its number `$4`, the instant `$9`) runs: it leaves the queue.
/// The version is not touched: it changes only when the outcome slot changes.
macro_rules! job_running_sql {
    () => {
        "UPDATE intent.jobs SET state = 'running', attempt_count = $4, retry_at = NULL, updated_at = $9
          WHERE id = $2"
    };
}
pub(crate) use job_running_sql;

// --- The details of the events each transition logs (docs/reference.md, intent.events) -------

/// `timeout`: a started attempt's lease ran out, noticed by a call.
macro_rules! lapsed_detail {
    ($deadline:expr, $noticed_by:expr) => {
        concat!(
            "jsonb_build_object('cause', 'lease_expired', 'deadline', ",
            $deadline,
            ", 'noticed_by', ",
            $noticed_by,
            ")"
        )
    };
}
pub(crate) use lapsed_detail;

/// `timeout`: the caller's own timeout fired (mark_unknown), maybe after the lease ran out too.
macro_rules! caller_timeout_detail {
    ($reason:expr, $deadline:expr) => {
        concat!(
            "jsonb_build_object('cause', 'caller_timeout', 'reason', ",
            $reason,
            ", 'deadline', ",
            $deadline,
            ", 'lease_expired', ",
            $deadline,
            " <= statement_timestamp())"
        )
    };
}
pub(crate) use caller_timeout_detail;

/// `abandoned`.
macro_rules! abandoned_detail {
    ($reason:expr, $previous_state:expr, $lease_expired:expr) => {
        concat!(
            "jsonb_build_object('reason', ",
            $reason,
            ", 'previous_state', ",
            $previous_state,
            ", 'lease_expired', ",
            $lease_expired,
            ")"
        )
    };
}
pub(crate) use abandoned_detail;

/// `cancelled`.
macro_rules! cancelled_detail {
    ($reason:expr, $previous_state:expr, $version:expr, $open_attempt:expr) => {
        concat!(
            "jsonb_build_object('reason', ",
            $reason,
            ", 'previous_state', ",
            $previous_state,
            ", 'version', ",
            $version,
            ", 'open_attempt', ",
            $open_attempt,
            ")"
        )
    };
}
pub(crate) use cancelled_detail;

/// `late_result`: a result that lost the compare-and-swap.
macro_rules! lost_detail {
    ($winner:expr, $presented:expr, $current:expr, $job_state:expr, $attempt_state:expr) => {
        concat!(
            "jsonb_build_object('winner', ",
            $winner,
            ", 'presented_version', ",
            $presented,
            ", 'current_version', ",
            $current,
            ", 'job_state', ",
            $job_state,
            ", 'attempt_state', ",
            $attempt_state,
            ")"
        )
    };
}
pub(crate) use lost_detail;
