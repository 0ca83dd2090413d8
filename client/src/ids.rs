//! The derived ids, exactly as the database derives them (docs/reference.md § 1.4), as
//! [`Uuid`]s: the computation is `pg_intent_protocol`'s.

use pg_intent_protocol::IdError;
use uuid::Uuid;

/// The job id of `(owner_id, idempotency_key)`, exactly as the database derives it.
///
/// ```
/// let id = pg_intent_client::job_id("alice", "click-1").unwrap();
/// assert_eq!(id.to_string(), "62ccd04c-f6e5-82dd-aeee-a9dac8090000");
/// ```
pub fn job_id(owner_id: &str, idempotency_key: &str) -> Result<Uuid, IdError> {
    pg_intent_protocol::job_id(owner_id, idempotency_key).map(Uuid::from_bytes)
}

/// The id of attempt `attempt_no` (1–65535) of `job_id`.
///
/// ```
/// let job = pg_intent_client::job_id("alice", "click-1").unwrap();
/// let a1 = pg_intent_client::attempt_id(job, 1).unwrap();
/// assert_eq!(a1.to_string(), "62ccd04c-f6e5-82dd-aeee-a9dac8090001");
/// ```
pub fn attempt_id(job_id: Uuid, attempt_no: u16) -> Result<Uuid, IdError> {
    pg_intent_protocol::attempt_id(*job_id.as_bytes(), i64::from(attempt_no)).map(Uuid::from_bytes)
}

/// The job an attempt id belongs to.
pub fn job_of(attempt_id: Uuid) -> Result<Uuid, IdError> {
    pg_intent_protocol::job_of(*attempt_id.as_bytes()).map(Uuid::from_bytes)
}

/// The attempt number in an id (0 for a job id).
pub fn attempt_no_of(id: Uuid) -> u16 {
    pg_intent_protocol::attempt_no_of(*id.as_bytes())
}
