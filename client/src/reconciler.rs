//! Resolving attempts whose outcome is `unknown` by asking the provider what became of them.
//!
//! A worker sends every provider call with the attempt's **provider idempotency key**: the
//! attempt id, or its keyed derivation ([`crate::ProviderKeys`]; use one when several parties
//! share a provider account, see [`crate::provider_keys`])
//! (`pg_intent_harness::ContractSuite::work_for`, `pg_intent_harness::Request::idempotency_key`).
//! When the worker then loses track of the call (its timeout fired, it crashed), the provider
//! can still be asked "what happened to request K?" — Stripe's model, which any provider that
//! keeps requests by idempotency key can answer. A [`Reconciler`] asks, through a
//! [`StatusLookup`] you give it, and applies the rules of docs/runbook.md § 2:
//!
//! | the provider says ([`ProviderStatus`]) | the reconciler | the call |
//! |---|---|---|
//! | [`Done`](ProviderStatus::Done): finished, here is the output | completes the attempt with it: it wins unless another outcome already stood ([`Decision::Completed`]) | `complete_attempt` |
//! | [`NeverReceived`](ProviderStatus::NeverReceived), or [`Failed`](ProviderStatus::Failed): it refused or failed the request without doing the work | fails it as retryable: the job goes back to `pending` and the next attempt may begin ([`Decision::Failed`]) | `fail_attempt(retryable => true)` |
//! | [`Running`](ProviderStatus::Running): still working on it | leaves it; asks again next pass ([`Decision::Running`]) | — |
//! | [`CannotTell`](ProviderStatus::CannotTell): no record, records expired | leaves it while it is younger than [`Reconciler::abandon_after`] ([`Decision::TooYoung`]), abandons it after ([`Decision::Abandoned`]); never, without that setting | `abandon_attempt` |
//!
//! A lookup that fails (the status API unreachable, an answer it cannot read) decides nothing
//! ([`Decision::LookupFailed`]): "the provider cannot tell" must be the provider's own answer,
//! never a network error's.
//!
//! # Fairness
//!
//! A pass takes at most [`Reconciler::batch`] (`n`) `unknown` attempts, **in turns between the
//! owners** that have some: first one attempt of every such owner, then a second of every owner
//! that has two, and so on until `n` are taken. Each owner's attempts are taken in order
//! (`started_at`, `id`) **starting after the last one of that owner this reconciler took**,
//! wrapping round. When a turn has more owners than room, the owners are taken **least
//! recently served first**: the reconciler remembers, for each owner that has `unknown`
//! attempts, when a pass last took one of its attempts; an owner it has not served yet ranks by
//! when it first saw it waiting, after every owner it knew before (owners first seen in the
//! same pass: by name). A served owner goes to the back. So an owner that appears later —
//! however many, whatever their names — queues behind every owner already waiting. What it
//! could not decide (nobody can tell yet, still running, the lookup failed, busy, blocked) is
//! therefore not taken again before the owner's other attempts have had their turn, and never
//! displaces another owner's.
//!
//! **The bound.** Let `O` be the largest number of owners with `unknown` attempts at any pass
//! of this reconciler meanwhile, and `u` the largest number of one owner's own `unknown`
//! attempts. Each of that owner's attempts is looked at (asked about, or found busy because
//! another reconciler is asking, or found decided, or blocked) within
//! `⌈O / n⌉ · ⌈u / max(1, ⌊n / O⌋)⌉` passes of any one reconciler, counted from the first pass
//! that begins after it became `unknown` — whatever the other owners hold (their numbers of
//! attempts do not appear in it), and however owners come and go meanwhile. Why: an owner not
//! served in a pass `P` was passed over for `n` owners ahead of it, each of which then goes
//! behind it; owners that start waiting after `P` rank behind it too; so at most
//! `O_P − n − 1` owners stay ahead of it, and each later pass serves `n` of them (or it):
//! it is served within `⌈O / n⌉` passes from its first, and again within `⌈O / n⌉` after each
//! service. Each service takes at least `max(1, ⌊n / O⌋)` of its attempts, in its cursor's
//! order. With `O ≤ n` every owner is served in every pass; an owner with one unknown attempt
//! has it looked at in the **next pass**. (An attempt that becomes `unknown` with a
//! `started_at` before its owner's cursor waits for the owner's wrap, which `u` counts.) An
//! attempt whose lock someone other than a reconciler holds is decided without it at its first
//! turn at least [`Reconciler::busy_grace`] after its first, once a bounded wait for the lock
//! runs out (*Each decision once, and the lock*, below). A pass lasts at most about `n` ×
//! ([`Reconciler::lookup_timeout`] + the calls, each statement bounded by the statement
//! timeout), plus the bounded lock wait of an attempt found locked again; so an owner whose
//! provider never answers, or whose job rows are held in open transactions, makes passes
//! slower, but does not push another owner's turn to a later pass.
//!
//! The memory lives in the [`Reconciler`] (shared by its clones; a new process starts from the
//! oldest again, the bound holding from its first pass): one entry (a cursor and a rank) per
//! owner that had `unknown` attempts at its last pass — an owner that has none left is
//! forgotten — so what it keeps, and sends with each work list, is bounded by the owners
//! waiting, not by history. The database keeps none of it, so any number of reconcilers rotate
//! independently, each keeping the bound in its own passes. The work list numbers every
//! `unknown` attempt within its owner (one window over them, as the old "oldest first" list
//! sorted them all) and reads only the chosen rows whole; a second query lists the owners
//! waiting.
//!
//! # Each decision once, and the lock
//!
//! Any number of reconcilers may run at once, in any number of processes: each attempt is
//! decided once. For every attempt the reconciler opens a `READ COMMITTED` transaction, bounds
//! its waits (`SET LOCAL lock_timeout` to [`Reconciler::lock_timeout`], default the lookup
//! timeout, and `SET LOCAL statement_timeout` to twice that), takes a transaction-level
//! advisory lock on the attempt id without waiting
//! (`pg_try_advisory_xact_lock(`[`LOCK_CLASS`]`, hashtext(id))`; another reconciler holding it
//! means [`Decision::Busy`]), reads the attempt's state **in a later statement** (so that it
//! sees whatever the previous holder committed; an attempt that is no longer `unknown` is
//! [`Decision::AlreadyDecided`]), asks the provider, makes the call, records the `reconciled`
//! event and commits, which releases the lock. An advisory lock rather than
//! `SELECT … FOR UPDATE`: an operator has `SELECT` on `intent.attempts`, and `FOR UPDATE`
//! needs `UPDATE`.
//!
//! **Nobody can hold a pass.** The call takes the job's row lock, which anyone allowed to
//! report on the job holds while its own transaction is open: a bound tenant's
//! `BEGIN; SELECT intent.complete_attempt(…)` left open would have kept the call, and the whole
//! pass, waiting for ever. A decision statement that waits longer than the lock timeout, or
//! runs longer than the statement timeout (Citus applies no `lock_timeout` to locks on its
//! workers: docs/scale-out.md), rolls the decision's transaction back and answers
//! [`Decision::Blocked`]: the attempt is left for a later pass, and the pass goes on with the
//! next attempt. Give tenant roles an `idle_in_transaction_session_timeout` so that such a
//! transaction ends (docs/runbook.md § 2.7).
//!
//! **Nobody else can keep an attempt busy.** Advisory locks need no privilege, and the key is
//! computable by anyone who knows the attempt id (derived from the owner and the job's key), or
//! reads it in `pg_locks` while a reconciler holds it: any role can hold it for its whole
//! session. A reconciler holds it for one lookup and one call. An attempt this reconciler finds
//! locked again at least [`Reconciler::busy_grace`] (default twice the lookup timeout) after
//! it first found it locked is waited for, in a savepoint, at most the lookup timeout plus the
//! statement timeout — longer than a reconciler with the same settings holds it. Granted in
//! that time (its holder was a reconciler, which committed), the attempt is decided with the
//! lock as above (usually: found decided). Only a holder that keeps it all that time leads to
//! a decision **without the lock**: the lookup and the call as above, and the `reconciled` event
//! carries `"without_lock": {"held_by_another_for_s", "first_found_locked_s_ago"}` (the first:
//! how long the holder kept it while this reconciler waited, without a break).
//!
//! **Each decision once, with or without the lock.** Every decision's `reconciled` event
//! carries a `"nonce"` of its own. Two decisions may still meet — two reconcilers deciding
//! without the lock, or one deciding without it while a reconciler with other settings (a
//! shorter wait) holds it: both calls take the job's row lock, so the second runs after the
//! first committed, and its `record_reconciliation` returns the first's event (one per attempt,
//! index `events_one_reconciliation`) instead of its own. Seeing another nonce, **whichever
//! path it took**, it rolls back its whole transaction — its call and whatever that call wrote
//! (a late result, a late failure) — and answers [`Decision::AlreadyDecided`] with the state the
//! first decision left. So the decision is made once; the lock only saves asking the provider
//! twice. This needs pg_intent 0.4.0 on (the `reconciled` event): on a 0.3.0 catalog a locked
//! attempt stays [`Decision::Busy`], and only the lock (with the state read after it) keeps
//! decisions apart.
//!
//! # What is recorded
//!
//! Every decision is recorded with its evidence (what the provider said, [`Lookup::evidence`])
//! as a **`reconciled` event** (`intent.record_reconciliation`, pg_intent 0.4.0 on), in the
//! decision's own transaction: `{"decision": "completed" | "failed" | "abandoned",
//! "attempt_state", "recorded_by", "evidence": {"kind": "reconciled", "decision",
//! "provider_says", "reconciled_by", "evidence", "nonce", …}}` (`"completion"` for a completion,
//! `"provider_error"` for a refusal the provider reported, `"age_s"` and `"abandon_after_s"` for
//! an abandon). Besides it, where each call records it:
//!
//! * **completed**: the attempt row — `succeeded` (or `discarded`, `failed` by the contract)
//!   with the provider's output as its `result`. The output is the job's result and is not
//!   altered; a `lost` completion also logs a `late_result` event, a rejected one a
//!   `contract_violation` event.
//! * **failed**: the attempt's `error` document (the same evidence document; the job's, when no
//!   attempt is left).
//! * **abandoned**: the `abandoned` event, whose `reason` is the same document as JSON text
//!   (at most 1000 characters).
//!
//! On a 0.3.0 catalog (the library upgraded, `ALTER EXTENSION pg_intent UPDATE` not yet run)
//! there is no `reconciled` event; the records above remain.
//!
//! Every decision, and every lookup that failed, is also logged (the `log` target
//! `pg_intent_client`) with its evidence, and returned in the [`Pass`].
//!
//! # Privileges
//!
//! `SELECT` on `intent.attempts` (the work list) and `intent.events` (every decision checks
//! that its record is the one that stands), `EXECUTE` on `sweep`, `abandon_attempt` and
//! `record_reconciliation`: an operator's role (`intent_operator`), on a session bound to no
//! owner.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio_postgres::IsolationLevel;
use uuid::Uuid;

