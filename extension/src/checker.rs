//! Running a contract's checker: a SQL function `(jsonb) → boolean` that someone other than
//! pg_intent wrote, run on a result a provider returned.
//!
//! The checker is named by its identity (see `contract::CONTRACT`), and its owner can replace its
//! body (`CREATE OR REPLACE`) or change it (`ALTER FUNCTION`) at any time after
//! `define_contract` vetted it. So every run:
//!
//! - looks at the function again: still `(jsonb) → boolean`, still STABLE or IMMUTABLE, still
//!   executable by its owner — else the result is rejected, saying why;
//! - runs it **as the role that owns it**, never as `intent_owner`, in PostgreSQL's restricted
//!   security context (as maintenance commands run index expressions: no `SET ROLE`, no temporary
//!   objects, and no pg_intent call from inside it);
//! - runs it with the search path `pg_catalog, pg_temp`, which its own `SET search_path` clause
//!   replaces as usual (pg_intent's pin is an ordinary setting, not an override);
//! - runs it in a subtransaction that is **always rolled back**: whatever it wrote, whatever
//!   settings it changed (`SET`, `SET LOCAL`, `set_config`), whatever locks it took are undone.
//!
//! Anything but `true` — `false`, NULL, or an error it raises — rejects the result, except
//! errors that say nothing about the result: a cancel or `statement_timeout` (57014), a
//! serialization failure or deadlock (class 40), `lock_timeout` (55P03), and the operator,
//! resource and system classes (57, 53, 58). Those abort the call, so that the completion is
//! retried rather than the result wrongly rejected.

use crate::jsonb::Jsonb;
use pgrx::pg_sys;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::{FromDatum, IntoDatum, PgTryBuilder};
use std::ffi::CStr;
use std::panic::AssertUnwindSafe;

/// What the catalog says of a checker function now.
pub struct Checker {
    /// Its regprocedure text, for messages.
    pub signature: String,
    pub owner: pg_sys::Oid,
    /// Takes one jsonb, returns one boolean, is a plain function.
    pub fits: bool,
    /// STABLE or IMMUTABLE.
    pub stable: bool,
    /// Its own `SET search_path`, if it has one, ends with `pg_temp` (see [`temp_comes_last`]).
    pub temp_last: bool,
}

/// Whether a function's `SET search_path` clause (from `proconfig`), if any, names `pg_temp`
/// last. A path that does not name it has PostgreSQL search the session's temporary schema
/// *first* for tables, views and types: a checker with `SET search_path = public` would read
/// the completing session's `CREATE TEMP TABLE allowed` instead of its own `public.allowed`.
/// Without a clause the checker runs with `pg_catalog, pg_temp`.
fn temp_comes_last(config: Option<Vec<Option<String>>>) -> bool {
    let Some(settings) = config else { return true };
    settings
        .into_iter()
        .flatten()
        .filter_map(|s| {
            s.split_once('=')
                .filter(|(name, _)| name.eq_ignore_ascii_case("search_path"))
                .map(|(_, value)| value.to_string())
        })
        .next_back()
        .is_none_or(|path| {
            path.rsplit(',')
                .next()
                .map(|last| last.trim().trim_matches('"') == "pg_temp")
                .unwrap_or(false)
        })
}

/// The checker function as the catalog has it now, or None when there is no such function.
pub fn describe(oid: pg_sys::Oid) -> Option<Checker> {
    // SAFETY: a syscache lookup, released before returning; the form is read while pinned.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(oid),
        );
        if tuple.is_null() {
            return None;
        }
        let form = pg_sys::GETSTRUCT(tuple) as *const pg_sys::FormData_pg_proc;
        let f = &*form;
        let first_arg = if f.pronargs >= 1 {
            *f.proargtypes.values.as_ptr()
        } else {
            pg_sys::InvalidOid
        };
        let checker = Checker {
            signature: String::new(),
            owner: f.proowner,
            fits: f.pronargs == 1
                && first_arg == pg_sys::JSONBOID
                && f.prorettype == pg_sys::BOOLOID
                && !f.proretset
                && f.prokind as u8 == pg_sys::PROKIND_FUNCTION,
            stable: f.provolatile as u8 != pg_sys::PROVOLATILE_VOLATILE,
            temp_last: {
                let mut isnull = false;
                let datum = pg_sys::SysCacheGetAttr(
                    pg_sys::SysCacheIdentifier::PROCOID as i32,
                    tuple,
                    pg_sys::Anum_pg_proc_proconfig as pg_sys::AttrNumber,
                    &mut isnull,
                );
                temp_comes_last(pgrx::FromDatum::from_polymorphic_datum(
                    datum,
                    isnull,
                    pg_sys::TEXTARRAYOID,
                ))
            },
        };
        pg_sys::ReleaseSysCache(tuple);
        Some(Checker {
            signature: CStr::from_ptr(pg_sys::format_procedure(oid))
                .to_string_lossy()
                .into_owned(),
            ..checker
        })
    }
}

