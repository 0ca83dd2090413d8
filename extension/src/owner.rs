//! Owner isolation: the setting `intent.owner_id` binds a session to one owner.
//!
//! It is a superuser-only setting (PGC_SUSET): a role can be bound for good with
//! `ALTER ROLE … SET intent.owner_id`, and a trusted gateway can be allowed to bind each request
//! with `GRANT SET ON PARAMETER intent.owner_id`. The row-level security policies of
//! `sql/isolation.sql` read it through [`bound_owner`]; `submit_job` refuses to act for anyone
//! else.

use crate::refusal::{Answer, Refusal};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CString;

static OWNER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

thread_local! {
    /// The binding the session user was given for this database (`ALTER ROLE … SET
    /// intent.owner_id`, or `ALTER DATABASE`), read from the catalog once per backend and
    /// session user: PostgreSQL itself applies role settings once, at login.
    static ROLE_BINDING: RefCell<Option<RoleBinding>> = const { RefCell::new(None) };
    /// While a contract's checker runs: the owner its reads are bound to (the job's owner, or
    /// the caller's binding; empty: no owner at all), whatever the session's setting says.
    static PINNED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone)]
struct RoleBinding {
    user: pg_sys::Oid,
    database: pg_sys::Oid,
    owner: Option<(String, pg_sys::GucSource::Type)>,
}

/// The session user's role (or database) binding, from the catalog; None when there is none,
/// or when no catalog can be read here (outside a transaction).
fn role_binding_cached() -> Option<(String, pg_sys::GucSource::Type)> {
    // SAFETY: plain reads of backend globals.
    let (in_transaction, user, database) = unsafe {
        (
            pg_sys::IsTransactionState(),
            pg_sys::GetSessionUserId(),
            pg_sys::MyDatabaseId,
        )
    };
    if let Some(b) = ROLE_BINDING.with_borrow(|b| b.clone())
        && b.user == user
        && b.database == database
    {
        return b.owner;
    }
    if !in_transaction || database == pg_sys::InvalidOid {
        return None;
    }
    // SAFETY: catalog access inside a transaction, as process_settings() does at login.
    let owner = unsafe { role_binding() };
    ROLE_BINDING.set(Some(RoleBinding {
        user,
        database,
        owner: owner.clone(),
    }));
    owner
}

/// Registers the setting; called from `_PG_init`.
pub fn register() {
    define();
    restore_role_binding();
}

fn define() {
    GucRegistry::define_string_guc(
        c"intent.owner_id",
        c"The owner this session acts for (pg_intent owner isolation).",
        c"When set, the session sees and changes only this owner's jobs, attempts and events. Only superusers, and roles granted SET on it, can change it.",
        &OWNER_ID,
        GucContext::Suset,
        // RESET ALL (which any role may run, from any code, DISCARD ALL too) must not undo a
        // binding: a tenant's trigger fired inside a gateway's bound transaction could
        // otherwise unbind the rest of it. RESET intent.owner_id itself is superuser-only.
        GucFlags::NO_RESET_ALL,
    );
}

/// A session can set a custom setting before the library that defines it is loaded, and a
/// client can pass one in its startup packet (`options=-c intent.owner_id=…`). PostgreSQL
/// discards such a value when the library loads if the session had no right to set it — but it
/// has already displaced the value the role or database was given with `ALTER ROLE … SET`, so
/// the session would be left unbound: a tenant could escape its binding. This puts the role's
/// (or database's) own setting back, with the priority a login gives it.
///
/// It runs SQL of no kind: the library loads in parallel workers, at `session_preload_libraries`
/// time and in the middle of arbitrary statements, and SQL run there breaks them (parallel
/// query, logins) or runs under the caller's search path. It reads `pg_db_role_setting` the way
/// PostgreSQL itself does at login, by an index scan with the catalog snapshot. Where the
/// setting cannot be changed (parallel mode), the binding is kept aside ([`PENDING`]) and binds
/// the session all the same, until it can be applied.
fn restore_role_binding() {
    // SAFETY: plain reads of backend globals.
    let initializing_worker = unsafe { pg_sys::InitializingParallelWorker };
    // A parallel worker starting up gets the leader's settings right after its libraries are
    // loaded. Loaded at server start (shared_preload_libraries) the setting exists before any
    // client value could displace anything.
    if is_set() || initializing_worker {
        return;
    }
    if let Some((owner, source)) = role_binding_cached() {
        // Where settings cannot change (parallel mode) this does nothing: the binding holds
        // anyway, through role_binding_cached() in bound_owner().
        apply(&owner, source);
    }
}

