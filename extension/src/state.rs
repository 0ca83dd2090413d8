//! The state machine, as the extension uses it: the typed states, the open and terminal sets,
//! the deadline rule (as a Rust predicate and as the SQL fragments every statement is built
//! from), and the transition table every call follows.
//!
//! The definitions live in the shared `pg_intent_protocol` crate (`id/src/state.rs`), so that
//! the client, the gateway and the model check use the very same states and table; this module
//! adds how the extension reads them from a row.

pub use pg_intent_protocol::state::{AttemptState, JobState, effective_attempt, effective_job};
pub(crate) use pg_intent_protocol::{
    lapsed_sql, live_sql, open_attempt_states_sql, open_job_states_sql,
};

use crate::plans;
use pgrx::spi::SpiTupleTable;
use std::str::FromStr;

/// Reads a state column (written `state::text` in the statement) of the current row.
pub fn read<S: FromStr>(row: &SpiTupleTable<'_>, ordinal: usize) -> S
where
    S::Err: std::fmt::Display,
{
    let label: String = plans::must(row, ordinal);
    label
        .parse()
        .unwrap_or_else(|e| panic!("pg_intent: column {ordinal}: {e}"))
}
