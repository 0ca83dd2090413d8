//! `submit_jobs`: many intents in one call, with the answers and errors `submit_job` would give
//! each of them, in their order.
//!
//! It is set-based rather than a loop of `submit_job`s: one lookup for every key, one insert for
//! the new ones. An intent whose key appears again later in the same batch is answered like a
//! second `submit_job` after the first: a replay if the fingerprint is equal, `IJ001` if not.
//! A refusal of one intent is a row (`sqlstate`, `message`, `detail`), not an error, so the
//! others still go through; only bad arrays refuse the whole call.

use crate::entry::{arg, enum_value, one_row_each};
use crate::input;
use crate::jsonb::{CallJsonb, Jsonb};
use crate::plans::{self, Statement};
use crate::refusal::{self, Answer, Refusal};
use crate::state::{JobState, lapsed_sql};
use crate::store::Comparison;
use crate::store::rules::first_version_sql;
use crate::submit::verdict;
use pg_intent_protocol::limits::{MAX_BATCH, MAX_BATCH_PARAMS_BYTES, MAX_BATCH_RESULT_BYTES};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::{IntoDatum, Uuid};
use std::collections::{HashMap, HashSet};

// The batch limits (MAX_BATCH, MAX_BATCH_PARAMS_BYTES, MAX_BATCH_RESULT_BYTES) are shared
// with every layer. Results are held in the call's memory and in the rows it returns, so a
// batch of replays of 16 MiB results must not exhaust the server's memory or disk; params are
// passed to the database again by every round.

/// How many rounds of lookup-then-insert a batch makes. Round 1 answers replays and inserts the
/// first occurrence of each new key; round 2 answers the repeated keys of the batch and the keys
/// a concurrent caller inserted first; each further round is another concurrent purge of a key
/// (as [`crate::submit`]'s rounds). Past these, an intent is told to retry (`40001`).
const BATCH_ROUNDS: usize = 4;

/// The results a batch has copied so far (one copy per job), and the bytes its rows return.
#[derive(Default)]
struct Results {
    by_job: HashMap<Uuid, Jsonb>,
    bytes: usize,
}

/// The existing jobs of a set of keys, with each intent's fingerprint compared in SQL.
static FIND_JOBS: Statement = Statement {
    name: "FindJobs",
    sql: concat!(
        "SELECT u.i::int4,
                 j.owner_id = u.o AND j.idempotency_key = u.k,
                 j.provider = u.p,
                 j.params = u.pa,
                 j.contract IS NOT DISTINCT FROM u.c,
                 j.state::text,
                 j.version,
                 j.result,
                 j.state = 'running' AND EXISTS (
                     SELECT 1 FROM intent.attempts a WHERE a.job_id = j.id AND ",
        lapsed_sql!("a"),
        ")
            FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::int8[])
                 AS u(id, o, k, p, pa, c, i)
            JOIN intent.jobs j ON j.id = u.id
           ORDER BY u.i"
    ),
    args: &[
        pg_sys::UUIDARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::JSONBARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT8ARRAYOID,
    ],
};