/// Sets `intent.owner_id` with the priority of `source`; false when PostgreSQL did not (in
/// parallel mode settings cannot change).
fn apply(owner: &str, source: pg_sys::GucSource::Type) -> bool {
    // SAFETY: reads the parallel-mode flag.
    if unsafe { pg_sys::IsInParallelMode() } {
        return false;
    }
    let Ok(value) = CString::new(owner) else {
        return false;
    };
    // SAFETY: a settings change with the priority a login gives it; a failure is a WARNING
    // and a result <= 0, not an error.
    let applied = unsafe {
        pg_sys::set_config_option(
            c"intent.owner_id".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            source,
            pg_sys::GucAction::GUC_ACTION_SET,
            true,
            pg_sys::WARNING as i32,
            false,
        )
    };
    applied > 0
}

/// Runs `f` with this session's reads bound to `owner` (empty: to no owner), whatever the
/// setting says: for a contract's checker, which runs in the completing session but must see
/// no more than the job's owner may.
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

/// `pg_db_role_setting` and its unique index on (setdatabase, setrole): fixed catalog oids.
const DB_ROLE_SETTING: pg_sys::Oid = pg_sys::Oid::from_u32(2964);
const DB_ROLE_SETTING_DATID_ROLID_INDEX: pg_sys::Oid = pg_sys::Oid::from_u32(2965);
/// Its columns setdatabase, setrole, setconfig.
const SETDATABASE: pg_sys::AttrNumber = 1;
const SETROLE: pg_sys::AttrNumber = 2;
const SETCONFIG: pg_sys::AttrNumber = 3;

/// The `intent.owner_id` a login of the session user into this database was given, with the
/// source PostgreSQL applies it with, in its order of precedence: this database and role, the
/// role, this database, every database and role.
unsafe fn role_binding() -> Option<(String, pg_sys::GucSource::Type)> {
    use pg_sys::GucSource::*;
    let (db, role) = unsafe { (pg_sys::MyDatabaseId, pg_sys::GetSessionUserId()) };
    let none = pg_sys::InvalidOid;
    let order = [
        (db, role, PGC_S_DATABASE_USER),
        (none, role, PGC_S_USER),
        (db, none, PGC_S_DATABASE),
        (none, none, PGC_S_GLOBAL),
    ];
    unsafe {
        let rel = pg_sys::table_open(DB_ROLE_SETTING, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetCatalogSnapshot(DB_ROLE_SETTING));
        let mut found = None;
        for (database, role, source) in order {
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

/// The owner this session is bound to, or NULL when it is not bound: the owner a running
/// checker is pinned to; else the setting; else, when the setting is empty, the binding the
/// session user's role (or the database) was given. So a binding that was displaced — a value
/// from the startup packet discarded when the library loaded, a load in parallel mode where the
/// role's value could not be put back, a parallel worker whose leader never loaded the library
/// — binds all the same. (An empty text, inside a checker pinned to no owner, matches no row.)
#[pg_extern(stable, parallel_safe)]
pub fn bound_owner() -> Option<String> {
    if let Some(pinned) = PINNED.with_borrow(|p| p.last().cloned()) {
        return Some(pinned);
    }
    OWNER_ID
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| role_binding_cached().map(|(owner, _)| owner))
}

/// Whether the setting itself holds an owner.
fn is_set() -> bool {
    OWNER_ID.get().is_some_and(|c| !c.is_empty())
}

/// Whether this session is bound to an owner (cheaper than reading which one).
pub fn is_bound() -> bool {
    PINNED.with_borrow(|p| !p.is_empty()) || is_set() || role_binding_cached().is_some()
}

/// Refuses (42501) to act for an owner other than the one the session is bound to.
pub fn check_acting_for(owner_id: &str) -> Answer<()> {
    match bound_owner() {
        Some(bound) if bound != owner_id => Err(Refusal::insufficient_privilege(format!(
            "this session acts for owner \"{bound}\" and cannot submit for owner \"{owner_id}\""
        ))
        .detail("The setting intent.owner_id binds the session to one owner.")
        .hint("Submit with the owner_id the session is bound to.")),
        _ => Ok(()),
    }
}
