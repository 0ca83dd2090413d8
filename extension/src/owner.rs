//! Owner isolation: the setting `intent.owner_id` binds a session to one owner.
//!
//! It is a superuser-only setting (PGC_SUSET): a role can be bound for good with
//! `ALTER ROLE … SET intent.owner_id`, and a trusted gateway can be allowed to bind each request
//! with `GRANT SET ON PARAMETER intent.owner_id`. The row-level security policies of
//! `sql/isolation.sql` read it through [`bound_owner`]; `submit_job` refuses to act for anyone
//! else.

use crate::refusal::{Answer, Refusal};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use std::ffi::CString;

static OWNER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Registers the setting; called from `_PG_init`.
pub fn register() {
    GucRegistry::define_string_guc(
        c"intent.owner_id",
        c"The owner this session acts for (pg_intent owner isolation).",
        c"When set, the session sees and changes only this owner's jobs, attempts and events. Only superusers, and roles granted SET on it, can change it.",
        &OWNER_ID,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// The owner this session is bound to, or NULL when it is not bound.
#[pg_extern(stable, parallel_safe)]
pub fn bound_owner() -> Option<String> {
    OWNER_ID
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
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