/// Inserts the new keys; like submit_job's insert, ON CONFLICT DO NOTHING waits for a
/// concurrent inserter of the same key, and every unique index is an arbiter. The rows go in
/// in id order, whatever the order of the arrays: two batches that share keys then meet them in
/// the same order, so one waits for the other instead of each waiting for the other (40P01).
pub(crate) static INSERT_JOBS: Statement = Statement {
    name: "InsertJobs",
    sql: concat!(
        "INSERT INTO intent.jobs (id, owner_id, idempotency_key, provider, params, contract, max_attempts,
                                   version, created_at, updated_at, retry_at)
          SELECT u.id, o, k, p, pa, c, m, ",
        first_version_sql!("r.version"),
        ", $8, $8, $8
            FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::int4[])
                 AS u(id, o, k, p, pa, c, m)
            LEFT JOIN intent.retired_keys r ON r.id = u.id
           ORDER BY u.id
          ON CONFLICT DO NOTHING
          RETURNING id, version"
    ),
    args: &[
        pg_sys::UUIDARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::JSONBARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4ARRAYOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The defined contracts among the names a batch uses.
static DEFINED_CONTRACTS: Statement = Statement {
    name: "DefinedContracts",
    sql: "SELECT name::text FROM intent.contracts WHERE name = ANY ($1::text[])",
    args: &[pg_sys::TEXTARRAYOID],
};

/// One intent of the batch, once its input passed the checks.
struct Item {
    ord: usize,
    job_id: Uuid,
    owner_id: String,
    key: String,
    provider: String,
    params: Jsonb,
    contract: Option<String>,
    max_attempts: i32,
}

/// One intent's answer.
struct Outcome {
    job_id: Option<Uuid>,
    created: bool,
    state: JobState,
    version: i64,
    result: Option<Jsonb>,
}

crate::entry::sql_function!(submit_jobs, submit_jobs);

/// `intent.submit_jobs(owner_ids, idempotency_keys, providers, params, contracts, max_attempts)`.
fn submit_jobs(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let owners: Vec<Option<String>> = input::required("owner_ids", arg(fcinfo, 0))?;
    let keys: Vec<Option<String>> = input::required("idempotency_keys", arg(fcinfo, 1))?;
    let providers: Vec<Option<String>> = input::required("providers", arg(fcinfo, 2))?;
    let params: Vec<Option<Jsonb>> = input::required("params", arg(fcinfo, 3))?;
    let contracts: Option<Vec<Option<String>>> = arg(fcinfo, 4);
    let max_attempts: Option<Vec<Option<i32>>> = arg(fcinfo, 5);
    let n = owners.len();
    let lengths_agree = [keys.len(), providers.len(), params.len()]
        .into_iter()
        .chain(contracts.as_ref().map(Vec::len))
        .chain(max_attempts.as_ref().map(Vec::len))
        .all(|len| len == n);
    if !lengths_agree {
        return Err(Refusal::bad_input("the arrays of submit_jobs must have the same length")
            .detail(format!(
                "owner_ids has {n} elements, idempotency_keys {}, providers {}, params {}{}{}.",
                keys.len(),
                providers.len(),
                params.len(),
                contracts.as_ref().map(|c| format!(", contracts {}", c.len())).unwrap_or_default(),
                max_attempts.as_ref().map(|m| format!(", max_attempts {}", m.len())).unwrap_or_default(),
            ))
            .hint("Pass one element per intent in every array (NULL contracts or max_attempts arrays mean the defaults)."));
    }
    if n > MAX_BATCH {
        return Err(
            Refusal::bad_input(format!("submit_jobs takes at most {MAX_BATCH} intents"))
                .detail(format!("The call has {n}."))
                .hint("Split the batch."),
        );
    }
    let params_bytes: usize = params.iter().flatten().map(|p| p.raw_size()).sum();
    if params_bytes > MAX_BATCH_PARAMS_BYTES {
        return Err(Refusal::program_limit(format!(
            "the params of one submit_jobs call may take at most {} MiB",
            MAX_BATCH_PARAMS_BYTES >> 20
        ))
        .detail(format!("The call's params take {params_bytes} bytes."))
        .hint("Split the batch."));
    }

    // Per intent: its answer, or a refusal, exactly as submit_job would check its input.
    let mut answers: Vec<Option<Answer<Outcome>>> = (0..n).map(|_| None).collect();
    let mut items = Vec::with_capacity(n);
    for ord in 0..n {
        let contract = contracts.as_ref().and_then(|c| c[ord].as_deref());
        let max = match &max_attempts {
            None => Some(i32::from(pg_intent_protocol::limits::DEFAULT_MAX_ATTEMPTS)),
            Some(m) => m[ord],
        };
        let checked = (|| {
            let owner_id = input::name("owner_id", owners[ord].as_deref())?;
            let key = input::name("idempotency_key", keys[ord].as_deref())?;
            let provider = input::name("provider", providers[ord].as_deref())?;
            let params = input::document("params", params[ord])?;
            let contract = input::optional_name("contract", contract)?;
            let max_attempts = input::max_attempts(max)?;
            crate::owner::check_acting_for(owner_id)?;
            Ok(Item {
                ord,
                job_id: Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(owner_id, key)),
                owner_id: owner_id.to_string(),
                key: key.to_string(),
                provider: provider.to_string(),
                params,
                contract: contract.map(str::to_string),
                max_attempts,
            })
        })();
        match checked {
            Ok(item) => items.push(item),
            Err(refusal) => answers[ord] = Some(Err(refusal)),
        }
    }

    Spi::connect_mut(|client| {
        refuse_undefined_contracts(client, &mut items, &mut answers);
        let mut pending = items;
        let mut results = Results::default();
        for _ in 0..BATCH_ROUNDS {
            if pending.is_empty() {
                break;
            }
            find(client, &pending, &mut answers, &mut results);
            pending.retain(|item| answers[item.ord].is_none());
            if pending.is_empty() {
                break;
            }
            insert(client, &pending, &mut answers);
            pending.retain(|item| answers[item.ord].is_none());
        }
        for item in pending {
            answers[item.ord] = Some(Err(refusal::kept_disappearing(item.job_id)));
        }
    });

    Ok(one_row_each(fcinfo, n, |ord, types| {
        let ordinality = Some(pg_sys::Datum::from(ord as i32 + 1));
        match answers[ord].take().expect("every intent has an answer") {
            Ok(o) => vec![
                ordinality,
                o.job_id.and_then(IntoDatum::into_datum),
                o.created.into_datum(),
                Some(enum_value(types[3], o.state.as_str())),
                o.version.into_datum(),
                o.result.and_then(IntoDatum::into_datum),
                None,
                None,
                None,
            ],
            Err(r) => vec![
                ordinality,
                None,
                None,
                None,
                None,
                None,
                r.code.code().into_datum(),
                r.message.as_str().into_datum(),
                r.full_detail().into_datum(),
            ],
        }
    }))
}

