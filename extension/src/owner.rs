//! Owner isolation: the setting `intent.owner_id` binds a session to one owner.
//!
//! It is a superuser-only setting (PGC_SUSET): a role can be bound for good with
//! `ALTER ROLE … SET intent.owner_id`, and a trusted gateway can be allowed to bind each request
//! with `GRANT SET ON PARAMETER intent.owner_id`. The row-level security policies of
//! `sql/isolation.sql` read the binding through [`bound_owner`]; `submit_job` refuses to act for
//! anyone else. The binding is, in this order:
//!
//! 1. no owner at all, for the rest of the session, if the library was first loaded in parallel
//!    mode while the setting held a value PostgreSQL could not re-apply there ([`POISONED`]);
//! 2. the owner a running contract checker is pinned to ([`pinned`]; a checker sees no owner);
//! 3. the setting, or when it is empty the binding the session user's role (or the database) was
//!    given, read from `pg_db_role_setting` (by an index scan, no SQL: the library loads in
//!    parallel workers, at `session_preload_libraries` time and inside arbitrary statements) as
//!    PostgreSQL reads it at login — so a binding a client displaced before the library loaded
//!    (a startup option, a `SET` of the placeholder, which PostgreSQL discards when the library
//!    loads), or one that could not be re-applied in parallel mode, binds all the same (`SHOW
//!    intent.owner_id` then reads empty; `intent.bound_owner()` tells);
//!    — but no owner at all if the setting has changed within the transaction after it first
//!    bound it: one transaction acts for one owner ([`FIRST_IN_TRANSACTION`]);
//! 4. intersected with the binding of the role the code runs as, when that is not the session
//!    user (SET ROLE, a SECURITY DEFINER function, a maintenance command running a table
//!    owner's index expression): a tenant's own code, wherever it runs, reads as that tenant.

use crate::refusal::{Answer, Refusal};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};

static OWNER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// A role's binding read from the catalog: the owner and the source a login applies it with.
type Binding = Option<(String, pg_sys::GucSource::Type)>;

thread_local! {
    /// Bindings read from the catalog, per (role, database, whether it is the session's own
    /// login): PostgreSQL itself reads role settings once, at login. Dropped when a transaction
    /// that filled it aborts (it may have read the transaction's own, uncommitted, setting).
    static BINDINGS: RefCell<HashMap<(pg_sys::Oid, pg_sys::Oid, bool), Binding>> =
        RefCell::new(HashMap::new());
    static FILLED_IN_TRANSACTION: Cell<bool> = const { Cell::new(false) };
    /// The first owner the setting held in the current transaction.
    static FIRST_IN_TRANSACTION: RefCell<Option<String>> = const { RefCell::new(None) };
    /// While a contract's checker runs: the owner its reads are bound to ("": none).
    static PINNED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// The library was first loaded in parallel mode while the setting held a value that could
    /// not be re-applied there: the session acts for no owner (reconnect).
    static POISONED: Cell<bool> = const { Cell::new(false) };
}

/// Registers the setting; called from `_PG_init`.
pub fn register() {
    // SAFETY: reads a setting (a placeholder, before the definition) and the parallel flag.
    let (placeholder, parallel) = unsafe {
        let value = pg_sys::GetConfigOption(c"intent.owner_id".as_ptr(), true, false);
        let value = (!value.is_null())
            .then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
            .filter(|v| !v.is_empty());
        (value, pg_sys::IsInParallelMode())
    };
    define();
    // SAFETY: registers a callback; no SQL.
    unsafe { pg_sys::RegisterXactCallback(Some(transaction_ends), std::ptr::null_mut()) };
    if parallel && placeholder.is_some() && setting() != placeholder {
        // PostgreSQL dropped the value with a WARNING ("cannot be set during a parallel
        // operation"): it may have been a trusted gateway's binding. Fail closed.
        POISONED.set(true);
    }
}

fn define() {
    // SAFETY: the assign hook is guarded and never raises.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"intent.owner_id",
            c"The owner this session acts for (pg_intent owner isolation).",
            c"When set, the session sees and changes only this owner's jobs, attempts and events. Only superusers, and roles granted SET on it, can change it.",
            &OWNER_ID,
            GucContext::Suset,
            // RESET ALL (which any role may run, from any code, DISCARD ALL too) must not undo
            // a binding: a tenant's trigger fired inside a gateway's bound transaction could
            // otherwise unbind the rest of it. RESET intent.owner_id itself is superuser-only.
            GucFlags::NO_RESET_ALL,
            None,
            Some(assign_owner),
            None,
        );
    }
}

