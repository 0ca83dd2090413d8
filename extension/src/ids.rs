//! The id derivations of docs/reference.md § 1.4 (`intent.job_id`, `intent.attempt_id`), as SQL
//! functions. They are immutable and strict (NULL in, NULL out, like PostgreSQL's own
//! functions); malformed input raises `22023`.

use pg_intent_protocol::IdError;
use pgrx::Uuid;
use pgrx::prelude::*;

fn refuse(err: IdError) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        err.to_string(),
        "pg_intent",
    )
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// The job id of an intent: SHA-256(owner_id ‖ 0x00 ‖ idempotency_key), as docs/reference.md § 1.4 says.
#[pg_extern(immutable, strict, parallel_safe)]
fn job_id(owner_id: &str, idempotency_key: &str) -> Uuid {
    match pg_intent_protocol::job_id(owner_id, idempotency_key) {
        Ok(bytes) => Uuid::from_bytes(bytes),
        Err(err) => refuse(err),
    }
}

/// The id of attempt `attempt_no` of a job: the job id with the number in its last two bytes.
#[pg_extern(immutable, strict, parallel_safe)]
fn attempt_id(job_id: Uuid, attempt_no: i32) -> Uuid {
    match pg_intent_protocol::attempt_id(*job_id.as_bytes(), i64::from(attempt_no)) {
        Ok(bytes) => Uuid::from_bytes(bytes),
        Err(err) => refuse(err),
    }
}

/// The job an attempt id belongs to.
#[pg_extern(immutable, strict, parallel_safe)]
fn job_of(attempt_id: Uuid) -> Uuid {
    match pg_intent_protocol::job_of(*attempt_id.as_bytes()) {
        Ok(bytes) => Uuid::from_bytes(bytes),
        Err(err) => refuse(err),
    }
}