/// 22023 for each intent that names a contract that is not defined, as submit_job would.
fn refuse_undefined_contracts(
    client: &mut SpiClient<'_>,
    items: &mut Vec<Item>,
    answers: &mut [Option<Answer<Outcome>>],
) {
    let mut names: Vec<String> = items.iter().filter_map(|i| i.contract.clone()).collect();
    if names.is_empty() {
        return;
    }
    names.sort();
    names.dedup();
    let defined: Vec<String> = plans::run(client, &DEFINED_CONTRACTS, &[names.into()])
        .map(|row| {
            row.get::<String>(1)
                .ok()
                .flatten()
                .expect("name is NOT NULL")
        })
        .collect();
    items.retain(|item| match &item.contract {
        Some(c) if !defined.contains(c) => {
            answers[item.ord] = Some(Err(crate::contract::undefined(c)));
            false
        }
        _ => true,
    });
}

/// Answers every pending intent whose key has a job: a replay, or IJ001.
fn find(
    client: &mut SpiClient<'_>,
    pending: &[Item],
    answers: &mut [Option<Answer<Outcome>>],
    results: &mut Results,
) {
    let last = pending
        .iter()
        .map(|i| i.ord as i64)
        .collect::<Vec<_>>()
        .into();
    let rows = plans::run(client, &FIND_JOBS, &columns(pending.iter(), last));
    let by_ord: HashMap<usize, &Item> = pending.iter().map(|i| (i.ord, i)).collect();
    for row in rows {
        let get_bool = |n| {
            row.get::<bool>(n)
                .ok()
                .flatten()
                .expect("comparisons of NOT NULL columns")
        };
        let ord = row.get::<i32>(1).ok().flatten().expect("ordinality") as usize;
        let item = by_ord[&ord];
        let comparison = Comparison {
            same_key: get_bool(2),
            same_provider: get_bool(3),
            same_params: get_bool(4),
            same_contract: get_bool(5),
        };
        let state: JobState = row
            .get::<String>(6)
            .ok()
            .flatten()
            .and_then(|label| label.parse().ok())
            .expect("state is a job_state label");
        let state = match verdict(
            item.job_id,
            &item.owner_id,
            &item.key,
            &comparison,
            state,
            || get_bool(9),
        ) {
            Ok(state) => state,
            Err(refusal) => {
                answers[ord] = Some(Err(refusal));
                continue;
            }
        };
        // Copied into the call's memory (SPI's is gone when the rows are returned), once per
        // job; every row that returns it counts against the batch's budget.
        let result = match results.by_job.get(&item.job_id) {
            Some(copy) => Some(*copy),
            None => row
                .get::<CallJsonb>(8)
                .ok()
                .flatten()
                .map(|CallJsonb(copy)| {
                    results.by_job.insert(item.job_id, copy);
                    copy
                }),
        };
        if let Some(result) = result {
            let size = result.raw_size();
            if results.bytes + size > MAX_BATCH_RESULT_BYTES {
                answers[ord] = Some(Err(Refusal::program_limit(format!(
                    "the results of this batch exceed {} MiB",
                    MAX_BATCH_RESULT_BYTES >> 20
                ))
                .detail(format!(
                    "Job {} has a result of {size} bytes, and the batch's rows before it return {} bytes.",
                    item.job_id, results.bytes
                ))
                .hint("Submit the intents that got this answer again, in smaller batches or with intent.submit_job().")));
                continue;
            }
            results.bytes += size;
        }
        answers[ord] = Some(Ok(Outcome {
            job_id: Some(item.job_id),
            created: false,
            state,
            version: row.get(7).ok().flatten().expect("version is NOT NULL"),
            result,
        }));
    }
}

