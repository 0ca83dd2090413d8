//! The steps in the distributed mode (Citus, `intent.distribute()`, docs/scale-out.md).
//!
//! Citus runs a statement as one task on one shard only when it names the distribution column
//! (the job id) and has no data-modifying CTE across tables: so each step here is one
//! single-shard statement, routed by a job id (`$` named in each), run one after the other in
//! the call's transaction after the call has locked the job row (nothing interleaves). An
//! event's facts are read from the locked job row before the event is written (`INSERT …
//! VALUES`; Citus would run `INSERT … SELECT` through the coordinator). Owner isolation is
//! applied by the statements and checked here, on the coordinator: the policies run on the
//! workers, where the session's binding is not known. The distributed mode needs a catalog of
//! 0.4.0 or later (`intent.distribute()` came with it), so nothing here knows older ones.

use super::rules::{
    abandoned_detail, attempt_abandoned_sql, attempt_returned_sql, attempt_unknown_sql,
    caller_timeout_detail, cancel_job_sql, cancelled_detail, first_version_sql, insert_attempt_sql,
    job_pending_now_sql, job_running_sql, job_unknown_sql, lapsed_detail, lost_detail, win_sql,
};
use super::{
    Abandoned, ClaimAsk, Claimed, Comparison, Found, Intent, NewAttempt, Presented, Store, compat,
    job_facts, job_of,
};
use crate::jsonb::{CallJsonb, Jsonb};
use crate::plans::{self, Statement};
use crate::state::{lapsed_sql, open_attempt_states_sql};
use pgrx::Uuid;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::{SpiClient, SpiTupleTable};

pub struct Shards;

/// The job row locked, with the session's binding ($2, NULL when unbound): without the owner
/// in the statement a bound call would lock (and wait for) another owner's row before
/// refusing, and how long it waited would tell that the job exists.
static LOCK_JOB: Statement = Statement {
    name: "LockJobDist",
    sql: "SELECT state::text, version, provider, contract, max_attempts, attempt_count, owner_id, completed_by
            FROM intent.jobs WHERE id = $1 AND ($2::text IS NULL OR owner_id = $2::text) FOR NO KEY UPDATE",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID],
};

static INSERT_ATTEMPT: Statement = Statement {
    name: "InsertAttemptDist",
    sql: insert_attempt_sql!(),
    args: super::rules::NEW_ATTEMPT_ARGS,
};

/// The job runs (`$2` the job, `$4` the attempt's number, `$9` the instant; the others
/// unused, so that the rule's numbering is the insert's).
static JOB_RUNNING: Statement = Statement {
    name: "JobRunningDist",
    sql: job_running_sql!(),
    args: INSERT_ATTEMPT.args,
};

/// The attempt ($1, of job $2) unknown, only when lapsed if `$3`.
static ATTEMPT_UNKNOWN: Statement = Statement {
    name: "AttemptUnknownDist",
    sql: concat!(
        attempt_unknown_sql!(concat!("job_id = $2 AND (NOT $3 OR ", lapsed_sql!(), ")")),
        " RETURNING owner_id::text, deadline"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID, pg_sys::BOOLOID],
};

static JOB_UNKNOWN: Statement = Statement {
    name: "JobUnknownDist",
    sql: job_unknown_sql!("$1", "$2"),
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

/// An event's `INSERT … VALUES`, routed by its job id ($1), its detail built from the values.
macro_rules! event_statement {
    ($name:literal, $kind:literal, $detail:expr, [$($arg:expr),*]) => {
        Statement {
            name: $name,
            sql: concat!(
                "INSERT INTO intent.events (job_id, owner_id, attempt_id, kind, detail) VALUES ($1, $2, $3, '",
                $kind,
                "', ",
                $detail,
                ")"
            ),
            args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::UUIDOID, $($arg),*],
        }
    };
}

static EVENT_LAPSED: Statement = event_statement!(
    "EventLapsedDist",
    "timeout",
    lapsed_detail!("$4::timestamptz", "$5::text"),
    [pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID]
);

static EVENT_CALLER_TIMEOUT: Statement = event_statement!(
    "EventCallerTimeoutDist",
    "timeout",
    caller_timeout_detail!("$4::text", "$5::timestamptz"),
    [pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID]
);

