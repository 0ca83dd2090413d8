//! Support for the reliability suite (`tests/tests/storm.rs`, `crash.rs`, `hostile_input/`):
//! how big a run is, a seeded random generator so any run can be replayed, values sent raw on
//! the wire (bytes that are not UTF-8, jsonb text that serde cannot build, intervals with any
//! field), the invariants of docs/protocol.md written as SQL, crash detection, and the one-line figures
//! that `scripts/reliability.sh` collects.
//!
//! Scale: by default every test runs a shortened form that exercises the same code paths in a
//! few seconds (CI). `PG_INTENT_FULL=1` selects the full form (64 connections × 1,000 rounds,
//! 20 crash cycles, 10,000 hostile inputs). Each figure can also be set on its own, e.g.
//! `PG_INTENT_STORM_ROUNDS=50`. `PG_INTENT_SEED=<n>` replays a run (every test prints its seed).

use crate::{Client, Cluster};
use std::error::Error;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio_postgres::types::private::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

// --- scale -------------------------------------------------------------------------------------

/// Whether the full form was asked for (`PG_INTENT_FULL=1`).
pub fn full() -> bool {
    std::env::var("PG_INTENT_FULL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A size of the run: the environment variable `name` if set, else `full` under
/// `PG_INTENT_FULL=1`, else `short`.
pub fn scale(name: &str, short: usize, full_size: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) if full() => full_size,
        Err(_) => short,
    }
}

/// The seed of this run: `PG_INTENT_SEED`, or one taken from the clock (printed, so that a
/// failing run can be replayed).
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("PG_INTENT_SEED") {
        Ok(v) => v.trim().parse().expect("PG_INTENT_SEED must be a number"),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42),
    };
    println!("{test}: PG_INTENT_SEED={seed}");
    seed
}

// --- randomness ----------------------------------------------------------------------------------

/// SplitMix64: small, fast, and the same sequence for the same seed on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for a sub-task, independent of the others but fixed by the seed.
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng(self.next_u64() ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % ((hi - lo) as u64 + 1)) as i64
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// --- figures and violations ------------------------------------------------------------------

/// The one line a test prints with its figures, parsed by `scripts/reliability.sh`:
/// `RELIABILITY test=storm rounds=1000 connections=64 ... violations=0 seconds=81.3`.
pub struct Figures {
    test: String,
    fields: Vec<(String, String)>,
    started: Instant,
}

impl Figures {
    pub fn new(test: &str) -> Figures {
        Figures {
            test: test.to_string(),
            fields: Vec::new(),
            started: Instant::now(),
        }
    }

    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Self {
        let value = value.to_string();
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(field) => field.1 = value,
            None => self.fields.push((key.to_string(), value)),
        }
        self
    }

    /// Prints the line (with the elapsed seconds).
    pub fn print(&self) {
        let mut line = format!("RELIABILITY test={}", self.test);
        for (k, v) in &self.fields {
            let _ = write!(line, " {k}={v}");
        }
        let _ = write!(line, " seconds={:.1}", self.started.elapsed().as_secs_f64());
        println!("{line}");
    }
}

/// Every broken invariant found, kept (the first ones in full) so that a run reports them all
/// at once instead of stopping at the first.
#[derive(Default)]
pub struct Violations {
    found: Mutex<(usize, Vec<String>)>,
}

impl Violations {
    const KEPT: usize = 50;

    pub fn new() -> Violations {
        Violations::default()
    }

    pub fn push(&self, what: impl Into<String>) {
        let mut found = self.found.lock().unwrap();
        found.0 += 1;
        if found.1.len() < Self::KEPT {
            found.1.push(what.into());
        }
    }

    /// Records `what()` unless `ok`.
    pub fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.push(what());
        }
    }

    pub fn extend(&self, list: impl IntoIterator<Item = String>) {
        for v in list {
            self.push(v);
        }
    }

    pub fn count(&self) -> usize {
        self.found.lock().unwrap().0
    }

    /// Panics with the violations found, if any.
    #[track_caller]
    pub fn assert_none(&self, context: &str) {
        let found = self.found.lock().unwrap();
        assert!(
            found.0 == 0,
            "{context}: {} violation(s); the first {}:\n  {}",
            found.0,
            found.1.len(),
            found.1.join("\n  ")
        );
    }
}

