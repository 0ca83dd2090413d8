//! `submit_job`: one job per intent, decided by the unique constraint alone.

use crate::input;
use crate::jsonb::Jsonb;
use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal, split};
use pgrx::Uuid;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Inserts the job unless its key exists. ON CONFLICT DO NOTHING waits for a concurrent
/// inserter of the same key: if that one commits we get no row, if it rolls back we insert.
/// The arbiter is the (owner_id, idempotency_key) constraint, the one that decides "same
/// intent"; the id is derived from that pair, so the job found by id is that key's job.
static INSERT_JOB: Statement = Statement {
    slot: 0,
    sql: "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts, created_at, updated_at)
          VALUES ($1, $2, $3, $4, $5, $6, $7, statement_timestamp(), statement_timestamp())
          ON CONFLICT (owner_id, idempotency_key) DO NOTHING
          RETURNING version",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID, pg_sys::TEXTOID, pg_sys::INT4OID],
};

/// Reads the existing job in a fresh statement (hence a fresh snapshot under READ COMMITTED) and
/// compares the fingerprint in SQL, with jsonb equality for params. A running job whose open
/// attempt is past its deadline is reported as unknown: the deadline rule holds swept or not.
static FIND_JOB: Statement = Statement {
    slot: 1,
    sql: "SELECT j.provider = $2,
                 j.params = $3,
                 j.contract IS NOT DISTINCT FROM $4,
                 CASE WHEN j.state = 'running' AND EXISTS (
                          SELECT 1 FROM intent.attempts a
                           WHERE a.job_id = j.id AND a.state = 'started'
                             AND a.deadline <= statement_timestamp())
                      THEN 'unknown' ELSE j.state::text END,
                 j.version,
                 j.result
            FROM intent.jobs j
           WHERE j.id = $1",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
    ],
};

struct Submitted {
    job_id: Uuid,
    created: bool,
    state: String,
    version: i64,
    result: Option<Jsonb>,
}

/// Core of `intent.submit_job`; the SQL wrapper raises the refusal, if any.
#[pg_extern(name = "_submit_job", volatile, parallel_unsafe)]
fn submit_job_core(
    owner_id: Option<&str>,
    idempotency_key: Option<&str>,
    provider: Option<&str>,
    params: Option<Jsonb>,
    contract: Option<&str>,
    max_attempts: Option<i32>,
) -> TableIterator<
    'static,
    (
        name!(err_code, Option<String>),
        name!(err_message, Option<String>),
        name!(err_detail, Option<String>),
        name!(err_hint, Option<String>),
        name!(job_id, Option<Uuid>),
        name!(created, Option<bool>),
        name!(state, Option<String>),
        name!(version, Option<i64>),
        name!(result, Option<Jsonb>),
    ),
> {
    let answer = submit(
        owner_id,
        idempotency_key,
        provider,
        params,
        contract,
        max_attempts,
    );
    let ((code, message, detail, hint), ok) = split(answer);
    TableIterator::once(match ok {
        Some(s) => (
            code,
            message,
            detail,
            hint,
            Some(s.job_id),
            Some(s.created),
            Some(s.state),
            Some(s.version),
            s.result,
        ),
        None => (code, message, detail, hint, None, None, None, None, None),
    })
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
    let job_id = Uuid::from_bytes(pg_intent_id::job_id_unchecked(owner_id, key));

    Spi::connect_mut(|client| {
        if let Some(contract) = contract {
            crate::contract::current_version(client, contract)?;
        }
        // A conflict whose row then cannot be found was deleted in between (a purge): the key is
        // free again, so insert again. Three rounds is plenty; more means something is wrong.
        for _ in 0..3 {
            let inserted = plans::run(
                client,
                &INSERT_JOB,
                &[
                    job_id.into(),
                    owner_id.into(),
                    key.into(),
                    provider.into(),
                    params.into(),
                    contract.into(),
                    max_attempts.into(),
                ],
            );
            if let Some(row) = plans::first(inserted) {
                return Ok(Submitted {
                    job_id,
                    created: true,
                    state: "pending".into(),
                    version: plans::must(&row, 1),
                    result: None,
                });
            }
            let found = plans::run(
                client,
                &FIND_JOB,
                &[
                    job_id.into(),
                    provider.into(),
                    params.into(),
                    contract.into(),
                ],
            );
            let Some(row) = plans::first(found) else {
                continue;
            };
            let mut differ = Vec::new();
            for (ordinal, field) in [(1, "provider"), (2, "params"), (3, "contract")] {
                if !plans::must::<bool>(&row, ordinal) {
                    differ.push(field);
                }
            }
            if !differ.is_empty() {
                return Err(Refusal::idempotency_conflict(format!(
                    "idempotency key \"{key}\" of owner \"{owner_id}\" was already used for a different intent"
                ))
                .detail(format!("Job {job_id} exists with a different {}.", differ.join(", ")))
                .hint("Resend exactly the original provider, params and contract to get the existing job, or use a new idempotency key for a new intent."));
            }
            return Ok(Submitted {
                job_id,
                created: false,
                state: plans::must(&row, 4),
                version: plans::must(&row, 5),
                result: plans::get(&row, 6),
            });
        }
        Err(Refusal::serialization_failure(format!(
            "job {job_id} kept disappearing while it was being submitted"
        ))
        .hint("Retry the transaction."))
    })
}
