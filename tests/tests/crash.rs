//! Crashes under load. Workers run the whole protocol (submit, submit-and-begin in one
//! transaction, begin, heartbeat, complete — also inside an explicit transaction —, fail,
//! abandon, mark_unknown, cancel, late results of abandoned attempts) while a terminator kills
//! their backends now and then; then the postmaster is killed with SIGKILL or stopped with
//! `pg_ctl -m immediate`, cycle after cycle, and restarted.
//!
//! After every restart, in SQL: the invariants of docs/protocol.md hold over every row (keys unique, at most
//! one open attempt per job, a succeeded job's completed_by is its one succeeded attempt, …),
//! amcheck finds every B-tree index intact, and everything a client was told after COMMIT is
//! there: every job, every attempt handed out, every `won` (still the job's outcome, with its
//! result), every `lost`, failure, cancel, abandon and timer. Calls whose answer was lost with
//! the connection are retried with the same key or attempt: they name the same job, and their
//! answers agree with what had been acknowledged. The next cycle carries on with the attempts
//! and jobs the crash left open.
//!
//! The second test kills a client's connection around its COMMIT, in every way that matters:
//! while the COMMIT waits after its commit record is flushed (pg_terminate_backend during a
//! synchronous-replication wait), before the COMMIT is sent, by dropping the socket right after
//! the COMMIT leaves the client, and by pg_terminate_backend racing the COMMIT at random
//! instants. A retry with the same key always returns the same job.
//!
//! Scale: `PG_INTENT_FULL=1` → 24 crash cycles, 12 workers, 200 racing kills; the default (CI) is
//! 3 cycles, 6 workers, 25 racing kills. `PG_INTENT_CRASH_CYCLES`, `PG_INTENT_CRASH_WORKERS`,
//! `PG_INTENT_COMMIT_KILLS` and `PG_INTENT_SEED` override.

use pg_intent_tests::reliability::{
    CommitCutter, Cut, Figures, Rng, Violations, full, index_violations, invariant_violations,
    scale, seed,
};
use pg_intent_tests::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::NoTls;

const PROVIDER: &str = "gpu-east";
const WORKER_APP: &str = "crash_worker";

fn result_of(attempt: Uuid) -> Value {
    json!({"attempt": attempt.to_string(), "image": format!("blob://{attempt}")})
}

/// How a call ended, as its client saw it.
enum Outcome<T> {
    /// The server answered (and, in autocommit, committed).
    Answer(T),
    /// The server refused with this SQLSTATE (and message).
    Refused(String),
    /// The connection broke: the call may or may not have committed.
    InDoubt,
}

/// SQLSTATEs that mean "the connection is going away", not "your call was refused".
fn connection_lost(code: &str) -> bool {
    code.starts_with("57P") || code.starts_with("08")
}

fn outcome<T>(r: Result<T, tokio_postgres::Error>) -> Outcome<T> {
    match r {
        Ok(v) => Outcome::Answer(v),
        Err(e) => match e.as_db_error() {
            Some(db) if !connection_lost(db.code().code()) => {
                Outcome::Refused(format!("{} {}", db.code().code(), db.message()))
            }
            _ => Outcome::InDoubt,
        },
    }
}

/// Everything a client was told after its COMMIT (or its autocommit call) returned.
#[derive(Default)]
struct Acked {
    /// job → (owner, key, params)
    jobs: HashMap<Uuid, (String, String, Value)>,
    /// job → how many callers were told `created = true`
    created: HashMap<Uuid, usize>,
    begun: HashMap<Uuid, Begun>,
    won: HashSet<Uuid>,
    lost: HashSet<Uuid>,
    /// jobs a failure was answered `failed` for
    failed_jobs: HashSet<Uuid>,
    cancelled: HashSet<Uuid>,
    abandoned: HashSet<Uuid>,
    marked_unknown: HashSet<Uuid>,
    calls: usize,
}

/// Calls whose answer the client never got.
#[derive(Default)]
struct Doubts {
    submits: Vec<(String, String, Value)>,
    completes: Vec<Begun>,
    other: usize,
}

struct Shared {
    acked: Mutex<Acked>,
    doubts: Mutex<Doubts>,
    violations: Violations,
    stop: AtomicBool,
}

impl Shared {
    fn ack(&self, f: impl FnOnce(&mut Acked)) {
        let mut acked = self.acked.lock().unwrap();
        acked.calls += 1;
        f(&mut acked);
    }
}

/// A job a worker is working.
#[derive(Debug, Clone)]
struct MyJob {
    id: Uuid,
    open: Option<Begun>,
    /// Abandoned attempts whose result may still turn up.
    late: Vec<Begun>,
}

