//! Test support for pg_intent's integration tests: the cluster harness (the crate
//! pg_intent_cluster, re-exported here: throwaway PostgreSQL clusters, fresh databases with the
//! extension, real tokio-postgres connections) and typed wrappers around the SQL API so that the
//! tests read like docs/reference.md.

pub mod dump;
pub mod fixtures;
pub mod model;
pub mod reliability;
pub mod roles;

pub use pg_intent_cluster::{
    Cluster, Db, FAST, StopMode, Target, citus, cron, eventually, major_of, pg_bin,
    postgres_command, running_as_root, target,
};
pub use serde_json::{self, Value, json};
pub use tokio_postgres::{self, Client};
pub use uuid::Uuid;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;

/// Runs `call(i, client)` on every client at the same instant: one task per connection, all
/// released together by a barrier once every task is ready. Returns the answers in client order.
pub async fn stampede<T, F, Fut>(clients: &[Arc<Client>], call: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, Arc<Client>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let handles: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let barrier = barrier.clone();
            let work = call(i, client.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(handles.len());
    for handle in handles {
        answers.push(handle.await.expect("a stampede task panicked"));
    }
    answers
}

// --- errors ----------------------------------------------------------------------------------

/// What a client sees of a server error: the SQLSTATE and the fields clients match on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// The SQLSTATE exactly as it arrived (`DbError::code().code()`).
    pub code: String,
    pub severity: String,
    pub message: String,
    /// The DETAIL's sentence (its facts line, if any, is in `facts`).
    pub detail: Option<String>,
    /// The facts line of the DETAIL, parsed (`pg_intent_protocol::facts`).
    pub facts: Option<pg_intent_protocol::Facts>,
    pub hint: Option<String>,
}

impl SqlError {
    /// The server error inside a tokio-postgres error; panics if it is not one (a broken
    /// connection, a type mismatch on our side …): tests must see the server's answer.
    #[track_caller]
    pub fn from_error(e: &tokio_postgres::Error) -> SqlError {
        let db = e
            .as_db_error()
            .unwrap_or_else(|| panic!("expected a server error, got: {e:?}"));
        SqlError {
            code: db.code().code().to_string(),
            severity: db.severity().to_string(),
            message: db.message().to_string(),
            detail: db
                .detail()
                .map(|d| pg_intent_protocol::Facts::prose(d).to_string()),
            facts: db.detail().and_then(pg_intent_protocol::Facts::from_detail),
            hint: db.hint().map(str::to_string),
        }
    }

    /// The SQLSTATE of a tokio-postgres error, if it came from the server.
    pub fn code_of(e: &tokio_postgres::Error) -> Option<String> {
        e.as_db_error().map(|d| d.code().code().to_string())
    }

    /// The DETAIL, which must be present.
    #[track_caller]
    pub fn detail(&self) -> &str {
        self.detail
            .as_deref()
            .unwrap_or_else(|| panic!("{} without a DETAIL: {self:?}", self.code))
    }

    /// The HINT, which must be present.
    #[track_caller]
    pub fn hint(&self) -> &str {
        self.hint
            .as_deref()
            .unwrap_or_else(|| panic!("{} without a HINT: {self:?}", self.code))
    }
}

/// Runs a statement that must fail, and returns the server's error.
pub async fn expect_error(client: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> SqlError {
    match client.query(sql, params).await {
        Ok(rows) => panic!("expected an error from {sql}, got {} row(s)", rows.len()),
        Err(e) => SqlError::from_error(&e),
    }
}

/// Unwraps a refusal that must have the given SQLSTATE.
#[track_caller]
pub fn refusal<T: fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    expected_code: &str,
) -> SqlError {
    match result {
        Ok(v) => panic!("expected SQLSTATE {expected_code}, got success: {v:?}"),
        Err(e) => {
            let err = SqlError::from_error(&e);
            assert_eq!(err.code, expected_code, "unexpected error: {err:?}");
            err
        }
    }
}

// --- the SQL API, typed --------------------------------------------------------------------

/// Answer of `intent.submit_job`.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub job_id: Uuid,
    pub created: bool,
    pub state: String,
    pub version: i64,
    pub result: Option<Value>,
}

/// Answer of `intent.begin_attempt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begun {
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    pub version: i64,
}