// --- raw values on the wire -----------------------------------------------------------------------

/// Text sent as raw bytes (binary format), so a test can send what `&str` cannot hold: bytes that
/// are not UTF-8. PostgreSQL must refuse them before any function runs.
#[derive(Debug, Clone)]
pub struct RawText(pub Vec<u8>);

impl ToSql for RawText {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME)
    }

    to_sql_checked!();
}

/// A jsonb value sent as its text (binary format: version byte 1, then the text), so that a test
/// can send documents serde_json would refuse to build or serialize (nesting 100,000 deep).
#[derive(Debug, Clone)]
pub struct RawJsonb(pub Vec<u8>);

impl ToSql for RawJsonb {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.extend_from_slice(&[1]);
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    to_sql_checked!();
}

/// An interval with every field chosen freely (binary format: microseconds, days, months).
#[derive(Debug, Clone, Copy)]
pub struct RawInterval {
    pub micros: i64,
    pub days: i32,
    pub months: i32,
}

impl ToSql for RawInterval {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.extend_from_slice(&self.micros.to_be_bytes());
        out.extend_from_slice(&self.days.to_be_bytes());
        out.extend_from_slice(&self.months.to_be_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }

    to_sql_checked!();
}

/// `depth` nested arrays around `core`: `[[[…core…]]]`, as jsonb text.
pub fn nested_json(depth: usize, core: &str) -> Vec<u8> {
    let mut text = Vec::with_capacity(2 * depth + core.len());
    text.resize(depth, b'[');
    text.extend_from_slice(core.as_bytes());
    text.resize(2 * depth + core.len(), b']');
    text
}

// --- the invariants, in SQL --------------------------------------------------------------------

