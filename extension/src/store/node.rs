//! The steps on a single node: each transition's writes combined into one statement (data-
//! modifying CTEs) where it pays, the replay lookup a direct index fetch (`direct.rs`), and the
//! owner isolation policies left to PostgreSQL's planner.

use super::rules::{
    abandoned_detail, attempt_abandoned_sql, attempt_unknown_sql, caller_timeout_detail,
    cancel_job_sql, insert_attempt_sql, job_pending_now_sql, job_running_sql, job_unknown_sql,
    lapsed_detail, win_sql,
};
use super::{
    Abandoned, ClaimAsk, Claimed, Found, Intent, NewAttempt, Presented, Store, compat, direct,
};
use crate::jsonb::CallJsonb;
use crate::plans::{self, Statement};
use crate::state::lapsed_sql;
use pgrx::Uuid;
use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::{SpiClient, SpiTupleTable};

pub struct Node;

static LOCK_JOB: Statement = Statement {
    name: "LockJob",
    sql: "SELECT state::text, version, provider, contract, max_attempts, attempt_count, owner_id, completed_by
            FROM intent.jobs WHERE id = $1 FOR NO KEY UPDATE",
    args: &[pg_sys::UUIDOID],
};

/// The attempt and its job running, in one statement, at the call's instant ($9). If a
/// hand-written row somehow got past the job lock, the partial unique index
/// `attempts_one_open_per_job` still refuses it.
static START_ATTEMPT: Statement = Statement {
    name: "StartAttempt",
    sql: concat!(
        "WITH a AS (",
        insert_attempt_sql!(),
        "), j AS (",
        job_running_sql!(),
        ") SELECT deadline FROM a"
    ),
    args: super::rules::NEW_ATTEMPT_ARGS,
};