use crate::calls::{
    MAX_REASON_CHARS, abandon_attempt, attempt_record, complete_attempt, fail_attempt,
    record_reconciliation, sweep,
};
use crate::error::{Context, Error};
use crate::exec::{BoxError, Connection, Executor, StatementCache};
use crate::records::AttemptRecord;
use crate::types::{AttemptState, Completion, JobState};

/// What the provider says became of a request (the attempt's id was its idempotency key).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProviderStatus {
    /// It finished: the output, as the worker would have reported it. The attempt is completed
    /// with it.
    Done(Value),
    /// It received the request and refused or failed it without doing the work (a 4xx, a 503
    /// with `Retry-After`, an answer that cannot be used): what it said. The attempt fails,
    /// retryable.
    Failed(Value),
    /// It has no record of ever receiving the request. The attempt fails, retryable.
    NeverReceived,
    /// It is still working on it. The attempt is left; the next pass asks again.
    Running,
    /// Nobody can tell: the provider's records of it are gone (expired, lost) or it has no
    /// status API. The attempt is abandoned once older than [`Reconciler::abandon_after`].
    CannotTell,
}

impl ProviderStatus {
    /// `done`, `failed`, `never_received`, `running` or `cannot_tell`: how the records say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProviderStatus::Done(_) => "done",
            ProviderStatus::Failed(_) => "failed",
            ProviderStatus::NeverReceived => "never_received",
            ProviderStatus::Running => "running",
            ProviderStatus::CannotTell => "cannot_tell",
        }
    }
}

/// A provider's answer to a status lookup: the status, and the evidence it rests on (what was
/// asked and what the provider answered: an URL without credentials, the HTTP status, the
/// provider's own request id, …), recorded with the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// What became of the request.
    pub status: ProviderStatus,
    /// What it rests on (`null`: nothing beyond the status).
    pub evidence: Value,
}

