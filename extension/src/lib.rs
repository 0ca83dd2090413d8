//! pg_intent: durable jobs and attempts that make retries and fallbacks safe, enforced inside
//! PostgreSQL. The public contract is `docs/reference.md`; the schema lives in `sql/`, one file per concern.
//!
//! Layering: each protocol call is a version-1 C function written in Rust (`entry.rs`) that does
//! the work through cached SPI plans, gets back a value or a refusal, and raises the refusal
//! with its exact SQLSTATE after pgrx's guard (see `entry.rs` for why). `sql/api.sql` declares
//! them.

// pgrx reads a function's result columns from the tuple written inline in its signature, so
// the core functions cannot name their row types with aliases.
#![allow(clippy::type_complexity)]

use pgrx::prelude::*;

::pgrx::pg_module_magic!(name, version);

/// Runs when a backend loads the library: registers the `intent.owner_id` setting before any
/// call (or row-level security policy) can read it.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pgrx appends a Rust backtrace to the DETAIL of every PostgreSQL error that crosses Rust
    // (a serialization failure, a deadlock…) when backtraces are enabled in the server's
    // environment, e.g. by a RUST_BACKTRACE=1 inherited from a shell. Clients would then get
    // stack frames instead of PostgreSQL's own DETAIL. Off unless asked for explicitly.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: a backend is single-threaded, and this runs before anything reads the variable.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
    owner::register();
    contract::register();
    purge::register();
    claim::register();
    claim_start::register();
    dist::register();
    citus_guard::register();
}

mod batch;
mod begin;
mod checker;
mod citus_guard;
mod claim;
mod claim_start;
mod clock;
mod contract;
mod decisions;
mod dist;
mod entry;
mod finish;
mod ids;
mod input;
mod job;
mod jsonb;
mod lease;
mod owner;
mod plans;
mod purge;
mod refusal;
mod schema;
mod settings;
mod state;
mod store;
mod submit;

extension_sql_file!("../../sql/types.sql", name = "types", bootstrap);
extension_sql_file!(
    "../../sql/jobs.sql",
    name = "jobs",
    requires = ["types", ids::job_id, ids::job_of]
);
extension_sql_file!(
    "../../sql/attempts.sql",
    name = "attempts",
    requires = ["jobs", ids::attempt_id]
);
extension_sql_file!(
    "../../sql/events.sql",
    name = "events",
    requires = ["jobs", ids::job_of]
);
extension_sql_file!(
    "../../sql/contracts.sql",
    name = "contracts",
    requires = ["jobs"]
);
extension_sql_file!(
    "../../sql/isolation.sql",
    name = "isolation",
    requires = ["jobs", "attempts", "events", owner::bound_owner]
);
extension_sql_file!(
    "../../sql/api.sql",
    name = "api",
    requires = ["attempts", "events", "contracts", "isolation"]
);
extension_sql_file!(
    "../../sql/contracts_api.sql",
    name = "contracts_api",
    requires = ["contracts", "api"]
);
extension_sql_file!(
    "../../sql/views.sql",
    name = "views",
    requires = ["attempts", "contracts", "isolation"]
);
extension_sql_file!(
    "../../sql/distribute.sql",
    name = "distribute",
    requires = ["api", "contracts_api", "views", "isolation"]
);
extension_sql_file!(
    "../../sql/settings.sql",
    name = "settings",
    requires = ["views"]
);
extension_sql_file!("../../sql/privileges.sql", name = "privileges", finalize);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
