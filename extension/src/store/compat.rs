//! Catalogs older than the library: the one place that knows them.
//!
//! A new release's library is installed (a package upgrade, a new image) before someone runs
//! `ALTER EXTENSION pg_intent UPDATE`; meanwhile every call keeps working on the older catalog,
//! as far as that catalog allows. **Support window**: the catalogs of every release from 0.1.0
//! on, until 1.0; a release that drops one says so in its notes, and the library then refuses
//! the older catalog at call entry ("run ALTER EXTENSION pg_intent UPDATE"). What differs:
//!
//! - before 0.5.0: the claim indexes are keyed on `coalesce(retry_at, updated_at)` and filtered
//!   on `state` (0.5.0: on `retry_at` alone, set exactly while a job is claimable): the claim
//!   orders by that key. The library writes `retry_at` as 0.5.0 does on these catalogs too (set
//!   at submit and when a job becomes pending, cleared when it leaves the queue for good), which
//!   gives that key the same order;
//! - 0.1.0 and 0.2.0: no `intent.jobs.retry_at` (0.3.0): no statement writes it (a submit, a
//!   win, a final failure, a cancel, a new attempt, an abandon), and a reopened job is claimable
//!   at once (no backoff); `fail_attempt` has no `retry_after` argument ([`arg_if_declared`]);
//! - 0.1.0: `intent.contracts` records neither the checker's owner nor its definer (0.2.0),
//!   and stores the checker as a `regprocedure`.
//!
//! Each probe is a syscache lookup by name (a few hash probes), cheap next to any statement.
//! The statements here are those releases' own, frozen: they never change with the current ones.

use crate::plans::Statement;
use pgrx::FromDatum;
use pgrx::pg_sys;

/// Whether table `intent.<table>` has column `column`.
fn has_column(table: &std::ffi::CStr, column: &std::ffi::CStr) -> bool {
    // SAFETY: syscache lookups by name.
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"intent".as_ptr(), false);
        let rel = pg_sys::get_relname_relid(table.as_ptr(), ns);
        rel != pg_sys::InvalidOid && pg_sys::get_attnum(rel, column.as_ptr()) > 0
    }
}

/// `intent.jobs` has `retry_at` (0.3.0 on).
fn has_retry_at() -> bool {
    has_column(c"jobs", c"retry_at")
}

/// The claim indexes are keyed on `retry_at` (0.5.0 on): a syscache lookup of the index by name
/// (nobody but the extension's owner can make a relation in schema `intent`).
fn claims_by_retry_at() -> bool {
    // SAFETY: syscache lookups by name.
    unsafe {
        let ns = pg_sys::get_namespace_oid(c"intent".as_ptr(), false);
        pg_sys::get_relname_relid(c"jobs_claimable_since".as_ptr(), ns) != pg_sys::InvalidOid
    }
}

/// `intent.contracts` records checker owners and definers (0.2.0 on).
pub fn records_definers() -> bool {
    has_column(c"contracts", c"defined_by")
}

/// Argument `n` if the SQL declaration has it, else None: a function that gained an argument in
/// a release is called through the older declaration until `ALTER EXTENSION … UPDATE` runs.
pub fn arg_if_declared<T: FromDatum>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<T> {
    // SAFETY: fcinfo is the call's own.
    let nargs = unsafe { (*fcinfo).nargs };
    if n < usize::try_from(nargs).unwrap_or(0) {
        crate::entry::arg(fcinfo, n)
    } else {
        None
    }
}

/// The single node's `START_ATTEMPT` on the catalog of 0.2.0 (no `retry_at`).
static START_ATTEMPT_0_2: Statement = Statement {
    name: "StartAttempt0_2",
    sql: "WITH a AS (
              INSERT INTO intent.attempts
                     (id, job_id, owner_id, attempt_no, provider, state, version_read, worker, lease, started_at, deadline)
              VALUES ($1, $2, $3, $4, $5, 'started', $6, $7, $8, $9, $9 + $8)
              RETURNING deadline),
          j AS (
              UPDATE intent.jobs SET state = 'running', attempt_count = $4, updated_at = $9
               WHERE id = $2)
          SELECT deadline FROM a",
    args: super::rules::NEW_ATTEMPT_ARGS,
};