struct Worker {
    id: usize,
    cycle: usize,
    rng: Rng,
    config: tokio_postgres::Config,
    conn: Option<Client>,
    jobs: Vec<MyJob>,
    /// Attempts a previous cycle's crash left open: complete or abandon them.
    orphans: Vec<Begun>,
    next_key: usize,
    shared: Arc<Shared>,
}

impl Worker {
    async fn run(mut self) {
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.conn.is_none() {
                match self.config.connect(NoTls).await {
                    Ok((client, connection)) => {
                        tokio::spawn(async move {
                            let _ = connection.await;
                        });
                        self.conn = Some(client);
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
            if !self.step().await {
                self.conn = None; // broken: reconnect (the terminator) or stop (the crash)
            }
        }
    }

    fn violation(&self, what: String) {
        self.shared
            .violations
            .push(format!("cycle {} worker {}: {what}", self.cycle, self.id));
    }

    /// One call (or one transaction). Returns false when the connection broke.
    async fn step(&mut self) -> bool {
        if !self.orphans.is_empty() && self.rng.percent(30) {
            let b = self.orphans.swap_remove(self.rng.below(self.orphans.len()));
            return if self.rng.percent(50) {
                self.complete(b, None, false).await
            } else {
                self.abandon(b, None).await
            };
        }
        if self.jobs.is_empty() || self.rng.percent(22) {
            return self.submit().await;
        }
        let j = self.rng.below(self.jobs.len());
        if !self.jobs[j].late.is_empty() && self.rng.percent(15) {
            let b = self.jobs[j].late.pop().expect("not empty");
            return self.complete(b, Some(j), false).await;
        }
        match self.jobs[j].open.clone() {
            None => self.begin(j).await,
            Some(b) => match self.rng.below(100) {
                0..20 => self.heartbeat(b).await,
                20..55 => self.complete(b, Some(j), false).await,
                55..65 => self.complete(b, Some(j), true).await,
                65..75 => self.fail(b, j, true).await,
                75..80 => self.fail(b, j, false).await,
                80..89 => self.abandon(b, Some(j)).await,
                89..96 => self.mark_unknown(b).await,
                _ => self.cancel(j).await,
            },
        }
    }

    fn c(&self) -> &Client {
        self.conn.as_ref().expect("connected")
    }

    async fn submit(&mut self) -> bool {
        let owner = format!("tenant-{}", self.id % 3);
        let key = format!("c{}-w{}-k{}", self.cycle, self.id, self.next_key);
        self.next_key += 1;
        let params = json!({"prompt": "a lighthouse at dusk", "key": key, "steps": 30});
        let job_id = job_id_of(&owner, &key);
        // A third of the submits begin the first attempt in the same transaction.
        let with_begin = self.rng.percent(33);
        let result = async {
            if with_begin {
                self.c().batch_execute("BEGIN").await?;
            }
            let s = submit(self.c(), &owner, &key, PROVIDER, &params).await?;
            let b = if with_begin {
                let b = begin(self.c(), job_id, None, "1 minute").await?;
                self.c().batch_execute("COMMIT").await?;
                Some(b)
            } else {
                None
            };
            Ok((s, b))
        }
        .await;
        match outcome(result) {
            Outcome::Answer((s, b)) => {
                if s.job_id != job_id || !s.created {
                    self.violation(format!("new key {key} answered {s:?}"));
                }
                self.shared.ack(|a| {
                    a.jobs.insert(job_id, (owner, key, params));
                    *a.created.entry(job_id).or_default() += 1;
                    if let Some(b) = &b {
                        a.begun.insert(b.attempt_id, b.clone());
                    }
                });
                self.jobs.push(MyJob {
                    id: job_id,
                    open: b,
                    late: Vec::new(),
                });
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("submit {key}: {e}"));
                let _ = self.c().batch_execute("ROLLBACK").await;
                true
            }
            Outcome::InDoubt => {
                self.shared
                    .doubts
                    .lock()
                    .unwrap()
                    .submits
                    .push((owner, key, params));
                false
            }
        }
    }

    async fn begin(&mut self, j: usize) -> bool {
        let job = self.jobs[j].id;
        let lease = if self.rng.percent(10) {
            "300 milliseconds"
        } else {
            "1 minute"
        };
        match outcome(begin(self.c(), job, None, lease).await) {
            Outcome::Answer(b) => {
                self.shared.ack(|a| {
                    a.begun.insert(b.attempt_id, b.clone());
                });
                self.jobs[j].open = Some(b);
                true
            }
            // The job ended (a late result won it, or it was cancelled), or its attempts ran out.
            Outcome::Refused(e) if e.starts_with("IJ004") || e.starts_with("IJ006") => {
                self.jobs.swap_remove(j);
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("begin {job}: {e}"));
                self.jobs.swap_remove(j);
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().other += 1;
                self.jobs.swap_remove(j);
                false
            }
        }
    }