/// Whether `role` may execute function `oid`.
pub fn may_execute(role: pg_sys::Oid, oid: pg_sys::Oid) -> bool {
    // SAFETY: an ACL check by oids.
    unsafe {
        #[cfg(feature = "pg15")]
        let result = pg_sys::pg_proc_aclcheck(oid, role, pg_sys::ACL_EXECUTE as pg_sys::AclMode);
        #[cfg(not(feature = "pg15"))]
        let result = pg_sys::object_aclcheck(
            pg_sys::ProcedureRelationId,
            oid,
            role,
            pg_sys::ACL_EXECUTE as pg_sys::AclMode,
        );
        result == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Runs the checker on `result`: `Ok` when it returned true, else why the result is rejected.
/// `owner` is the role that owned the checker when the contract was defined, `definer` the
/// role that defined it (None: a contract from before 0.2.0, vetted by the rules of then).
pub fn run(
    oid: pg_sys::Oid,
    owner: Option<pg_sys::Oid>,
    definer: Option<pg_sys::Oid>,
    result: Jsonb,
) -> Result<(), String> {
    let Some(checker) = describe(oid) else {
        return Err(format!("checker function {oid} no longer exists"));
    };
    let name = &checker.signature;
    if owner.is_some_and(|o| o != checker.owner) {
        return Err(format!(
            "checker {name} has changed owner since the contract was defined: redefine the contract"
        ));
    }
    // SAFETY: a role-membership check by oids.
    if let Some(definer) = definer
        && !unsafe { pg_sys::has_privs_of_role(definer, checker.owner) }
    {
        return Err(format!(
            "the role that defined the contract no longer has the rights of the owner of checker {name}: redefine the contract"
        ));
    }
    if !checker.fits {
        return Err(format!(
            "checker {name} no longer takes (jsonb) and returns boolean"
        ));
    }
    if !checker.stable {
        return Err(format!(
            "checker {name} was made VOLATILE; a checker must be STABLE or IMMUTABLE"
        ));
    }
    if !may_execute(checker.owner, oid) {
        return Err(format!("checker {name} cannot be executed by its owner"));
    }
    if !checker.temp_last {
        return Err(format!(
            "checker {name} sets a search_path that does not end with pg_temp (the completing session's temporary tables would be found first): end it with pg_temp"
        ));
    }
    let outcome = rolled_back(|| as_owner(checker.owner, || unsafe { call(oid, result) }));
    match outcome {
        Ok(Some(true)) => Ok(()),
        Ok(Some(false)) => Err(format!("checker {name} returned false")),
        Ok(None) => Err(format!("checker {name} returned NULL")),
        Err((code, message)) => Err(format!("checker {name} raised {code}: {message}")),
    }
}

/// Errors that say nothing about the result being checked: they abort the call instead of
/// rejecting the result.
fn aborts_the_call(code: PgSqlErrorCode) -> bool {
    let state = sqlstate_text(code);
    matches!(&state[..2], "40" | "53" | "57" | "58") || state == "55P03"
}

/// The five-character SQLSTATE of a code (PGUNSIXBIT of MAKE_SQLSTATE).
fn sqlstate_text(code: PgSqlErrorCode) -> String {
    let mut n = code as i32;
    (0..5)
        .map(|_| {
            let c = ((n & 0x3F) as u8 + b'0') as char;
            n >>= 6;
            c
        })
        .collect()
}

/// Runs `f` in an internal subtransaction that is rolled back whatever happens, as PL/pgSQL runs
/// an exception block. A PostgreSQL error raised by `f` is returned as (SQLSTATE, message),
/// unless it must abort the call ([`aborts_the_call`]): that one is raised again after the
/// rollback.
fn rolled_back<R>(f: impl FnOnce() -> R) -> Result<R, (String, String)> {
    // SAFETY: the subtransaction protocol of PL/pgSQL's exception blocks: begin, switch back to
    // the caller's memory, and after the body (or its error) roll back and restore the memory
    // context and resource owner.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);
        let outcome: Result<R, Box<CaughtError>> = PgTryBuilder::new(AssertUnwindSafe(|| Ok(f())))
            .catch_others(|e| Err(Box::new(e)))
            .execute();
        pg_sys::RollbackAndReleaseCurrentSubTransaction();
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = owner;
        match outcome {
            Ok(r) => Ok(r),
            Err(caught) => {
                let (code, message) = match caught.as_ref() {
                    CaughtError::PostgresError(e)
                    | CaughtError::ErrorReport(e)
                    | CaughtError::RustPanic { ereport: e, .. } => {
                        (e.sql_error_code(), e.message().to_string())
                    }
                };
                if aborts_the_call(code) {
                    caught.rethrow();
                }
                Err((sqlstate_text(code), message))
            }
        }
    }
}

/// Runs `f` as `role`, in a restricted security context, with the search path `pg_catalog,
/// pg_temp`. The user is restored here (and by the subtransaction's abort if `f` fails); the
/// search path, and any setting `f` changed, by the rollback of the enclosing subtransaction.
fn as_owner<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: the same switch a SECURITY DEFINER function makes, plus the restricted-operation
    // bit maintenance commands add; row-level security forced (never skipped for the checker).
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            crate::entry::PINNED_SEARCH_PATH.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        let restricted = (context & !(pg_sys::SECURITY_NOFORCE_RLS as i32))
            | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
            | pg_sys::SECURITY_RESTRICTED_OPERATION as i32;
        pg_sys::SetUserIdAndSecContext(role, restricted);
    }
    let r = f();
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    r
}

