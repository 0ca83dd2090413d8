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
use std::ffi::CString;

static OWNER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

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
        GucFlags::default(),
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
/// PostgreSQL itself does at login, by an index scan with the catalog snapshot.
fn restore_role_binding() {
    // SAFETY: plain reads of backend globals.
    let can_read_catalogs = unsafe {
        pg_sys::IsTransactionState()
            && pg_sys::ParallelWorkerNumber < 0
            && !pg_sys::InitializingParallelWorker
            && pg_sys::MyDatabaseId != pg_sys::InvalidOid
    };
    // Loaded at server start (shared_preload_libraries) the setting exists before any client
    // value could displace anything; outside a transaction there is no catalog to read. A
    // parallel worker gets its settings from its leader, which has done this already.
    if is_bound() || !can_read_catalogs {
        return;
    }
    // SAFETY: catalog access inside a transaction, as process_settings() does at login.
    let Some((owner, source)) = (unsafe { role_binding() }) else {
        return;
    };
    let value = CString::new(owner).expect("a setting has no NUL byte");
    unsafe {
        pg_sys::SetConfigOption(
            c"intent.owner_id".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            source,
        );
    }
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
    const PREFIX: &str = "intent.owner_id=";
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
                // The last entry wins, as when PostgreSQL applies the array.
                found = entries
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.strip_prefix(PREFIX).map(str::to_string))
                    .next_back();
            }
        }
        pg_sys::systable_endscan(scan);
        found
    }
}

/// The owner this session is bound to, or NULL when it is not bound.
#[pg_extern(stable, parallel_safe)]
pub fn bound_owner() -> Option<String> {
    OWNER_ID
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
}

/// Whether this session is bound to an owner (cheaper than reading which one).
pub fn is_bound() -> bool {
    OWNER_ID.get().is_some_and(|c| !c.is_empty())
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
