//! Where a claim starts reading the claimable queue: past the jobs this backend has already
//! claimed from it, so that its cost does not grow with the row versions an old snapshot keeps
//! alive (docs/architecture.md § The claim under a held snapshot).
//!
//! A claimed job leaves the partial index `jobs_claimable_since`, but while another session holds a
//! snapshot from before the claim (`pg_dump`, a long report, a client idle in a transaction)
//! neither the job's old row version nor its index entry can be removed, and every claim that
//! reads the queue from its start walks them all, one heap visit each: the cost grows with every
//! job claimed since the snapshot began. So a claim reads from the newest job this backend
//! claimed from the same queue last time (its *start*): the index scan begins there and skips
//! the claimed prefix in one descent. (A claim takes the oldest jobs it can lock, so what lies
//! before that point was claimed, or held by another transaction when the claim passed it.)
//!
//! What could be behind the start is a job that became claimable with an older time than one
//! already claimed: its submit committed after a younger job was claimed, or another
//! transaction held it (`SKIP LOCKED`) and let it go unchanged. So the start is forgotten, and
//! the claim reads the whole queue again, when `intent.claim_rescan` has passed since this
//! backend last did (1 s by default; 0 reads the whole queue every time): such a job waits at
//! most that long longer than it would have, and any other backend may take it before.
//! The start is also forgotten when the claim that set it did not commit (its rows are
//! claimable again): it is kept with the transaction that set it, and trusted only while that
//! transaction is this one or committed.
//!
//! Per backend, and only a hint: a claim never runs in a parallel worker (`claim_attempts` is
//! parallel unsafe), and whatever the start, a claim takes only claimable jobs, under the same
//! conditions and locks. Written once for every storage mode: the stores take the start as a
//! lower bound on the queue's key.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// `intent.claim_rescan` (milliseconds): how long a backend's claims may read its queue from
/// where the last one started before reading all of it again.
static CLAIM_RESCAN: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// How many queues (provider lists × bound owner) a backend keeps a start for.
const QUEUES: usize = 16;

/// Registers `intent.claim_rescan`; called from `_PG_init`.
pub fn register() {
    GucRegistry::define_int_guc(
        c"intent.claim_rescan",
        c"How long a backend's claims may start past the jobs it claimed last, before reading the whole claimable queue again.",
        c"A job that became claimable with an older time than one already claimed is found by the next whole read, at most this long later. 0: every claim reads the whole queue.",
        &CLAIM_RESCAN,
        0,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
}

/// A queue as a claim names it: its providers (any when None) and the bound owner.
#[derive(PartialEq, Eq, Clone)]
pub struct Queue {
    pub providers: Option<Vec<String>>,
    pub owner: Option<String>,
}

struct Start {
    queue: Queue,
    /// The newest time (`retry_at` before the claim; `coalesce(retry_at, updated_at)` on an older catalog) the last claim that took jobs took,
    /// and the (sub)transaction that took it (a full transaction id).
    from: Option<(i64, u64)>,
    /// When this backend last read the whole queue.
    read_whole: Instant,
}

thread_local! {
    static STARTS: RefCell<Vec<Start>> = const { RefCell::new(Vec::new()) };
}

/// Where a claim of `queue` starts: None to read the whole queue.
pub fn start(queue: &Queue) -> Option<TimestampWithTimeZone> {
    let rescan = Duration::from_millis(u64::try_from(CLAIM_RESCAN.get()).unwrap_or(0));
    if rescan.is_zero() {
        return None;
    }
    STARTS.with_borrow_mut(|starts| {
        let s = starts.iter_mut().find(|s| s.queue == *queue)?;
        if s.read_whole.elapsed() >= rescan {
            return None;
        }
        let (from, xid) = s.from?;
        if !committed_or_current(xid) {
            s.from = None;
            return None;
        }
        TimestampWithTimeZone::try_from(from).ok()
    })
}

/// Whether the (sub)transaction `xid` (a full transaction id) is this one, or committed. Asked
/// through `pg_xact_status`, which answers NULL, not an error, for an xid older than the commit
/// log keeps (a start may be kept for hours while the queue is idle).
fn committed_or_current(xid: u64) -> bool {
    // The xid: the low 32 bits of the full one.
    let short = pg_sys::TransactionId::from_inner(xid as u32);
    // SAFETY: a check of this backend's own transaction state, for an xid it was assigned.
    if unsafe { pg_sys::TransactionIdIsCurrentTransactionId(short) } {
        return true;
    }
    // SAFETY: pg_xact_status(xid8) with an xid8 datum (passed by value), as its SQL signature
    // says; an xid this backend was assigned is never in the future.
    let status = unsafe {
        pgrx::direct_function_call::<String>(
            pg_sys::pg_xact_status,
            &[Some(pg_sys::Datum::from(xid))],
        )
    };
    status.as_deref() == Some("committed")
}

/// Records a claim of `queue` that read from `started` (None: the whole queue) and took jobs
/// whose newest time is `newest` (None: took none).
pub fn claimed(
    queue: &Queue,
    started: Option<TimestampWithTimeZone>,
    newest: Option<TimestampWithTimeZone>,
) {
    STARTS.with_borrow_mut(|starts| {
        let i = match starts.iter().position(|s| s.queue == *queue) {
            Some(i) => i,
            None => {
                if starts.len() >= QUEUES {
                    starts.remove(0);
                }
                starts.push(Start {
                    queue: queue.clone(),
                    from: None,
                    read_whole: Instant::now(),
                });
                starts.len() - 1
            }
        };
        let s = &mut starts[i];
        // The transaction that took the jobs: on Citus the rows are written on the workers, so
        // the coordinator's transaction may have no xid of its own yet.
        // SAFETY: assigns this (sub)transaction an xid if it has none, as any write would.
        let taken = newest.map(|t| {
            (
                t.into_inner(),
                unsafe { pg_sys::GetCurrentFullTransactionId() }.value,
            )
        });
        if started.is_none() {
            s.read_whole = Instant::now();
        }
        // A claim that took nothing keeps the start it had: an idle worker's polls read from
        // there, not the whole queue (which is what a held snapshot makes costly).
        if taken.is_some() {
            s.from = taken;
        }
    });
}