/// Calls function `oid` with one non-NULL argument through the function manager (which applies
/// its own SECURITY DEFINER and SET clauses); None when it returns NULL.
///
/// # Safety
/// `oid` must take one argument of the datum's type and return boolean.
unsafe fn call(oid: pg_sys::Oid, arg: Jsonb) -> Option<bool> {
    unsafe {
        let flinfo =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::FmgrInfo>()) as *mut pg_sys::FmgrInfo;
        pg_sys::fmgr_info(oid, flinfo);
        let size = std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
            + std::mem::size_of::<pg_sys::NullableDatum>();
        let fcinfo = pg_sys::palloc0(size) as pg_sys::FunctionCallInfo;
        (*fcinfo).flinfo = flinfo;
        (*fcinfo).fncollation = pg_sys::InvalidOid;
        (*fcinfo).nargs = 1;
        let args = (*fcinfo).args.as_mut_ptr();
        (*args).value = arg.into_datum().expect("a jsonb datum");
        (*args).isnull = false;
        let function = (*flinfo).fn_addr.expect("fmgr_info sets fn_addr");
        let datum = pg_sys::ffi::pg_guard_ffi_boundary(|| function(fcinfo));
        if (*fcinfo).isnull {
            None
        } else {
            bool::from_datum(datum, false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_read_back() {
        assert_eq!(
            sqlstate_text(PgSqlErrorCode::ERRCODE_QUERY_CANCELED),
            "57014"
        );
        assert_eq!(
            sqlstate_text(PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE),
            "40001"
        );
        assert!(aborts_the_call(PgSqlErrorCode::ERRCODE_QUERY_CANCELED));
        assert!(aborts_the_call(
            PgSqlErrorCode::ERRCODE_T_R_DEADLOCK_DETECTED
        ));
        assert!(aborts_the_call(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE));
        assert!(!aborts_the_call(PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO));
        assert!(!aborts_the_call(PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION));
    }
}