/// Remembers the first owner the setting holds in a transaction.
#[pg_guard]
unsafe extern "C-unwind" fn assign_owner(newval: *const c_char, _extra: *mut c_void) {
    // SAFETY: newval is the setting's new value (or NULL); the transaction state is a read.
    let value = unsafe {
        if newval.is_null() || !pg_sys::IsTransactionState() {
            return;
        }
        CStr::from_ptr(newval).to_string_lossy().into_owned()
    };
    if !value.is_empty() && FIRST_IN_TRANSACTION.with_borrow(Option::is_none) {
        FIRST_IN_TRANSACTION.set(Some(value));
    }
}

/// At the end of every transaction: forget its first owner; after an abort, forget what was
/// read from the catalog during it.
#[pg_guard]
unsafe extern "C-unwind" fn transaction_ends(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PREPARE => {
            FIRST_IN_TRANSACTION.set(None);
            FILLED_IN_TRANSACTION.set(false);
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            FIRST_IN_TRANSACTION.set(None);
            if FILLED_IN_TRANSACTION.replace(false) {
                BINDINGS.with_borrow_mut(HashMap::clear);
            }
        }
        _ => {}
    }
}

/// The binding `role` was given (`login`: the session user's own login binding, database-wide
/// ones included), from the catalog once; None when there is none, or when no catalog can be
/// read here (outside a transaction).
fn binding_of(role: pg_sys::Oid, login: bool) -> Binding {
    // SAFETY: plain reads of backend globals.
    let (in_transaction, database) =
        unsafe { (pg_sys::IsTransactionState(), pg_sys::MyDatabaseId) };
    if let Some(b) = BINDINGS.with_borrow(|m| m.get(&(role, database, login)).cloned()) {
        return b;
    }
    if !in_transaction || database == pg_sys::InvalidOid {
        return None;
    }
    // SAFETY: catalog access inside a transaction, as process_settings() does at login.
    let binding = unsafe { role_binding(role, login) };
    BINDINGS.with_borrow_mut(|m| m.insert((role, database, login), binding.clone()));
    FILLED_IN_TRANSACTION.set(true);
    binding
}

/// Runs `f` with this session's reads bound to `owner` (empty: to no owner), whatever the
/// setting says: for a contract's checker, which runs in the completing session.
pub fn pinned<R>(owner: &str, f: impl FnOnce() -> R) -> R {
    struct Unpin;
    impl Drop for Unpin {
        fn drop(&mut self) {
            PINNED.with_borrow_mut(|p| p.pop());
        }
    }
    PINNED.with_borrow_mut(|p| p.push(owner.to_string()));
    let _unpin = Unpin;
    f()
}

/// The setting's value, when it holds an owner.
fn setting() -> Option<String> {
    OWNER_ID
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
}

/// `pg_db_role_setting` and its unique index on (setdatabase, setrole): fixed catalog oids.
const DB_ROLE_SETTING: pg_sys::Oid = pg_sys::Oid::from_u32(2964);
const DB_ROLE_SETTING_DATID_ROLID_INDEX: pg_sys::Oid = pg_sys::Oid::from_u32(2965);
/// Its columns setdatabase, setrole, setconfig.
const SETDATABASE: pg_sys::AttrNumber = 1;
const SETROLE: pg_sys::AttrNumber = 2;
const SETCONFIG: pg_sys::AttrNumber = 3;

