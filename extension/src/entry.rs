//! How the SQL API enters Rust, and how its refusals leave it with their exact SQLSTATE.
//!
//! pgrx re-raises every error that crosses a `#[pg_extern]` through its enum of built-in
//! SQLSTATEs, so a refusal such as `IJ002` raised inside pgrx's guard would reach the client as
//! `XX000`. The API functions are therefore plain version-1 C functions: each runs its body
//! under pgrx's guard (so PostgreSQL errors and Rust panics are handled as usual), gets back
//! either a result or a [`Refusal`], and raises the refusal itself *after* the guard, with
//! PostgreSQL's own `ereport` machinery. No PL/pgSQL hop, no per-call settings change.
//!
//! The functions are declared `SECURITY DEFINER` (they run as `intent_owner`) without a `SET`
//! clause, which would cost a settings change on every call: instead each call pins the search
//! path to `pg_catalog` alone while it runs. Every object of ours is schema-qualified in the SQL
//! it executes, so nothing a caller puts in `public` or `pg_temp` can be picked up.

use crate::refusal::{Answer, Refusal};
use pgrx::pg_sys;
use pgrx::{FromDatum, IntoDatum};
use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};

/// The version-1 calling convention record every C function must expose.
pub static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };

/// Declares the C function behind SQL function `intent.$name` (`sql/api.sql` declares it with
/// symbol `intent_$name`): it runs `$body` through [`call`]. The SQL name, which the server log
/// gives as a refusal's location, is `intent.$name` unless given.
macro_rules! sql_function {
    ($name:ident, $body:path) => {
        $crate::entry::sql_function!($name, $body, concat!("intent.", stringify!($name)));
    };
    ($name:ident, $body:path, $sql:expr) => {
        ::paste::paste! {
            #[unsafe(no_mangle)]
            pub extern "C" fn [<pg_finfo_intent_ $name>]() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
                &$crate::entry::V1
            }

            #[unsafe(no_mangle)]
            pub unsafe extern "C-unwind" fn [<intent_ $name>](
                fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
            ) -> ::pgrx::pg_sys::Datum {
                const SQL: &::std::ffi::CStr = match ::std::ffi::CStr::from_bytes_with_nul(
                    concat!($sql, "\0").as_bytes(),
                ) {
                    Ok(name) => name,
                    Err(_) => panic!("a SQL name has no NUL"),
                };
                unsafe { $crate::entry::call(fcinfo, $body, SQL) }
            }
        }
    };
}
pub(crate) use sql_function;