    async fn heartbeat(&mut self, b: Begun) -> bool {
        match outcome(heartbeat(self.c(), b.attempt_id, None).await) {
            Outcome::Answer(_) => {
                self.shared.ack(|_| {});
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("heartbeat {}: {e}", b.attempt_id));
                true
            }
            Outcome::InDoubt => false,
        }
    }

    /// Completes `b` (in autocommit, or inside BEGIN … COMMIT). `j`: the job it is working, if
    /// any (None for an orphan).
    async fn complete(&mut self, b: Begun, j: Option<usize>, in_transaction: bool) -> bool {
        let id = b.attempt_id;
        let result = async {
            if in_transaction {
                self.c().batch_execute("BEGIN").await?;
            }
            let answer = complete(self.c(), id, b.version, &result_of(id)).await?;
            if in_transaction {
                self.c().batch_execute("COMMIT").await?;
            }
            Ok(answer)
        }
        .await;
        let job_done = |w: &mut Worker| {
            if let Some(j) = j {
                let job = w.jobs[j].id;
                if let Some(j) = w.jobs.iter().position(|m| m.id == job) {
                    w.jobs.swap_remove(j);
                }
            }
        };
        match outcome(result) {
            Outcome::Answer(answer) => {
                match answer.as_str() {
                    "won" => self.shared.ack(|a| {
                        a.won.insert(id);
                    }),
                    "lost" => self.shared.ack(|a| {
                        a.lost.insert(id);
                    }),
                    other => self.violation(format!("complete {id} answered {other}")),
                }
                match (answer.as_str(), j) {
                    // The job is decided.
                    ("won", _) => job_done(self),
                    // Our open attempt lost: the job ended some other way.
                    ("lost", Some(j)) if self.jobs[j].open.as_ref() == Some(&b) => job_done(self),
                    _ => {}
                }
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("complete {id}: {e}"));
                let _ = self.c().batch_execute("ROLLBACK").await;
                job_done(self);
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().completes.push(b);
                job_done(self);
                false
            }
        }
    }

    async fn fail(&mut self, b: Begun, j: usize, retryable: bool) -> bool {
        let id = b.attempt_id;
        let error = json!({"status": if retryable { 503 } else { 400 }});
        match outcome(fail(self.c(), id, b.version, &error, retryable).await) {
            Outcome::Answer(state) => {
                let job = self.jobs[j].id;
                self.shared.ack(|a| {
                    if state == "failed" {
                        a.failed_jobs.insert(job);
                    }
                });
                if state == "pending" {
                    self.jobs[j].open = None;
                } else {
                    // A final failure ends the job (unless a late result had already won it).
                    if !retryable && !matches!(state.as_str(), "failed" | "succeeded" | "cancelled")
                    {
                        self.violation(format!("a final failure of {id} left the job {state}"));
                    }
                    self.jobs.swap_remove(j);
                }
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("fail {id}: {e}"));
                self.jobs.swap_remove(j);
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().other += 1;
                self.jobs.swap_remove(j);
                false
            }
        }
    }

    async fn abandon(&mut self, b: Begun, j: Option<usize>) -> bool {
        let id = b.attempt_id;
        match outcome(abandon(self.c(), id, "operator: provider unreachable").await) {
            Outcome::Answer(()) => {
                self.shared.ack(|a| {
                    a.abandoned.insert(id);
                });
                if let Some(j) = j {
                    self.jobs[j].open = None;
                    self.jobs[j].late.push(b);
                }
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("abandon {id}: {e}"));
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().other += 1;
                if let Some(j) = j {
                    self.jobs.swap_remove(j);
                }
                false
            }
        }
    }

    async fn mark_unknown(&mut self, b: Begun) -> bool {
        let id = b.attempt_id;
        match outcome(mark_unknown(self.c(), id, Some("client timeout")).await) {
            Outcome::Answer(()) => {
                self.shared.ack(|a| {
                    a.marked_unknown.insert(id);
                });
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("mark_unknown {id}: {e}"));
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().other += 1;
                false
            }
        }
    }

    async fn cancel(&mut self, j: usize) -> bool {
        let job = self.jobs[j].id;
        let answer = outcome(cancel(self.c(), job, Some("the user changed their mind")).await);
        self.jobs.swap_remove(j);
        match answer {
            Outcome::Answer(cancelled) => {
                self.shared.ack(|a| {
                    if cancelled {
                        a.cancelled.insert(job);
                    }
                });
                true
            }
            Outcome::Refused(e) => {
                self.violation(format!("cancel {job}: {e}"));
                true
            }
            Outcome::InDoubt => {
                self.shared.doubts.lock().unwrap().other += 1;
                false
            }
        }
    }
}

