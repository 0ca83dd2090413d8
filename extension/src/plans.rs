//! Statements prepared once per backend and kept, so no call re-parses or re-plans its SQL.
//!
//! Every statement is prepared as mutating: SPI then takes a fresh snapshot for each one under
//! READ COMMITTED, which is what lets the lookup after `INSERT … ON CONFLICT DO NOTHING` see the
//! row that another transaction has just committed. Kept plans are revalidated by PostgreSQL
//! itself when the objects they use change.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};
use pgrx::{FromDatum, IntoDatum};
use std::cell::RefCell;
use std::ffi::CStr;
use std::rc::Rc;

/// Every statement of the protocol, by name: its position in the per-backend plan cache, and
/// how panics and logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Name {
    // batch.rs
    FindJobs,
    InsertJobs,
    DefinedContracts,
    // begin.rs
    StartAttempt,
    /// `StartAttempt` on the catalog of 0.2.0.
    StartAttempt0_2,
    // claim.rs
    Claim,
    /// `Claim` for a session bound to an owner, naming it.
    ClaimBound,
    // contract.rs
    Contract,
    CallerMayUse,
    UpsertContract,
    Certify,
    ValidityOk,
    Revoke,
    Certification,
    /// `Contract` on the catalog of 0.1.0.
    Contract0_1,
    /// `UpsertContract` on the catalog of 0.1.0.
    UpsertContract0_1,
    // decisions.rs
    Abandon,
    /// `Abandon` on the catalog of 0.2.0.
    Abandon0_2,
    Cancel,
    FindReconciled,
    WasUnknown,
    RecordReconciled,
    /// `RecordReconciled` in the distributed mode: `INSERT … VALUES`, routed by the job id.
    RecordReconciledDist,
    // finish.rs
    Complete,
    LogResultAfterFailure,
    FailAttempt,
    LogViolation,
    FailJob,
    ReopenJob,
    /// `ReopenJob` on the catalog of 0.2.0.
    ReopenJob0_2,
    LogLateFailure,
    // job.rs
    LockJob,
    ReadAttempt,
    OpenAttempt,
    SettleLapsed,
    // lease.rs
    MarkUnknown,
    Heartbeat,
    LapsedAttempts,
    /// `LapsedAttempts` in the distributed mode, naming the bound owner.
    LapsedAttemptsDist,
    TryLockJob,
    // purge.rs
    RetentionOk,
    PurgeBatch,
    // submit.rs
    InsertJob,
    RunningLapsed,
    // dist.rs (the distributed mode), submit.rs, claim.rs and purge.rs in that mode
    FindJobDist,
    LockJobDist,
    FirstVersionDist,
    ReadAttemptDist,
    JobFactsDist,
    LoggedDist,
    InsertAttemptDist,
    MarkRunningDist,
    AttemptUnknownDist,
    JobUnknownDist,
    EventLapsedDist,
    EventCallerTimeoutDist,
    EventAbandonedDist,
    EventCancelledDist,
    EventLostDist,
    EventResultAfterFailureDist,
    EventViolationDist,
    EventLateFailureDist,
    HeartbeatDist,
    AbandonAttemptDist,
    JobPendingDist,
    CancelJobDist,
    OpenAttemptIdDist,
    WinDist,
    AttemptReturnedDist,
    FailAttemptDist,
    FailJobDist,
    ReopenJobDist,
    ClaimCandidatesDist,
    ClaimLockDist,
    PurgeCandidatesDist,
    PurgeLockDist,
    PurgeEventsDist,
    PurgeJobDist,
    RetireDist,
    UpsertContractDist,
}

impl Name {
    /// How many statements there are.
    pub const COUNT: usize = Name::UpsertContractDist as usize + 1;
}

