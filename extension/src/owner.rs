//! Owner isolation: the setting `intent.owner_id` binds a session to one owner.
//!
//! It is a superuser-only setting (PGC_SUSET): a role can be bound for good with
//! `ALTER ROLE … SET intent.owner_id`, and a trusted gateway can be allowed to bind each request
//! with `GRANT SET ON PARAMETER intent.owner_id`. The row-level security policies of
//! `sql/isolation.sql` read the binding through [`bound_owner`]; `submit_job` refuses to act for
//! anyone else.
//!
//! **The binding is a function of what a parallel worker restores from its leader** — the
//! setting's current value, the session user, the current user, the catalog — and of nothing
//! kept only in this process's memory: a worker runs the same policies with the leader's
//! settings, not with the leader's statics. So every rule that needs memory is enforced where
//! the setting is *changed*, which only a leader can do, and leaves the setting itself saying
//! what binds:
//!
//! 1. one transaction acts for one owner: once the setting has bound the transaction (set, or
//!    read by a call or a policy, to an owner), changing it to anything else before the
//!    transaction ends is refused (42501, [`check_owner`], [`check_utility`]); a tenant's
//!    trigger running in a gateway's bound transaction can neither rebind nor unbind it. What
//!    PostgreSQL changes back without asking (a rolled-back savepoint, the end of a function's
//!    `SET` clause, a reset by `set_config(…, NULL, …)`) binds the rest of the transaction to
//!    no owner, and the setting is made to say so before the next query starts and again before
//!    it runs, and before every utility statement ([`pin_a_reverted_binding`]);
//! 2. while a contract's checker runs ([`without_owner`]), the setting holds [`NO_OWNER`], at a
//!    GUC nesting level of its own, as a function's `SET` clause would: the checker, and any
//!    parallel worker of its queries, reads no owner's rows; nothing may change it meanwhile;
//! 3. the library's first load in parallel mode, where PostgreSQL cannot re-apply a placeholder
//!    value a client set before the load and drops it, is refused ([`register`]) unless the
//!    dropped value is the one the next rule reads back anyway: the placeholder is then kept,
//!    and the next statement outside parallel mode loads the library with it;
//! 4. when the setting is empty: the binding the session user's role (or the database) was
//!    given, read from `pg_db_role_setting` (by an index scan, no SQL: the library loads in
//!    parallel workers, at `session_preload_libraries` time and inside arbitrary statements) as
//!    PostgreSQL reads it at login — so a binding a client displaced before the library loaded
//!    (a startup option, a `SET` of the placeholder, which PostgreSQL discards when the library
//!    loads) binds all the same (`SHOW intent.owner_id` then reads empty; `intent.bound_owner()`
//!    tells);
//! 5. intersected with the binding of the role the code runs as, when that is not the session
//!    user (SET ROLE, a SECURITY DEFINER function, a maintenance command running a table
//!    owner's index expression): a tenant's own code, wherever it runs, reads as that tenant.

use crate::refusal::{Answer, Refusal};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};

static OWNER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `intent.transaction_binding`: what binds the current transaction, as the leader last made
/// sure of it ([`pin_a_reverted_binding`]): its owner, [`NO_OWNER`], or empty (not bound). Set
/// only by pg_intent, `SET LOCAL`, with the backend-start context that no SQL statement can
/// give (`SET`, `set_config`, `RESET`: "cannot be set after connection start"), and copied to
/// parallel workers like every setting: what a worker trusts when the setting itself was reset
/// by code that ran after the leader's last pin (a parallel index build folds the caller's
/// functions in the leader just before it launches workers, without the executor).
static TRANSACTION_BINDING: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// A role's binding read from the catalog: the owner and the source a login applies it with.
type Binding = Option<(String, pg_sys::GucSource::Type)>;

