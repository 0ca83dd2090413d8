//! Retention: `purge` removes finished jobs, with their attempts and events, in bounded batches.
//!
//! Only terminal jobs (succeeded, failed, cancelled) are ever touched. After a purge the key is
//! free again: the same (owner_id, idempotency_key) creates a new job. So the retention must be
//! longer than any client's retry window. The new job reuses the old one's id and attempt ids
//! (they are derived from the key), so its versions start above the old job's last one: a late
//! report from the old job's attempts presents a version the new job never handed out.

use crate::entry::{arg, value};
use crate::input;
use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal};
use pgrx::datum::Interval;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

static RETENTION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The most jobs one call removes: a purge must never hold many locks or one long transaction.
use pg_intent_protocol::limits::MAX_PURGE_BATCH as MAX_BATCH;

/// Registers `intent.retention`; called from `_PG_init`.
pub fn register() {
    GucRegistry::define_string_guc(
        c"intent.retention",
        c"How long finished jobs are kept before intent.purge() may remove them (an interval).",
        c"Used when intent.purge() is called without a retention. Unset: purge needs an explicit one.",
        &RETENTION,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// Parses and checks the retention: positive, given or from the setting.
static RETENTION_OK: Statement = Statement {
    name: "RetentionOk",
    sql: "SELECT r, r > interval '0' FROM (SELECT coalesce($1, nullif($2, '')::interval) AS r) s",
    args: &[pg_sys::INTERVALOID, pg_sys::TEXTOID],
};

/// One batch: the oldest finished jobs past the retention that nobody is working on right now
/// (SKIP LOCKED), with their events; attempts go with their job (ON DELETE CASCADE).
static PURGE_BATCH: Statement = Statement {
    name: "PurgeBatch",
    sql: "WITH doomed AS (
              SELECT id FROM intent.jobs
               WHERE created_at < statement_timestamp() - $1
                 AND updated_at < statement_timestamp() - $1
                 AND state IN ('succeeded', 'failed', 'cancelled')
               ORDER BY created_at
               LIMIT $2
                 FOR UPDATE SKIP LOCKED),
          e AS (
              DELETE FROM intent.events e USING doomed d WHERE e.job_id = d.id),
          j AS (
              DELETE FROM intent.jobs j USING doomed d WHERE j.id = d.id RETURNING j.id, j.version),
          -- The key may be used again: remember the last version handed out under this id, so
          -- that the next job of the key never reuses a fencing token (see retired_keys).
          r AS (
              INSERT INTO intent.retired_keys (id, version, retired_at)
              SELECT id, version, statement_timestamp() FROM j
              ON CONFLICT (id) DO UPDATE SET version = excluded.version, retired_at = excluded.retired_at)
          SELECT count(*) FROM j",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID],
};

/// Distributed, the candidates: read on every shard (Citus cannot lock rows of many shards
/// with SKIP LOCKED), merged on the coordinator, oldest first. The owner isolation policies run
/// on the workers, which do not know the session's binding: a bound session's owner ($3) is
/// named here.
static CANDIDATES_DIST: Statement = Statement {
    name: "PurgeCandidatesDist",
    sql: "SELECT id FROM intent.jobs
           WHERE created_at < statement_timestamp() - $1
             AND updated_at < statement_timestamp() - $1
             AND state IN ('succeeded', 'failed', 'cancelled')
             AND ($3::text IS NULL OR owner_id::text = $3::text)
           ORDER BY created_at
           LIMIT $2",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID, pg_sys::TEXTOID],
};

/// Distributed, each candidate on its own shard: the same conditions read again under the lock,
/// skipped if another transaction holds it.
static LOCK_DIST: Statement = Statement {
    name: "PurgeLockDist",
    sql: "SELECT version::int8 FROM intent.jobs
           WHERE id = $1
             AND created_at < statement_timestamp() - $2
             AND updated_at < statement_timestamp() - $2
             AND state IN ('succeeded', 'failed', 'cancelled')
             AND ($3::text IS NULL OR owner_id::text = $3::text)
             FOR UPDATE SKIP LOCKED",
    args: &[pg_sys::UUIDOID, pg_sys::INTERVALOID, pg_sys::TEXTOID],
};

static EVENTS_DIST: Statement = Statement {
    name: "PurgeEventsDist",
    sql: "DELETE FROM intent.events WHERE job_id = $1",
    args: &[pg_sys::UUIDOID],
};

/// Its attempts go with it (ON DELETE CASCADE, on the same shard).
static JOB_DIST: Statement = Statement {
    name: "PurgeJobDist",
    sql: "DELETE FROM intent.jobs WHERE id = $1",
    args: &[pg_sys::UUIDOID],
};

static RETIRE_DIST: Statement = Statement {
    name: "RetireDist",
    sql: "INSERT INTO intent.retired_keys (id, version, retired_at)
          VALUES ($1, $2, statement_timestamp())
          ON CONFLICT (id) DO UPDATE SET version = excluded.version, retired_at = excluded.retired_at",
    args: &[pg_sys::UUIDOID, pg_sys::INT8OID],
};

/// A purge batch in the distributed mode: each job removed is a single-shard transaction part.
fn purge_dist(client: &mut pgrx::spi::SpiClient<'_>, retention: Interval, batch_size: i32) -> i64 {
    let owner = crate::owner::bound_owner();
    let candidates: Vec<pgrx::Uuid> = plans::run(
        client,
        &CANDIDATES_DIST,
        &[retention.into(), batch_size.into(), owner.as_deref().into()],
    )
    .map(|row| {
        row.get::<pgrx::Uuid>(1)
            .ok()
            .flatten()
            .expect("ids are NOT NULL")
    })
    .collect();
    let mut purged = 0;
    for id in candidates {
        let Some(row) = plans::first(plans::run(
            client,
            &LOCK_DIST,
            &[id.into(), retention.into(), owner.as_deref().into()],
        )) else {
            continue;
        };
        let version: i64 = plans::must(&row, 1);
        plans::run(client, &EVENTS_DIST, &[id.into()]);
        plans::run(client, &JOB_DIST, &[id.into()]);
        plans::run(client, &RETIRE_DIST, &[id.into(), version.into()]);
        purged += 1;
    }
    purged
}

crate::entry::sql_function!(purge, purge_entry);

/// `intent.purge(older_than, batch_size)` → bigint.
fn purge_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let purged = purge(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(value(fcinfo, Some(purged)))
}

fn purge(older_than: Option<Interval>, batch_size: Option<i32>) -> Answer<i64> {
    let batch_size = input::required("batch_size", batch_size)?;
    if !(1..=MAX_BATCH).contains(&batch_size) {
        return Err(
            Refusal::bad_input(format!("batch_size must be between 1 and {MAX_BATCH}"))
                .detail(format!("batch_size is {batch_size}."))
                .hint(
                    "Call intent.purge() repeatedly (pg_cron does) rather than in one huge batch.",
                ),
        );
    }
    let setting = RETENTION.get().map(|c| c.to_string_lossy().into_owned());
    Spi::connect_mut(|client| {
        // A malformed intent.retention is rejected by PostgreSQL's own interval input (22007).
        let row = plans::first(plans::run(
            client,
            &RETENTION_OK,
            &[older_than.into(), setting.as_deref().into()],
        ))
        .expect("SELECT returns a row");
        let Some(retention) = plans::get::<Interval>(&row, 1) else {
            return Err(Refusal::bad_input("no retention given and intent.retention is not set")
                .detail("intent.purge() removes finished jobs older than a retention, and none was given.")
                .hint("Pass one, e.g. intent.purge('30 days'), or set intent.retention."));
        };
        if !input::within_ten_thousand_years(&retention) {
            return Err(
                Refusal::bad_input("the retention must be less than ten thousand years")
                    .detail(format!("The retention is {retention}.")),
            );
        }
        if !plans::must::<bool>(&row, 2) {
            return Err(Refusal::bad_input("the retention must be positive")
                .detail(format!("The retention is {retention}."))
                .hint("Keep finished jobs longer than any client's retry window: after a purge the same key creates a new job."));
        }
        if crate::dist::distributed() {
            return Ok(purge_dist(client, retention, batch_size));
        }
        let row = plans::first(plans::run(
            client,
            &PURGE_BATCH,
            &[retention.into(), batch_size.into()],
        ))
        .expect("count(*) returns a row");
        Ok(plans::must(&row, 1))
    })
}