/// Runs one API call. Must be the last thing the C function does: a refusal never returns.
///
/// # Safety
/// `fcinfo` must be the call's own, as PostgreSQL passed it.
pub unsafe fn call(
    fcinfo: pg_sys::FunctionCallInfo,
    body: fn(pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum>,
    sql_name: &'static std::ffi::CStr,
) -> pg_sys::Datum {
    let answer = unsafe {
        pg_sys::submodules::panic::pgrx_extern_c_guard(|| {
            let _call = Call::enter()?;
            body(fcinfo)
        })
    };
    match answer {
        Ok(datum) => datum,
        Err(refusal) => unsafe { raise(refusal, sql_name) },
    }
}

thread_local! {
    /// The memory context each API call was entered in, innermost last (see [`caller_memory`]).
    static CALLER_MEMORY: RefCell<Vec<pg_sys::MemoryContext>> = const { RefCell::new(Vec::new()) };
}

/// The memory context the innermost API call was entered in: where a value it returns must
/// live. Memory allocated inside `Spi::connect*` belongs to SPI and is freed when SPI
/// disconnects, before the call returns; a value read there and returned (a stored result, on
/// a replay) must be copied here first.
pub fn caller_memory() -> pg_sys::MemoryContext {
    CALLER_MEMORY
        .with_borrow(|stack| stack.last().copied())
        .expect("pg_intent: caller_memory() outside an API call")
}

/// What every API call sets up before its body runs, undone when it ends (on unwinding too; a
/// transaction abort would undo the security context and the search path anyway).
///
/// - It refuses to run inside a restricted operation (below).
/// - It fixes the security context: row-level security forced for a bound session, skipped
///   for an unbound one (below).
/// - It pins the search path.
/// - It records the caller's memory context for [`caller_memory`].
/// - It starts the call without an instant: `crate::clock::now` reads the clock on first use.
struct Call {
    security: Option<(pg_sys::Oid, c_int)>,
    /// The enclosing call's instant (crate::clock), put back when this one ends.
    now: Option<pg_sys::TimestampTz>,
    _path: PinnedSearchPath,
}

impl Call {
    fn enter() -> Answer<Call> {
        // SAFETY: plain reads of the backend's security context.
        if unsafe { pg_sys::InSecurityRestrictedOperation() } {
            // PostgreSQL runs index expressions, ANALYZE, VACUUM, CLUSTER, REINDEX and REFRESH
            // MATERIALIZED VIEW as the table's owner, in a restricted security context, in the
            // session of whoever started them (often an unbound DBA session). Code a tenant
            // planted there must not act on jobs through that session.
            return Err(Refusal::insufficient_privilege(
                "pg_intent cannot be called from inside a maintenance operation",
            )
            .detail("The call ran in a restricted security context: an index expression, or a function run by ANALYZE, VACUUM, CLUSTER, REINDEX, CREATE INDEX or REFRESH MATERIALIZED VIEW.")
            .hint("Call pg_intent from ordinary statements only."));
        }
        // The distributed mode: nothing Citus would replay on this call's connections.
        crate::citus_guard::before_call()?;
        let security = security_context();
        CALLER_MEMORY.with_borrow_mut(|stack| stack.push(unsafe { pg_sys::CurrentMemoryContext }));
        Ok(Call {
            security,
            now: crate::clock::enter(),
            _path: PinnedSearchPath::push(),
        })
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        CALLER_MEMORY.with_borrow_mut(|stack| stack.pop());
        crate::clock::leave(self.now);
        if let Some((user, context)) = self.security {
            // SAFETY: puts back what `security_context` read.
            unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
        }
    }
}

/// Sets the security context of a call; returns the one to restore, if it changed.
///
/// Row-level security binds the table owner, as whom the functions run, only while the
/// context lacks SECURITY_NOFORCE_RLS. PostgreSQL sets that bit for referential-integrity
/// actions, and code reached from them (a trigger on a table an `ON DELETE CASCADE` deletes
/// from) inherits it: a bound session must never run our statements with it, or its owner
/// isolation would be skipped. So a bound session's call clears the bit.
///
/// For an unbound session the isolation policies are `owner_id = owner_id`: true for every
/// row, yet each statement would still pay for evaluating them. Such a session's call sets
/// the bit, which changes no answer. Plans are cached per mode (`plans::run`), so a plan built
/// without the policies never serves a bound session.
fn security_context() -> Option<(pg_sys::Oid, c_int)> {
    let no_force = pg_sys::SECURITY_NOFORCE_RLS as c_int;
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: plain reads and writes of the backend's current user and security context.
    unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
    let wanted = if crate::owner::is_bound() {
        context & !no_force
    } else {
        context | no_force
    };
    if wanted == context {
        return None;
    }
    unsafe { pg_sys::SetUserIdAndSecContext(user, wanted) };
    Some((user, context))
}

/// Runs `f` as the owner of the function being called, the way PostgreSQL runs a SECURITY
/// DEFINER function (for the one call that must first read who called it, `define_contract`).
pub fn as_function_owner<R>(fcinfo: pg_sys::FunctionCallInfo, f: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, c_int);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: puts back what was read below.
            unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) };
        }
    }
    let owner = function_owner(fcinfo);
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: the switch a SECURITY DEFINER function makes.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
    }
    let _restore = Restore(user, context);
    f()
}

