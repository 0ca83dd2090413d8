//! The distributed mode (Citus, `intent.distribute()`, docs/scale-out.md): whether this
//! database's `intent.jobs` is a distributed table, known per backend.
//!
//! On a single node the answer is false and every call runs its single-node statements
//! unchanged; the only cost is reading a cached boolean. The answer is computed once per
//! backend — without SQL: a syscache probe for the extension `citus` (absent: false, nothing
//! else is read) and, when Citus is there, a scan of its catalog `pg_dist_partition` (a row per
//! distributed table) for `intent.jobs` — and computed again only after a relcache
//! invalidation of `intent.jobs` (Citus sends one when it distributes the table, and an
//! aborted transaction undoes its own).
//!
//! What the calls do differently in that mode is `store/shards.rs`'s concern alone (the seam,
//! `store/mod.rs`).

use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    /// None: not computed since the last invalidation.
    static DISTRIBUTED: Cell<Option<bool>> = const { Cell::new(None) };
    /// The oid of `intent.jobs` the answer was computed for.
    static JOBS: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
}

/// `intent.force_distributed_statements`: the conformance suite's switch (tests/README.md), which
/// runs the distributed mode's statements on a single node so that every suite — the model
/// check included — covers them without a Citus cluster. It can only turn the distributed
/// statements on: on a single node both modes keep the same contract. What a caller can observe
/// besides speed: under contention a distributed claim may take fewer jobs than are claimable
/// (its candidates are read without locks, then taken one by one, `store/shards.rs`).
static FORCE: pgrx::guc::GucSetting<bool> = pgrx::guc::GucSetting::<bool>::new(false);

/// Registers the invalidation callback and the switch; called from `_PG_init` (no SQL, no
/// catalog access).
pub fn register() {
    pgrx::guc::GucRegistry::define_bool_guc(
        c"intent.force_distributed_statements",
        c"Runs the distributed mode's statements on a single node (for the conformance suite).",
        c"Off: the distributed statements run only where intent.jobs is distributed by Citus. On: they run everywhere. Both keep the same contract; the single-node statements are faster, and a claim under contention may take fewer jobs with the distributed ones.",
        &FORCE,
        pgrx::guc::GucContext::Suset,
        pgrx::guc::GucFlags::default(),
    );
    // SAFETY: registers a callback that only resets a cached value.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
}

unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == JOBS.get() {
        DISTRIBUTED.set(None);
    }
}

/// Whether `intent.jobs` is distributed by Citus in this database (or the distributed statements
/// are forced on).
pub fn distributed() -> bool {
    FORCE.get() || on_citus()
}

/// Whether `intent.jobs` really is distributed by Citus (what the switch does not change).
pub fn on_citus() -> bool {
    if let Some(d) = DISTRIBUTED.get() {
        return d;
    }
    // SAFETY: a read of the transaction state; catalog reads only inside a transaction (every
    // API call runs in one).
    if !unsafe { pg_sys::IsTransactionState() } {
        return false;
    }
    let d = unsafe { compute() };
    DISTRIBUTED.set(Some(d));
    d
}

unsafe fn compute() -> bool {
    unsafe {
        // First, so that distributing the table later invalidates a "no" given now.
        let ns = pg_sys::get_namespace_oid(c"intent".as_ptr(), true);
        let jobs = pg_sys::get_relname_relid(c"jobs".as_ptr(), ns);
        JOBS.set(jobs);
        if pg_sys::get_extension_oid(c"citus".as_ptr(), true) == pg_sys::InvalidOid {
            return false;
        }
        let catalog = pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE);
        let partition = pg_sys::get_relname_relid(c"pg_dist_partition".as_ptr(), catalog);
        if jobs == pg_sys::InvalidOid || partition == pg_sys::InvalidOid {
            return false;
        }
        let rel = pg_sys::table_open(partition, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        // pg_dist_partition.logicalrelid (regclass) is its first column.
        pg_sys::ScanKeyInit(
            &mut key,
            1,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_OIDEQ),
            pg_sys::Datum::from(jobs),
        );
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            std::ptr::null_mut(),
            1,
            &mut key,
        );
        let found = !pg_sys::systable_getnext(scan).is_null();
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}
