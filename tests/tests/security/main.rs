//! Secure by default, proven with real login roles (the test clusters trust local logins, so a
//! test connects as any role it creates):
//!
//! - PUBLIC can use nothing in schema `intent`: no table, view or sequence privilege, no
//!   EXECUTE on any function — checked in the catalog and by actually trying every one.
//! - `intent_app`, `intent_operator` and `intent_admin` carry exactly the calls the README
//!   documents, and nothing else (catalog and real calls, function by function).
//! - Functions run as `intent_owner` (no superuser, no BYPASSRLS), and nothing a caller plants in
//!   `public` or `pg_temp` — tables, functions, operators — is ever used by them, whatever the
//!   caller's search_path.
//! - Owner isolation: a session bound to an owner sees and acts on that owner's rows only.
//! - `pg_dump` / `pg_restore` keeps every row (pg_extension_config_dump).
//!
//! One test binary, a module per concern: [`privileges`] (the catalog and real calls, role by
//! role), [`definer`] (who the functions run as, and their pinned search_path), [`shadows`]
//! (objects planted in `public` and `pg_temp`), [`owners`] (owner isolation and binding),
//! [`parallel`] (the same reads again through parallel workers), and
//! [`backups`].

mod backups;
mod definer;
mod owners;
mod parallel;
mod privileges;
mod shadows;
