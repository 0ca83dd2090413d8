//! Workers: `claim_attempts` (the database as the dispatcher), the retry backoff settings, and
//! the `intent_claimable` notification.
//!
//! A claim is `begin_attempt` for jobs the database picks: pending, attempts left, retry time
//! passed, longest-waiting first. It locks the jobs it takes `FOR NO KEY UPDATE SKIP LOCKED`, as
//! every call locks a job before changing it, but never waits for one another transaction holds:
//! concurrent claimers take disjoint jobs. It scans the partial index `jobs_claimable`, whose
//! size is the queue's, whatever the number of finished jobs.

use crate::entry::{arg, one_row_each};
use crate::input;
use crate::jsonb::{CallJsonb, Jsonb};
use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal};
use pg_intent_protocol::limits::MAX_CLAIM;
use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{IntoDatum, Uuid};
use std::ffi::CString;

/// `intent.retry_backoff`: the first retry's delay; read by the statements as an interval.
static RETRY_BACKOFF: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"1 second"));
/// `intent.retry_backoff_max`: the longest default delay.
static RETRY_BACKOFF_MAX: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"5 minutes"));
/// `intent.notify`: whether a job that becomes claimable at once sends `NOTIFY intent_claimable`.
/// Off by default: NOTIFY serializes committing transactions on a cluster-wide lock (submit
/// throughput at 8 clients fell to 0.27–0.45 of itself, docs/benchmarks.md), a transaction that
/// notified cannot `PREPARE TRANSACTION`, and every role may LISTEN on the channel.
static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(false);

/// The channel idle workers `LISTEN` on.
pub const CHANNEL: &str = "intent_claimable";

/// The default backoff's settings, checked as `retry_after` is (0 to 30 days, no month part, no
/// negative part), in seconds: `(first delay, longest delay)`. A malformed value is PostgreSQL's
/// own interval error (22007); one out of bounds is refused with 22023.
pub fn backoff_settings() -> Answer<(f64, f64)> {
    let read = |name: &str, setting: &GucSetting<Option<CString>>, default: &std::ffi::CStr| {
        let text = setting.get().unwrap_or_else(|| default.to_owned());
        // SAFETY: interval_in(cstring, oid, int4), as PostgreSQL's own input calls it.
        let value = unsafe {
            pgrx::direct_function_call::<Interval>(
                pg_sys::interval_in,
                &[
                    pg_sys::Datum::from(text.as_ptr()).into(),
                    pg_sys::InvalidOid.into_datum(),
                    (-1i32).into_datum(),
                ],
            )
        }
        .expect("interval_in returns a value");
        match crate::input::retry_after(Some(value)) {
            Ok(_) => Ok(value.days() as f64 * 86_400.0 + value.micros() as f64 / 1e6),
            Err(_) => Err(
                Refusal::bad_input(format!("{name} must be between 0 and 30 days"))
                    .detail(format!("{name} is {value}."))
                    .hint(format!(
                        "RESET {name}, or set it to an interval of at most 30 days."
                    )),
            ),
        }
    };
    Ok((
        read("intent.retry_backoff", &RETRY_BACKOFF, c"1 second")?,
        read("intent.retry_backoff_max", &RETRY_BACKOFF_MAX, c"5 minutes")?,
    ))
}