/// The owner of the function being called.
pub fn function_owner(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    // SAFETY: the function's own pg_proc row, by the oid of the call's own flinfo.
    unsafe {
        let oid = (*(*fcinfo).flinfo).fn_oid;
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(oid),
        );
        assert!(
            !tuple.is_null(),
            "pg_intent: cache lookup failed for function {oid:?}"
        );
        let owner = (*(pg_sys::GETSTRUCT(tuple) as *const pg_sys::FormData_pg_proc)).proowner;
        pg_sys::ReleaseSysCache(tuple);
        owner
    }
}

/// The search path every call runs with: `pg_catalog, pg_temp`, set the way PostgreSQL sets a
/// function's `SET search_path` clause (a new GUC nesting level, the value saved, and the level
/// closed when the call ends), so that it works alike on every supported major (PostgreSQL 17
/// removed `PushOverrideSearchPath`).
///
/// Being an ordinary setting rather than an override, it also leaves code that is not ours free
/// to choose its own path: a contract's checker sets `pg_catalog, pg_temp` for itself (see
/// `checker::as_owner`) and may `SET search_path` or carry a `SET` clause of its own, which an
/// override would have silently beaten.
///
/// Every name our statements use is schema-qualified anyway; the pin is for what a query
/// cannot qualify cheaply (operators, casts, and functions reached through them), so that a
/// caller's `SET search_path = evil, pg_catalog` changes nothing. `pg_temp` comes last so
/// that a temporary object can never shadow a catalog one.
pub(crate) struct PinnedSearchPath {
    level: c_int,
}

/// The pinned value (see [`PinnedSearchPath`]).
pub(crate) const PINNED_SEARCH_PATH: &std::ffi::CStr = c"pg_catalog, pg_temp";

/// The settings every call pins, at one GUC level: the search path, and
/// `quote_all_identifiers = off`, because a contract stores and finds its checker by the
/// identity `pg_identify_object` writes, whose quoting that setting (which anyone may change)
/// would otherwise alter.
const PINNED: [(&std::ffi::CStr, &std::ffi::CStr); 2] = [
    (c"search_path", PINNED_SEARCH_PATH),
    (c"quote_all_identifiers", c"off"),
];

/// The time zone every call computes in: UTC. PostgreSQL adds an interval's days and months to a
/// `timestamptz` in the session's `TimeZone`, which any role may set — to a made-up POSIX zone
/// whose daylight-saving jump is days long — so that `now + retry_after`, a lease's deadline or a
/// purge's cutoff `now - retention` would move by up to days (the attacker's review of 0.5.0: a
/// tenant's retry claimed ahead of every other owner's jobs; a purge removing jobs that
/// finished minutes before). Pinned only when the session's zone is not UTC itself: a pointer
/// comparison in the common case, no setting parsed.
const PINNED_TIME_ZONE: &std::ffi::CStr = c"UTC";