impl Lookup {
    /// A lookup's answer without evidence beyond the status.
    pub fn new(status: ProviderStatus) -> Self {
        Lookup {
            status,
            evidence: Value::Null,
        }
    }

    /// The same answer, with `evidence`.
    pub fn evidence(mut self, evidence: Value) -> Self {
        self.evidence = evidence;
        self
    }
}

/// A boxed future of a status lookup.
pub type LookupFuture<'a> = Pin<Box<dyn Future<Output = Result<Lookup, BoxError>> + Send + 'a>>;

/// Asks a provider what became of an attempt's request (sent with the attempt id as its
/// idempotency key).
///
/// An `Err` means the lookup itself failed (the status API unreachable, an answer that cannot
/// be read): nothing is decided, and the next pass asks again. Answer
/// [`ProviderStatus::CannotTell`] only when the provider says it cannot tell (or has no status
/// API at all): that answer can lead to abandoning the attempt.
///
/// Any `Fn(AttemptRecord) -> impl Future<Output = Result<Lookup, BoxError>>` is one;
/// `pg_intent_harness::RequestLookup` (feature `openai`) asks OpenAI-compatible providers that
/// keep requests by idempotency key.
pub trait StatusLookup: Send + Sync {
    /// What became of `attempt` (its provider is `attempt.provider`).
    fn lookup<'a>(&'a self, attempt: &'a AttemptRecord) -> LookupFuture<'a>;
}

impl<F, Fut> StatusLookup for F
where
    F: Fn(AttemptRecord) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Lookup, BoxError>> + Send + 'static,
{
    fn lookup<'a>(&'a self, attempt: &'a AttemptRecord) -> LookupFuture<'a> {
        Box::pin(self(attempt.clone()))
    }
}

impl<L: StatusLookup + ?Sized> StatusLookup for Arc<L> {
    fn lookup<'a>(&'a self, attempt: &'a AttemptRecord) -> LookupFuture<'a> {
        (**self).lookup(attempt)
    }
}

/// What a reconciler did with one attempt.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// The provider finished: `complete_attempt` answered this (`won`: the job succeeded with
    /// the provider's output).
    Completed(Completion),
    /// The provider never received it, or refused it: `fail_attempt` (retryable) left the job
    /// in this state (`pending`: another attempt may begin; `failed`: none left).
    Failed(JobState),
    /// Nobody could tell, and it was older than [`Reconciler::abandon_after`]: abandoned; the
    /// job is `pending` again.
    Abandoned,
    /// The provider is still working on it: left.
    Running,
    /// Nobody could tell, and it is younger than [`Reconciler::abandon_after`] (or abandoning
    /// is off): left.
    TooYoung {
        /// How long ago it started.
        age: Duration,
    },
    /// Its lock is held by someone else — another reconciler deciding it at this moment: left
    /// to it. (Found locked again [`Reconciler::busy_grace`] later, the reconciler waits for the
    /// lock, and decides without it only when one holder keeps it longer than a reconciler
    /// would.)
    Busy,
    /// It was no longer `unknown` when its lock was taken (decided by another reconciler, a
    /// person or the worker's late report), or another decision's `reconciled` event stood
    /// when this one recorded its own (this one then rolled back): nothing to do.
    AlreadyDecided(AttemptState),
    /// It no longer exists (purged with its job): nothing to do.
    Gone,
    /// The lookup failed or took longer than [`Reconciler::lookup_timeout`]: left; the next
    /// pass asks again.
    LookupFailed(String),
    /// A statement of the decision waited longer than [`Reconciler::lock_timeout`] for a lock
    /// someone else holds (the job's row, held by another session's open transaction: a late
    /// report that never commits), or ran longer than its statement timeout (SQLSTATE `55P03`
    /// or `57014`, the server's message here): the decision's transaction rolled back, nothing
    /// of it stays, and the attempt is left for a later pass; the pass goes on with the next.
    Blocked(String),
}

impl Decision {
    /// Whether the attempt was decided by this reconciler (completed, failed or abandoned), as
    /// opposed to left as it was.
    pub fn is_decision(&self) -> bool {
        matches!(
            self,
            Decision::Completed(_) | Decision::Failed(_) | Decision::Abandoned
        )
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Completed(c) => write!(f, "completed with the provider's output ({c})"),
            Decision::Failed(s) => write!(f, "failed as retryable (the job is {s})"),
            Decision::Abandoned => f.write_str("abandoned: nobody can tell"),
            Decision::Running => f.write_str("left: the provider is still working on it"),
            Decision::TooYoung { age } => write!(f, "left: nobody can tell yet ({age:?} old)"),
            Decision::Busy => f.write_str("left: another reconciler holds it"),
            Decision::AlreadyDecided(s) => write!(f, "already decided ({s})"),
            Decision::Gone => f.write_str("gone (purged)"),
            Decision::LookupFailed(e) => write!(f, "left: the lookup failed: {e}"),
            Decision::Blocked(e) => write!(f, "left: the decision waited too long: {e}"),
        }
    }
}

/// One attempt, reconciled.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    /// The attempt.
    pub attempt_id: Uuid,
    /// Its job.
    pub job_id: Uuid,
    /// Its provider.
    pub provider: String,
    /// What was done.
    pub decision: Decision,
    /// What the provider said ([`Lookup::evidence`] with its status), `null` when it was not
    /// asked.
    pub evidence: Value,
}

/// What one [`Reconciler::run_once`] did.
#[derive(Debug, Default)]
pub struct Pass {
    /// How many lapsed leases `sweep` persisted as `unknown` first.
    pub swept: u64,
    /// Each attempt of the work list, in order.
    pub reconciled: Vec<Reconciled>,
    /// The attempts whose call the database refused or could not run (each in a transaction
    /// of its own, rolled back): they stay `unknown` for the next pass.
    pub errors: Vec<(Uuid, Error)>,
}

impl Pass {
    /// The attempts decided (completed, failed or abandoned) in this pass.
    pub fn decided(&self) -> impl Iterator<Item = &Reconciled> {
        self.reconciled.iter().filter(|r| r.decision.is_decision())
    }
}

/// A connection a reconciler can run its transactions on: a [`Connection`], or (feature
/// `deadpool`) a pooled `deadpool_postgres::Object`. Not in a transaction already, and not used
/// by anything else while the reconciler runs.
pub trait Transactional: Executor + sealed::Sealed {
    /// The client to begin transactions on, and the statement cache of its connection if it
    /// keeps one the calls can share (without one, a pass prepares its statements once).
    #[doc(hidden)]
    fn client_and_cache(&mut self) -> (&mut tokio_postgres::Client, Option<&StatementCache>);
}

mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for Connection {}

impl Transactional for Connection {
    fn client_and_cache(&mut self) -> (&mut tokio_postgres::Client, Option<&StatementCache>) {
        let (client, cache) = self.parts_mut();
        (client, Some(cache))
    }
}

#[cfg(feature = "deadpool")]
impl sealed::Sealed for deadpool_postgres::Object {}

#[cfg(feature = "deadpool")]
impl Transactional for deadpool_postgres::Object {
    fn client_and_cache(&mut self) -> (&mut tokio_postgres::Client, Option<&StatementCache>) {
        // deadpool's statement cache is keyed by SQL text and lives with the connection; the
        // transaction's calls use a cache of their own instead, for one pass.
        let client: &mut tokio_postgres::Client = &mut *self;
        (client, None)
    }
}

/// The first key of the reconciler's advisory locks (the second is `hashtext(attempt id)`):
/// `'pgir'` in ASCII, so that the locks are recognisable in `pg_locks` (`classid`).
pub const LOCK_CLASS: i32 = 0x7067_6972;

/// The default [`Reconciler::batch`].
pub const DEFAULT_BATCH: u32 = 100;

/// The default [`Reconciler::lookup_timeout`].
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The work list of a pass (see *Fairness*): every `unknown` attempt numbered within its owner
/// (its *turn*), starting after the owner's cursor (`$2`–`$4`: the last attempt of that owner
/// this reconciler took, `NULL` for none) and wrapping round; taken turn by turn, each turn's
/// owners by their rank (`$5`: least recently served first; an owner this reconciler does not
/// know yet comes after all it knows, by name), at most `$1`. Only the chosen rows are read
/// whole.
const WORK_LIST: &str = "\
WITH known AS (
    SELECT * FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::timestamptz[]),
                             pg_catalog.unnest($4::uuid[]), pg_catalog.unnest($5::int8[]))
                      AS c(owner_id, started_at, id, rank)
), turns AS (
    SELECT a.id, a.owner_id::text AS owner_id, c.rank,
           pg_catalog.row_number() OVER (PARTITION BY a.owner_id ORDER BY
               coalesce((a.started_at, a.id) <= (c.started_at, c.id), false), a.started_at, a.id) AS turn
      FROM intent.attempts a LEFT JOIN known c ON c.owner_id = a.owner_id::text
     WHERE a.state = 'unknown'
), chosen AS (
    SELECT id, owner_id, turn, rank FROM turns ORDER BY turn, rank NULLS LAST, owner_id LIMIT $1
)
SELECT a.id, a.job_id, a.attempt_no, a.provider, a.state::text, a.version_read, a.worker, a.lease,
       a.started_at, a.deadline, a.finished_at, a.result, a.error, w.owner_id
  FROM chosen w JOIN intent.attempts a ON a.id = w.id
 ORDER BY w.turn, w.rank NULLS LAST, w.owner_id";

/// The owners that have `unknown` attempts now: who joins the rotation, and whose entry the
/// reconciler can forget.
const OWNERS_WAITING: &str =
    "SELECT DISTINCT owner_id::text FROM intent.attempts WHERE state = 'unknown'";

/// How long a reconciler remembers an attempt it found locked and has not seen since.
const FORGET_LOCKED_AFTER: Duration = Duration::from_secs(3600);

/// What a reconciler remembers of one owner that has `unknown` attempts.
#[derive(Debug, Clone, Copy)]
struct Turn {
    /// The last of its attempts a pass took: `(started_at, id)`; `None` before the first.
    cursor: Option<(SystemTime, Uuid)>,
    /// Its place in the rotation: when it was last served (a pass took one of its attempts),
    /// or, never served, when it was first seen waiting. Smaller goes first.
    rank: i64,
}

/// A reconciler's memory between passes (the module documentation: *Fairness*, and *Each
/// decision once, and the lock*).
#[derive(Debug, Default)]
struct Fairness {
    /// One entry per owner that had `unknown` attempts at the last pass, no more.
    owners: HashMap<String, Turn>,
    /// The next rank to hand out: larger than every rank handed out before.
    next_rank: i64,
    /// Attempts found locked by someone else: since when, and when last.
    locked: HashMap<Uuid, (Instant, Instant)>,
}

type Cursors = (
    Vec<String>,
    Vec<Option<SystemTime>>,
    Vec<Option<Uuid>>,
    Vec<i64>,
);

impl Fairness {
    fn cursors(&self) -> Cursors {
        let n = self.owners.len();
        let (mut owners, mut starts, mut ids, mut ranks) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (owner, turn) in &self.owners {
            owners.push(owner.clone());
            starts.push(turn.cursor.map(|c| c.0));
            ids.push(turn.cursor.map(|c| c.1));
            ranks.push(turn.rank);
        }
        (owners, starts, ids, ranks)
    }

    /// After a work list (`owners[i]` the owner of `work[i]`) and the owners `waiting` now:
    /// forgets the owners that have no `unknown` attempt left; an owner first seen waiting and
    /// not served ranks after every owner known before (and before those served in this
    /// pass); each owner served moves its cursor on to the last of its attempts taken and goes
    /// to the back, in the order served.
    fn advance(&mut self, owners: &[String], work: &[AttemptRecord], waiting: &[String]) {
        let seen = self.next_rank;
        let mut keep: HashSet<&str> = waiting.iter().map(String::as_str).collect();
        keep.extend(owners.iter().map(String::as_str));
        self.owners.retain(|owner, _| keep.contains(owner.as_str()));
        for owner in waiting {
            self.owners.entry(owner.clone()).or_insert(Turn {
                cursor: None,
                rank: seen,
            });
        }
        let mut rank = seen;
        let mut served = HashSet::new();
        for (owner, attempt) in owners.iter().zip(work) {
            let turn = self.owners.entry(owner.clone()).or_insert(Turn {
                cursor: None,
                rank: seen,
            });
            turn.cursor = Some((attempt.started_at, attempt.id));
            if served.insert(owner.as_str()) {
                rank += 1;
                turn.rank = rank;
            }
        }
        self.next_rank = rank + 1;
        self.locked
            .retain(|_, (_, seen)| seen.elapsed() < FORGET_LOCKED_AFTER);
    }

