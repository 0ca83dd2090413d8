//! `submit_job`: one job per intent, decided by the unique constraint alone.

use crate::entry::{arg, enum_value, one_row};
use crate::input;
use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::refusal::{self, Answer};
use crate::state::{JobState, lapsed_sql};
use crate::store::{self, Comparison, Intent};
use pg_intent_protocol::FingerprintField;
use pgrx::IntoDatum;
use pgrx::Uuid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

/// Inserts the job unless its key exists. ON CONFLICT DO NOTHING waits for a concurrent
/// inserter of the same key: if that one commits we get no row, if it rolls back we insert.
/// Both unique indexes must be arbiters: a concurrent insert of the same intent collides on the
/// primary key too (the id is derived from the key), and a collision on a unique index that is
/// not an arbiter is an error (23505), not a "do nothing".
pub(crate) static INSERT_JOB: Statement = Statement {
    name: "InsertJob",
    // $8, the first version, is above the last version of a purged job of the same key (see
    // store::rules::first_version): a late report from one of the purged job's attempts, whose ids
    // the new job reuses, then presents a version the new job never handed out.
    // Claimable from now: retry_at is set while a job is claimable (store::rules::clear_retry_sql!).
    sql: "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts,
                                   version, created_at, updated_at, retry_at)
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $9)
          ON CONFLICT DO NOTHING
          RETURNING version",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// For a running job: whether its attempt ran out of lease, which makes the job unknown (the
/// deadline rule holds swept or not). A separate statement, because most replays find a job
/// that is not running, and every expression in a statement costs at each execution.
static RUNNING_LAPSED: Statement = Statement {
    name: "RunningLapsed",
    sql: concat!(
        "SELECT EXISTS (SELECT 1 FROM intent.attempts a WHERE a.job_id = $1 AND ",
        lapsed_sql!("a"),
        ")"
    ),
    args: &[pg_sys::UUIDOID],
};

/// How many times `submit_job` inserts after a lookup found no job and the insert then found
/// one it cannot see (a purge removed it in between). Each round means another concurrent
/// purge of the same key; past this many, the caller is told to retry (`40001`).
const SUBMIT_ROUNDS: usize = 3;

struct Submitted {
    job_id: Uuid,
    created: bool,
    state: JobState,
    version: i64,
    result: Option<Jsonb>,
}

crate::entry::sql_function!(submit_job, submit_job);

/// `intent.submit_job(owner_id, idempotency_key, provider, params, contract, max_attempts)`.
fn submit_job(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let s = submit(
        arg(fcinfo, 0),
        arg(fcinfo, 1),
        arg(fcinfo, 2),
        arg(fcinfo, 3),
        arg(fcinfo, 4),
        arg(fcinfo, 5),
    )?;
    Ok(one_row(fcinfo, |types| {
        vec![
            s.job_id.into_datum(),
            s.created.into_datum(),
            Some(enum_value(types[2], s.state.as_str())),
            s.version.into_datum(),
            s.result.and_then(IntoDatum::into_datum),
        ]
    }))
}