thread_local! {
    /// Bindings read from the catalog, per (role, database, whether it is the session's own
    /// login): PostgreSQL itself reads role settings once, at login. Dropped when a transaction
    /// that filled it aborts (it may have read the transaction's own, uncommitted, setting).
    static BINDINGS: RefCell<HashMap<(pg_sys::Oid, pg_sys::Oid, bool), Binding>> =
        RefCell::new(HashMap::new());
    static FILLED_IN_TRANSACTION: Cell<bool> = const { Cell::new(false) };
    /// The owner the current transaction is bound to: the first owner the setting held in it,
    /// or held when a call or a policy first read it. Only [`check_owner`] reads it, in the
    /// process that changes the setting (a leader: a parallel worker cannot change settings).
    static TRANSACTION_OWNER: RefCell<Option<String>> = const { RefCell::new(None) };
    /// How many [`without_owner`] scopes are open: nothing may change the setting meanwhile.
    static PINS: Cell<u32> = const { Cell::new(0) };
    /// While [`without_owner`] itself sets the setting.
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// The setting's value while a contract's checker runs, or after a transaction's binding was
/// undone ([`pin_a_reverted_binding`]): longer than any owner id may be
/// ([`pg_intent_protocol::limits::MAX_NAME_CHARS`]), so it is no owner's, and it says what it is
/// to whoever reads `SHOW intent.owner_id` there. [`bound_owner`] reads it as "no owner".
pub const NO_OWNER: &str = concat!(
    "(no owner: a contract checker runs, or this transaction's binding was undone; pg_intent reads no owner's rows) ",
    "................................................................................",
    "................................................................................",
    "................................................................................",
);

/// Registers the setting; called from `_PG_init`, first thing.
///
/// Refuses (55000) the library's first load in parallel mode while the setting holds a
/// placeholder value that the catalog would not give back: PostgreSQL cannot re-apply it there
/// and would drop it, and a gateway's binding could be that value. Nothing is registered then,
/// the placeholder stays, and the next load outside parallel mode keeps it.
pub fn register() {
    // SAFETY: reads a setting (a placeholder, before the definition) and the parallel flag.
    let (placeholder, parallel) = unsafe {
        let value = pg_sys::GetConfigOption(c"intent.owner_id".as_ptr(), true, false);
        let value = (!value.is_null())
            .then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
            .filter(|v| !v.is_empty());
        (value, pg_sys::IsInParallelMode())
    };
    if parallel && let Some(value) = placeholder {
        // SAFETY: a plain read of a backend global.
        let session_user = unsafe { pg_sys::GetSessionUserId() };
        let kept = binding_of(session_user, true).map(|(o, _)| o) == Some(value);
        // The transaction-end callback is not registered yet: forget what was read here.
        BINDINGS.with_borrow_mut(HashMap::clear);
        FILLED_IN_TRANSACTION.set(false);
        if !kept {
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                "pg_intent cannot be loaded for the first time inside a parallel query while intent.owner_id is set",
                "pg_intent::owner::register",
            )
            .set_detail("PostgreSQL cannot keep a setting's value when a library defining it is first loaded in parallel mode: the session's binding would be lost. Nothing was changed; the setting keeps its value.")
            .set_hint("Load the library before the parallel query: run any pg_intent call first, LOAD 'pg_intent', or add it to session_preload_libraries.")
            .report(PgLogLevel::ERROR);
        }
    }
    // What the definition re-applies (the placeholder's values) neither binds the transaction
    // nor is refused: the first read or SET after the load does.
    {
        let _internal = Internal::enter();
        define();
    }
    // SAFETY: registers a callback and chains the executor hook, as every extension does; no
    // SQL.
    unsafe {
        pg_sys::RegisterXactCallback(Some(transaction_ends), std::ptr::null_mut());
        PREVIOUS_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        PREVIOUS_EXECUTOR_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
    }
}

static mut PREVIOUS_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREVIOUS_EXECUTOR_RUN: pg_sys::ExecutorRun_hook_type = None;

// PostgreSQL's own, declared here rather than through pgrx's bindings (which would carry an
// error it raises on as a Rust panic and rebuild it): an error goes to PostgreSQL's handler
// directly, with nothing of ours on the stack to skip.
unsafe extern "C-unwind" {
    #[link_name = "standard_ExecutorStart"]
    fn postgres_standard_executor_start(query: *mut pg_sys::QueryDesc, eflags: i32);
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    #[link_name = "standard_ExecutorRun"]
    fn postgres_standard_executor_run(
        query: *mut pg_sys::QueryDesc,
        direction: pg_sys::ScanDirection::Type,
        count: u64,
        execute_once: bool,
    );
    #[cfg(feature = "pg18")]
    #[link_name = "standard_ExecutorRun"]
    fn postgres_standard_executor_run(
        query: *mut pg_sys::QueryDesc,
        direction: pg_sys::ScanDirection::Type,
        count: u64,
    );
}