static EVENT_ABANDONED: Statement = event_statement!(
    "EventAbandonedDist",
    "abandoned",
    abandoned_detail!("$4::text", "$5::text", "$6::boolean"),
    [pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::BOOLOID]
);

static EVENT_CANCELLED: Statement = event_statement!(
    "EventCancelledDist",
    "cancelled",
    cancelled_detail!("$4::text", "$5::text", "$6::int8", "$7::uuid"),
    [
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::UUIDOID
    ]
);

static EVENT_LOST: Statement = event_statement!(
    "EventLostDist",
    "late_result",
    lost_detail!("$4::uuid", "$5::int8", "$6::int8", "$7::text", "$8::text"),
    [
        pg_sys::UUIDOID,
        pg_sys::INT8OID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID
    ]
);

/// The attempt ($1, of job $2) abandoned.
static ATTEMPT_ABANDONED: Statement = Statement {
    name: "AttemptAbandonedDist",
    sql: concat!(
        attempt_abandoned_sql!(),
        " AND job_id = $2 RETURNING owner_id::text"
    ),
    args: &[pg_sys::UUIDOID, pg_sys::UUIDOID],
};

static JOB_PENDING_NOW: Statement = Statement {
    name: "JobPendingNowDist",
    sql: job_pending_now_sql!("$1", "$2"),
    args: &[pg_sys::UUIDOID, pg_sys::TIMESTAMPTZOID],
};