fn submit(
    owner_id: Option<&str>,
    idempotency_key: Option<&str>,
    provider: Option<&str>,
    params: Option<Jsonb>,
    contract: Option<&str>,
    max_attempts: Option<i32>,
) -> Answer<Submitted> {
    let owner_id = input::name("owner_id", owner_id)?;
    let key = input::name("idempotency_key", idempotency_key)?;
    let provider = input::name("provider", provider)?;
    let params = input::document("params", params)?;
    let contract = input::optional_name("contract", contract)?;
    let max_attempts = input::max_attempts(max_attempts)?;
    crate::owner::check_acting_for(owner_id)?;
    let job_id = Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(owner_id, key));

    Spi::connect_mut(|client| {
        if let Some(contract) = contract {
            crate::contract::current_version(client, contract)?;
        }
        let intent = Intent {
            job_id,
            owner_id,
            key,
            provider,
            params,
            contract,
        };
        // Most submits of an existing key are replays (the double click, the retry): look first,
        // and skip the insert, whose constraint checks cost more than the lookup.
        if let Some(answer) = find(client, &intent) {
            return answer;
        }
        // A conflict whose row then cannot be found was deleted in between (a purge): the key is
        // free again, so insert again.
        for _ in 0..SUBMIT_ROUNDS {
            // Read after a lookup that found no job: if a purge removed the job, its tombstone
            // committed with the removal and is visible here.
            let first_version = store::get().first_version(client, job_id);
            let inserted = plans::run(
                client,
                store::compat::insert_job(&INSERT_JOB),
                &[
                    job_id.into(),
                    owner_id.into(),
                    key.into(),
                    provider.into(),
                    params.into(),
                    contract.into(),
                    max_attempts.into(),
                    first_version.into(),
                    crate::clock::now().into(),
                ],
            );
            if let Some(row) = plans::first(inserted) {
                crate::claim::notify_claimable(provider);
                let version = plans::must(&row, 1);
                if version > 1 {
                    purged_before(job_id, version);
                }
                return Ok(Submitted {
                    job_id,
                    created: true,
                    state: JobState::Pending,
                    version,
                    result: None,
                });
            }
            if let Some(answer) = find(client, &intent) {
                return answer;
            }
        }
        Err(refusal::kept_disappearing(job_id))
    })
}

/// Tells the caller (a NOTICE) that its key had a job that was purged (past `intent.retention`),
/// so that this job is a new one: a retry that comes after the retention runs the work again.
/// Free when it does not apply: a created job's first version is above 1 only when
/// `intent.retired_keys` holds its id, which the insert read anyway.
fn purged_before(job_id: Uuid, version: i64) {
    pgrx::ereport!(
        NOTICE,
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!("job {job_id} is new: an earlier job of this idempotency key was purged"),
        format!(
            "The earlier job finished and was removed past the retention (intent.retention); its versions ended at {}, this job's start at {version}. A key is kept only as long as its finished job.",
            version - 1
        )
    );
}

/// The existing job of this key, judged against the intent: the job (a replay), or IJ001 when
/// the key was used for another intent. None when there is no such job.
fn find(client: &mut SpiClient<'_>, intent: &Intent<'_>) -> Option<Answer<Submitted>> {
    let found = store::get().find_job(client, intent)?;
    let job_id = intent.job_id;
    let state = verdict(
        job_id,
        intent.owner_id,
        intent.key,
        &found.comparison,
        found.state,
        || {
            let lapsed = plans::first(plans::run(client, &RUNNING_LAPSED, &[job_id.into()]))
                .expect("SELECT EXISTS returns a row");
            plans::must::<bool>(&lapsed, 1)
        },
    );
    Some(state.map(|state| Submitted {
        job_id,
        created: false,
        state,
        version: found.version,
        result: found.result,
    }))
}

impl Comparison {
    /// The fingerprint fields that differ, in the order the DETAIL names them.
    fn differing(&self) -> Vec<FingerprintField> {
        [
            (self.same_provider, FingerprintField::Provider),
            (self.same_params, FingerprintField::Params),
            (self.same_contract, FingerprintField::Contract),
        ]
        .into_iter()
        .filter(|(same, _)| !same)
        .map(|(_, field)| field)
        .collect()
    }
}

/// The verdict on an intent whose key has a job, for `submit_job` and every intent of
/// `submit_jobs` alike: the job's state as the protocol reports it (a replay), or `IJ001` when
/// the key names another intent. `lapsed` is asked only for a running job: whether its
/// attempt ran out of lease, which makes it unknown (the deadline rule, without writing).
pub fn verdict(
    job_id: Uuid,
    owner_id: &str,
    key: &str,
    comparison: &Comparison,
    state: JobState,
    lapsed: impl FnOnce() -> bool,
) -> Answer<JobState> {
    if !comparison.same_key {
        return Err(refusal::id_collision(job_id));
    }
    let differ = comparison.differing();
    if !differ.is_empty() {
        return Err(refusal::fingerprint_conflict(
            job_id, owner_id, key, &differ,
        ));
    }
    Ok(crate::state::effective_job(
        state,
        state == JobState::Running && lapsed(),
    ))
}