/// Before every run of a query a leader starts: [`pin_a_reverted_binding`] again. ExecutorStart
/// itself can run the caller's code after the pin at its entry (executor-startup partition
/// pruning evaluates STABLE functions, which may reset the setting by NULL); the run is the
/// last point before the executor enters parallel mode and a Gather copies the settings to
/// its workers (after it, PostgreSQL refuses every change of a setting but a function's `SET`
/// clause, which the check hook sees). It also covers a portal bound, then executed later.
#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
unsafe extern "C-unwind" fn executor_run(
    query: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    // SAFETY: inside pgrx's guard; then the previous hook, or PostgreSQL's own, with the
    // arguments PostgreSQL gave.
    unsafe {
        pg_sys::submodules::panic::pgrx_extern_c_guard(pin_a_reverted_binding);
        match PREVIOUS_EXECUTOR_RUN {
            Some(previous) => previous(query, direction, count, execute_once),
            None => postgres_standard_executor_run(query, direction, count, execute_once),
        }
    }
}

/// [`executor_run`] as PostgreSQL 18 calls it (no `execute_once`).
#[cfg(feature = "pg18")]
unsafe extern "C-unwind" fn executor_run(
    query: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    // SAFETY: as above.
    unsafe {
        pg_sys::submodules::panic::pgrx_extern_c_guard(pin_a_reverted_binding);
        match PREVIOUS_EXECUTOR_RUN {
            Some(previous) => previous(query, direction, count),
            None => postgres_standard_executor_run(query, direction, count),
        }
    }
}

/// Before every query a leader starts: [`pin_a_reverted_binding`] (and again before it runs,
/// [`executor_run`], before it can launch a parallel worker, which copies the settings as
/// they are then).
unsafe extern "C-unwind" fn executor_start(query: *mut pg_sys::QueryDesc, eflags: i32) {
    // SAFETY: inside pgrx's guard; then the previous hook, or PostgreSQL's own, with the
    // arguments PostgreSQL gave.
    unsafe {
        pg_sys::submodules::panic::pgrx_extern_c_guard(pin_a_reverted_binding);
        match PREVIOUS_EXECUTOR_START {
            Some(previous) => previous(query, eflags),
            None => postgres_standard_executor_start(query, eflags),
        }
    }
}

/// Rule 1's other half, and what the workers trust. A change of the setting that PostgreSQL
/// makes without asking — the rollback of a savepoint, the end of a function's `SET` clause, a
/// reset by `set_config(…, NULL, …)` — leaves the transaction bound to an owner the setting no
/// longer names. [`bound_owner`] reads that as no owner; so that parallel workers, which read
/// only the settings, do too, the setting itself is set to [`NO_OWNER`] for the rest of the
/// transaction (`SET LOCAL`). And `intent.transaction_binding` is set to what binds the
/// transaction, which no SQL can change: a worker whose copy of the setting differs from it
/// (the caller's code reset the setting after this ran, before its workers were launched)
/// acts for no owner. Run before every query starts and runs and before every utility
/// statement; only the leader, outside parallel mode, can set settings.
pub fn pin_a_reverted_binding() {
    // SAFETY: plain reads of backend state.
    let (in_transaction, parallel, worker) = unsafe {
        (
            pg_sys::IsTransactionState(),
            pg_sys::IsInParallelMode(),
            pg_sys::ParallelWorkerNumber >= 0,
        )
    };
    if !in_transaction || parallel || worker {
        return;
    }
    // The binding in force when the transaction's first statement runs (a session-level SET or
    // the role's, from an earlier transaction) binds it too: tenant code that runs before
    // anything reads it (a trigger on the tenant's own table) cannot change it either. The
    // statements that bind or begin a transaction ([`binds_or_begins`]) do not pin it.
    if TRANSACTION_OWNER.with_borrow(Option::is_none)
        && let Some(owner) = setting()
    {
        bind_transaction(owner);
    }
    if reverted(None) {
        set_no_owner(pg_sys::GucAction::GUC_ACTION_LOCAL);
    }
    // What binds the transaction now, for the workers (empty: not bound, nothing to keep).
    let binding = if PINS.get() > 0 || setting().as_deref() == Some(NO_OWNER) {
        Some(NO_OWNER.to_string())
    } else {
        TRANSACTION_OWNER.with_borrow(|o| o.clone())
    };
    if let Some(binding) = binding
        && transaction_binding().as_deref() != Some(binding.as_str())
    {
        let value = CString::new(binding).unwrap_or_default();
        // SAFETY: SET LOCAL with the backend-start context, which only code can give; no SQL.
        unsafe {
            let _internal = Internal::enter();
            pg_sys::set_config_option(
                c"intent.transaction_binding".as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SU_BACKEND,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_LOCAL,
                true,
                0,
                false,
            );
        }
    }
}