/// Kills a random worker's backend now and then: a client's connection dies mid-call, maybe
/// mid-transaction or mid-COMMIT.
async fn terminator(config: tokio_postgres::Config, mut rng: Rng, shared: Arc<Shared>) -> usize {
    let Ok((c, connection)) = config.connect(NoTls).await else {
        return 0;
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut kills = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.between(60, 250) as u64)).await;
        if let Ok(row) = c
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM
                   (SELECT pid FROM pg_stat_activity WHERE application_name = $1
                     ORDER BY random() LIMIT 1) s",
                &[&WORKER_APP],
            )
            .await
        {
            kills += row.get::<_, i64>(0) as usize;
        } else {
            break;
        }
    }
    kills
}

/// Work that a crash left open: attempts still started or unknown (for the workers to
/// complete or abandon) and pending jobs (to begin again).
async fn leftovers(c: &Client) -> (Vec<Begun>, Vec<Uuid>) {
    let attempts = c
        .query(
            "SELECT id, attempt_no, version_read FROM intent.attempts
              WHERE state IN ('started', 'unknown')",
            &[],
        )
        .await
        .expect("read open attempts")
        .iter()
        .map(|r| Begun {
            attempt_id: r.get(0),
            attempt_no: r.get(1),
            version: r.get(2),
        })
        .collect();
    let pending = c
        .query("SELECT id FROM intent.jobs WHERE state = 'pending'", &[])
        .await
        .expect("read pending jobs")
        .iter()
        .map(|r| r.get(0))
        .collect();
    (attempts, pending)
}

/// A job row as the checks read it: owner, key, params, state, completed_by, result.
type JobFacts = (String, String, Value, String, Option<Uuid>, Option<Value>);