/// A lapsed attempt ($1) unknown, its running job too, the timeout logged ($2 who noticed,
/// $3 the call's instant).
static SETTLE_LAPSED: Statement = Statement {
    name: "SettleLapsed",
    sql: concat!(
        "WITH a AS (",
        attempt_unknown_sql!(lapsed_sql!()),
        " RETURNING id, job_id, owner_id, deadline),
          j AS (",
        job_unknown_sql!("(SELECT job_id FROM a)", "$3"),
        "), e AS (
              INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
              SELECT a.job_id, a.owner_id, a.id, 'timeout', ",
        lapsed_detail!("a.deadline", "$2::text"),
        " FROM a)
          SELECT count(*) FROM a"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
};

/// The caller's own timeout fired ($1, $2 its reason, $3 the call's instant).
static MARK_UNKNOWN: Statement = Statement {
    name: "MarkUnknown",
    sql: concat!(
        "WITH a AS (",
        attempt_unknown_sql!("true"),
        " RETURNING id, job_id, owner_id, deadline),
          j AS (",
        job_unknown_sql!("(SELECT job_id FROM a)", "$3"),
        ") INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'timeout', ",
        caller_timeout_detail!("$2::text", "a.deadline"),
        " FROM a"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
};

/// The attempt ($1) abandoned, its job claimable at once, logged ($2 reason, $3 previous
/// state, $4 whether its lease had run out, $5 the call's instant).
static ABANDON: Statement = Statement {
    name: "Abandon",
    sql: concat!(
        "WITH a AS (",
        attempt_abandoned_sql!(),
        " RETURNING id, job_id, owner_id),
          j AS (",
        job_pending_now_sql!("(SELECT job_id FROM a)", "$5"),
        ") INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
          SELECT a.job_id, a.owner_id, a.id, 'abandoned', ",
        abandoned_detail!("$2::text", "$3::text", "$4::boolean"),
        " FROM a"
    ),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::BOOLOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The job ($1) cancelled and logged with its open attempt ($2 reason, $3 previous state, $4
/// the call's instant).
macro_rules! cancel_sql {
    ($cancel:expr) => {
        concat!(
            "WITH j AS (",
            $cancel,
            " RETURNING id, owner_id, version)
          INSERT INTO intent.events (job_id, owner_id, kind, detail)
          SELECT j.id, j.owner_id, 'cancelled', ",
            $crate::store::rules::cancelled_detail!(
                "$2::text",
                "$3::text",
                "j.version",
                concat!(
                    "(SELECT a.id FROM intent.attempts a WHERE a.job_id = j.id AND a.state IN ",
                    $crate::state::open_attempt_states_sql!(),
                    ")"
                )
            ),
            " FROM j
          RETURNING 1"
        )
    };
}
pub(crate) use cancel_sql;

/// [`cancel_sql!`] on this catalog.
pub(crate) static CANCEL: Statement = Statement {
    name: "Cancel",
    sql: cancel_sql!(cancel_job_sql!("$4")),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The compare-and-swap, the attempt's own outcome and, when it lost, the logged race. `$5`
/// the attempt's state when the result came.
macro_rules! complete_sql {
    ($win:expr) => {
        concat!(
            "WITH won AS (",
            $win,
            "), a AS (",
            $crate::store::rules::attempt_returned_sql!("EXISTS (SELECT 1 FROM won)"),
            "), e AS (
              INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail)
              SELECT j.id, j.owner_id, $1, 'late_result', ",
            $crate::store::rules::lost_detail!(
                "j.completed_by",
                "$4",
                "j.version",
                "j.state",
                "$5::text"
            ),
            " FROM intent.jobs j
               WHERE j.id = $2 AND NOT EXISTS (SELECT 1 FROM won))
          SELECT EXISTS (SELECT 1 FROM won)"
        )
    };
}
pub(crate) use complete_sql;

/// The compare-and-swap of [`complete_sql!`] on this catalog.
pub(crate) static COMPLETE: Statement = Statement {
    name: "Complete",
    sql: complete_sql!(win_sql!()),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The claim, for a session bound to no owner or to the owner `$6`, with `$7` (or `$6`) the
/// start (crate::claim_start). `$since`: since when a job is claimable, the key of the claim
/// index (`j.retry_at` from 0.5.0; before, `coalesce(j.retry_at, j.updated_at)`, store::compat). `c` takes the
/// jobs (skipping those another transaction holds); `a` inserts their attempts as begin_attempt
/// would (its version, its worker, its lease); `j` marks them running and clears their retry
/// time. `$5` is the call's instant (crate::clock): what is due, and when the leases start.
macro_rules! claim_sql {
    ($owner:literal, $by_owner:literal, $since:literal, $start:literal) => {
        concat!(
            "WITH c AS (
              SELECT j.id, j.owner_id, j.attempt_count + 1 AS attempt_no, j.version, j.provider, j.params, j.contract,
                     ",
            $since,
            " AS since
                FROM intent.jobs j
               WHERE j.state = 'pending' AND j.attempt_count < j.max_attempts",
            $owner,
            "
                 AND ",
            $since,
            " <= $5
                 AND ",
            $since,
            " >= ",
            $start,
            "
                 AND ($1::text[] IS NULL OR j.provider = ANY ($1::text[]))
               ORDER BY ",
            $by_owner,
            $since,
            "
               LIMIT $4
                 FOR NO KEY UPDATE OF j SKIP LOCKED),
          a AS (
              INSERT INTO intent.attempts
                     (id, job_id, owner_id, attempt_no, provider, state, version_read, worker, lease, started_at, deadline)
              SELECT intent.attempt_id(c.id, c.attempt_no), c.id, c.owner_id, c.attempt_no, c.provider, 'started',
                     c.version, $2, $3, $5, $5 + $3
                FROM c
              RETURNING id, job_id, deadline),
          j AS (
              UPDATE intent.jobs SET state = 'running', attempt_count = c.attempt_no, retry_at = NULL,
                                     updated_at = $5
                FROM c WHERE intent.jobs.id = c.id)
          SELECT c.id, a.id, c.attempt_no::int4, c.version::int8, a.deadline, c.provider::text, c.params, c.contract::text,
                 c.since
            FROM c JOIN a ON a.job_id = c.id
           ORDER BY c.since"
        )
    };
}

pub(crate) use claim_sql;

/// Begins the next attempt of up to `$4` claimable jobs of every owner, longest-waiting first:
/// the scan of `jobs_claimable_since`.
pub(crate) static CLAIM: Statement = Statement {
    name: "Claim",
    sql: claim_sql!("", "", "j.retry_at", "$6"),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// [`CLAIM`] for a session bound to the owner `$6`: the owner named in the statement, so that it
/// scans that owner's part of `jobs_claimable_since_by_owner` (ordered by owner, then the same key)
/// instead of walking every owner's queue and leaving the others' rows to the policies. Its
/// cost, and so its timing, does not depend on other owners' queues: run with its generic plan
/// (plans::run_generic), planned once, not for each call from the table's statistics, and
/// without bitmap scans, so that the plan is the ordered scan of the owner's part that stops
/// at `$4` jobs. The policies still apply.
pub(crate) static CLAIM_BOUND: Statement = Statement {
    name: "ClaimBound",
    // The owner as a range (`>= $6 AND <= $6`, which for a deterministic collation is
    // equality), with the equality itself as a plain filter (`IS TRUE`): an `owner_id = $6`
    // clause would make owner_id a constant to the planner, so that jobs_claimable_since (ordered by
    // the queue key alone) would provide the order too, and the plan could walk it and filter
    // the owner, which is what a bound claim must never do (auto_explain showed it chosen, with
    // two owners in the statistics). As written, only jobs_claimable_since_by_owner provides the order
    // (owner_id, key) and takes the owner as its index condition; any other plan sorts.
    sql: claim_sql!(
        " AND j.owner_id >= $6::text AND j.owner_id <= $6::text AND (j.owner_id = $6::text) IS TRUE",
        "j.owner_id, ",
        "j.retry_at",
        "$7"
    ),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
    ],
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

impl Store for Node {
    fn lock_job<'c>(&self, client: &mut SpiClient<'c>, job_id: Uuid) -> Option<SpiTupleTable<'c>> {
        plans::first(plans::run(client, &LOCK_JOB, &[job_id.into()]))
    }

    fn start_attempt(
        &self,
        client: &mut SpiClient<'_>,
        new: &NewAttempt<'_>,
    ) -> TimestampWithTimeZone {
        let row = plans::first(plans::run(
            client,
            compat::start_attempt(&START_ATTEMPT),
            &[
                new.attempt_id.into(),
                new.job_id.into(),
                new.owner_id.into(),
                new.attempt_no.into(),
                new.provider.into(),
                new.version.into(),
                new.worker.into(),
                new.lease.into(),
                crate::clock::now().into(),
            ],
        ))
        .expect("INSERT … RETURNING returns the row it inserted");
        plans::must(&row, 1)
    }

    fn settle_lapsed(
        &self,
        client: &mut SpiClient<'_>,
        attempt_id: Uuid,
        noticed_by: &str,
    ) -> bool {
        let row = plans::first(plans::run(
            client,
            &SETTLE_LAPSED,
            &[
                attempt_id.into(),
                noticed_by.into(),
                crate::clock::now().into(),
            ],
        ))
        .expect("count(*) returns a row");
        plans::must::<i64>(&row, 1) > 0
    }

    fn mark_unknown(&self, client: &mut SpiClient<'_>, attempt_id: Uuid, reason: Option<&str>) {
        plans::run(
            client,
            &MARK_UNKNOWN,
            &[attempt_id.into(), reason.into(), crate::clock::now().into()],
        );
    }

    fn abandon(&self, client: &mut SpiClient<'_>, abandoned: &Abandoned<'_>) {
        plans::run(
            client,
            compat::abandon(&ABANDON),
            &[
                abandoned.attempt_id.into(),
                abandoned.reason.into(),
                abandoned.previous_state.into(),
                abandoned.lease_expired.into(),
                crate::clock::now().into(),
            ],
        );
    }

    fn cancel(
        &self,
        client: &mut SpiClient<'_>,
        job_id: Uuid,
        reason: Option<&str>,
        previous_state: &str,
    ) -> bool {
        plans::first(plans::run(
            client,
            compat::cancel(&CANCEL),
            &[
                job_id.into(),
                reason.into(),
                previous_state.into(),
                crate::clock::now().into(),
            ],
        ))
        .is_some()
    }

    fn complete(&self, client: &mut SpiClient<'_>, p: &Presented<'_>) -> bool {
        let row = plans::first(plans::run(
            client,
            compat::complete(&COMPLETE),
            &[
                p.attempt_id.into(),
                p.job_id.into(),
                p.result.into(),
                p.version.into(),
                p.attempt_state.into(),
                crate::clock::now().into(),
            ],
        ))
        .expect("SELECT EXISTS returns a row");
        plans::must::<bool>(&row, 1)
    }

    fn find_job(&self, _client: &mut SpiClient<'_>, intent: &Intent<'_>) -> Option<Found> {
        direct::find_job(intent)
    }

    fn first_version(&self, _client: &mut SpiClient<'_>, job_id: Uuid) -> i64 {
        super::rules::first_version(direct::retired_version(job_id))
    }

    fn claim(&self, client: &mut SpiClient<'_>, ask: &ClaimAsk) -> Vec<Claimed> {
        let bound = crate::owner::bound_owner();
        let now = crate::clock::now();
        // The whole queue from -infinity: one statement, one plan, the start always an index
        // bound (a generic plan cannot bound a scan by `$n IS NULL OR …`).
        let start = ask
            .start
            .unwrap_or_else(TimestampWithTimeZone::negative_infinity);
        let args: [DatumWithOid<'_>; 6] = [
            ask.providers.clone().into(),
            ask.worker.as_deref().into(),
            ask.lease.into(),
            ask.max_jobs.into(),
            now.into(),
            start.into(),
        ];
        let rows = match &bound {
            None => plans::run(client, compat::claim(&CLAIM), &args),
            Some(owner) => {
                let [providers, worker, lease, max_jobs, now, start] = args;
                plans::run_generic(
                    client,
                    compat::claim_bound(&CLAIM_BOUND),
                    &[
                        providers,
                        worker,
                        lease,
                        max_jobs,
                        now,
                        owner.as_str().into(),
                        start,
                    ],
                    // Not a bitmap scan of the owner's part and a sort of all of it: the
                    // ordered scan, which stops at max_jobs (an owner's own long queue). And no
                    // sequential scan anywhere in it: a plan made while intent.jobs was nearly
                    // empty would join the claimed rows back to the table by reading all of it
                    // (every owner's rows) for as long as the plan is kept.
                    &[(c"enable_bitmapscan", c"off"), (c"enable_seqscan", c"off")],
                )
            }
        };
        rows.map(|row| {
            let not_null = |n| -> ! { panic!("pg_intent: claim column {n} is unexpectedly NULL") };
            Claimed {
                job_id: row.get(1).ok().flatten().unwrap_or_else(|| not_null(1)),
                attempt_id: row.get(2).ok().flatten().unwrap_or_else(|| not_null(2)),
                attempt_no: row.get(3).ok().flatten().unwrap_or_else(|| not_null(3)),
                version: row.get(4).ok().flatten().unwrap_or_else(|| not_null(4)),
                deadline: row.get(5).ok().flatten().unwrap_or_else(|| not_null(5)),
                provider: row.get(6).ok().flatten().unwrap_or_else(|| not_null(6)),
                params: row
                    .get::<CallJsonb>(7)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| not_null(7))
                    .0,
                contract: row.get(8).ok().flatten(),
                since: row.get(9).ok().flatten().unwrap_or_else(|| not_null(9)),
            }
        })
        .collect()
    }

    fn purge(&self, client: &mut SpiClient<'_>, retention: Interval, batch_size: i32) -> i64 {
        let row = plans::first(plans::run(
            client,
            &PURGE_BATCH,
            &[retention.into(), batch_size.into()],
        ))
        .expect("count(*) returns a row");
        plans::must(&row, 1)
    }
}