/// `intent.transaction_binding`'s value, when it holds one.
fn transaction_binding() -> Option<String> {
    TRANSACTION_BINDING
        .get()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
}

/// Sets the setting to [`NO_OWNER`] with `action` (`SET LOCAL`, or a function's `SET` clause at
/// the current nesting level), as a superuser's function would (the setting is superuser-only);
/// the check hook lets pg_intent's own change through ([`INTERNAL`]).
fn set_no_owner(action: pg_sys::GucAction::Type) {
    let no_owner = CString::new(NO_OWNER).expect("no NUL");
    // SAFETY: the value is copied by the GUC machinery; no SQL.
    unsafe {
        let _internal = Internal::enter();
        pg_sys::set_config_option(
            c"intent.owner_id".as_ptr(),
            no_owner.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            0,
            false,
        );
    }
}

/// Whether the setting (`now`, or read when None is given) no longer says what binds: a
/// checker is running and it is not [`NO_OWNER`], or the transaction is bound to an owner it
/// no longer names (and not to no owner already). Changes PostgreSQL makes without a check
/// hook lead here: a rolled-back savepoint, the end of a function's `SET` clause, and a reset
/// by `set_config(…, NULL, …)` or an `UPDATE` of `pg_settings`.
fn reverted(now: Option<Option<&str>>) -> bool {
    let pinned = PINS.get() > 0;
    TRANSACTION_OWNER.with_borrow(|owner| {
        if owner.is_none() && !pinned {
            return false;
        }
        let read;
        let now = match now {
            Some(now) => now,
            None => {
                read = setting();
                read.as_deref()
            }
        };
        // While a checker runs, the setting must say no owner (a reset by NULL, which runs no
        // check hook, may have changed it); otherwise it must name the transaction's owner.
        now != Some(NO_OWNER) && (pinned || now != owner.as_deref())
    })
}

/// While pg_intent itself sets the setting ([`INTERNAL`]); cleared however the scope ends.
struct Internal;

impl Internal {
    fn enter() -> Internal {
        INTERNAL.set(true);
        Internal
    }
}

impl Drop for Internal {
    fn drop(&mut self) {
        INTERNAL.set(false);
    }
}

fn define() {
    GucRegistry::define_string_guc(
        c"intent.transaction_binding",
        c"Internal: what binds the current transaction, for pg_intent's parallel workers.",
        c"Set by pg_intent only. A parallel worker acts for no owner when intent.owner_id differs from it.",
        &TRANSACTION_BINDING,
        GucContext::SuBackend,
        GucFlags::NO_SHOW_ALL | GucFlags::DISALLOW_IN_FILE | GucFlags::NO_RESET_ALL,
    );
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
            Some(check_owner),
            Some(assign_owner),
            None,
        );
    }
}

/// Why changing the setting to `value` now would break rule 1 or 2 of the module comment
/// (message, detail), or None when the change may go ahead. The one place the rule is decided;
/// [`check_owner`] and [`check_utility`] apply it where PostgreSQL makes each kind of change.
fn refused_change(value: &str) -> Option<(String, String)> {
    if PINS.get() > 0 {
        return Some((
            "intent.owner_id cannot be changed while a contract's checker runs".to_string(),
            "A checker reads no owner's rows, whatever the setting says.".to_string(),
        ));
    }
    if setting().as_deref() == Some(NO_OWNER) && value != NO_OWNER {
        return Some((
            "intent.owner_id cannot change within a transaction once it has bound it".to_string(),
            "This transaction acts for no owner until it ends: its binding was undone within it."
                .to_string(),
        ));
    }
    match TRANSACTION_OWNER.with_borrow(|o| o.clone()) {
        Some(owner) if owner != value => Some((
            "intent.owner_id cannot change within a transaction once it has bound it".to_string(),
            format!(
                "This transaction acts for owner \"{owner}\" until it ends; one transaction acts for one owner."
            ),
        )),
        _ => None,
    }
}

const CHANGE_HINT: &str = "Bind once per transaction (SET LOCAL intent.owner_id at its start); change it after COMMIT or ROLLBACK.";

