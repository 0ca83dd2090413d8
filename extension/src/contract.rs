//! Contracts: what a job's result must satisfy before it can win.

use crate::job::{Attempt, Job};
use crate::jsonb::Jsonb;
use pgrx::spi::SpiClient;

/// The error kind recorded on an attempt whose result broke the job's contract.
pub const VIOLATION: &str = "contract_violation";

/// Validates a result against the job's contract; on a violation records the rejection and
/// returns true.
pub fn reject(
    _client: &mut SpiClient<'_>,
    _job: &Job,
    _attempt: &Attempt,
    _contract: &str,
    _result: Jsonb,
) -> bool {
    false
}