/// Checks everything acknowledged so far against the rows.
async fn check_acknowledged(c: &Client, acked: &Acked, v: &Violations, cycle: usize) -> usize {
    let at = |what: String| format!("after crash {cycle}: {what}");
    let mut jobs: HashMap<Uuid, JobFacts> = HashMap::new();
    for r in c
        .query(
            "SELECT id, owner_id, idempotency_key, params, state::text, completed_by, result
               FROM intent.jobs",
            &[],
        )
        .await
        .expect("read jobs")
    {
        jobs.insert(
            r.get(0),
            (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)),
        );
    }
    let mut attempts: HashMap<Uuid, (Uuid, i32, i64, String, Option<Value>)> = HashMap::new();
    for r in c
        .query(
            "SELECT id, job_id, attempt_no, version_read, state::text, result FROM intent.attempts",
            &[],
        )
        .await
        .expect("read attempts")
    {
        attempts.insert(r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)));
    }
    let mut checked = 0;
    for (job, (owner, key, params)) in &acked.jobs {
        checked += 1;
        match jobs.get(job) {
            Some((o, k, p, ..)) => v.check(o == owner && k == key && p == params, || {
                at(format!(
                    "job {job} is ({o}, {k}, {p}), was told ({owner}, {key}, {params})"
                ))
            }),
            None => v.push(at(format!(
                "acknowledged job {job} ({owner}, {key}) is gone"
            ))),
        }
    }
    for (job, n) in &acked.created {
        v.check(*n <= 1, || {
            at(format!("{n} callers were told they created job {job}"))
        });
    }
    for (id, b) in &acked.begun {
        checked += 1;
        match attempts.get(id) {
            Some((_, no, version, ..)) => {
                v.check(*no == b.attempt_no && *version == b.version, || {
                    at(format!(
                        "attempt {id} is no {no} version {version}, was told {b:?}"
                    ))
                })
            }
            None => v.push(at(format!("acknowledged attempt {id} is gone"))),
        }
    }
    let mut winners: HashMap<Uuid, Uuid> = HashMap::new();
    for id in &acked.won {
        checked += 1;
        let job = Uuid::from_bytes(pg_intent_protocol::job_of(*id.as_bytes()).expect("attempt id"));
        if let Some(other) = winners.insert(job, *id) {
            v.push(at(format!(
                "job {job}: attempts {other} and {id} were both told won"
            )));
        }
        match (jobs.get(&job), attempts.get(id)) {
            (Some((.., state, by, result)), Some((.., a_state, _))) => {
                v.check(
                    state == "succeeded" && *by == Some(*id) && a_state == "succeeded",
                    || {
                        at(format!(
                            "attempt {id} was told won; job is {state} by {by:?}, attempt {a_state}"
                        ))
                    },
                );
                v.check(*result == Some(result_of(*id)), || {
                    at(format!("job {job} result {result:?} is not its winner's"))
                });
            }
            _ => v.push(at(format!("the winner {id} or its job is gone"))),
        }
    }
    for id in &acked.lost {
        checked += 1;
        match attempts.get(id) {
            Some((job, _, _, state, _)) => {
                v.check(state == "discarded" || state == "failed", || {
                    at(format!("attempt {id} was told lost and is {state}"))
                });
                if let Some((.., j_state, by, _)) = jobs.get(job) {
                    v.check(!(j_state == "succeeded" && *by == Some(*id)), || {
                        at(format!("attempt {id} was told lost but won job {job}"))
                    });
                }
            }
            None => v.push(at(format!("lost attempt {id} is gone"))),
        }
    }
    let job_state = |job: &Uuid| jobs.get(job).map(|j| j.3.as_str());
    for job in &acked.failed_jobs {
        checked += 1;
        v.check(job_state(job) == Some("failed"), || {
            at(format!(
                "job {job} was told failed and is {:?}",
                job_state(job)
            ))
        });
    }
    for job in &acked.cancelled {
        checked += 1;
        v.check(job_state(job) == Some("cancelled"), || {
            at(format!(
                "job {job} was told cancelled and is {:?}",
                job_state(job)
            ))
        });
    }
    let attempt_state = |id: &Uuid| attempts.get(id).map(|a| a.3.as_str());
    for id in &acked.abandoned {
        checked += 1;
        v.check(
            !matches!(attempt_state(id), None | Some("started" | "unknown")),
            || {
                at(format!(
                    "attempt {id} was abandoned and is {:?}",
                    attempt_state(id)
                ))
            },
        );
    }
    for id in &acked.marked_unknown {
        checked += 1;
        v.check(!matches!(attempt_state(id), None | Some("started")), || {
            at(format!(
                "attempt {id} timed out and is {:?}",
                attempt_state(id)
            ))
        });
    }
    checked
}