/// Checks that must hold of the tables at any committed instant, whatever happened before: each
/// query returns one text per violation. Run after storms and after every crash.
const INVARIANTS: &[(&str, &str)] = &[
    (
        "one job per (owner_id, idempotency_key)",
        "SELECT format('key (%s, %s) has %s jobs', owner_id, idempotency_key, count(*))
           FROM intent.jobs GROUP BY owner_id, idempotency_key HAVING count(*) > 1",
    ),
    (
        "job ids are the derived ones",
        "SELECT format('job %s is not intent.job_id(%L, %L)', id, owner_id, idempotency_key)
           FROM intent.jobs WHERE id <> intent.job_id(owner_id, idempotency_key)",
    ),
    (
        "at most one open attempt per job",
        "SELECT format('job %s has %s open attempts', job_id, count(*))
           FROM intent.attempts WHERE state IN ('started', 'unknown')
          GROUP BY job_id HAVING count(*) > 1",
    ),
    (
        "a succeeded job's completed_by is a succeeded attempt of that job",
        "SELECT format('job %s succeeded, completed_by %s is %s', j.id, j.completed_by,
                       coalesce(a.state::text, 'no attempt of this job'))
           FROM intent.jobs j
           LEFT JOIN intent.attempts a ON a.id = j.completed_by AND a.job_id = j.id
          WHERE j.state = 'succeeded' AND a.state IS DISTINCT FROM 'succeeded'",
    ),
    (
        "a failed job's completed_by is a failed attempt of that job",
        "SELECT format('job %s failed, completed_by %s is %s', j.id, j.completed_by,
                       coalesce(a.state::text, 'no attempt of this job'))
           FROM intent.jobs j
           LEFT JOIN intent.attempts a ON a.id = j.completed_by AND a.job_id = j.id
          WHERE j.state = 'failed' AND a.state IS DISTINCT FROM 'failed'",
    ),
    (
        "only one succeeded attempt per job, and it is completed_by",
        "SELECT format('attempt %s succeeded but job %s (%s) names %s', a.id, j.id, j.state, j.completed_by)
           FROM intent.attempts a JOIN intent.jobs j ON j.id = a.job_id
          WHERE a.state = 'succeeded' AND j.completed_by IS DISTINCT FROM a.id",
    ),
    (
        "the job's result is its winner's result",
        "SELECT format('job %s result %s, winner %s returned %s', j.id, j.result, a.id, a.result)
           FROM intent.jobs j JOIN intent.attempts a ON a.id = j.completed_by AND a.job_id = j.id
          WHERE j.state = 'succeeded' AND j.result IS DISTINCT FROM a.result",
    ),
    (
        "the version moves exactly once, when the outcome slot changes",
        "SELECT format('attempt %s read version %s of job %s, which is %s at version %s',
                       a.id, a.version_read, j.id, j.state, j.version)
           FROM intent.attempts a JOIN intent.jobs j ON j.id = a.job_id
          WHERE a.version_read <> j.version
                  - CASE WHEN j.state IN ('succeeded', 'failed', 'cancelled') THEN 1 ELSE 0 END",
    ),
    (
        "attempt_count counts the attempts, numbered 1..n",
        "SELECT format('job %s: attempt_count %s, %s attempts, numbers up to %s',
                       j.id, j.attempt_count, count(a.id), coalesce(max(a.attempt_no), 0))
           FROM intent.jobs j LEFT JOIN intent.attempts a ON a.job_id = j.id
          GROUP BY j.id, j.attempt_count
         HAVING j.attempt_count <> count(a.id) OR j.attempt_count <> coalesce(max(a.attempt_no), 0)",
    ),
    (
        "an open job's state matches its open attempt",
        "SELECT format('job %s is %s with open attempts %s', j.id, j.state,
                       coalesce((SELECT string_agg(a.id || ' ' || a.state, ', ') FROM intent.attempts a
                                  WHERE a.job_id = j.id AND a.state IN ('started', 'unknown')), 'none'))
           FROM intent.jobs j
          WHERE CASE j.state
                  WHEN 'pending' THEN EXISTS (SELECT 1 FROM intent.attempts a
                                               WHERE a.job_id = j.id AND a.state IN ('started', 'unknown'))
                  WHEN 'running' THEN NOT EXISTS (SELECT 1 FROM intent.attempts a
                                                   WHERE a.job_id = j.id AND a.state = 'started')
                  WHEN 'unknown' THEN NOT EXISTS (SELECT 1 FROM intent.attempts a
                                                   WHERE a.job_id = j.id AND a.state = 'unknown')
                  ELSE false END",
    ),
    (
        "a job has a retry time exactly while it is claimable (the claim indexes read it)",
        "SELECT format('job %s is %s with %s of %s attempts and retry_at %s',
                       id, state, attempt_count, max_attempts, coalesce(retry_at::text, 'NULL'))
           FROM intent.jobs
          WHERE (retry_at IS NOT NULL) <> (state = 'pending' AND attempt_count < max_attempts)",
    ),
    (
        "attempts belong to their job's owner",
        "SELECT format('attempt %s has owner %s, its job %s', a.id, a.owner_id, j.owner_id)
           FROM intent.attempts a JOIN intent.jobs j ON j.id = a.job_id
          WHERE a.owner_id <> j.owner_id",
    ),
    (
        "a discarded result is kept on its attempt and its race is logged",
        "SELECT format('attempt %s is discarded with result %s and %s late_result events', a.id, a.result,
                       (SELECT count(*) FROM intent.events e
                         WHERE e.job_id = a.job_id AND e.attempt_id = a.id AND e.kind = 'late_result'))
           FROM intent.attempts a
          WHERE a.state = 'discarded'
            AND (a.result IS NULL OR NOT EXISTS (SELECT 1 FROM intent.events e
                                                 WHERE e.job_id = a.job_id AND e.attempt_id = a.id
                                                   AND e.kind = 'late_result'))",
    ),
    (
        "a cancelled job has no outcome and a cancel event",
        "SELECT format('job %s is cancelled with completed_by %s, result %s', j.id, j.completed_by, j.result)
           FROM intent.jobs j
          WHERE j.state = 'cancelled'
            AND (j.completed_by IS NOT NULL OR j.result IS NOT NULL
                 OR NOT EXISTS (SELECT 1 FROM intent.events e WHERE e.job_id = j.id AND e.kind = 'cancelled'))",
    ),
];

