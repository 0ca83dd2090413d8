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
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

/// One SQL statement of the protocol, with the types of its parameters: a `static` beside the
/// code that runs it. There is no list of statements to keep in step: a statement's plan is
/// cached under the statement's own address, the first time it runs in a backend.
pub struct Statement {
    /// How panics and logs name it.
    pub name: &'static str,
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    /// Kept plans by statement (its address) and by whether they were built with the owner
    /// isolation policies applied (false) or without them for sessions not bound to an owner
    /// (true, see entry.rs). PostgreSQL's plan cache does not tell the two apart, so a plan
    /// must never cross from one to the other.
    static CACHE: RefCell<HashMap<(usize, bool), Rc<OwnedPreparedStatement>>> =
        RefCell::new(HashMap::new());
}

fn plan(client: &SpiClient<'_>, stmt: &'static Statement) -> Rc<OwnedPreparedStatement> {
    // SAFETY: reads the backend's security context.
    let slot = (std::ptr::from_ref(stmt) as usize, unsafe {
        pg_sys::InNoForceRLSOperation()
    });
    if let Some(plan) = CACHE.with_borrow(|cache| cache.get(&slot).cloned()) {
        return plan;
    }
    let types: Vec<PgOid> = stmt.args.iter().map(|oid| PgOid::from(*oid)).collect();
    let plan = Rc::new(
        client
            .prepare_mut(stmt.sql, &types)
            .unwrap_or_else(|e| panic!("pg_intent: cannot prepare statement {}: {e}", stmt.name))
            .keep(),
    );
    CACHE.with_borrow_mut(|cache| cache.insert(slot, plan.clone()));
    plan
}

/// Runs a protocol statement and returns its rows.
pub fn run<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    let plan = plan(client, stmt);
    client
        .update(&*plan, None, args)
        .unwrap_or_else(|e| panic!("pg_intent: statement {} failed: {e}", stmt.name))
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
    stmt: &'static Statement,
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