/// Retries, after the restart, the calls whose answers were lost: the same key names the same
/// job, and the answers agree with everything acknowledged.
async fn retry_doubts(c: &Client, shared: &Shared, cycle: usize) -> usize {
    let doubts = std::mem::take(&mut *shared.doubts.lock().unwrap());
    let v = &shared.violations;
    let mut retried = 0;
    for (owner, key, params) in doubts.submits {
        retried += 1;
        match submit(c, &owner, &key, PROVIDER, &params).await {
            Ok(s) => {
                let job = job_id_of(&owner, &key);
                v.check(s.job_id == job, || {
                    format!(
                        "after crash {cycle}: retrying {key} gave job {} not {job}",
                        s.job_id
                    )
                });
                shared.ack(|a| {
                    a.jobs
                        .insert(job, (owner.clone(), key.clone(), params.clone()));
                    if s.created {
                        *a.created.entry(job).or_default() += 1;
                    }
                });
            }
            Err(e) => v.push(format!("after crash {cycle}: retrying submit {key}: {e:?}")),
        }
    }
    for b in doubts.completes {
        retried += 1;
        match complete(c, b.attempt_id, b.version, &result_of(b.attempt_id)).await {
            Ok(answer) => {
                let id = b.attempt_id;
                shared.ack(|a| match answer.as_str() {
                    "won" => {
                        a.won.insert(id);
                    }
                    "lost" => {
                        v.check(!a.won.contains(&id), || {
                            format!("after crash {cycle}: {id} was told won, its retry lost")
                        });
                        a.lost.insert(id);
                    }
                    other => v.push(format!(
                        "after crash {cycle}: retry of {id} answered {other}"
                    )),
                });
            }
            Err(e) => v.push(format!(
                "after crash {cycle}: retrying complete {}: {e:?}",
                b.attempt_id
            )),
        }
    }
    retried + doubts.other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_cycles_under_a_mixed_workload_lose_nothing_acknowledged() {
    let cycles = scale("PG_INTENT_CRASH_CYCLES", 3, 24);
    let workers = scale("PG_INTENT_CRASH_WORKERS", 6, 12);
    let mut rng = Rng::new(seed("crash"));
    let mut figures = Figures::new("crash");

    let cluster = Cluster::start();
    let db = cluster.fresh_db("crash").await;
    let mut config = cluster.config(&db.name);
    config.application_name(WORKER_APP);
    let shared = Arc::new(Shared {
        acked: Mutex::default(),
        doubts: Mutex::default(),
        violations: Violations::new(),
        stop: AtomicBool::new(false),
    });
    let (mut sigkills, mut immediates, mut backend_kills, mut doubts, mut checked) =
        (0, 0, 0, 0, 0);

    for cycle in 0..cycles {
        let c = db.connect().await;
        let (orphans, pending) = leftovers(&c).await;
        drop(c);
        let mut handles = Vec::new();
        for w in 0..workers {
            let mine = |i: &usize| i % workers == w;
            handles.push(tokio::spawn(
                Worker {
                    id: w,
                    cycle,
                    rng: rng.fork((cycle * 1000 + w) as u64),
                    config: config.clone(),
                    conn: None,
                    jobs: pending
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mine(i))
                        .map(|(_, id)| MyJob {
                            id: *id,
                            open: None,
                            late: Vec::new(),
                        })
                        .collect(),
                    orphans: orphans
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mine(i))
                        .map(|(_, b)| b.clone())
                        .collect(),
                    next_key: 0,
                    shared: shared.clone(),
                }
                .run(),
            ));
        }
        let killer = tokio::spawn(terminator(
            cluster.config(&db.name),
            rng.fork(cycle as u64),
            shared.clone(),
        ));

        let run_for = if full() {
            rng.between(500, 2500)
        } else {
            rng.between(300, 900)
        };
        tokio::time::sleep(Duration::from_millis(run_for as u64)).await;
        let started = cluster.postmaster_start_time().await;
        // Alternate the two ways a server dies without a checkpoint.
        if cycle % 2 == 0 {
            tokio::task::block_in_place(|| cluster.kill_postmaster());
            sigkills += 1;
        } else {
            tokio::task::block_in_place(|| cluster.stop(StopMode::Immediate));
            immediates += 1;
        }
        shared.stop.store(true, Ordering::Relaxed);
        for h in handles {
            tokio::time::timeout(Duration::from_secs(120), h)
                .await
                .expect("a worker hangs after the crash")
                .expect("a worker panicked");
        }
        backend_kills += killer.await.expect("terminator");
        tokio::task::block_in_place(|| cluster.restart());
        shared.stop.store(false, Ordering::Relaxed);
        assert!(
            cluster.postmaster_start_time().await > started,
            "cycle {cycle}: a new postmaster after the crash"
        );

        let c = db.connect().await;
        doubts += retry_doubts(&c, &shared, cycle).await;
        let v = &shared.violations;
        v.extend(
            invariant_violations(&c)
                .await
                .into_iter()
                .map(|s| format!("after crash {cycle}: {s}")),
        );
        v.extend(
            index_violations(&c)
                .await
                .into_iter()
                .map(|s| format!("after crash {cycle}: {s}")),
        );
        let acked = std::mem::take(&mut *shared.acked.lock().unwrap());
        checked = check_acknowledged(&c, &acked, v, cycle).await;
        *shared.acked.lock().unwrap() = acked;
        if v.count() > 0 {
            break;
        }
    }

    let c = db.connect().await;
    let d = digest(&c).await;
    let acked = shared.acked.lock().unwrap();
    figures
        .set("cycles", sigkills + immediates)
        .set("sigkill", sigkills)
        .set("immediate", immediates)
        .set("workers", workers)
        .set("acknowledged_calls", acked.calls)
        .set("in_doubt_retried", doubts)
        .set("backends_killed", backend_kills)
        .set("facts_checked", checked)
        .set("jobs", d.jobs)
        .set("attempts", d.attempts)
        .set("won", acked.won.len())
        .set("violations", shared.violations.count())
        .set("full", full());
    figures.print();
    shared.violations.assert_none("crash");
    assert!(
        !acked.won.is_empty() && !acked.abandoned.is_empty() && !acked.failed_jobs.is_empty(),
        "the workload reached wins, abandons and failures"
    );
}

/// Terminates the backend of the session named `application_name`.
async fn terminate(observer: &Client, application_name: &str) {
    let n: i64 = observer
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert_eq!(n, 1, "one session named {application_name}");
}