/// The setting's check hook: applies [`refused_change`] to `SET`, `SET LOCAL`, `set_config()`
/// and a function's `SET` clause (source `PGC_S_SESSION`, in a transaction, in the leader). It
/// passes everything else: validation (`ALTER ROLE … SET`: `PGC_S_TEST`), initialization and
/// login settings, a parallel worker restoring its leader's settings (it must take them as they
/// are), and pg_intent's own load and pin ([`INTERNAL`]). `RESET` and `SET … TO DEFAULT` run no
/// check hook: [`check_utility`] sees them. Reverting a change — at the end of a
/// (sub)transaction or of a function's `SET` clause — runs neither: it puts back a value that
/// was allowed.
#[pg_guard]
unsafe extern "C-unwind" fn check_owner(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: newval points at the proposed value (or NULL); the rest are plain reads.
    let (value, in_transaction, worker, restoring) = unsafe {
        let value = if newval.is_null() || (*newval).is_null() {
            String::new()
        } else {
            CStr::from_ptr(*newval).to_string_lossy().into_owned()
        };
        (
            value,
            pg_sys::IsTransactionState(),
            pg_sys::ParallelWorkerNumber >= 0,
            pg_sys::InitializingParallelWorker,
        )
    };
    if source != pg_sys::GucSource::PGC_S_SESSION || INTERNAL.get() || !in_transaction || restoring
    {
        return true;
    }
    let refused = if worker {
        // A worker changes the setting only through a function's SET clause (PostgreSQL
        // allows those in parallel mode). What binds is what it restored from its leader: the
        // leader's transaction owner, or no owner; it may change nothing when that is bound.
        match setting() {
            Some(now) if now != value => Some((
                "intent.owner_id cannot change within a transaction once it has bound it"
                    .to_string(),
                "A parallel worker acts for its leader's binding.".to_string(),
            )),
            _ => None,
        }
    } else {
        refused_change(&value)
    };
    let Some((message, detail)) = refused else {
        return true;
    };
    // SAFETY: what GUC_check_errcode() and the GUC_check_err*() macros do: the strings are
    // read by the caller's ereport, in the caller's memory context.
    unsafe {
        pg_sys::GUC_check_errcode(PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE as i32);
        let text = |s: &str| pg_sys::pstrdup(CString::new(s).unwrap_or_default().as_ptr());
        pg_sys::GUC_check_errmsg_string = text(&message);
        pg_sys::GUC_check_errdetail_string = text(&detail);
        pg_sys::GUC_check_errhint_string = text(CHANGE_HINT);
    }
    false
}

/// Whether a utility statement sets a setting (`SET`, `SET LOCAL`, `RESET`, `SET TRANSACTION`)
/// or controls the transaction (`BEGIN`, `SAVEPOINT`, `COMMIT`, …): the utility hook does not
/// pin the transaction's binding before those, so that a gateway can bind (or rebind) at a
/// transaction's start.
///
/// # Safety
/// `stmt` is the statement the utility hook was given (or NULL).
pub unsafe fn binds_or_begins(stmt: *mut pg_sys::Node) -> bool {
    // SAFETY: a read of the node's tag.
    !stmt.is_null()
        && matches!(
            unsafe { (*stmt).type_ },
            pg_sys::NodeTag::T_VariableSetStmt | pg_sys::NodeTag::T_TransactionStmt
        )
}

/// For every utility statement (the utility hook, `citus_guard.rs`): applies [`refused_change`] to
/// `RESET intent.owner_id` and `SET intent.owner_id TO DEFAULT`, which PostgreSQL carries out
/// without the check hook (it puts the reset value back directly).
///
/// # Safety
/// `stmt` is the statement the utility hook was given (or NULL).
pub unsafe fn check_utility(stmt: *mut pg_sys::Node) {
    // SAFETY: the node's tag is read before it is cast; the name is a C string of the node.
    let resets = unsafe {
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_VariableSetStmt {
            return;
        }
        let set = stmt as *mut pg_sys::VariableSetStmt;
        matches!(
            (*set).kind,
            pg_sys::VariableSetKind::VAR_RESET | pg_sys::VariableSetKind::VAR_SET_DEFAULT
        ) && !(*set).name.is_null()
            && CStr::from_ptr((*set).name)
                .to_bytes()
                .eq_ignore_ascii_case(b"intent.owner_id")
    };
    if !resets {
        return;
    }
    // SAFETY: reads the value RESET would put back.
    let reset_to = unsafe {
        let v = pg_sys::GetConfigOptionResetString(c"intent.owner_id".as_ptr());
        if v.is_null() {
            String::new()
        } else {
            CStr::from_ptr(v).to_string_lossy().into_owned()
        }
    };
    if let Some((message, detail)) = refused_change(&reset_to) {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            message,
            "pg_intent::owner::check_utility",
        )
        .set_detail(detail)
        .set_hint(CHANGE_HINT)
        .report(PgLogLevel::ERROR);
    }
}