/// Inserts the first pending occurrence of each key; answers those it created.
fn insert(client: &mut SpiClient<'_>, pending: &[Item], answers: &mut [Option<Answer<Outcome>>]) {
    let mut seen = HashSet::with_capacity(pending.len());
    let first: Vec<&Item> = pending.iter().filter(|i| seen.insert(i.job_id)).collect();
    let by_id: HashMap<Uuid, (usize, usize)> = first
        .iter()
        .enumerate()
        .map(|(n, i)| (i.job_id, (i.ord, n)))
        .collect();
    let last = first
        .iter()
        .map(|i| i.max_attempts)
        .collect::<Vec<_>>()
        .into();
    let [ids, owners, keys, providers, params, contracts, last] =
        columns(first.iter().copied(), last);
    let rows = plans::run(
        client,
        crate::store::compat::insert_jobs(&INSERT_JOBS),
        &[
            ids,
            owners,
            keys,
            providers,
            params,
            contracts,
            last,
            crate::clock::now().into(),
        ],
    );
    for row in rows {
        let id: Uuid = row.get(1).ok().flatten().expect("id is NOT NULL");
        let version: i64 = row.get(2).ok().flatten().expect("version is NOT NULL");
        crate::claim::notify_claimable(&first[by_id[&id].1].provider);
        answers[by_id[&id].0] = Some(Ok(Outcome {
            job_id: Some(id),
            created: true,
            state: JobState::Pending,
            version,
            result: None,
        }));
    }
}

/// The intents' columns as the arrays FIND_JOBS and INSERT_JOBS unnest: id, owner, key,
/// provider, params, contract, then `last` (the ordinalities, or the max_attempts).
fn columns<'a>(
    items: impl Iterator<Item = &'a Item> + Clone,
    last: DatumWithOid<'static>,
) -> [DatumWithOid<'a>; 7] {
    [
        items.clone().map(|i| i.job_id).collect::<Vec<_>>().into(),
        items
            .clone()
            .map(|i| i.owner_id.as_str())
            .collect::<Vec<_>>()
            .into(),
        items
            .clone()
            .map(|i| i.key.as_str())
            .collect::<Vec<_>>()
            .into(),
        items
            .clone()
            .map(|i| i.provider.as_str())
            .collect::<Vec<_>>()
            .into(),
        items.clone().map(|i| i.params).collect::<Vec<_>>().into(),
        items
            .map(|i| i.contract.as_deref())
            .collect::<Vec<_>>()
            .into(),
        last,
    ]
}
