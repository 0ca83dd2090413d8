//! Refusals: the documented errors of the SPEC, carried back to SQL as data.
//!
//! pgrx re-raises any error that crosses its guard through its enum of built-in SQLSTATEs, so a
//! custom code such as `IJ002` raised inside the guard would reach the client as `XX000`. The
//! Rust code therefore never raises a refusal: it returns one, and `entry.rs` raises it with the
//! exact SQLSTATE, DETAIL and HINT once the guard is behind. Because the raise aborts the
//! statement, a refusal never leaves a row behind.

/// A documented refusal: SQLSTATE, message, DETAIL facts and, where one exists, a HINT.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: &'static str,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

/// The answer of an API call's body: a value, or a refusal that `entry.rs` raises.
pub type Answer<T> = Result<T, Refusal>;

impl Refusal {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// `22023` invalid_parameter_value: bad input, nothing was looked up or written.
    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new("22023", message)
    }

    /// `IJ001` idempotency_conflict.
    pub fn idempotency_conflict(message: impl Into<String>) -> Self {
        Self::new("IJ001", message)
    }

    /// `IJ002` attempt_in_flight.
    pub fn attempt_in_flight(message: impl Into<String>) -> Self {
        Self::new("IJ002", message)
    }

    /// `IJ003` outcome_unknown.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        Self::new("IJ003", message)
    }

    /// `IJ004` job_finished.
    pub fn job_finished(message: impl Into<String>) -> Self {
        Self::new("IJ004", message)
    }

    /// `IJ005` provider_not_certified.
    pub fn provider_not_certified(message: impl Into<String>) -> Self {
        Self::new("IJ005", message)
    }

    /// `IJ006` attempts_exhausted.
    pub fn attempts_exhausted(message: impl Into<String>) -> Self {
        Self::new("IJ006", message)
    }

    /// `IJ007` not_found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("IJ007", message)
    }

    /// `42501` insufficient_privilege: acting for an owner the session is not bound to.
    pub fn insufficient_privilege(message: impl Into<String>) -> Self {
        Self::new("42501", message)
    }

    /// `54000` program_limit_exceeded: a call would need more than pg_intent allows itself.
    pub fn program_limit(message: impl Into<String>) -> Self {
        Self::new("54000", message)
    }

    /// `40001` serialization_failure: the caller should retry the transaction.
    pub fn serialization_failure(message: impl Into<String>) -> Self {
        Self::new("40001", message)
    }
}

/// The `IJ007` refusal for a job id that names no job.
pub fn no_such_job(job_id: pgrx::Uuid) -> Refusal {
    Refusal::not_found(format!("job {job_id} does not exist"))
        .detail(format!("No row in intent.jobs has id {job_id}."))
        .hint("Job ids are derived from (owner_id, idempotency_key) by intent.job_id(); check both, or submit the job first.")
}

/// The `IJ007` refusal for an attempt id that names no attempt.
pub fn no_such_attempt(attempt_id: pgrx::Uuid) -> Refusal {
    Refusal::not_found(format!("attempt {attempt_id} does not exist"))
        .detail(format!("No row in intent.attempts has id {attempt_id}."))
        .hint("Use the attempt_id that intent.begin_attempt() returned.")
}
