//! Catalogs older than the library: the one place that knows them.
//!
//! A new release's library is installed (a package upgrade, a new image) before someone runs
//! `ALTER EXTENSION pg_intent UPDATE`; meanwhile every call keeps working on the older catalog,
//! as far as that catalog allows. **Support window**: the catalogs of every release from 0.1.0
//! on, until 1.0; a release that drops one says so in its notes, and the library then refuses
//! the older catalog at call entry ("run ALTER EXTENSION pg_intent UPDATE"). What differs:
//!
//! - 0.1.0 and 0.2.0: no `intent.jobs.retry_at` (0.3.0): a new attempt and an abandon do not
//!   clear it, and a reopened job is claimable at once (no backoff); `fail_attempt` has no
//!   `retry_after` argument ([`arg_if_declared`]);
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