/// The `intent.owner_id` that `role` was given for this database, with the source PostgreSQL
/// applies it with at login, in its order of precedence: this database and role, the role,
/// and — for the session's own login (`login`) — this database, every database and role.
unsafe fn role_binding(
    role: pg_sys::Oid,
    login: bool,
) -> Option<(String, pg_sys::GucSource::Type)> {
    use pg_sys::GucSource::*;
    let db = unsafe { pg_sys::MyDatabaseId };
    let none = pg_sys::InvalidOid;
    let order = [
        (db, role, PGC_S_DATABASE_USER),
        (none, role, PGC_S_USER),
        (db, none, PGC_S_DATABASE),
        (none, none, PGC_S_GLOBAL),
    ];
    let order = if login { &order[..] } else { &order[..2] };
    unsafe {
        let rel = pg_sys::table_open(DB_ROLE_SETTING, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetCatalogSnapshot(DB_ROLE_SETTING));
        let mut found = None;
        for &(database, role, source) in order {
            if let Some(owner) = setting_of(rel, snapshot, database, role) {
                found = Some((owner, source));
                break;
            }
        }
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// The `intent.owner_id=` entry of one (database, role) row of `pg_db_role_setting`.
unsafe fn setting_of(
    rel: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    database: pg_sys::Oid,
    role: pg_sys::Oid,
) -> Option<String> {
    unsafe {
        let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
        for (key, (attno, value)) in keys
            .iter_mut()
            .zip([(SETDATABASE, database), (SETROLE, role)])
        {
            pg_sys::ScanKeyInit(
                key,
                attno,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::Oid::from(pg_sys::F_OIDEQ),
                pg_sys::Datum::from(value),
            );
        }
        let scan = pg_sys::systable_beginscan(
            rel,
            DB_ROLE_SETTING_DATID_ROLID_INDEX,
            true,
            snapshot,
            2,
            keys.as_mut_ptr(),
        );
        let tuple = pg_sys::systable_getnext(scan);
        let mut found = None;
        if !tuple.is_null() {
            let mut isnull = false;
            let config = pg_sys::heap_getattr(tuple, SETCONFIG as i32, (*rel).rd_att, &mut isnull);
            if !isnull {
                let entries = Vec::<Option<String>>::from_datum(config, false).unwrap_or_default();
                // Setting names compare case-insensitively, as PostgreSQL compares them (a role
                // set with "INTENT.owner_id" is bound at login); the last entry wins, as when
                // PostgreSQL applies the array.
                found = entries
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        let (name, value) = e.split_once('=')?;
                        name.eq_ignore_ascii_case("intent.owner_id")
                            .then(|| value.to_string())
                    })
                    .next_back();
            }
        }
        pg_sys::systable_endscan(scan);
        found
    }
}

/// The owner this session is bound to, or NULL when it is not bound (the module comment gives
/// the rules). An empty text binds to no owner: it matches no row.
#[pg_extern(stable, parallel_safe)]
pub fn bound_owner() -> Option<String> {
    if POISONED.get() {
        return Some(String::new());
    }
    if let Some(pinned) = PINNED.with_borrow(|p| p.last().cloned()) {
        return Some(pinned);
    }
    // SAFETY: plain reads of the backend's user ids.
    let (user, session_user) = unsafe { (pg_sys::GetUserId(), pg_sys::GetSessionUserId()) };
    let session = setting().or_else(|| binding_of(session_user, true).map(|(o, _)| o));
    let session = match FIRST_IN_TRANSACTION.with_borrow(|f| f.clone()) {
        Some(first) if session.as_deref() != Some(first.as_str()) => Some(String::new()),
        _ => session,
    };
    let acting = if user == session_user {
        None
    } else {
        binding_of(user, false).map(|(o, _)| o)
    };
    match (acting, session) {
        (Some(a), Some(s)) if a != s => Some(String::new()),
        (Some(a), _) => Some(a),
        (None, s) => s,
    }
}

/// Whether this session is bound to an owner (to no owner counts).
pub fn is_bound() -> bool {
    bound_owner().is_some()
}

/// Refuses (42501) to act for an owner other than the one the session is bound to.
pub fn check_acting_for(owner_id: &str) -> Answer<()> {
    match bound_owner() {
        Some(bound) if bound.is_empty() => Err(Refusal::insufficient_privilege(format!(
            "this session acts for no owner and cannot submit for owner \"{owner_id}\""
        ))
        .detail("The session's binding changed within the transaction, its role's binding differs from the session's, or the library was first loaded in parallel mode while intent.owner_id had a value it could not keep.")
        .hint("Bind once per transaction (or reconnect).")),
        Some(bound) if bound != owner_id => Err(Refusal::insufficient_privilege(format!(
            "this session acts for owner \"{bound}\" and cannot submit for owner \"{owner_id}\""
        ))
        .detail("The setting intent.owner_id binds the session to one owner.")
        .hint("Submit with the owner_id the session is bound to.")),
        _ => Ok(()),
    }
}