    /// The attempt was found locked by someone else: for how long it has been (since this
    /// reconciler first found it so).
    fn locked_for(&mut self, id: Uuid) -> Duration {
        let now = Instant::now();
        let (since, seen) = self.locked.entry(id).or_insert((now, now));
        *seen = now;
        now.duration_since(*since)
    }

    /// The attempt's lock was taken, or it is decided: forget it was found locked.
    fn settled(&mut self, id: Uuid) {
        self.locked.remove(&id);
    }
}

/// Resolves `unknown` attempts by asking their provider (see the [module](self) documentation).
///
/// ```no_run
/// # async fn f(mut db: pg_intent_client::Connection) -> Result<(), pg_intent_client::Error> {
/// use std::time::Duration;
/// use pg_intent_client::reconciler::{Lookup, ProviderStatus, Reconciler};
///
/// // A provider with no status API: nobody can tell, so abandon after 15 minutes.
/// let reconciler = Reconciler::new(|_attempt| async {
///     Ok(Lookup::new(ProviderStatus::CannotTell))
/// })
/// .abandon_after(Duration::from_secs(15 * 60))
/// .name("reconciler-1");
/// let pass = reconciler.run_once(&mut db).await?;
/// for r in pass.decided() {
///     println!("{}: {}", r.attempt_id, r.decision);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reconciler {
    lookup: Arc<dyn StatusLookup>,
    abandon_after: Option<Duration>,
    batch: u32,
    lookup_timeout: Duration,
    lock_timeout: Option<Duration>,
    busy_grace: Option<Duration>,
    name: String,
    /// Where the next pass starts, and which attempts were found locked since when: shared by
    /// the clones of one reconciler.
    fair: Arc<Mutex<Fairness>>,
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("abandon_after", &self.abandon_after)
            .field("batch", &self.batch)
            .field("lookup_timeout", &self.lookup_timeout)
            .field("lock_timeout", &self.lock_wait())
            .field("busy_grace", &self.grace())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler asking `lookup`; it never abandons until told
    /// ([`Reconciler::abandon_after`]).
    pub fn new(lookup: impl StatusLookup + 'static) -> Self {
        Reconciler {
            lookup: Arc::new(lookup),
            abandon_after: None,
            batch: DEFAULT_BATCH,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            lock_timeout: None,
            busy_grace: None,
            name: "reconciler".into(),
            fair: Arc::default(),
        }
    }

    /// Abandons an attempt nobody can tell about once it started longer than `age` ago (by
    /// the database's clock). Abandoning means the work may happen twice (runbook § 2.4):
    /// choose an age after which a duplicate is better than waiting. Default: never, such
    /// attempts are left to a person.
    pub fn abandon_after(mut self, age: Duration) -> Self {
        self.abandon_after = Some(age);
        self
    }

    /// Never abandons (the default): an attempt nobody can tell about is left to a person.
    pub fn never_abandon(mut self) -> Self {
        self.abandon_after = None;
        self
    }

    /// How many `unknown` attempts one pass takes on (default [`DEFAULT_BATCH`]; at least 1),
    /// shared out between the owners that have some (the [module](self) documentation:
    /// *Fairness*).
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long one lookup may take (default [`DEFAULT_LOOKUP_TIMEOUT`]). The attempt's
    /// transaction stays open meanwhile.
    pub fn lookup_timeout(mut self, timeout: Duration) -> Self {
        self.lookup_timeout = timeout;
        self
    }

    /// How long a statement of a decision may wait for a lock someone else holds (default: the
    /// [`Reconciler::lookup_timeout`]): `SET LOCAL lock_timeout` in every decision's
    /// transaction, with `SET LOCAL statement_timeout` at twice it (Citus applies no
    /// `lock_timeout` to locks on its workers: docs/scale-out.md). A decision that waits longer
    /// (a tenant's open transaction holds its job's row) is [`Decision::Blocked`]: left for a
    /// later pass, and the pass goes on.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = Some(timeout);
        self
    }

    fn lock_wait(&self) -> Duration {
        self.lock_timeout.unwrap_or(self.lookup_timeout)
    }

    /// A decision statement's `statement_timeout`: twice the lock timeout.
    fn statement_limit(&self) -> Duration {
        self.lock_wait().saturating_mul(2)
    }

    /// How long a reconciler waits for an attempt's lock before deciding without it: longer
    /// than a reconciler with these settings holds it (one lookup, then statements of at most
    /// the statement timeout, each waiting at most the lock timeout).
    fn lock_patience(&self) -> Duration {
        self.lookup_timeout.saturating_add(self.statement_limit())
    }

    /// How long an attempt whose lock someone else holds is left to that holder without waiting
    /// for it (default: twice [`Reconciler::lookup_timeout`]): found locked again at least this
    /// long after it was first found locked, the reconciler waits for the lock, at most the
    /// lookup timeout plus twice the lock timeout (longer than a reconciler holds it: one
    /// lookup and one call), and decides without it only when that wait runs out (the
    /// [module](self) documentation: *Each decision once, and the lock*).
    pub fn busy_grace(mut self, grace: Duration) -> Self {
        self.busy_grace = Some(grace);
        self
    }

    fn grace(&self) -> Duration {
        self.busy_grace
            .unwrap_or_else(|| self.lookup_timeout.saturating_mul(2))
    }

    /// `SET LOCAL lock_timeout` and `statement_timeout` for the decision's statements.
    async fn limit_waits(&self, client: &tokio_postgres::Client) -> Result<(), Error> {
        set_waits(client, self.lock_wait(), self.statement_limit()).await
    }

    /// Waits for the attempt's lock at most [`Reconciler::lock_patience`], in a savepoint (a
    /// lock wait that runs out aborts its statement): `true`, it is held now; `false`, its
    /// holder kept it all that time.
    async fn wait_for_lock(
        &self,
        client: &tokio_postgres::Client,
        id: Uuid,
    ) -> Result<bool, Error> {
        let cx = Context::attempt(id);
        let pg = |e| Error::from_pg(e, cx);
        let patience = self.lock_patience();
        client
            .batch_execute("SAVEPOINT pg_intent_lock_wait")
            .await
            .map_err(pg)?;
        set_waits(
            client,
            patience,
            patience.saturating_add(self.statement_limit()),
        )
        .await?;
        match client
            .execute(
                "SELECT pg_catalog.pg_advisory_xact_lock($1::int4, pg_catalog.hashtext($2::uuid::text))",
                &[&LOCK_CLASS, &id],
            )
            .await
        {
            Ok(_) => {
                // Released, the savepoint keeps the lock (until the transaction ends) and the
                // longer waits: the decision's own come back.
                client
                    .batch_execute("RELEASE SAVEPOINT pg_intent_lock_wait")
                    .await
                    .map_err(pg)?;
                self.limit_waits(client).await?;
                Ok(true)
            }
            Err(e) if is_wait_too_long(e.code()) => {
                client
                    .batch_execute("ROLLBACK TO SAVEPOINT pg_intent_lock_wait")
                    .await
                    .map_err(pg)?;
                Ok(false)
            }
            Err(e) => Err(pg(e)),
        }
    }

    /// Who decides, as recorded (`reconciled_by`) and logged (default `reconciler`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// One pass: `sweep` (lapsed leases become `unknown`), then at most
    /// [`Reconciler::batch`] `unknown` attempts, taken in turns between the owners that have
    /// some, each owner's from where this reconciler's last pass left it (the [module](self)
    /// documentation: *Fairness*), each reconciled as [`Reconciler::reconcile`] does. `db` must
    /// not be in a transaction.
    ///
    /// An `Err` is a failed `sweep` or work list; a call refused for one attempt is in
    /// [`Pass::errors`], and the pass goes on with the next (it stops when the connection is
    /// closed).
    pub async fn run_once<C: Transactional + ?Sized>(&self, db: &mut C) -> Result<Pass, Error> {
        let swept = sweep(&*db).await?;
        let work = self.work_list(&*db).await?;
        let mut pass = Pass {
            swept,
            ..Pass::default()
        };
        let scratch = StatementCache::new();
        for attempt in &work {
            match self.reconcile_with(db, attempt, &scratch).await {
                Ok(r) => pass.reconciled.push(r),
                Err(e) => {
                    log::warn!(
                        target: "pg_intent_client",
                        "{}: attempt {} ({}): not reconciled: {e}",
                        self.name, attempt.id, attempt.provider
                    );
                    pass.errors.push((attempt.id, e));
                    if db.client().is_closed() {
                        break;
                    }
                }
            }
        }
        Ok(pass)
    }

    /// This pass's attempts, in turns between owners (see *Fairness*); the cursors move on
    /// at once, so that a clone running meanwhile takes the next ones.
    async fn work_list(&self, db: &(impl Executor + ?Sized)) -> Result<Vec<AttemptRecord>, Error> {
        let cx = Context::default();
        let (owners, starts, ids, ranks) = self.fairness().cursors();
        let rows = db
            .client()
            .query(
                WORK_LIST,
                &[&i64::from(self.batch), &owners, &starts, &ids, &ranks],
            )
            .await
            .map_err(|e| Error::from_pg(e, cx))?;
        let waiting = db
            .client()
            .query(OWNERS_WAITING, &[])
            .await
            .map_err(|e| Error::from_pg(e, cx))?
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::Decode { source })?;
        let mut work = Vec::with_capacity(rows.len());
        let mut owners = Vec::with_capacity(rows.len());
        for row in &rows {
            work.push(attempt_record(row)?);
            owners.push(
                row.try_get::<_, String>(13)
                    .map_err(|source| Error::Decode { source })?,
            );
        }
        self.fairness().advance(&owners, &work, &waiting);
        Ok(work)
    }

    fn fairness(&self) -> std::sync::MutexGuard<'_, Fairness> {
        self.fair.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reconciles one attempt of [`crate::unknown_attempts`]'s list, in a transaction of its
    /// own on `db` (which must not be in one): takes its lock (or answers
    /// [`Decision::Busy`]), checks that it is still `unknown` (or answers
    /// [`Decision::AlreadyDecided`]), asks the provider, and makes the decision.
    pub async fn reconcile<C: Transactional + ?Sized>(
        &self,
        db: &mut C,
        attempt: &AttemptRecord,
    ) -> Result<Reconciled, Error> {
        self.reconcile_with(db, attempt, &StatementCache::new())
            .await
    }

    async fn reconcile_with<C: Transactional + ?Sized>(
        &self,
        db: &mut C,
        attempt: &AttemptRecord,
        scratch: &StatementCache,
    ) -> Result<Reconciled, Error> {
        let cx = Context::attempt(attempt.id);
        let pg = |e| Error::from_pg(e, cx);
        let (client, cache) = db.client_and_cache();
        let cache = cache.unwrap_or(scratch);
        // READ COMMITTED whatever the session's default: each statement sees what was
        // committed before it began (see `decide`). Dropped on an error, it rolls back.
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(pg)?;
        // Every wait of the decision bounded: a lock held by someone else's open transaction
        // (a tenant's late report on the job's row) makes it `Blocked`, not the pass wait.
        self.limit_waits(tx.client()).await?;
        let (decision, evidence, keep) = match self.decide(&cache.on(&tx), attempt).await {
            Ok(decided) => decided,
            Err(e) if is_wait_too_long(e.pg_error().and_then(tokio_postgres::Error::code)) => {
                log::warn!(
                    target: "pg_intent_client",
                    "{}: attempt {} ({}): left for a later pass, the decision waited too long: {e}",
                    self.name, attempt.id, attempt.provider
                );
                (Decision::Blocked(e.to_string()), Value::Null, false)
            }
            Err(e) => return Err(e),
        };
        if keep {
            tx.commit().await.map_err(pg)?;
        } else {
            tx.rollback().await.map_err(pg)?;
        }
        let reconciled = Reconciled {
            attempt_id: attempt.id,
            job_id: attempt.job_id,
            provider: attempt.provider.clone(),
            decision,
            evidence,
        };
        self.log(&reconciled);
        Ok(reconciled)
    }

    async fn decide(
        &self,
        tx: &(impl Executor + ?Sized),
        attempt: &AttemptRecord,
    ) -> Result<(Decision, Value, bool), Error> {
        let cx = Context::attempt(attempt.id);
        let pg = |e| Error::from_pg(e, cx);
        let client = tx.client();
        let locked: bool = client
            .query_one(
                "SELECT pg_catalog.pg_try_advisory_xact_lock($1::int4, pg_catalog.hashtext($2::uuid::text))",
                &[&LOCK_CLASS, &attempt.id],
            )
            .await
            .map_err(pg)?
            .get(0);
        // Without the lock: decided all the same once one holder has kept it longer than a
        // reconciler holds it (any role can take an advisory lock). Found locked again after
        // `busy_grace`, the reconciler waits for it, longer than a reconciler holds it; only a
        // holder that keeps it all that time (not a reconciler) leads to deciding without it
        // (module documentation: *Each decision once, and the lock*).
        let mut unlocked = None;
        if locked {
            self.fairness().settled(attempt.id);
        } else {
            let grace = self.grace();
            let locked_for = self.fairness().locked_for(attempt.id);
            if locked_for < grace || !records_reconciliations(tx).await? {
                return Ok((Decision::Busy, Value::Null, true));
            }
            let waited = Instant::now();
            if self.wait_for_lock(client, attempt.id).await? {
                self.fairness().settled(attempt.id);
            } else {
                let held = waited.elapsed();
                let found = self.fairness().locked_for(attempt.id);
                log::warn!(
                    target: "pg_intent_client",
                    "{}: attempt {} ({}): its lock was held by someone else all the {held:?} \
                     this reconciler waited for it (first found locked {found:?} ago): deciding \
                     it without the lock",
                    self.name, attempt.id, attempt.provider
                );
                unlocked = Some(json!({
                    "held_by_another_for_s": seconds(held),
                    "first_found_locked_s_ago": seconds(found),
                }));
            }
        }
        // Every decision's `reconciled` event carries a nonce: only the transaction whose event
        // stands commits.
        let nonce = Uuid::new_v4().to_string();
        // A statement of its own, after the lock: under READ COMMITTED it sees what the lock's
        // previous holder committed. (Read in the lock's statement, the state would come from
        // a snapshot taken before the lock was granted, and could be the undecided one.)
        let row = client
            .query_opt(
                "SELECT state::text, version_read, \
                 extract(epoch FROM statement_timestamp() - started_at)::float8 \
                 FROM intent.attempts WHERE id = $1",
                &[&attempt.id],
            )
            .await
            .map_err(pg)?;
        let Some(row) = row else {
            return Ok((Decision::Gone, Value::Null, true));
        };
        let state: AttemptState = row
            .try_get::<_, &str>(0)
            .map_err(|source| Error::Decode { source })?
            .parse()?;
        if state != AttemptState::Unknown {
            self.fairness().settled(attempt.id);
            return Ok((Decision::AlreadyDecided(state), Value::Null, true));
        }
        let version: i64 = row.try_get(1).map_err(|source| Error::Decode { source })?;
        let age_secs: f64 = row.try_get(2).map_err(|source| Error::Decode { source })?;
        let age = Duration::try_from_secs_f64(age_secs.max(0.0)).unwrap_or(Duration::MAX);
        let mut handle = attempt.handle();
        handle.version = version;

        let lookup = match tokio::time::timeout(self.lookup_timeout, self.lookup.lookup(attempt))
            .await
        {
            Err(_) => {
                return Ok((
                    Decision::LookupFailed(format!("no answer within {:?}", self.lookup_timeout)),
                    Value::Null,
                    true,
                ));
            }
            Ok(Err(e)) => return Ok((Decision::LookupFailed(e.to_string()), Value::Null, true)),
            Ok(Ok(lookup)) => lookup,
        };
        let evidence = json!({
            "provider_says": lookup.status.as_str(),
            "evidence": lookup.evidence,
        });
        let record = |decision: &str| {
            let mut recorded = json!({
                "kind": "reconciled",
                "decision": decision,
                "provider_says": lookup.status.as_str(),
                "reconciled_by": self.name,
                "evidence": lookup.evidence,
            });
            if let Some(unlocked) = &unlocked {
                recorded["without_lock"] = unlocked.clone();
            }
            recorded
        };
        let (decision, recorded) = match &lookup.status {
            ProviderStatus::Done(result) => {
                let completion = complete_attempt(tx, &handle, result).await?;
                let mut recorded = record("completed");
                recorded["completion"] = json!(completion.as_str());
                (Decision::Completed(completion), Some(recorded))
            }
            ProviderStatus::Failed(said) => {
                let mut error = record("failed");
                error["provider_error"] = said.clone();
                let state = fail_attempt(tx, &handle, &error, true).await?;
                (Decision::Failed(state), Some(error))
            }
            ProviderStatus::NeverReceived => {
                let error = record("failed");
                let state = fail_attempt(tx, &handle, &error, true).await?;
                (Decision::Failed(state), Some(error))
            }
            ProviderStatus::Running => (Decision::Running, None),
            ProviderStatus::CannotTell => match self.abandon_after {
                Some(after) if age >= after => {
                    let mut reason = record("abandoned");
                    reason["age_s"] = json!(seconds(age));
                    reason["abandon_after_s"] = json!(seconds(after));
                    abandon_attempt(tx, attempt.id, &reason_text(reason.clone())).await?;
                    (Decision::Abandoned, Some(reason))
                }
                _ => (Decision::TooYoung { age }, None),
            },
        };
        // The decision and its evidence as a `reconciled` event, in the decision's own
        // transaction (pg_intent 0.4.0 on; a 0.3.0 catalog keeps the records above only).
        if let Some(mut recorded) = recorded
            && records_reconciliations(tx).await?
        {
            recorded["nonce"] = json!(nonce);
            let event = record_reconciliation(
                tx,
                attempt.id,
                recorded["decision"].as_str().unwrap_or(""),
                &recorded,
            )
            .await?;
            // Another decision may have come first (one made without the lock while this one
            // held it, or this one made without it): its event is the attempt's one
            // reconciliation (`record_reconciliation` returns it, after the job's row lock
            // that both decisions take), and this transaction rolls back, with whatever its
            // own call wrote (a late result, a late failure). Whether with the lock or without.
            let row = client
                .query_one(
                    "SELECT coalesce((SELECT detail #>> '{evidence,nonce}' = $2 \
                     FROM intent.events WHERE id = $1), false), \
                     (SELECT detail ->> 'attempt_state' FROM intent.events WHERE id = $1), \
                     (SELECT state::text FROM intent.attempts WHERE id = $3)",
                    &[&event, &nonce, &attempt.id],
                )
                .await
                .map_err(pg)?;
            let ours: bool = row.get(0);
            if !ours {
                let theirs: Option<String> = row.get(1);
                let now: Option<String> = row.get(2);
                let state = theirs.or(now).unwrap_or_default().parse()?;
                self.fairness().settled(attempt.id);
                return Ok((Decision::AlreadyDecided(state), Value::Null, false));
            }
        }
        if decision.is_decision() {
            self.fairness().settled(attempt.id);
        }
        Ok((decision, evidence, true))
    }

    fn log(&self, r: &Reconciled) {
        let level = match r.decision {
            Decision::Completed(_) | Decision::Failed(_) | Decision::Abandoned => log::Level::Info,
            Decision::LookupFailed(_) => log::Level::Warn,
            _ => log::Level::Debug,
        };
        log::log!(
            target: "pg_intent_client",
            level,
            "{}: attempt {} ({}): {}; evidence: {}",
            self.name,
            r.attempt_id,
            r.provider,
            r.decision,
            r.evidence
        );
    }
}

