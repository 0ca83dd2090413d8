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
fn restore_role_binding() {
    // Loaded at server start (shared_preload_libraries) the setting exists before any client
    // value could displace anything; outside a transaction there is no catalog to read anyway.
    if is_bound() || unsafe { !pg_sys::IsTransactionState() } {
        return;
    }
    // The precedence PostgreSQL applies at login: database-and-role, then role, then database.
    let binding = Spi::get_one::<String>(
        "SELECT substr(s, length('intent.owner_id=') + 1)
           FROM pg_catalog.pg_db_role_setting d, unnest(d.setconfig) AS s
          WHERE s LIKE 'intent.owner_id=%'
            AND ((d.setrole = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = session_user)
                  AND d.setdatabase IN ((SELECT oid FROM pg_catalog.pg_database
                                          WHERE datname = pg_catalog.current_database()), 0))
              OR (d.setrole = 0 AND d.setdatabase = (SELECT oid FROM pg_catalog.pg_database
                                                      WHERE datname = pg_catalog.current_database())))
          ORDER BY d.setrole = 0, d.setdatabase = 0
          LIMIT 1",
    );
    if let Ok(Some(owner)) = binding {
        let value = CString::new(owner).expect("a setting has no NUL byte");
        unsafe {
            pg_sys::SetConfigOption(
                c"intent.owner_id".as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_USER,
            );
        }
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