/// Waits until the session named `application_name` waits on `wait_event`.
async fn wait_for_wait_event(observer: &Client, application_name: &str, wait_event: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event = $2",
                &[&application_name, &wait_event],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{application_name} never waited on {wait_event}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn params_for(key: &str) -> Value {
    json!({"cart": [1, 2, 3], "key": key})
}

/// Retries `key` and checks the answer: the same job, with the params the client sent, created
/// by the retry exactly when the first try did not commit. Returns the retry's `created`.
async fn retry_same_key(c: &Client, key: &str, v: &Violations, what: &str) -> bool {
    let s = submit(c, "shopper", key, PROVIDER, &params_for(key))
        .await
        .unwrap_or_else(|e| panic!("{what}: the retry of {key} failed: {e:?}"));
    v.check(s.job_id == job_id_of("shopper", key), || {
        format!("{what}: the retry of {key} returned job {}", s.job_id)
    });
    let job = job_row(c, s.job_id).await;
    v.check(job.params == params_for(key), || {
        format!("{what}: job {} has params {}", s.job_id, job.params)
    });
    s.created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_around_its_commit_retries_to_the_same_job() {
    let races = scale("PG_INTENT_COMMIT_KILLS", 25, 200);
    let mut rng = Rng::new(seed("commit_kill"));
    let mut figures = Figures::new("commit_kill");
    let v = Violations::new();
    let cluster = Cluster::start();
    let db = cluster.fresh_db("commit_kill").await;
    let observer = db.connect().await;

    // 1. Killed before the COMMIT was sent (idle in transaction): rolled back, and the retry
    //    creates the job — the same job.
    let victim = db.connect_as("victim_idle").await;
    victim.batch_execute("BEGIN").await.unwrap();
    let first = submit(&victim, "shopper", "idle", PROVIDER, &params_for("idle"))
        .await
        .unwrap();
    assert!(first.created);
    terminate(&observer, "victim_idle").await;
    // Gone before the COMMIT is even sent.
    while observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'victim_idle'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        victim.batch_execute("COMMIT").await.is_err(),
        "the COMMIT cannot succeed"
    );
    v.check(
        retry_same_key(&observer, "idle", &v, "killed idle in transaction").await,
        || {
            "killed before COMMIT: the transaction rolled back, the retry must create the job"
                .into()
        },
    );

    // 2. The socket dropped instead of sending the COMMIT: rolled back; the retry creates it.
    // 3. The socket dropped right after the COMMIT left the client: committed, the answer lost;
    //    the retry finds the job (created = false), and a retried completion is still `won`.
    let cutter = CommitCutter::start(cluster.port()).await;
    let mut via_cutter = tokio_postgres::Config::new();
    via_cutter
        .host("127.0.0.1")
        .port(cutter.port())
        .user("postgres")
        .dbname(&db.name);
    for (cut, key, committed) in [
        (Cut::BeforeCommit, "cut-before", false),
        (Cut::AfterCommit, "cut-after", true),
    ] {
        let (client, connection) = via_cutter.connect(NoTls).await.expect("connect via relay");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client.batch_execute("BEGIN").await.unwrap();
        let s = submit(&client, "shopper", key, PROVIDER, &params_for(key))
            .await
            .unwrap();
        let b = begin(&client, s.job_id, None, "1 minute").await.unwrap();
        cutter.arm(cut);
        assert!(
            client.batch_execute("COMMIT").await.is_err(),
            "{key}: the client never hears"
        );
        let created = retry_same_key(&observer, key, &v, key).await;
        v.check(created != committed, || {
            format!("{key}: committed = {committed}, but the retry said created = {created}")
        });
        if committed {
            // The attempt begun in that transaction is there; complete it through the relay,
            // lose that answer too, and retry: the same answer.
            let (client, connection) = via_cutter.connect(NoTls).await.unwrap();
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client.batch_execute("BEGIN").await.unwrap();
            let answer = complete(&client, b.attempt_id, b.version, &result_of(b.attempt_id))
                .await
                .unwrap();
            assert_eq!(answer, "won");
            cutter.arm(Cut::AfterCommit);
            assert!(client.batch_execute("COMMIT").await.is_err());
            let again = complete(&observer, b.attempt_id, b.version, &result_of(b.attempt_id))
                .await
                .unwrap();
            v.check(again == "won", || {
                format!("{key}: the retried completion said {again}")
            });
            let job = job_row(&observer, s.job_id).await;
            v.check(
                job.state == "succeeded" && job.completed_by == Some(b.attempt_id),
                || format!("{key}: job is {} by {:?}", job.state, job.completed_by),
            );
        }
    }

    // 4. Killed *during* the COMMIT, after the commit record is flushed: a synchronous standby
    //    that never answers makes every COMMIT wait there, where pg_terminate_backend catches it.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = 'pg_intent_standby_that_never_answers'",
        "SELECT pg_reload_conf()",
    ] {
        observer.batch_execute(sql).await.unwrap();
    }
    loop {
        let c = db.connect().await;
        let names: String = c
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .unwrap()
            .get(0);
        if !names.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    observer
        .batch_execute("SET synchronous_commit = local")
        .await
        .unwrap();
    {
        // A submit in autocommit, then a completion in autocommit.
        let victim = Arc::new(db.connect_as("victim_syncrep").await);
        let call = {
            let victim = victim.clone();
            tokio::spawn(async move {
                submit(
                    &victim,
                    "shopper",
                    "during-commit",
                    PROVIDER,
                    &params_for("during-commit"),
                )
                .await
            })
        };
        wait_for_wait_event(&observer, "victim_syncrep", "SyncRep").await;
        terminate(&observer, "victim_syncrep").await;
        assert!(
            call.await.unwrap().is_err(),
            "the client never hears its COMMIT"
        );
        let created = retry_same_key(&observer, "during-commit", &v, "killed during COMMIT").await;
        v.check(!created, || {
            "killed during COMMIT: the commit stands, the retry must find the job".into()
        });

        let job = job_id_of("shopper", "during-commit");
        let b = begin(&observer, job, None, "1 minute").await.unwrap();
        let victim = Arc::new(db.connect_as("victim_syncrep_complete").await);
        let call = {
            let victim = victim.clone();
            tokio::spawn(async move {
                complete(&victim, b.attempt_id, b.version, &result_of(b.attempt_id)).await
            })
        };
        wait_for_wait_event(&observer, "victim_syncrep_complete", "SyncRep").await;
        terminate(&observer, "victim_syncrep_complete").await;
        assert!(call.await.unwrap().is_err());
        let again = complete(&observer, b.attempt_id, b.version, &result_of(b.attempt_id))
            .await
            .unwrap();
        v.check(again == "won", || {
            format!("killed during COMMIT of a completion; the retry said {again}")
        });
    }
    for sql in [
        "ALTER SYSTEM RESET synchronous_standby_names",
        "SELECT pg_reload_conf()",
    ] {
        observer.batch_execute(sql).await.unwrap();
    }
    loop {
        let c = db.connect().await;
        let names: String = c
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .unwrap()
            .get(0);
        if names.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // 5. pg_terminate_backend racing the COMMIT at random instants.
    let (mut acked, mut unacked_committed, mut rolled_back) = (0, 0, 0);
    let kill = observer
        .prepare("SELECT pg_terminate_backend($1)")
        .await
        .unwrap();
    for i in 0..races {
        let key = format!("race-{i}");
        let app = format!("victim_race_{i}");
        let victim = Arc::new(db.connect_as(&app).await);
        victim.batch_execute("BEGIN").await.unwrap();
        submit(&victim, "shopper", &key, PROVIDER, &params_for(&key))
            .await
            .unwrap();
        // The COMMIT and the kill each leave after a random pause: either may land first.
        let pid = backend_pid(&victim).await;
        let (commit_after, kill_after) = (rng.between(0, 700), rng.between(0, 300));
        let commit = {
            let victim = victim.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(commit_after as u64)).await;
                victim.batch_execute("COMMIT").await
            })
        };
        tokio::time::sleep(Duration::from_micros(kill_after as u64)).await;
        observer.query(&kill, &[&pid]).await.unwrap();
        let committed_ok = commit.await.unwrap().is_ok();
        let created = retry_same_key(&observer, &key, &v, "racing kill").await;
        match (committed_ok, created) {
            (true, false) => acked += 1,
            (false, false) => unacked_committed += 1,
            (false, true) => rolled_back += 1,
            (true, true) => v.push(format!(
                "{key}: COMMIT said ok, yet the retry created the job"
            )),
        }
    }

    let d = digest(&observer).await;
    figures
        // Killed idle in transaction; socket dropped before COMMIT; after the COMMIT of a
        // submit and of a completion; during the COMMIT of a submit and of a completion.
        .set("staged_kills", 6)
        .set("racing_kills", races)
        .set("acked", acked)
        .set("committed_unacked", unacked_committed)
        .set("rolled_back", rolled_back)
        .set("retries", races + 6)
        .set("jobs", d.jobs)
        .set("violations", v.count())
        .set("full", full());
    figures.print();
    v.assert_none("commit_kill");
}