/// The single node's start of an attempt (`current`) for this catalog.
pub fn start_attempt(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &START_ATTEMPT_0_2
    }
}

/// The single node's claim before 0.5.0: ordered by `coalesce(retry_at, updated_at)`.
static CLAIM_0_4: Statement = Statement {
    name: "Claim0_4",
    sql: super::node::claim_sql!("", "", "coalesce(j.retry_at, j.updated_at)", "$6"),
    args: super::node::CLAIM.args,
};

/// The single node's bound claim before 0.5.0 (see `node::CLAIM_BOUND`).
static CLAIM_BOUND_0_4: Statement = Statement {
    name: "ClaimBound0_4",
    sql: super::node::claim_sql!(
        " AND j.owner_id >= $6::text AND j.owner_id <= $6::text AND (j.owner_id = $6::text) IS TRUE",
        "j.owner_id, ",
        "coalesce(j.retry_at, j.updated_at)",
        "$7"
    ),
    args: super::node::CLAIM_BOUND.args,
};

/// The single node's claim (`current`) for this catalog.
pub fn claim(current: &'static Statement) -> &'static Statement {
    if claims_by_retry_at() {
        current
    } else {
        &CLAIM_0_4
    }
}

/// The single node's bound claim (`current`) for this catalog.
pub fn claim_bound(current: &'static Statement) -> &'static Statement {
    if claims_by_retry_at() {
        current
    } else {
        &CLAIM_BOUND_0_4
    }
}

/// The distributed claim's candidates before 0.5.0 (see `shards::CLAIM_CANDIDATES`).
static CLAIM_CANDIDATES_0_4: Statement = Statement {
    name: "ClaimCandidatesDist0_4",
    sql: super::shards::claim_candidates_sql!("coalesce(j.retry_at, j.updated_at)"),
    args: super::shards::CLAIM_CANDIDATES.args,
};

/// The distributed claim's candidates (`current`) for this catalog.
pub fn claim_candidates(current: &'static Statement) -> &'static Statement {
    if claims_by_retry_at() {
        current
    } else {
        &CLAIM_CANDIDATES_0_4
    }
}

/// The single node's `COMPLETE` on the catalog of 0.2.0 (no `retry_at` to clear).
static COMPLETE_0_2: Statement = Statement {
    name: "Complete0_2",
    sql: super::node::complete_sql!(super::rules::win_sql!("")),
    args: super::node::COMPLETE.args,
};

/// The single node's complete (`current`) for this catalog.
pub fn complete(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &COMPLETE_0_2
    }
}

/// The single node's `CANCEL` on the catalog of 0.2.0 (no `retry_at` to clear).
static CANCEL_0_2: Statement = Statement {
    name: "Cancel0_2",
    sql: super::node::cancel_sql!(super::rules::cancel_job_sql!("$4", "")),
    args: super::node::CANCEL.args,
};

/// The single node's cancel (`current`) for this catalog.
pub fn cancel(current: &'static Statement) -> &'static Statement {
    if has_retry_at() { current } else { &CANCEL_0_2 }
}

/// `FAIL_JOB` on the catalog of 0.2.0 (no `retry_at` to clear).
static FAIL_JOB_0_2: Statement = Statement {
    name: "FailJob0_2",
    sql: super::fail_job_sql!(""),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The final failure (`current`) for this catalog.
pub fn fail_job(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &FAIL_JOB_0_2
    }
}

/// submit_job's insert on the catalog of 0.2.0 (no `retry_at`).
static INSERT_JOB_0_2: Statement = Statement {
    name: "InsertJob0_2",
    sql: "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts,
                                   version, created_at, updated_at)
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
          ON CONFLICT DO NOTHING
          RETURNING version",
    args: crate::submit::INSERT_JOB.args,
};

/// submit_job's insert (`current`) for this catalog.
pub fn insert_job(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &INSERT_JOB_0_2
    }
}

/// submit_jobs' insert on the catalog of 0.2.0 (no `retry_at`).
static INSERT_JOBS_0_2: Statement = Statement {
    name: "InsertJobs0_2",
    sql: concat!(
        "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts,
                                   version, created_at, updated_at)
          SELECT u.id, o, k, p, pa, c, m, ",
        super::rules::first_version_sql!("r.version"),
        ", $8, $8
            FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::int4[])
                 AS u(id, o, k, p, pa, c, m)
            LEFT JOIN intent.retired_keys r ON r.id = u.id
           ORDER BY u.id
          ON CONFLICT DO NOTHING
          RETURNING id, version"
    ),
    args: crate::batch::INSERT_JOBS.args,
};