/// Remembers the first owner the setting holds in a transaction.
#[pg_guard]
unsafe extern "C-unwind" fn assign_owner(newval: *const c_char, _extra: *mut c_void) {
    // SAFETY: newval is the setting's new value (or NULL); the transaction state is a read.
    let value = unsafe {
        if newval.is_null() || !pg_sys::IsTransactionState() || INTERNAL.get() {
            return;
        }
        CStr::from_ptr(newval).to_string_lossy().into_owned()
    };
    bind_transaction(value);
}

/// Binds the current transaction to `owner` unless it is bound already (or `owner` is none).
fn bind_transaction(owner: String) {
    if !owner.is_empty() && owner != NO_OWNER && TRANSACTION_OWNER.with_borrow(Option::is_none) {
        TRANSACTION_OWNER.set(Some(owner));
    }
}

/// At the end of every transaction: forget its owner; after an abort, forget what was
/// read from the catalog during it.
#[pg_guard]
unsafe extern "C-unwind" fn transaction_ends(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PREPARE => {
            TRANSACTION_OWNER.set(None);
            FILLED_IN_TRANSACTION.set(false);
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => {
            TRANSACTION_OWNER.set(None);
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

/// Runs `f` with this session's reads bound to no owner, whatever the setting said: for a
/// contract's checker, which runs in the completing session. The setting holds [`NO_OWNER`] at a
/// GUC nesting level of its own (as a function's `SET` clause), so that parallel workers of the
/// checker's queries, which restore the leader's settings, read no owner's rows either; nothing
/// may change it meanwhile ([`check_owner`]).
pub fn without_owner<R>(f: impl FnOnce() -> R) -> R {
    struct Scope(i32);
    impl Drop for Scope {
        fn drop(&mut self) {
            PINS.set(PINS.get() - 1);
            // SAFETY: closes the level opened below, as a function's exit does; on an error the
            // abort of the (sub)transaction has closed it already and this does nothing.
            unsafe { pg_sys::AtEOXact_GUC(true, self.0) };
        }
    }
    // SAFETY: what fmgr_security_definer does for a function's SET clause: a nesting level of
    // its own, closed by `Scope`.
    let level = unsafe { pg_sys::NewGUCNestLevel() };
    set_no_owner(pg_sys::GucAction::GUC_ACTION_SAVE);
    PINS.set(PINS.get() + 1);
    let _scope = Scope(level);
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
    let setting = setting();
    if setting.as_deref() == Some(NO_OWNER) || reverted(Some(setting.as_deref())) {
        return Some(String::new());
    }
    // SAFETY: a plain read of a backend global.
    if unsafe { pg_sys::ParallelWorkerNumber >= 0 }
        && let Some(binding) = transaction_binding()
        && setting.as_deref() != Some(binding.as_str())
    {
        // The leader made sure the transaction was bound to `binding`; the setting copied to
        // this worker says otherwise (reset after the leader's last pin): no owner.
        return Some(String::new());
    }
    // SAFETY: plain reads of the backend's user ids and transaction state.
    let (user, session_user, in_transaction) = unsafe {
        (
            pg_sys::GetUserId(),
            pg_sys::GetSessionUserId(),
            pg_sys::IsTransactionState(),
        )
    };
    if in_transaction
        && let Some(owner) = &setting
        && TRANSACTION_OWNER.with_borrow(Option::is_none)
    {
        bind_transaction(owner.clone());
    }
    let session = setting.or_else(|| binding_of(session_user, true).map(|(o, _)| o));
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
        .detail("A contract's checker is running, or the binding of the role the code runs as differs from the session's.")
        .hint("Submit from the session's own role, outside a checker.")),
        Some(bound) if bound != owner_id => Err(Refusal::insufficient_privilege(format!(
            "this session acts for owner \"{bound}\" and cannot submit for owner \"{owner_id}\""
        ))
        .detail("The setting intent.owner_id binds the session to one owner.")
        .hint("Submit with the owner_id the session is bound to.")),
        _ => Ok(()),
    }
}