/// Runs every invariant with index scans disabled (so that a broken index cannot hide a
/// duplicate), and returns one line per violation.
pub async fn invariant_violations(c: &Client) -> Vec<String> {
    c.batch_execute(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
         SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off;
         SET LOCAL enable_bitmapscan = off;",
    )
    .await
    .expect("start the invariant check");
    let mut found = Vec::new();
    for (name, sql) in INVARIANTS {
        let rows = c
            .query(*sql, &[])
            .await
            .unwrap_or_else(|e| panic!("invariant query '{name}': {e:?}"));
        for row in rows {
            found.push(format!("{name}: {}", row.get::<_, String>(0)));
        }
    }
    c.batch_execute("COMMIT").await.expect("end the check");
    found
}

/// Verifies every B-tree index of the extension's tables with amcheck (`bt_index_check` with
/// `heapallindexed`: every row is in the index, the index is ordered). Needs the `amcheck`
/// contrib extension; returns one line per broken index.
pub async fn index_violations(c: &Client) -> Vec<String> {
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        .await
        .expect("CREATE EXTENSION amcheck (postgresql-contrib)");
    let indexes: Vec<String> = c
        .query(
            "SELECT i.indexrelid::regclass::text
               FROM pg_index i
               JOIN pg_class t ON t.oid = i.indrelid
               JOIN pg_class ic ON ic.oid = i.indexrelid
               JOIN pg_am am ON am.oid = ic.relam
              WHERE t.relnamespace = 'intent'::regnamespace AND am.amname = 'btree'",
            &[],
        )
        .await
        .expect("list the indexes")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!indexes.is_empty(), "the extension has B-tree indexes");
    let mut found = Vec::new();
    for index in indexes {
        if let Err(e) = c
            .query("SELECT bt_index_check($1::text::regclass, true)", &[&index])
            .await
        {
            found.push(format!("index {index} is corrupt: {e:?}"));
        }
    }
    found
}

// --- crash detection ---------------------------------------------------------------------------

/// Proof that no backend crashed during a stretch of a test.
///
/// `pg_postmaster_start_time()` alone does not prove it: when a backend dies of a signal the
/// postmaster kills every other backend and reinitialises, but keeps its start time. So this
/// also keeps a sentinel connection open (a crash of any backend takes it down) and reads the
/// server log for the postmaster's own account of a crash.
pub struct CrashWatch {
    sentinel: Client,
    started: f64,
    log_offset: usize,
}

/// What the postmaster logs when a backend crashes.
const CRASH_MARKS: &[&str] = &[
    "terminated by signal",
    "terminated by exception",
    "all server processes terminated",
    "PANIC:",
    "has overflowed its stack",
];

impl CrashWatch {
    /// Starts watching `cluster` (connecting the sentinel to database `db`).
    pub async fn start(cluster: &Cluster, db: &str) -> CrashWatch {
        let sentinel = cluster.connect_as(db, "pg_intent_sentinel").await;
        let started = cluster.postmaster_start_time().await;
        CrashWatch {
            sentinel,
            started,
            log_offset: cluster.server_log().len(),
        }
    }

    /// The postmaster start time seen when watching began.
    pub fn start_time(&self) -> f64 {
        self.started
    }

    /// Everything that shows a crash since watching began (empty: none).
    pub async fn crashes(&self, cluster: &Cluster) -> Vec<String> {
        let mut found = Vec::new();
        match self.sentinel.query_one("SELECT 1", &[]).await {
            Ok(_) => {}
            Err(e) => found.push(format!("the sentinel connection died: {e}")),
        }
        match cluster
            .connect("postgres")
            .await
            .query_one(
                "SELECT extract(epoch FROM pg_postmaster_start_time())::float8",
                &[],
            )
            .await
        {
            Ok(row) if row.get::<_, f64>(0) == self.started => {}
            Ok(row) => found.push(format!(
                "the postmaster restarted: start time {} → {}",
                self.started,
                row.get::<_, f64>(0)
            )),
            Err(e) => found.push(format!("cannot read pg_postmaster_start_time(): {e}")),
        }
        let log = cluster.server_log();
        for line in log.get(self.log_offset..).unwrap_or("").lines() {
            if CRASH_MARKS.iter().any(|m| line.contains(m)) {
                found.push(format!("server log: {line}"));
            }
        }
        found
    }
}

// --- a socket that drops at COMMIT ---------------------------------------------------------------

