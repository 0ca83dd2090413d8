//! Retention: `purge` removes finished jobs, with their attempts and events, in bounded batches.
//!
//! Only terminal jobs (succeeded, failed, cancelled) are ever touched. After a purge the key is
//! free again: the same (owner_id, idempotency_key) creates a new job. So the retention must be
//! longer than any client's retry window: 7 days by default (`intent.retention`), `never` to keep
//! finished jobs for ever. The new job reuses the old one's id and attempt ids
//! (they are derived from the key), so its versions start above the old job's last one: a late
//! report from the old job's attempts presents a version the new job never handed out.

use crate::entry::{arg, value};
use crate::input;
use crate::plans::{self, Statement};
use crate::refusal::{Answer, Refusal};
use pgrx::datum::Interval;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

/// The default retention: far longer than any client's retry window (HTTP clients retry within
/// minutes; Stripe keeps idempotency keys for at least 24 hours), short enough that a busy
/// installation's finished jobs stay bounded (docs/reference.md § 7).
pub const DEFAULT_RETENTION: &std::ffi::CStr = c"7 days";

static RETENTION: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(DEFAULT_RETENTION));

/// The value of `intent.retention` that keeps finished jobs for ever (any case).
const NEVER: &str = "never";

/// The most jobs one call removes: a purge must never hold many locks or one long transaction.
use pg_intent_protocol::limits::MAX_PURGE_BATCH as MAX_BATCH;

thread_local! {
    /// Whether this session's `intent.retention` is not the one the database gave it: a value
    /// was waiting for the library (a placeholder) and did not survive its registration. A
    /// client's startup option (`-c intent.retention=…`, `PGOPTIONS`) outranks the database's,
    /// role's and file's values, so those are never kept for the placeholder; at registration
    /// PostgreSQL refuses the client's value (only superusers may set it) and falls back to the
    /// built-in default, 7 days — whatever the database said (`never`, `30 days`). A purge by
    /// the setting then refuses (the attacker's review of 0.5.0).
    static RETENTION_DISPLACED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Registers `intent.retention`; called from `_PG_init`.
pub fn register() {
    // SAFETY: reads the placeholder's value, if there is one, before the setting replaces it.
    let waiting = unsafe {
        let v = pg_sys::GetConfigOption(c"intent.retention".as_ptr(), true, false);
        (!v.is_null()).then(|| std::ffi::CStr::from_ptr(v).to_owned())
    };
    GucRegistry::define_string_guc(
        c"intent.retention",
        c"How long finished jobs are kept before intent.purge() may remove them (an interval).",
        c"Used when intent.purge() is called without a retention (the Runner's and pg_cron's purges). 'never': finished jobs are kept for ever, and intent.purge() without a retention removes nothing. After a purge the same key creates a new job.",
        &RETENTION,
        GucContext::Suset,
        GucFlags::default(),
    );
    if let Some(waiting) = waiting {
        RETENTION_DISPLACED.set(RETENTION.get().as_deref() != Some(waiting.as_c_str()));
    }
}

/// Parses and checks the retention: positive, given or from the setting.
static RETENTION_OK: Statement = Statement {
    name: "RetentionOk",
    sql: "SELECT r, r > interval '0' FROM (SELECT coalesce($1, nullif($2, '')::interval) AS r) s",
    args: &[pg_sys::INTERVALOID, pg_sys::TEXTOID],
};

crate::entry::sql_function!(purge, purge_entry);

/// `intent.purge(older_than, batch_size)` → bigint.
fn purge_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let purged = purge(arg(fcinfo, 0), arg(fcinfo, 1))?;
    Ok(value(fcinfo, Some(purged)))
}

crate::entry::sql_function!(purge_expired, purge_expired_entry);

/// `intent.purge_expired(batch_size)` → bigint: `purge` by the database's retention only, so
/// that an application's own worker (intent_app) keeps the tables bounded without being able to
/// choose a shorter retention than the one the database publishes (intent.retention is a
/// superuser setting).
fn purge_expired_entry(fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    let purged = purge(None, arg(fcinfo, 0))?;
    Ok(value(fcinfo, Some(purged)))
}

fn purge(older_than: Option<Interval>, batch_size: Option<i32>) -> Answer<i64> {
    let batch_size = input::required("batch_size", batch_size)?;
    if !(1..=MAX_BATCH).contains(&batch_size) {
        return Err(
            Refusal::bad_input(format!("batch_size must be between 1 and {MAX_BATCH}"))
                .detail(format!("batch_size is {batch_size}."))
                .hint(
                    "Call intent.purge() repeatedly (pg_cron does) rather than in one huge batch.",
                ),
        );
    }
    if older_than.is_none() && RETENTION_DISPLACED.get() {
        return Err(Refusal::insufficient_privilege(
            "this session's intent.retention is not the database's: a value only a superuser may set was given before the library loaded",
        )
        .detail("A client's startup option (-c intent.retention=…, PGOPTIONS) or SET of intent.retention before the library loaded displaced the retention the database, role or configuration file gives; PostgreSQL then fell back to the built-in default.")
        .hint("Reconnect without setting intent.retention (or preload the library: shared_preload_libraries), or pass the retention explicitly to intent.purge()."));
    }
    let setting = RETENTION.get().map(|c| c.to_string_lossy().into_owned());
    // 'never': nothing is past the retention. Only the setting may say so; an explicit
    // older_than is always honoured.
    if older_than.is_none()
        && setting
            .as_deref()
            .is_some_and(|s| s.trim().eq_ignore_ascii_case(NEVER))
    {
        return Ok(0);
    }
    Spi::connect_mut(|client| {
        // A malformed intent.retention is rejected by PostgreSQL's own interval input (22007).
        let row = plans::first(plans::run(
            client,
            &RETENTION_OK,
            &[older_than.into(), setting.as_deref().into()],
        ))
        .expect("SELECT returns a row");
        let Some(retention) = plans::get::<Interval>(&row, 1) else {
            return Err(Refusal::bad_input("no retention given and intent.retention is not set")
                .detail("intent.purge() removes finished jobs older than a retention, and none was given.")
                .hint("Pass one, e.g. intent.purge('30 days'), or set intent.retention (RESET gives its default, 7 days; 'never' keeps finished jobs for ever)."));
        };
        if !input::within_ten_thousand_years(&retention) {
            return Err(
                Refusal::bad_input("the retention must be less than ten thousand years")
                    .detail(format!("The retention is {retention}.")),
            );
        }
        if !plans::must::<bool>(&row, 2) {
            return Err(Refusal::bad_input("the retention must be positive")
                .detail(format!("The retention is {retention}."))
                .hint("Keep finished jobs longer than any client's retry window: after a purge the same key creates a new job."));
        }
        Ok(crate::store::get().purge(client, retention, batch_size))
    })
}
