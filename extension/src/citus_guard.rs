//! The distributed mode: what Citus would replay as `intent_owner`.
//!
//! With `citus.propagate_set_commands = 'local'` (a setting any role may change), Citus keeps
//! every `SET LOCAL`, `SET TRANSACTION` and `RESET` a transaction runs, and sends it on each
//! connection to a worker that the transaction opens afterwards, and at once on those already
//! open. The calls are SECURITY DEFINER: Citus opens their connections as `intent_owner`, so
//! what it replays there runs as `intent_owner`, unbound — and Citus 13.2 replays the whole
//! query string a `SET` came in, so a string holding a `SET LOCAL` and other statements runs
//! all of them there (docs/security.md § 13).
//!
//! So, in the distributed mode:
//! - a call refuses to run (42501) while Citus holds propagated commands for this
//!   transaction (or for one of its open savepoints): they would be replayed on its
//!   connections;
//! - once a call ran in a transaction (its connections may stay open until the transaction
//!   ends), a `SET`/`RESET` statement run while propagation is on is refused (42501) until the
//!   transaction ends: Citus would send it on those connections at once.
//!
//! Citus keeps the commands in its global `activeSetStmts` and, for open savepoints, in the
//! list `ActiveSubXactContexts()` returns; both are looked up by name in Citus's library. A
//! Citus without them is refused as well: pg_intent cannot tell what it would replay.

use crate::refusal::{Answer, Refusal};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{CStr, c_char, c_void};

thread_local! {
    /// A call ran in the distributed mode in the current transaction.
    static CALLED: Cell<bool> = const { Cell::new(false) };
    /// Citus's globals, once looked up (None: not yet).
    static CITUS: Cell<Option<Citus>> = const { Cell::new(None) };
}

static mut PREVIOUS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

#[derive(Clone, Copy)]
struct Citus {
    /// `StringInfo activeSetStmts` (null: not found).
    active_set_stmts: *mut *mut pg_sys::StringInfoData,
    /// `List *ActiveSubXactContexts(void)` (None: not found).
    sub_xact_contexts: Option<unsafe extern "C-unwind" fn() -> *mut pg_sys::List>,
}

/// Citus 13's `SubXactContext` (transaction_management.h).
#[repr(C)]
struct SubXactContext {
    sub_id: pg_sys::SubTransactionId,
    set_local_cmds: *mut pg_sys::StringInfoData,
    propagated_objects: *mut c_void,
}

/// Installs the utility hook and the end-of-transaction callback; called from `_PG_init`
/// (no SQL, no catalog access: it also runs in parallel workers and at preload time).
pub fn register() {
    // SAFETY: hook chaining at load time, as every extension does; the callback only resets a
    // flag.
    unsafe {
        PREVIOUS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(utility);
        pg_sys::RegisterXactCallback(Some(transaction_ended), std::ptr::null_mut());
    }
}

unsafe extern "C-unwind" fn transaction_ended(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        CALLED.set(false);
    }
}

/// What every API call does first in the distributed mode (entry.rs).
pub fn before_call() -> Answer<()> {
    if !crate::dist::on_citus() {
        return Ok(());
    }
    CALLED.set(true);
    match unsafe { pending() } {
        Some(false) => Ok(()),
        Some(true) => Err(Refusal::insufficient_privilege(
            "pg_intent cannot run in a transaction whose SET commands Citus propagates",
        )
        .detail("SET LOCAL, SET TRANSACTION or RESET ran in this transaction while citus.propagate_set_commands was 'local': Citus would send those commands on the connections this call opens to the workers, which run as intent_owner.")
        .hint("Make the call in a transaction without propagated SET commands (citus.propagate_set_commands = 'none' before they run).")),
        None => Err(Refusal::insufficient_privilege(
            "pg_intent cannot tell which SET commands this Citus propagates",
        )
        .detail("Citus's activeSetStmts or ActiveSubXactContexts() was not found in its library: a Citus version pg_intent was not built for.")
        .hint("Use a Citus version docs/scale-out.md names.")),
    }
}

/// Whether Citus holds propagated commands for this transaction; None when Citus's globals
/// are not there.
unsafe fn pending() -> Option<bool> {
    let citus = citus();
    let (Some(contexts), false) = (citus.sub_xact_contexts, citus.active_set_stmts.is_null())
    else {
        return None;
    };
    // SAFETY: Citus's own globals, read in the backend that owns them; a StringInfo is a
    // palloc'd struct whose len counts the bytes held, a List of SubXactContext pointers.
    unsafe {
        let active = *citus.active_set_stmts;
        if !active.is_null() && (*active).len > 0 {
            return Some(true);
        }
        let list = contexts();
        if list.is_null() {
            return Some(false);
        }
        for i in 0..(*list).length as usize {
            let context = (*(*list).elements.add(i)).ptr_value as *const SubXactContext;
            if !context.is_null() {
                let cmds = (*context).set_local_cmds;
                if !cmds.is_null() && (*cmds).len > 0 {
                    return Some(true);
                }
            }
        }
    }
    Some(false)
}