/// One SQL statement of the protocol, with the types of its parameters.
pub struct Statement {
    pub name: Name,
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

/// The cache's size, per mode.
const SLOTS: usize = Name::COUNT;

thread_local! {
    /// Plans built with the owner isolation policies applied (the first SLOTS), and without them
    /// for sessions not bound to an owner (the next SLOTS, see entry.rs). PostgreSQL's plan
    /// cache does not tell the two apart, so a plan must never cross from one to the other.
    static CACHE: RefCell<Vec<Option<Rc<OwnedPreparedStatement>>>> =
        RefCell::new((0..2 * SLOTS).map(|_| None).collect());
}

fn plan(client: &SpiClient<'_>, stmt: &Statement) -> Rc<OwnedPreparedStatement> {
    // SAFETY: reads the backend's security context.
    let slot = if unsafe { pg_sys::InNoForceRLSOperation() } {
        SLOTS + stmt.name as usize
    } else {
        stmt.name as usize
    };
    if let Some(plan) = CACHE.with_borrow(|cache| cache[slot].clone()) {
        return plan;
    }
    let types: Vec<PgOid> = stmt.args.iter().map(|oid| PgOid::from(*oid)).collect();
    let plan = Rc::new(
        client
            .prepare_mut(stmt.sql, &types)
            .unwrap_or_else(|e| panic!("pg_intent: cannot prepare statement {:?}: {e}", stmt.name))
            .keep(),
    );
    CACHE.with_borrow_mut(|cache| cache[slot] = Some(plan.clone()));
    plan
}

/// Runs a protocol statement and returns its rows.
pub fn run<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &Statement,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    let plan = plan(client, stmt);
    client
        .update(&*plan, None, args)
        .unwrap_or_else(|e| panic!("pg_intent: statement {:?} failed: {e}", stmt.name))
}

/// [`run`] with the statement's generic plan (`plan_cache_mode = force_generic_plan` for this
/// execution only, whatever the session set), built once per backend and kept, and planned
/// with `settings` (planner settings, at the same GUC level) as well.
///
/// By default PostgreSQL plans a kept statement afresh for each execution when the generic plan
/// looks costlier than its custom plans, and custom planning reads the table's statistics and
/// probes its indexes' ends: for a bound claim, work (and time) that follows the other owners'
/// rows even though the plan then reads none of them (0.1 → 0.4 ms with 400,000 of them).
pub fn run_generic<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &Statement,
    args: &[DatumWithOid<'_>],
    settings: &[(&CStr, &CStr)],
) -> SpiTupleTable<'conn> {
    let _pinned = Settings::push(&[(c"plan_cache_mode", c"force_generic_plan")], settings);
    run(client, stmt, args)
}

/// Settings at a GUC level of their own, until dropped.
struct Settings {
    level: std::ffi::c_int,
}

impl Settings {
    fn push(first: &[(&CStr, &CStr)], more: &[(&CStr, &CStr)]) -> Self {
        // SAFETY: as entry::PinnedSearchPath: what fmgr_security_definer does for a function's
        // SET clause. The values are copied by the GUC machinery; the level is closed in
        // `drop`, or by the abort of the (sub)transaction an error ends.
        let level = unsafe {
            let level = pg_sys::NewGUCNestLevel();
            for (name, value) in first.iter().chain(more) {
                pg_sys::set_config_option(
                    name.as_ptr(),
                    value.as_ptr(),
                    pg_sys::GucContext::PGC_USERSET,
                    pg_sys::GucSource::PGC_S_SESSION,
                    pg_sys::GucAction::GUC_ACTION_SAVE,
                    true,
                    0,
                    false,
                );
            }
            level
        };
        Settings { level }
    }
}

impl Drop for Settings {
    fn drop(&mut self) {
        // SAFETY: closes the level opened in `push`.
        unsafe { pg_sys::AtEOXact_GUC(true, self.level) };
    }
}

/// The first row of a result, positioned for reading, or None when there is no row.
pub fn first<'conn>(table: SpiTupleTable<'conn>) -> Option<SpiTupleTable<'conn>> {
    if table.is_empty() {
        None
    } else {
        Some(table.first())
    }
}

/// Reads column `ordinal` (1-based) of the current row; NULL is None.
pub fn get<T: FromDatum + IntoDatum>(row: &SpiTupleTable<'_>, ordinal: usize) -> Option<T> {
    row.get::<T>(ordinal)
        .unwrap_or_else(|e| panic!("pg_intent: cannot read column {ordinal}: {e}"))
}

/// Reads a column that the statement guarantees is not NULL.
pub fn must<T: FromDatum + IntoDatum>(row: &SpiTupleTable<'_>, ordinal: usize) -> T {
    get(row, ordinal).unwrap_or_else(|| panic!("pg_intent: column {ordinal} is unexpectedly NULL"))
}