/// Whether the catalog has `intent.record_reconciliation` (0.4.0 on). Asked in the decision's
/// transaction: calling a function that is not there would abort it, and the decision with it.
async fn records_reconciliations(tx: &(impl Executor + ?Sized)) -> Result<bool, Error> {
    tx.client()
        .query_one(
            "SELECT pg_catalog.to_regprocedure('intent.record_reconciliation(uuid,text,jsonb)') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| Error::from_pg(e, Context::default()))?
        .try_get(0)
        .map_err(|source| Error::Decode { source })
}

/// `SET LOCAL lock_timeout = lock, statement_timeout = statement` (at least a millisecond each:
/// 0 would turn them off).
async fn set_waits(
    client: &tokio_postgres::Client,
    lock: Duration,
    statement: Duration,
) -> Result<(), Error> {
    let ms = |d: Duration| format!("{}ms", d.as_millis().clamp(1, i32::MAX as u128));
    client
        .query_one(
            "SELECT pg_catalog.set_config('lock_timeout', $1, true), \
                    pg_catalog.set_config('statement_timeout', $2, true)",
            &[&ms(lock), &ms(statement)],
        )
        .await
        .map_err(|e| Error::from_pg(e, Context::default()))?;
    Ok(())
}

/// A lock wait that ran out (`55P03`, `lock_not_available`) or a statement that ran out of time
/// (`57014`, `query_canceled`).
fn is_wait_too_long(code: Option<&tokio_postgres::error::SqlState>) -> bool {
    use tokio_postgres::error::SqlState;
    code.is_some_and(|c| *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED)
}

/// Seconds, to the millisecond.
fn seconds(d: Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

/// `reason` as JSON text of at most [`MAX_REASON_CHARS`] characters (what `abandon_attempt`
/// takes), still JSON: a long `evidence` is replaced by the start of its text.
fn reason_text(mut reason: Value) -> String {
    let text = reason.to_string();
    if text.chars().count() <= MAX_REASON_CHARS {
        return text;
    }
    let evidence = reason["evidence"].to_string();
    reason["evidence"] = json!("");
    let room = MAX_REASON_CHARS.saturating_sub(reason.to_string().chars().count() + 16);
    // Escaping can lengthen the cut text: cut until it fits.
    let mut keep = room.min(evidence.chars().count());
    loop {
        let cut: String = evidence.chars().take(keep).collect();
        reason["evidence"] = json!(format!("{cut}…"));
        let text = reason.to_string();
        if text.chars().count() <= MAX_REASON_CHARS || keep == 0 {
            return text;
        }
        keep = keep.saturating_sub((keep / 4).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_stay_json_within_the_limit() {
        let short = json!({"kind": "reconciled", "evidence": {"status": 410}});
        assert_eq!(reason_text(short.clone()), short.to_string());
        let long = json!({"kind": "reconciled", "evidence": {"body": "\"\\".repeat(2000)}});
        let text = reason_text(long);
        assert!(text.chars().count() <= MAX_REASON_CHARS, "{}", text.len());
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["kind"], "reconciled");
        assert!(parsed["evidence"].as_str().unwrap().ends_with('…'));
    }

    fn unknown(id: u128) -> AttemptRecord {
        AttemptRecord {
            id: Uuid::from_u128(id),
            job_id: Uuid::from_u128(id),
            attempt_no: 1,
            provider: "p".into(),
            state: AttemptState::Unknown,
            version_read: 1,
            worker: None,
            lease: Duration::from_secs(60),
            started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(id as u64),
            deadline: SystemTime::UNIX_EPOCH + Duration::from_secs(id as u64 + 60),
            finished_at: None,
            result: None,
            error: None,
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Review B, M2 and L1: served owners go to the back in the order served, an owner first
    /// seen waiting ranks after every owner known before it (and before those served in the
    /// same pass), later newcomers rank after it, and owners with nothing left are forgotten.
    #[test]
    fn owners_rotate_least_recently_served_first_and_are_forgotten_when_done() {
        let mut f = Fairness::default();
        // Pass 1: a and b served; z waiting, not served.
        f.advance(
            &names(&["a", "b", "a"]),
            &[unknown(1), unknown(2), unknown(3)],
            &names(&["a", "b", "z"]),
        );
        let rank = |f: &Fairness, o: &str| f.owners[o].rank;
        assert!(rank(&f, "z") < rank(&f, "a") && rank(&f, "a") < rank(&f, "b"));
        assert_eq!(f.owners["a"].cursor.unwrap().1, Uuid::from_u128(3));
        assert_eq!(f.owners["z"].cursor, None);
        // Pass 2: a and b have nothing left; newcomer y (sorting before z) waits too.
        f.advance(&[], &[], &names(&["y", "z"]));
        assert_eq!(f.owners.len(), 2, "{:?}", f.owners);
        assert!(
            rank(&f, "z") < rank(&f, "y"),
            "a newcomer does not overtake z"
        );
        // Pass 3: z served; then only y waits, and what is kept is y's entry alone.
        f.advance(&names(&["z"]), &[unknown(9)], &names(&["y"]));
        assert!(rank(&f, "y") < rank(&f, "z"));
        f.advance(&[], &[], &names(&["y"]));
        assert_eq!(f.cursors().0, names(&["y"]));
    }

    #[test]
    fn only_calls_are_decisions() {
        assert!(Decision::Completed(Completion::Won).is_decision());
        assert!(Decision::Failed(JobState::Pending).is_decision());
        assert!(Decision::Abandoned.is_decision());
        for left in [
            Decision::Running,
            Decision::Busy,
            Decision::TooYoung {
                age: Duration::ZERO,
            },
            Decision::AlreadyDecided(AttemptState::Succeeded),
            Decision::LookupFailed("x".into()),
            Decision::Blocked("x".into()),
        ] {
            assert!(!left.is_decision(), "{left:?}");
        }
    }
}