/// The jobs one `intent.claim_attempts` of `provider` (worker "w", a minute's lease) began, at
/// most `max_jobs`, in the order it answered them.
pub async fn claim_jobs(c: &Client, provider: &str, max_jobs: i32) -> Vec<Uuid> {
    c.query(
        "SELECT job_id FROM intent.claim_attempts(ARRAY[$1], 'w', '1 minute', $2)",
        &[&provider, &max_jobs],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `intent.submit_job(owner, key, provider, params)` with the defaults.
pub async fn submit(
    c: &Client,
    owner: &str,
    key: &str,
    provider: &str,
    params: &Value,
) -> Result<Submitted, tokio_postgres::Error> {
    submit_full(c, owner, key, provider, params, None, 3).await
}

/// `intent.submit_job` with every argument.
pub async fn submit_full(
    c: &Client,
    owner: &str,
    key: &str,
    provider: &str,
    params: &Value,
    contract: Option<&str>,
    max_attempts: i32,
) -> Result<Submitted, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT job_id, created, state::text, version, result
               FROM intent.submit_job($1, $2, $3, $4, $5, $6)",
            &[&owner, &key, &provider, params, &contract, &max_attempts],
        )
        .await?;
    Ok(Submitted {
        job_id: row.get(0),
        created: row.get(1),
        state: row.get(2),
        version: row.get(3),
        result: row.get(4),
    })
}

/// `intent.begin_attempt(job, provider, lease)`; `lease` is an interval literal ('30 seconds').
pub async fn begin(
    c: &Client,
    job_id: Uuid,
    provider: Option<&str>,
    lease: &str,
) -> Result<Begun, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT attempt_id, attempt_no, version
               FROM intent.begin_attempt($1, $2, $3::text::interval)",
            &[&job_id, &provider, &lease],
        )
        .await?;
    Ok(Begun {
        attempt_id: row.get(0),
        attempt_no: row.get(1),
        version: row.get(2),
    })
}

/// `intent.complete_attempt`: `won`, `lost` or `rejected`.
pub async fn complete(
    c: &Client,
    attempt_id: Uuid,
    version: i64,
    result: &Value,
) -> Result<String, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.complete_attempt($1, $2, $3)::text",
            &[&attempt_id, &version, result],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.fail_attempt`: the job's state afterwards.
pub async fn fail(
    c: &Client,
    attempt_id: Uuid,
    version: i64,
    error: &Value,
    retryable: bool,
) -> Result<String, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.fail_attempt($1, $2, $3, $4)::text",
            &[&attempt_id, &version, error, &retryable],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.mark_unknown`.
pub async fn mark_unknown(
    c: &Client,
    attempt_id: Uuid,
    reason: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    c.query_one(
        "SELECT intent.mark_unknown($1, $2)::text",
        &[&attempt_id, &reason],
    )
    .await?;
    Ok(())
}