thread_local! {
    /// PostgreSQL's zone for "UTC" (its time zone cache keeps it for the backend's life).
    static UTC: std::cell::Cell<*mut pg_sys::pg_tz> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// Whether the session's time zone is another than UTC.
fn zone_is_not_utc() -> bool {
    // SAFETY: pg_tzset looks the zone up in (or loads it into) PostgreSQL's cache, whose entries
    // live as long as the backend; session_timezone is the current zone.
    unsafe {
        let mut utc = UTC.get();
        if utc.is_null() {
            utc = pg_sys::pg_tzset(PINNED_TIME_ZONE.as_ptr());
            UTC.set(utc);
        }
        utc.is_null() || pg_sys::session_timezone != utc
    }
}

impl PinnedSearchPath {
    pub(crate) fn push() -> Self {
        // SAFETY: what fmgr_security_definer does for a function's SET clause. The value is
        // copied by the GUC machinery; the level is closed in `drop`, or by the abort of the
        // (sub)transaction an error ends.
        let utc = zone_is_not_utc();
        let level = unsafe {
            let level = pg_sys::NewGUCNestLevel();
            let zone = [(c"TimeZone", PINNED_TIME_ZONE)];
            let zone: &[(&std::ffi::CStr, &std::ffi::CStr)] = if utc { &zone } else { &[] };
            for (name, value) in PINNED.iter().chain(zone) {
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
        PinnedSearchPath { level }
    }
}

impl Drop for PinnedSearchPath {
    fn drop(&mut self) {
        // SAFETY: closes the level opened in `push`, as a function's exit does. Levels opened
        // inside it by subtransactions are closed already (their commit or abort closes them).
        unsafe { pg_sys::AtEOXact_GUC(true, self.level) };
    }
}

// PostgreSQL's error reporting, declared here rather than taken from pgrx's bindings: pgrx
// wraps its bindings so that the non-local exit of `errfinish` becomes a Rust panic, and it is
// precisely that exit we want to reach PostgreSQL unchanged.
unsafe extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errdetail(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
}

/// MAKE_SQLSTATE of a five-character code.
fn sqlstate(code: &str) -> c_int {
    code.bytes()
        .take(5)
        .enumerate()
        .map(|(i, b)| (c_int::from(b.wrapping_sub(b'0')) & 0x3F) << (6 * i))
        .sum()
}

fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', "")).expect("NUL bytes were removed")
}

/// Raises a refusal as an ERROR with its exact SQLSTATE, message, DETAIL and HINT.
///
/// # Safety
/// Never returns: PostgreSQL's error handling takes over. Nothing with a destructor may be live
/// in the callers' frames.
unsafe fn raise(refusal: Refusal, sql_name: &'static std::ffi::CStr) -> ! {
    let code = sqlstate(refusal.code.code());
    let message = c_text(&refusal.message);
    let detail = refusal.full_detail().as_deref().map(c_text);
    let hint = refusal.hint.as_deref().map(c_text);
    drop(refusal);
    unsafe {
        if errstart(pgrx::PgLogLevel::ERROR as c_int, std::ptr::null()) {
            errcode(code);
            // Each call copies its text into PostgreSQL's error context.
            errmsg(c"%s".as_ptr(), message.as_ptr());
            if let Some(detail) = &detail {
                errdetail(c"%s".as_ptr(), detail.as_ptr());
            }
            if let Some(hint) = &hint {
                errhint(c"%s".as_ptr(), hint.as_ptr());
            }
        }
        drop(message);
        drop(detail);
        drop(hint);
        // The location a server log prints (`LOCATION:` with log_error_verbosity = verbose):
        // the SQL function that refused.
        errfinish(c"pg_intent".as_ptr(), 0, sql_name.as_ptr());
    }
    unreachable!("errfinish does not return at ERROR")
}

/// Argument `n` (0-based), or None for SQL NULL.
pub fn arg<T: FromDatum>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<T> {
    // SAFETY: the caller passes its own fcinfo and the argument's declared type.
    unsafe { pgrx::fcinfo::pg_getarg::<T>(fcinfo, n) }
}

/// Returns from a function declared `RETURNS void` (PG_RETURN_VOID: a zero datum, not NULL).
pub fn void() -> pg_sys::Datum {
    pg_sys::Datum::from(0usize)
}

/// Returns SQL NULL.
pub fn null(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: fcinfo is the call's own.
    unsafe { (*fcinfo).isnull = true };
    pg_sys::Datum::from(0usize)
}

/// Returns a value, NULL when it is None.
pub fn value<T: IntoDatum>(fcinfo: pg_sys::FunctionCallInfo, v: Option<T>) -> pg_sys::Datum {
    match v.and_then(IntoDatum::into_datum) {
        Some(d) => d,
        None => null(fcinfo),
    }
}

/// The declared result type of the function being called.
pub fn result_type(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    // SAFETY: fcinfo and its flinfo are the call's own.
    unsafe { pg_sys::get_fn_expr_rettype((*fcinfo).flinfo) }
}

thread_local! {
    /// A handful of (enum type, label) pairs: a list is quicker to search than to hash.
    static ENUM_VALUES: RefCell<Vec<(pg_sys::Oid, String, pg_sys::Datum)>> =
        const { RefCell::new(Vec::new()) };
}

/// The datum of an enum label (intent.job_state, intent.completion, …), looked up once per
/// session.
pub fn enum_value(type_oid: pg_sys::Oid, label: &str) -> pg_sys::Datum {
    if let Some(d) = ENUM_VALUES.with_borrow(|m| {
        m.iter()
            .find(|(t, l, _)| *t == type_oid && l == label)
            .map(|(_, _, d)| *d)
    }) {
        return d;
    }
    let text = c_text(label);
    // SAFETY: enum_in takes (cstring, oid) and returns the label's oid as a datum.
    let datum = unsafe {
        pgrx::fcinfo::direct_function_call_as_datum(
            pg_sys::enum_in,
            &[
                Some(pg_sys::Datum::from(text.as_ptr().cast_mut())),
                type_oid.into_datum(),
            ],
        )
    }
    .expect("enum_in returns a value");
    ENUM_VALUES.with_borrow_mut(|m| m.push((type_oid, label.to_string(), datum)));
    datum
}

/// Returns one row from a function declared `RETURNS TABLE (…)`. `row` receives the result's
/// column types, in order, and returns the columns' datums (None: NULL).
pub fn one_row(
    fcinfo: pg_sys::FunctionCallInfo,
    row: impl FnOnce(&[pg_sys::Oid]) -> Vec<Option<pg_sys::Datum>>,
) -> pg_sys::Datum {
    let mut row = Some(row);
    one_row_each(fcinfo, 1, |_, types| {
        (row.take().expect("called once"))(types)
    })
}

/// Returns `n` rows from a function declared `RETURNS TABLE (…)`: `row(i, types)` gives row i.
pub fn one_row_each(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    mut row: impl FnMut(usize, &[pg_sys::Oid]) -> Vec<Option<pg_sys::Datum>>,
) -> pg_sys::Datum {
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        let flags = if !rsinfo.is_null() && !(*rsinfo).expectedDesc.is_null() {
            pg_sys::MAT_SRF_USE_EXPECTED_DESC
        } else {
            0
        };
        pg_sys::InitMaterializedSRF(fcinfo, flags);
        let desc = (*rsinfo).setDesc;
        let natts = (*desc).natts as usize;
        let types: Vec<pg_sys::Oid> = (0..natts).map(|i| (*attribute(desc, i)).atttypid).collect();
        for i in 0..n {
            let columns = row(i, &types);
            assert_eq!(
                columns.len(),
                natts,
                "pg_intent: result row has the wrong width"
            );
            let mut values: Vec<pg_sys::Datum> = columns
                .iter()
                .map(|c| c.unwrap_or(pg_sys::Datum::from(0usize)))
                .collect();
            let mut nulls: Vec<bool> = columns.iter().map(Option::is_none).collect();
            pg_sys::tuplestore_putvalues(
                (*rsinfo).setResult,
                desc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
        }
    }
    pg_sys::Datum::from(0usize)
}

/// The `i`th attribute of a tuple descriptor (PostgreSQL 18 put the compact attributes first,
/// so the array moved: this is its TupleDescAttr).
unsafe fn attribute(desc: pg_sys::TupleDesc, i: usize) -> *const pg_sys::FormData_pg_attribute {
    // SAFETY: `i` is below natts (the callers' loops say so).
    unsafe {
        #[cfg(not(feature = "pg18"))]
        let attr = (*desc).attrs.as_ptr().add(i);
        #[cfg(feature = "pg18")]
        let attr = ((*desc).compact_attrs.as_ptr().add((*desc).natts as usize)
            as *const pg_sys::FormData_pg_attribute)
            .add(i);
        attr
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlstates_are_encoded_like_make_sqlstate() {
        // MAKE_SQLSTATE('2','2','0','2','3') and ('I','J','0','0','1'), computed by hand.
        let make = |c: &[u8; 5]| -> i32 {
            c.iter()
                .enumerate()
                .map(|(i, b)| ((i32::from(*b) - 48) & 0x3F) << (6 * i))
                .sum()
        };
        assert_eq!(super::sqlstate("22023"), make(b"22023"));
        assert_eq!(super::sqlstate("IJ001"), make(b"IJ001"));
    }
}