static CANCEL_JOB: Statement = Statement {
    name: "CancelJobDist",
    sql: concat!(
        cancel_job_sql!("$2"),
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

/// The compare-and-swap (the single node's numbering: `$5` unused).
static WIN: Statement = Statement {
    name: "WinDist",
    sql: win_sql!(),
    args: &[
        pg_sys::UUIDOID,
        pg_sys::UUIDOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
        pg_sys::BOOLOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// The attempt's own outcome (`$5` whether it won; `$2` its job).
static ATTEMPT_RETURNED: Statement = Statement {
    name: "AttemptReturnedDist",
    sql: concat!(attempt_returned_sql!("$5"), " AND job_id = $2"),
    args: WIN.args,
};

/// The replay lookup: the direct index fetch of the single node would read the coordinator's
/// shell of `intent.jobs`, which holds no rows, so the lookup is a statement, routed by the
/// job id to its shard.
static FIND_JOB: Statement = Statement {
    name: "FindJobDist",
    sql:
        "SELECT owner_id::text, owner_id = $2 AND idempotency_key = $3, provider = $4, params = $5,
                 contract IS NOT DISTINCT FROM $6, state::text, version, result
            FROM intent.jobs WHERE id = $1",
    args: &[
        pg_sys::UUIDOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
    ],
};

/// The first version of a new job of this id (the tombstone lives on the job's shard).
static FIRST_VERSION: Statement = Statement {
    name: "FirstVersionDist",
    sql: concat!(
        "SELECT ",
        first_version_sql!("(SELECT version FROM intent.retired_keys WHERE id = $1)")
    ),
    args: &[pg_sys::UUIDOID],
};

/// The claim's candidates, a page at a time: a read on every shard (no lock: Citus cannot lock
/// rows of many shards with SKIP LOCKED), merged on the coordinator, longest-waiting first; a
/// bound session's own jobs only. `($5, $6)`: the last candidate of the previous page (NULL for
/// the first), so that candidates another transaction holds do not end the claim.
macro_rules! claim_candidates_sql {
    ($since:literal) => {
        concat!(
            "SELECT j.id, ",
            $since,
            " FROM intent.jobs j
           WHERE j.state = 'pending' AND j.attempt_count < j.max_attempts
             AND ",
            $since,
            " <= $4
             AND ($1::text[] IS NULL OR j.provider = ANY ($1::text[]))
             AND ($3::text IS NULL OR j.owner_id = $3)
             AND ",
            $since,
            " >= $7
             AND ($5::timestamptz IS NULL OR (",
            $since,
            ", j.id) > ($5::timestamptz, $6::uuid))
           ORDER BY ",
            $since,
            ", j.id
           LIMIT $2"
        )
    };
}
pub(crate) use claim_candidates_sql;

/// [`claim_candidates_sql!`] keyed on `retry_at` (0.5.0; before, store::compat).
pub(crate) static CLAIM_CANDIDATES: Statement = Statement {
    name: "ClaimCandidatesDist",
    sql: claim_candidates_sql!("j.retry_at"),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::UUIDOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Each candidate in turn: taken as the single-node claim takes it (the same conditions, read
/// again under the lock), on its own shard, skipped if another transaction holds it.
static CLAIM_TAKE: Statement = Statement {
    name: "ClaimTakeDist",
    sql: "SELECT j.owner_id::text, j.attempt_count + 1, j.version::int8, j.provider::text, j.params, j.contract::text
            FROM intent.jobs j
           WHERE j.id = $1 AND j.state = 'pending' AND j.attempt_count < j.max_attempts
             AND coalesce(j.retry_at, j.updated_at) <= $3
             AND ($2::text[] IS NULL OR j.provider = ANY ($2::text[]))
             FOR NO KEY UPDATE OF j SKIP LOCKED",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTARRAYOID, pg_sys::TIMESTAMPTZOID],
};

/// How many candidates a page holds per job asked for: some may be taken by a concurrent
/// claimer between the read and the lock, or held by another transaction.
const CANDIDATES_PER_JOB: i32 = 2;

/// How many pages a claim reads at most: a claim's work stays bounded (at most 32 candidates
/// per job asked for) even behind a long run of jobs other transactions hold.
const MAX_CANDIDATE_PAGES: usize = 16;

/// The purge's candidates: read on every shard, merged on the coordinator, oldest first; a
/// bound session's own ($3).
static PURGE_CANDIDATES: Statement = Statement {
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

/// Each candidate on its own shard: the same conditions read again under the lock, skipped if
/// another transaction holds it.
static PURGE_LOCK: Statement = Statement {
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

static PURGE_EVENTS: Statement = Statement {
    name: "PurgeEventsDist",
    sql: "DELETE FROM intent.events WHERE job_id = $1",
    args: &[pg_sys::UUIDOID],
};

/// Its attempts go with it (ON DELETE CASCADE, on the same shard).
static PURGE_JOB: Statement = Statement {
    name: "PurgeJobDist",
    sql: "DELETE FROM intent.jobs WHERE id = $1",
    args: &[pg_sys::UUIDOID],
};

/// The key may be used again: the last version handed out under this id is remembered, so
/// that the next job of the key never reuses a fencing token (see retired_keys).
static RETIRE: Statement = Statement {
    name: "RetireDist",
    sql: "INSERT INTO intent.retired_keys (id, version, retired_at)
          VALUES ($1, $2, statement_timestamp())
          ON CONFLICT (id) DO UPDATE SET version = excluded.version, retired_at = excluded.retired_at",
    args: &[pg_sys::UUIDOID, pg_sys::INT8OID],
};

impl Shards {
    /// The attempt unknown and its job too; the owner and deadline for the event, or None
    /// when the attempt was not started (or, with `only_lapsed`, still within its lease).
    fn attempt_unknown(
        client: &mut SpiClient<'_>,
        attempt_id: Uuid,
        only_lapsed: bool,
    ) -> Option<(String, TimestampWithTimeZone)> {
        let job_id = job_of(attempt_id);
        let row = plans::first(plans::run(
            client,
            &ATTEMPT_UNKNOWN,
            &[attempt_id.into(), job_id.into(), only_lapsed.into()],
        ))?;
        let found = (plans::must(&row, 1), plans::must(&row, 2));
        plans::run(
            client,
            &JOB_UNKNOWN,
            &[job_id.into(), crate::clock::now().into()],
        );
        Some(found)
    }

    /// Takes the candidates in turn, each as the single-node claim takes it, until `claimed`
    /// holds `ask.max_jobs`; a candidate another transaction holds (or took) is skipped.
    fn take(
        &self,
        client: &mut SpiClient<'_>,
        ask: &ClaimAsk,
        candidates: &[(Uuid, TimestampWithTimeZone)],
        claimed: &mut Vec<Claimed>,
    ) {
        for &(job_id, since) in candidates {
            if claimed.len() >= ask.max_jobs as usize {
                return;
            }
            let Some(row) = plans::first(plans::run(
                client,
                &CLAIM_TAKE,
                &[
                    job_id.into(),
                    ask.providers.clone().into(),
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
            let deadline = self.start_attempt(
                client,
                &NewAttempt {
                    attempt_id,
                    job_id,
                    owner_id: &owner,
                    attempt_no,
                    provider: &provider,
                    version,
                    worker: ask.worker.as_deref(),
                    lease: ask.lease,
                },
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
                since,
            });
        }
    }
}

impl Store for Shards {
    fn lock_job<'c>(&self, client: &mut SpiClient<'c>, job_id: Uuid) -> Option<SpiTupleTable<'c>> {
        let bound = crate::owner::bound_owner();
        let row = plans::first(plans::run(
            client,
            &LOCK_JOB,
            &[job_id.into(), bound.clone().into()],
        ))?;
        let owner: String = plans::must(&row, 7);
        if bound.is_some_and(|bound| bound != owner) {
            return None;
        }
        Some(row)
    }

    fn start_attempt(
        &self,
        client: &mut SpiClient<'_>,
        new: &NewAttempt<'_>,
    ) -> TimestampWithTimeZone {
        let args = || {
            [
                new.attempt_id.into(),
                new.job_id.into(),
                new.owner_id.into(),
                new.attempt_no.into(),
                new.provider.into(),
                new.version.into(),
                new.worker.into(),
                new.lease.into(),
                crate::clock::now().into(),
            ]
        };
        let row = plans::first(plans::run(client, &INSERT_ATTEMPT, &args()))
            .expect("INSERT … RETURNING returns the row it inserted");
        let deadline = plans::must(&row, 1);
        plans::run(client, &JOB_RUNNING, &args());
        deadline
    }

    fn settle_lapsed(
        &self,
        client: &mut SpiClient<'_>,
        attempt_id: Uuid,
        noticed_by: &str,
    ) -> bool {
        let Some((owner, deadline)) = Self::attempt_unknown(client, attempt_id, true) else {
            return false;
        };
        plans::run(
            client,
            &EVENT_LAPSED,
            &[
                job_of(attempt_id).into(),
                owner.as_str().into(),
                attempt_id.into(),
                deadline.into(),
                noticed_by.into(),
            ],
        );
        true
    }

    fn mark_unknown(&self, client: &mut SpiClient<'_>, attempt_id: Uuid, reason: Option<&str>) {
        let Some((owner, deadline)) = Self::attempt_unknown(client, attempt_id, false) else {
            return;
        };
        plans::run(
            client,
            &EVENT_CALLER_TIMEOUT,
            &[
                job_of(attempt_id).into(),
                owner.as_str().into(),
                attempt_id.into(),
                reason.into(),
                deadline.into(),
            ],
        );
    }

    fn abandon(&self, client: &mut SpiClient<'_>, a: &Abandoned<'_>) {
        let job_id = job_of(a.attempt_id);
        let Some(row) = plans::first(plans::run(
            client,
            &ATTEMPT_ABANDONED,
            &[a.attempt_id.into(), job_id.into()],
        )) else {
            return;
        };
        let owner: String = plans::must(&row, 1);
        plans::run(
            client,
            &JOB_PENDING_NOW,
            &[job_id.into(), crate::clock::now().into()],
        );
        plans::run(
            client,
            &EVENT_ABANDONED,
            &[
                job_id.into(),
                owner.as_str().into(),
                a.attempt_id.into(),
                a.reason.into(),
                a.previous_state.into(),
                a.lease_expired.into(),
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
        let Some(row) = plans::first(plans::run(
            client,
            &CANCEL_JOB,
            &[job_id.into(), crate::clock::now().into()],
        )) else {
            return false;
        };
        let owner: String = plans::must(&row, 1);
        let version: i64 = plans::must(&row, 2);
        let open: Option<Uuid> =
            plans::first(plans::run(client, &OPEN_ATTEMPT_ID, &[job_id.into()]))
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

    fn complete(&self, client: &mut SpiClient<'_>, p: &Presented<'_>) -> bool {
        let args = |won: bool| {
            [
                p.attempt_id.into(),
                p.job_id.into(),
                p.result.into(),
                p.version.into(),
                won.into(),
                crate::clock::now().into(),
            ]
        };
        let won = plans::first(plans::run(client, &WIN, &args(false))).is_some();
        plans::run(client, &ATTEMPT_RETURNED, &args(won));
        if !won {
            let (owner, state, current, winner) = job_facts(client, p.job_id);
            plans::run(
                client,
                &EVENT_LOST,
                &[
                    p.job_id.into(),
                    owner.as_str().into(),
                    p.attempt_id.into(),
                    winner.into(),
                    p.version.into(),
                    current.into(),
                    state.as_str().into(),
                    p.attempt_state.into(),
                ],
            );
        }
        won
    }

    fn find_job(&self, client: &mut SpiClient<'_>, intent: &Intent<'_>) -> Option<Found> {
        let row = plans::first(plans::run(
            client,
            &FIND_JOB,
            &[
                intent.job_id.into(),
                intent.owner_id.into(),
                intent.key.into(),
                intent.provider.into(),
                intent.params.into(),
                intent.contract.into(),
            ],
        ))?;
        let owner: String = plans::must(&row, 1);
        if crate::owner::bound_owner().is_some_and(|bound| bound != owner) {
            return None;
        }
        Some(Found {
            comparison: Comparison {
                same_key: plans::must(&row, 2),
                same_provider: plans::must(&row, 3),
                same_params: plans::must(&row, 4),
                same_contract: plans::must(&row, 5),
            },
            state: crate::state::read(&row, 6),
            version: plans::must(&row, 7),
            result: row
                .get::<CallJsonb>(8)
                .unwrap_or_else(|e| panic!("pg_intent: cannot read column 8: {e}"))
                .map(|j| j.0),
        })
    }

    fn first_version(&self, client: &mut SpiClient<'_>, job_id: Uuid) -> i64 {
        let row = plans::first(plans::run(client, &FIRST_VERSION, &[job_id.into()]))
            .expect("SELECT returns a row");
        plans::must(&row, 1)
    }

    fn claim(&self, client: &mut SpiClient<'_>, ask: &ClaimAsk) -> Vec<Claimed> {
        let bound = crate::owner::bound_owner();
        let page = ask.max_jobs.saturating_mul(CANDIDATES_PER_JOB);
        let mut claimed = Vec::new();
        let mut after: Option<(TimestampWithTimeZone, Uuid)> = None;
        for _ in 0..MAX_CANDIDATE_PAGES {
            let candidates: Vec<(Uuid, TimestampWithTimeZone)> = plans::run(
                client,
                compat::claim_candidates(&CLAIM_CANDIDATES),
                &[
                    ask.providers.clone().into(),
                    page.into(),
                    bound.as_deref().into(),
                    crate::clock::now().into(),
                    after.map(|(since, _)| since).into(),
                    after.map(|(_, id)| id).into(),
                    ask.start
                        .unwrap_or_else(TimestampWithTimeZone::negative_infinity)
                        .into(),
                ],
            )
            .map(|row| {
                let id = row.get::<Uuid>(1).ok().flatten().expect("ids are NOT NULL");
                let since = row
                    .get::<TimestampWithTimeZone>(2)
                    .ok()
                    .flatten()
                    .expect("a claimable job's time is NOT NULL");
                (id, since)
            })
            .collect();
            let last_page = candidates.len() < page as usize;
            after = candidates.last().map(|&(id, since)| (since, id));
            self.take(client, ask, &candidates, &mut claimed);
            if last_page || claimed.len() >= ask.max_jobs as usize {
                break;
            }
        }
        claimed
    }

    fn purge(&self, client: &mut SpiClient<'_>, retention: Interval, batch_size: i32) -> i64 {
        let owner = crate::owner::bound_owner();
        let candidates: Vec<Uuid> = plans::run(
            client,
            &PURGE_CANDIDATES,
            &[retention.into(), batch_size.into(), owner.as_deref().into()],
        )
        .map(|row| row.get::<Uuid>(1).ok().flatten().expect("ids are NOT NULL"))
        .collect();
        let mut purged = 0;
        for id in candidates {
            let Some(row) = plans::first(plans::run(
                client,
                &PURGE_LOCK,
                &[id.into(), retention.into(), owner.as_deref().into()],
            )) else {
                continue;
            };
            let version: i64 = plans::must(&row, 1);
            plans::run(client, &PURGE_EVENTS, &[id.into()]);
            plans::run(client, &PURGE_JOB, &[id.into()]);
            plans::run(client, &RETIRE, &[id.into(), version.into()]);
            purged += 1;
        }
        purged
    }
}