/// submit_jobs' insert (`current`) for this catalog.
pub fn insert_jobs(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &INSERT_JOBS_0_2
    }
}

/// The single node's `ABANDON` on the catalog of 0.2.0 (no `retry_at`).
static ABANDON_0_2: Statement = Statement {
    name: "Abandon0_2",
    sql: "WITH a AS (
              UPDATE intent.attempts SET state = 'abandoned'
               WHERE id = $1 AND state IN ('started', 'unknown')
              RETURNING id, job_id, owner_id),
          j AS (
              UPDATE intent.jobs SET state = 'pending', updated_at = $5
               WHERE id = (SELECT job_id FROM a) AND state IN ('running', 'unknown'))
          INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'abandoned',
                 jsonb_build_object('reason', $2::text, 'previous_state', $3::text, 'lease_expired', $4::boolean)
            FROM a",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::BOOLOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The single node's abandon (`current`) for this catalog.
pub fn abandon(current: &'static Statement) -> &'static Statement {
    if has_retry_at() {
        current
    } else {
        &ABANDON_0_2
    }
}

/// The reopen of the catalog of 0.2.0 (no `retry_at`: claimable at once; `$1` the job, `$2`
/// the call's instant), or None for the current one.
static REOPEN_JOB_0_2: Statement = Statement {
    name: "ReopenJob0_2",
    sql: "UPDATE intent.jobs SET state = 'pending', updated_at = $2
           WHERE id = $1 AND state IN ('running', 'unknown')
          RETURNING true",
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

pub fn reopen_job() -> Option<&'static Statement> {
    (!has_retry_at()).then_some(&REOPEN_JOB_0_2)
}

/// `contract::CONTRACT` on the catalog of 0.1.0: the same columns, no owner or definer.
static CONTRACT_0_1: Statement = Statement {
    name: "Contract0_1",
    sql: "SELECT version, checker::oid, output_schema, NULL::oid, NULL::oid, checker::text
            FROM intent.contracts WHERE name = $1",
    args: &[pg_sys::TEXTOID],
};

/// The contract lookup for this catalog: `current` unless the catalog is 0.1.0's.
pub fn contract(current: &'static Statement) -> &'static Statement {
    if records_definers() {
        current
    } else {
        &CONTRACT_0_1
    }
}

/// `contract::UPSERT_CONTRACT` on the catalog of 0.1.0 (`$1` name, `$2` schema, `$3` the
/// checker's oid).
pub static UPSERT_CONTRACT_0_1: Statement = Statement {
    name: "UpsertContract0_1",
    sql: "INSERT INTO intent.contracts AS c (name, output_schema, checker, created_at, updated_at)
          VALUES ($1, $2, $3::regprocedure, statement_timestamp(), statement_timestamp())
          ON CONFLICT (name) DO UPDATE
             SET output_schema = excluded.output_schema, checker = excluded.checker,
                 version = c.version + 1, updated_at = statement_timestamp()
           WHERE c.output_schema IS DISTINCT FROM excluded.output_schema
              OR c.checker IS DISTINCT FROM excluded.checker
          RETURNING version",
    args: &[pg_sys::TEXTOID, pg_sys::JSONBOID, pg_sys::OIDOID],
};