/// `intent.heartbeat`; `extend` is an interval literal.
pub async fn heartbeat(
    c: &Client,
    attempt_id: Uuid,
    extend: Option<&str>,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.heartbeat($1, $2::text::interval)",
            &[&attempt_id, &extend],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.abandon_attempt`.
pub async fn abandon(
    c: &Client,
    attempt_id: Uuid,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    c.query_one(
        "SELECT intent.abandon_attempt($1, $2)::text",
        &[&attempt_id, &reason],
    )
    .await?;
    Ok(())
}

/// `intent.cancel_job`.
pub async fn cancel(
    c: &Client,
    job_id: Uuid,
    reason: Option<&str>,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one("SELECT intent.cancel_job($1, $2)", &[&job_id, &reason])
        .await?;
    Ok(row.get(0))
}

/// `intent.sweep()`.
pub async fn sweep(c: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = c.query_one("SELECT intent.sweep()", &[]).await?;
    Ok(row.get(0))
}

/// The job id docs/reference.md § 1.4 derives, computed client side (no database involved).
pub fn job_id_of(owner: &str, key: &str) -> Uuid {
    Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(owner, key))
}

/// The id of attempt `n` of a job, computed client side.
pub fn attempt_id_of(job_id: Uuid, n: i64) -> Uuid {
    Uuid::from_bytes(
        pg_intent_protocol::attempt_id(*job_id.as_bytes(), n).expect("valid attempt_no"),
    )
}

// --- reading the tables ----------------------------------------------------------------------

/// One row of `intent.jobs`, as the tests look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: Uuid,
    pub state: String,
    pub version: i64,
    pub completed_by: Option<Uuid>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub attempt_count: i32,
    pub provider: String,
    pub params: Value,
    pub contract: Option<String>,
}

/// The job row (panics when there is none).
pub async fn job_row(c: &Client, job_id: Uuid) -> JobRow {
    let row = c
        .query_one(
            "SELECT id, state::text, version, completed_by, result, error, attempt_count,
                    provider, params, contract
               FROM intent.jobs WHERE id = $1",
            &[&job_id],
        )
        .await
        .unwrap_or_else(|e| panic!("read job {job_id}: {e}"));
    JobRow {
        id: row.get(0),
        state: row.get(1),
        version: row.get(2),
        completed_by: row.get(3),
        result: row.get(4),
        error: row.get(5),
        attempt_count: row.get(6),
        provider: row.get(7),
        params: row.get(8),
        contract: row.get(9),
    }
}

/// The job row exactly as stored: its full text form plus its physical identity (`ctid`,
/// `xmin`), so that a comparison proves the row was not even rewritten with equal values.
pub async fn job_row_raw(c: &Client, job_id: Uuid) -> String {
    c.query_one(
        "SELECT j.ctid::text || ' xmin=' || j.xmin::text || ' ' || j::text
           FROM intent.jobs j WHERE id = $1",
        &[&job_id],
    )
    .await
    .unwrap_or_else(|e| panic!("read job {job_id}: {e}"))
    .get(0)
}

/// One row of `intent.attempts`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    pub id: Uuid,
    pub attempt_no: i32,
    pub provider: String,
    pub state: String,
    pub version_read: i64,
    pub finished: bool,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

/// The attempts of a job, by number.
pub async fn attempt_rows(c: &Client, job_id: Uuid) -> Vec<AttemptRow> {
    c.query(
        "SELECT id, attempt_no, provider, state::text, version_read, finished_at IS NOT NULL,
                result, error
           FROM intent.attempts WHERE job_id = $1 ORDER BY attempt_no",
        &[&job_id],
    )
    .await
    .expect("read attempts")
    .iter()
    .map(|r| AttemptRow {
        id: r.get(0),
        attempt_no: r.get(1),
        provider: r.get(2),
        state: r.get(3),
        version_read: r.get(4),
        finished: r.get(5),
        result: r.get(6),
        error: r.get(7),
    })
    .collect()
}

/// One attempt row (panics when there is none).
pub async fn attempt_row(c: &Client, attempt_id: Uuid) -> AttemptRow {
    let job =
        Uuid::from_bytes(pg_intent_protocol::job_of(*attempt_id.as_bytes()).expect("attempt id"));
    attempt_rows(c, job)
        .await
        .into_iter()
        .find(|a| a.id == attempt_id)
        .unwrap_or_else(|| panic!("no attempt {attempt_id}"))
}

/// One row of `intent.events`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub kind: String,
    pub attempt_id: Option<Uuid>,
    pub detail: Value,
}

/// The events of a job, in order.
pub async fn event_rows(c: &Client, job_id: Uuid) -> Vec<EventRow> {
    c.query(
        "SELECT kind, attempt_id, detail FROM intent.events WHERE job_id = $1 ORDER BY id",
        &[&job_id],
    )
    .await
    .expect("read events")
    .iter()
    .map(|r| EventRow {
        kind: r.get(0),
        attempt_id: r.get(1),
        detail: r.get(2),
    })
    .collect()
}

/// Everything the extension stores, summarised: row counts and a digest of every row (with
/// its physical identity) of `intent.jobs`, `intent.attempts` and `intent.events`. Equal
/// digests before and after a call prove that the call wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub jobs: i64,
    pub attempts: i64,
    pub events: i64,
    pub md5: String,
}

/// The [`Digest`] of the database `c` is connected to.
pub async fn digest(c: &Client) -> Digest {
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM intent.jobs),
                    (SELECT count(*) FROM intent.attempts),
                    (SELECT count(*) FROM intent.events),
                    md5(coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.jobs t), '')
                     || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.attempts t), '')
                     || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.events t), ''))",
            &[],
        )
        .await
        .expect("digest");
    Digest {
        jobs: row.get(0),
        attempts: row.get(1),
        events: row.get(2),
        md5: row.get(3),
    }
}

/// The backend process id of a connection.
pub async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid()")
        .get(0)
}

/// Waits until `n` sessions named `application_name` are waiting for a lock (proof that
/// concurrent calls really are queued behind one another), or panics after `timeout`. On a
/// Citus coordinator (the `citus` target) a session's statement waits on a worker, for a lock
/// there: such a session counts when Citus's `citus_lock_waits` (the wait graph of every node)
/// names it as waiting.
pub async fn wait_for_lock_waiters(
    observer: &Client,
    application_name: &str,
    n: i64,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let on_citus: bool = observer
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await
        .expect("read pg_extension")
        .get(0);
    let sql = if on_citus {
        "SELECT count(*) FROM citus_stat_activity
          WHERE application_name = $1
            AND (wait_event_type = 'Lock'
                 OR global_pid IN (SELECT waiting_gpid FROM citus_lock_waits))"
    } else {
        "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = $1 AND wait_event_type = 'Lock'"
    };
    loop {
        let waiting: i64 = observer
            .query_one(sql, &[&application_name])
            .await
            .expect("read pg_stat_activity")
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {waiting} of {n} sessions '{application_name}' are waiting for a lock after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Simulated time: moves the deadline of attempt `attempt_id` to just after its start, so its
/// lease has run out (exactly what the server would see once the lease had passed); the number
/// of rows changed. In two statements, the new deadline computed here: Citus (the `citus`
/// target) refuses an UPDATE of a distributed table whose SET applies a STABLE function
/// (`timestamptz + interval`) to a column.
pub async fn lapse_lease(c: &Client, attempt_id: Uuid) -> Result<u64, tokio_postgres::Error> {
    let Some(row) = c
        .query_opt(
            "SELECT job_id, started_at FROM intent.attempts WHERE id = $1",
            &[&attempt_id],
        )
        .await?
    else {
        return Ok(0);
    };
    let (job_id, started): (Uuid, std::time::SystemTime) = (row.get(0), row.get(1));
    c.execute(
        "UPDATE intent.attempts SET deadline = $3 WHERE job_id = $1 AND id = $2",
        &[&job_id, &attempt_id, &(started + Duration::from_micros(1))],
    )
    .await
}

/// Simulated time: makes job `job_id` `days` days older (its `created_at` and `updated_at`), for
/// retention. The new times are computed here, as in [`lapse_lease`] (Citus, the `citus` target,
/// refuses `timestamptz - interval` on a column in an UPDATE's SET).
pub async fn age_job(c: &Client, job_id: Uuid, days: u64) -> Result<u64, tokio_postgres::Error> {
    let Some(row) = c
        .query_opt(
            "SELECT created_at, updated_at FROM intent.jobs WHERE id = $1",
            &[&job_id],
        )
        .await?
    else {
        return Ok(0);
    };
    let age = Duration::from_secs(days * 86_400);
    let (created, updated): (std::time::SystemTime, std::time::SystemTime) =
        (row.get(0), row.get(1));
    c.execute(
        "UPDATE intent.jobs SET created_at = $2, updated_at = $3 WHERE id = $1",
        &[&job_id, &(created - age), &(updated - age)],
    )
    .await
}

/// Sleeps until the server's clock has passed `deadline` of an attempt (read from the table),
/// so that lease tests do not depend on the two clocks agreeing.
pub async fn wait_past_deadline(c: &Client, attempt_id: Uuid) {
    let started = Instant::now();
    loop {
        let past: bool = c
            .query_one(
                "SELECT deadline < clock_timestamp() FROM intent.attempts WHERE id = $1",
                &[&attempt_id],
            )
            .await
            .expect("read deadline")
            .get(0);
        if past {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "attempt {attempt_id} never ran out of lease"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Makes sure a contract named `name` can be referenced by a job: defines it with an
/// accept-anything schema when the installed extension has `intent.define_contract` (once
/// contracts exist, a job must name a defined one); does nothing on a build without contracts.
/// Returns whether contracts are supported.
pub async fn ensure_contract(c: &Client, name: &str) -> bool {
    let supported: bool = c
        .query_one(
            "SELECT to_regprocedure('intent.define_contract(text,jsonb,regprocedure)') IS NOT NULL",
            &[],
        )
        .await
        .expect("look up intent.define_contract")
        .get(0);
    if supported {
        c.query("SELECT intent.define_contract($1, '{}'::jsonb)", &[&name])
            .await
            .unwrap_or_else(|e| panic!("define contract {name}: {e:?}"));
    }
    supported
}