/// What [`CommitCutter`] does to the next `COMMIT` a client sends through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Relay everything.
    Pass,
    /// Drop the connection instead of relaying the `COMMIT`: the server sees the client vanish
    /// inside its transaction and rolls it back.
    BeforeCommit,
    /// Relay the `COMMIT`, then drop the client's side at once, so the client never hears the
    /// answer; the server's side stays open until the server has answered (the commit is done).
    AfterCommit,
}

/// A TCP relay on 127.0.0.1 in front of a test server that can cut a client's connection around
/// its `COMMIT` (a simple-protocol query containing the word), once, as [`Cut`] says.
pub struct CommitCutter {
    port: u16,
    cut: std::sync::Arc<Mutex<Cut>>,
    accept: tokio::task::JoinHandle<()>,
}

impl CommitCutter {
    /// Starts relaying to `127.0.0.1:server_port`.
    pub async fn start(server_port: u16) -> CommitCutter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let cut = std::sync::Arc::new(Mutex::new(Cut::Pass));
        let shared = cut.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", server_port)).await
                else {
                    continue;
                };
                tokio::spawn(relay(client, server, shared.clone()));
            }
        });
        CommitCutter { port, cut, accept }
    }

    /// The port clients connect to instead of the server's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Arms the cutter for the next `COMMIT` (it disarms itself once it has cut).
    pub fn arm(&self, cut: Cut) {
        *self.cut.lock().unwrap() = cut;
    }
}

impl Drop for CommitCutter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(
    mut client: tokio::net::TcpStream,
    mut server: tokio::net::TcpStream,
    cut: std::sync::Arc<Mutex<Cut>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            n = client.read(&mut from_client) => {
                let n = match n { Ok(0) | Err(_) => return, Ok(n) => n };
                let chunk = &from_client[..n];
                let armed = {
                    let mut cut = cut.lock().unwrap();
                    let armed = *cut;
                    if armed != Cut::Pass && contains(chunk, b"COMMIT") {
                        *cut = Cut::Pass;
                        armed
                    } else {
                        Cut::Pass
                    }
                };
                match armed {
                    Cut::Pass => {
                        if server.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                    Cut::BeforeCommit => return,
                    Cut::AfterCommit => {
                        let _ = server.write_all(chunk).await;
                        drop(client);
                        // Wait for the server's ReadyForQuery: the COMMIT has been executed.
                        let mut seen = Vec::new();
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), async {
                            while let Ok(n) = server.read(&mut from_server).await {
                                if n == 0 {
                                    break;
                                }
                                seen.extend_from_slice(&from_server[..n]);
                                if contains(&seen, &[b'Z', 0, 0, 0, 5]) {
                                    break;
                                }
                            }
                        })
                        .await;
                        return;
                    }
                }
            }
            n = server.read(&mut from_server) => {
                let n = match n { Ok(0) | Err(_) => return, Ok(n) => n };
                if client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// --- everything stored -------------------------------------------------------------------------

/// A digest of every row of every table of the extension (jobs, attempts, events, contracts,
/// certifications, and any table added later), with each row's physical identity (`ctid`,
/// `xmin`): equal digests before and after a call prove that the call wrote nothing anywhere.
pub struct TableDigest {
    sql: String,
}

impl TableDigest {
    /// Lists the extension's tables (once) and builds the digest query.
    pub async fn new(c: &Client) -> TableDigest {
        let tables: Vec<String> = c
            .query(
                "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'intent' AND c.relkind IN ('r', 'p') ORDER BY 1",
                &[],
            )
            .await
            .expect("list the extension's tables")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(tables.len() >= 3, "the extension's tables: {tables:?}");
        let parts: Vec<String> = tables
            .iter()
            .map(|t| {
                format!(
                    "'{t}:' || coalesce((SELECT string_agg(x.ctid::text || x.xmin::text || x::text, '|' ORDER BY x.ctid) FROM {t} x), '')"
                )
            })
            .collect();
        TableDigest {
            sql: format!("SELECT md5({})", parts.join(" || '#' || ")),
        }
    }

    pub async fn take(&self, c: &Client) -> String {
        c.query_one(&self.sql, &[])
            .await
            .expect("digest of the extension's tables")
            .get(0)
    }
}
