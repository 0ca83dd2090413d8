//! The view `intent.settings` (sql/settings.sql): every `intent.*` setting readable from any
//! session, the library's first call included.
//!
//! A setting of an extension exists only once its library is loaded (`_PG_init` registers it),
//! and PostgreSQL has no hook for a name it does not know: `SHOW intent.retention` before the
//! session's first pg_intent call fails ("unrecognized configuration parameter"; `SHOW` looks the
//! name up without creating a placeholder, guc.c `GetConfigOptionByName`). The view calls
//! `intent._load_library()` first: calling a C function of the library loads it, which
//! registers every setting with its default and the session's value (a placeholder set before
//! is taken over), and the view then reads `pg_settings`.

use crate::entry::void;
use crate::refusal::Answer;
use pgrx::pg_sys;

crate::entry::sql_function!(load_library, load_library, "intent._load_library");

/// `intent._load_library()`: nothing to do; being called loaded the library.
fn load_library(_fcinfo: pg_sys::FunctionCallInfo) -> Answer<pg_sys::Datum> {
    Ok(void())
}