/// Registers the worker settings; called from `_PG_init`.
pub fn register() {
    GucRegistry::define_string_guc(
        c"intent.retry_backoff",
        c"The delay before a job is claimable again after its first retryable failure (an interval).",
        c"Doubled for each further failed attempt of the job, up to intent.retry_backoff_max. Used when fail_attempt gets no retry_after.",
        &RETRY_BACKOFF,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"intent.retry_backoff_max",
        c"The longest delay the default backoff gives (an interval).",
        c"Caps intent.retry_backoff doubled per failed attempt.",
        &RETRY_BACKOFF_MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"intent.notify",
        c"Whether pg_intent sends NOTIFY intent_claimable when a job becomes claimable at once.",
        c"The payload is the job's provider; it is delivered at commit. Off (the default): workers poll.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// Tells idle workers that a job of `provider` is claimable now (at commit), unless
/// `intent.notify` is off. NOTIFY folds identical notifications of one transaction into one.
pub fn notify_claimable(provider: &str) {
    if !NOTIFY.get() {
        return;
    }
    // pg_notify through the function manager: PostgreSQL's own checks and errors, under pgrx's
    // guard (a direct Async_Notify is not in pgrx's bindings).
    // SAFETY: pg_notify(text, text) with two text datums, as its SQL signature says.
    unsafe {
        pgrx::direct_function_call::<()>(
            pg_sys::pg_notify,
            &[CHANNEL.into_datum(), provider.into_datum()],
        );
    }
}

/// The claim, for a session bound to no owner (`$6` unused) or to the owner `$6`. `c` takes the
/// jobs (skipping those another transaction holds); `a` inserts their attempts as begin_attempt
/// would (its version, its worker, its lease); `j` marks them running and clears their retry
/// time. `$5` is the call's instant (crate::clock): what is due, and when the leases start.
macro_rules! claim_sql {
    ($owner:literal, $order:literal) => {
        concat!(
            "WITH c AS (
              SELECT j.id, j.owner_id, j.attempt_count + 1 AS attempt_no, j.version, j.provider, j.params, j.contract,
                     coalesce(j.retry_at, j.updated_at) AS since
                FROM intent.jobs j
               WHERE j.state = 'pending' AND j.attempt_count < j.max_attempts",
            $owner,
            "
                 AND coalesce(j.retry_at, j.updated_at) <= $5
                 AND ($1::text[] IS NULL OR j.provider = ANY ($1::text[]))
               ORDER BY ",
            $order,
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
          SELECT c.id, a.id, c.attempt_no::int4, c.version::int8, a.deadline, c.provider::text, c.params, c.contract::text
            FROM c JOIN a ON a.job_id = c.id
           ORDER BY c.since"
        )
    };
}

/// Begins the next attempt of up to `$4` claimable jobs of every owner, longest-waiting first:
/// the scan of `jobs_claimable`.
static CLAIM: Statement = Statement {
    name: "Claim",
    sql: claim_sql!("", "coalesce(j.retry_at, j.updated_at)"),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// [`CLAIM`] for a session bound to the owner `$6`: the owner named in the statement, so that it
/// scans that owner's part of `jobs_claimable_by_owner` (ordered by owner, then the same key)
/// instead of walking every owner's queue and leaving the others' rows to the policies. Its
/// cost, and so its timing, does not depend on other owners' queues: run with its generic plan
/// (plans::run_generic), planned once, not for each call from the table's statistics, and
/// without bitmap scans, so that the plan is the ordered scan of the owner's part that stops
/// at `$4` jobs. The policies still apply.
static CLAIM_BOUND: Statement = Statement {
    name: "ClaimBound",
    // The owner as a range (`>= $6 AND <= $6`, which for a deterministic collation is
    // equality), with the equality itself as a plain filter (`IS TRUE`): an `owner_id = $6`
    // clause would make owner_id a constant to the planner, so that jobs_claimable (ordered by
    // the queue key alone) would provide the order too, and the plan could walk it and filter
    // the owner, which is what a bound claim must never do (auto_explain showed it chosen, with
    // two owners in the statistics). As written, only jobs_claimable_by_owner provides the order
    // (owner_id, key) and takes the owner as its index condition; any other plan sorts.
    sql: claim_sql!(
        " AND j.owner_id >= $6::text AND j.owner_id <= $6::text AND (j.owner_id = $6::text) IS TRUE",
        "j.owner_id, coalesce(j.retry_at, j.updated_at)"
    ),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
    ],
};

/// Distributed, the candidates: a read on every shard (no lock: Citus cannot lock rows of
/// many shards with SKIP LOCKED), merged on the coordinator, longest-waiting first; a bound
/// session's own jobs only (the policies run on the workers, which do not know the binding).
static CANDIDATES_DIST: Statement = Statement {
    name: "ClaimCandidatesDist",
    sql: "SELECT j.id FROM intent.jobs j
           WHERE j.state = 'pending' AND j.attempt_count < j.max_attempts
             AND coalesce(j.retry_at, j.updated_at) <= $4
             AND ($1::text[] IS NULL OR j.provider = ANY ($1::text[]))
             AND ($3::text IS NULL OR j.owner_id = $3)
           ORDER BY coalesce(j.retry_at, j.updated_at)
           LIMIT $2",
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Distributed, each candidate in turn: taken as the single-node claim takes it (the same
/// conditions, read again under the lock), on its own shard, skipped if another transaction
/// holds it.
static TAKE_DIST: Statement = Statement {
    name: "ClaimLockDist",
    sql: "SELECT j.owner_id::text, j.attempt_count + 1, j.version::int8, j.provider::text, j.params, j.contract::text
            FROM intent.jobs j
           WHERE j.id = $1 AND j.state = 'pending' AND j.attempt_count < j.max_attempts
             AND coalesce(j.retry_at, j.updated_at) <= $3
             AND ($2::text[] IS NULL OR j.provider = ANY ($2::text[]))
             FOR NO KEY UPDATE OF j SKIP LOCKED",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTARRAYOID, pg_sys::TIMESTAMPTZOID],
};

/// How many candidates the distributed claim reads per job asked for: some may be taken by a
/// concurrent claimer between the read and the lock.
const CANDIDATES_PER_JOB: i32 = 2;

/// `claim` in the distributed mode: each job taken is a single-shard lock, insert and update.
fn claim_dist(
    client: &mut pgrx::spi::SpiClient<'_>,
    providers: Option<Vec<String>>,
    worker: Option<&str>,
    lease: Interval,
    max_jobs: i32,
) -> Vec<Claimed> {
    let bound = crate::owner::bound_owner();
    let candidates: Vec<Uuid> = plans::run(
        client,
        &CANDIDATES_DIST,
        &[
            providers.clone().into(),
            max_jobs.saturating_mul(CANDIDATES_PER_JOB).into(),
            bound.as_deref().into(),
            crate::clock::now().into(),
        ],
    )
    .map(|row| row.get::<Uuid>(1).ok().flatten().expect("ids are NOT NULL"))
    .collect();
    let mut claimed = Vec::new();
    for job_id in candidates {
        if claimed.len() >= max_jobs as usize {
            break;
        }
        let Some(row) = plans::first(plans::run(
            client,
            &TAKE_DIST,
            &[
                job_id.into(),
                providers.clone().into(),
                crate::clock::now().into(),
            ],
        )) else {
            continue;
        };
        let owner: String = plans::must(&row, 1);
        let attempt_no: i32 = plans::must(&row, 2);
        let version: i64 = plans::must(&row, 3);
        let provider: String = plans::must(&row, 4);
        let params: Jsonb = row
            .get::<CallJsonb>(5)
            .ok()
            .flatten()
            .expect("params is NOT NULL")
            .0;
        let contract: Option<String> = plans::get(&row, 6);
        let attempt_id = Uuid::from_bytes(
            pg_intent_protocol::attempt_id(*job_id.as_bytes(), i64::from(attempt_no))
                .expect("attempt_no is within 1..=max_attempts <= 65535"),
        );
        let deadline = crate::dist::start_attempt(
            client, attempt_id, job_id, &owner, attempt_no, &provider, version, worker, lease,
        );
        claimed.push(Claimed {
            job_id,
            attempt_id,
            attempt_no,
            version,
            deadline,
            provider,
            params,
            contract,
        });
    }
    claimed
}

/// One claimed attempt, copied out of SPI's memory.
struct Claimed {
    job_id: Uuid,
    attempt_id: Uuid,
    attempt_no: i32,
    version: i64,
    deadline: TimestampWithTimeZone,
    provider: String,
    params: Jsonb,
    contract: Option<String>,
}

crate::entry::sql_function!(claim_attempts, claim_attempts);

/// `intent.claim_attempts(providers, worker, lease, max_jobs)`.
fn claim_attempts(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let providers: Option<Vec<Option<String>>> = arg(fcinfo, 0);
    let worker: Option<&str> = arg(fcinfo, 1);
    let lease: Option<Interval> = arg(fcinfo, 2);
    let max_jobs: Option<i32> = arg(fcinfo, 3);
    let claimed = claim(providers, worker, lease, max_jobs)?;
    Ok(one_row_each(fcinfo, claimed.len(), |i, _| {
        let c = &claimed[i];
        vec![
            c.job_id.into_datum(),
            c.attempt_id.into_datum(),
            c.attempt_no.into_datum(),
            c.version.into_datum(),
            c.deadline.into_datum(),
            c.provider.as_str().into_datum(),
            c.params.into_datum(),
            c.contract.as_deref().into_datum(),
        ]
    }))
}

fn claim(
    providers: Option<Vec<Option<String>>>,
    worker: Option<&str>,
    lease: Option<Interval>,
    max_jobs: Option<i32>,
) -> Answer<Vec<Claimed>> {
    let providers = match providers {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|p| input::name("providers", p.as_deref()).map(str::to_string))
                .collect::<Answer<Vec<String>>>()?,
        ),
    };
    let worker = input::optional_name("worker", worker)?;
    let lease = input::lease("lease", lease)?;
    let max_jobs = input::required("max_jobs", max_jobs)?;
    if !(1..=MAX_CLAIM as i32).contains(&max_jobs) {
        return Err(
            Refusal::bad_input(format!("max_jobs must be between 1 and {MAX_CLAIM}"))
                .detail(format!("max_jobs is {max_jobs}.")),
        );
    }
    if crate::dist::distributed() {
        return Ok(Spi::connect_mut(|client| {
            claim_dist(client, providers, worker, lease, max_jobs)
        }));
    }
    let bound = crate::owner::bound_owner();
    Ok(Spi::connect_mut(|client| {
        let now = crate::clock::now();
        let args: [DatumWithOid<'_>; 5] = [
            providers.into(),
            worker.into(),
            lease.into(),
            max_jobs.into(),
            now.into(),
        ];
        let rows = match &bound {
            None => plans::run(client, &CLAIM, &args),
            Some(owner) => {
                let [providers, worker, lease, max_jobs, now] = args;
                plans::run_generic(
                    client,
                    &CLAIM_BOUND,
                    &[
                        providers,
                        worker,
                        lease,
                        max_jobs,
                        now,
                        owner.as_str().into(),
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
            }
        })
        .collect()
    }))
}