fn citus() -> Citus {
    if let Some(c) = CITUS.get() {
        return c;
    }
    let library = c"$libdir/citus";
    // SAFETY: Citus is loaded (shared_preload_libraries; the distributed mode needs it), so
    // this finds its handle; a missing symbol gives None, not an error.
    let find = |name: &CStr| unsafe {
        pg_sys::load_external_function(library.as_ptr(), name.as_ptr(), false, std::ptr::null_mut())
    };
    let find = |name: &CStr| -> Option<*const c_void> {
        let p = find(name);
        (!p.is_null()).then_some(p as *const c_void)
    };
    let c = Citus {
        active_set_stmts: find(c"activeSetStmts").map_or(std::ptr::null_mut(), |p| {
            p as *mut *mut pg_sys::StringInfoData
        }),
        // SAFETY: the symbol is Citus's `List *ActiveSubXactContexts(void)`.
        sub_xact_contexts:
            find(c"ActiveSubXactContexts").map(|p| unsafe {
                std::mem::transmute::<
                    *const c_void,
                    unsafe extern "C-unwind" fn() -> *mut pg_sys::List,
                >(p)
            }),
    };
    CITUS.set(Some(c));
    c
}

/// Whether Citus would propagate this utility statement: a SET or RESET while
/// `citus.propagate_set_commands` is `local` (Citus then propagates SET LOCAL, SET
/// TRANSACTION, RESET and RESET ALL; every SET and RESET is refused here, to be sure).
unsafe fn propagated_set(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    // SAFETY: the statement PostgreSQL is about to run, and a read of a setting by name.
    unsafe {
        let stmt = (*pstmt).utilityStmt;
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_VariableSetStmt {
            return false;
        }
        let value = pg_sys::GetConfigOption(c"citus.propagate_set_commands".as_ptr(), true, false);
        !value.is_null()
            && CStr::from_ptr(value)
                .to_bytes()
                .eq_ignore_ascii_case(b"local")
    }
}

// PostgreSQL's own, declared here rather than through pgrx's bindings: those catch an error
// it raises and carry it on as a Rust panic, which would rebuild the error (losing its table,
// constraint and position fields) or, outside a guard, abort. Called as C calls it, an error
// it raises goes to PostgreSQL's handler directly: nothing of ours is on the stack to skip.
unsafe extern "C-unwind" {
    #[link_name = "standard_ProcessUtility"]
    fn postgres_standard_process_utility(
        pstmt: *mut pg_sys::PlannedStmt,
        query: *const c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the refusal is raised from inside pgrx's guard, as every pg_intent error is; the
    // statement is the one PostgreSQL gave.
    unsafe {
        pg_sys::submodules::panic::pgrx_extern_c_guard(|| {
            let stmt = if pstmt.is_null() {
                std::ptr::null_mut()
            } else {
                (*pstmt).utilityStmt
            };
            // A utility statement may start parallel workers without the executor (a parallel
            // index build): the setting must say what binds before it runs, too.
            if !crate::owner::binds_or_begins(stmt) {
                crate::owner::pin_a_reverted_binding();
            }
            crate::owner::check_utility(stmt)
        })
    };
    if CALLED.get() {
        // SAFETY: the refusal is raised from inside pgrx's guard, as every pg_intent error is.
        unsafe {
            pg_sys::submodules::panic::pgrx_extern_c_guard(|| {
                if propagated_set(pstmt) {
                    pgrx::ereport!(
                        pgrx::PgLogLevel::ERROR,
                        pgrx::PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                        "pg_intent refuses a SET command that Citus would propagate after a pg_intent call in this transaction",
                        "citus.propagate_set_commands is 'local': Citus would send this command on the connections a pg_intent call of this transaction opened to the workers, which run as intent_owner. Run it in a transaction of its own, or with citus.propagate_set_commands = 'none'."
                    );
                }
            })
        };
    }
    // SAFETY: the previous hook, or PostgreSQL's own, with the arguments PostgreSQL gave.
    unsafe {
        match PREVIOUS_UTILITY {
            Some(previous) => {
                previous(pstmt, query, read_only_tree, context, params, env, dest, qc)
            }
            None => postgres_standard_process_utility(
                pstmt,
                query,
                read_only_tree,
                context,
                params,
                env,
                dest,
                qc,
            ),
        }
    }
}
