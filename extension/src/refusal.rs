//! Refusals: the documented errors, carried back to SQL as data. The Rust code never raises
//! one: it returns it, and `entry.rs` raises it (see there why). Because the raise aborts the
//! statement, a refusal never leaves a row behind.
//!
//! The constructors of refusals that more than one call makes live here, so that every call
//! says the same thing the same way.

use crate::state::{AttemptState, JobState};
use pg_intent_protocol::{Facts, FingerprintField, SqlState};
use pgrx::Uuid;

/// A documented refusal: SQLSTATE, message, DETAIL, the facts a program reads (appended to the
/// DETAIL as its last line, see `pg_intent_protocol::facts`) and, where one exists, a HINT.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub code: SqlState,
    pub message: String,
    pub detail: Option<String>,
    /// Boxed: most refusals carry none, and an `Answer` stays small.
    pub facts: Option<Box<Facts>>,
    pub hint: Option<String>,
}

/// The answer of an API call's body: a value, or a refusal that `entry.rs` raises.
pub type Answer<T> = Result<T, Refusal>;

impl Refusal {
    fn new(code: SqlState, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            detail: None,
            facts: None,
            hint: None,
        }
    }

    /// The facts this refusal carries.
    pub fn facts(mut self, facts: Facts) -> Self {
        self.facts = Some(Box::new(facts));
        self
    }

    /// The DETAIL as raised: the sentence, then the facts line. The sentence may quote text
    /// a caller chose (a worker name, a revocation reason), so no line of it may pass for a
    /// facts line: one that would is indented.
    pub fn full_detail(&self) -> Option<String> {
        let sentence = self.detail.as_deref().map(Facts::defuse);
        match (sentence, self.facts.as_ref().and_then(|f| f.line())) {
            (Some(d), Some(f)) => Some(format!("{d}\n{f}")),
            (d, f) => d.or(f),
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
        Self::new(SqlState::InvalidParameterValue, message)
    }

    /// `IJ001` idempotency_conflict.
    pub fn idempotency_conflict(message: impl Into<String>) -> Self {
        Self::new(SqlState::IdempotencyConflict, message)
    }

    /// `IJ002` attempt_in_flight.
    pub fn attempt_in_flight(message: impl Into<String>) -> Self {
        Self::new(SqlState::AttemptInFlight, message)
    }

    /// `IJ003` outcome_unknown.
    pub fn outcome_unknown(message: impl Into<String>) -> Self {
        Self::new(SqlState::OutcomeUnknown, message)
    }

    /// `IJ004` job_finished.
    pub fn job_finished(message: impl Into<String>) -> Self {
        Self::new(SqlState::JobFinished, message)
    }

    /// `IJ005` provider_not_certified.
    pub fn provider_not_certified(message: impl Into<String>) -> Self {
        Self::new(SqlState::ProviderNotCertified, message)
    }

    /// `IJ006` attempts_exhausted.
    pub fn attempts_exhausted(message: impl Into<String>) -> Self {
        Self::new(SqlState::AttemptsExhausted, message)
    }

    /// `IJ007` not_found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(SqlState::NotFound, message)
    }

    /// `42501` insufficient_privilege: acting for an owner the session is not bound to.
    pub fn insufficient_privilege(message: impl Into<String>) -> Self {
        Self::new(SqlState::InsufficientPrivilege, message)
    }

    /// `54000` program_limit_exceeded: a call would need more than pg_intent allows itself.
    pub fn program_limit(message: impl Into<String>) -> Self {
        Self::new(SqlState::ProgramLimitExceeded, message)
    }

    /// `40001` serialization_failure: the caller should retry the transaction.
    pub fn serialization_failure(message: impl Into<String>) -> Self {
        Self::new(SqlState::SerializationFailure, message)
    }
}

/// Facts naming a job.
pub fn job_facts(job_id: Uuid) -> Facts {
    Facts {
        job_id: Some(*job_id.as_bytes()),
        ..Facts::default()
    }
}

/// The `IJ007` refusal for a job id that names no job.
pub fn no_such_job(job_id: Uuid) -> Refusal {
    Refusal::not_found(format!("job {job_id} does not exist"))
        .detail(format!("No row in intent.jobs has id {job_id}."))
        .hint("Job ids are derived from (owner_id, idempotency_key) by intent.job_id(); check both, or submit the job first.")
}

/// The `IJ007` refusal for an attempt id that names no attempt.
pub fn no_such_attempt(attempt_id: Uuid) -> Refusal {
    Refusal::not_found(format!("attempt {attempt_id} does not exist"))
        .detail(format!("No row in intent.attempts has id {attempt_id}."))
        .hint("Use the attempt_id that intent.begin_attempt() returned.")
}

/// `IJ001` when the job id of a key is taken by another key: 112 bits of SHA-256 agreed for two
/// different keys. Never hand out another intent's job.
pub fn id_collision(job_id: Uuid) -> Refusal {
    Refusal::idempotency_conflict(format!(
        "job id {job_id} is already taken by another (owner_id, idempotency_key)"
    ))
    .detail("Two different keys derived the same job id.")
    .facts(Facts {
        fields: Some(Vec::new()),
        ..job_facts(job_id)
    })
    .hint("Use another idempotency key.")
}

/// `IJ001`: the key was used for another intent; the DETAIL names the fields that differ.
pub fn fingerprint_conflict(
    job_id: Uuid,
    owner_id: &str,
    key: &str,
    differ: &[FingerprintField],
) -> Refusal {
    let names: Vec<&str> = differ.iter().map(|f| f.as_str()).collect();
    Refusal::idempotency_conflict(format!(
        "idempotency key \"{key}\" of owner \"{owner_id}\" was already used for a different intent"
    ))
    .detail(format!("Job {job_id} exists with a different {}.", names.join(", ")))
    .facts(Facts {
        fields: Some(differ.to_vec()),
        ..job_facts(job_id)
    })
    .hint("Resend exactly the original provider, params and contract to get the existing job, or use a new idempotency key for a new intent.")
}

/// `40001` when a submit kept finding its job gone (concurrent purges) for all its rounds.
pub fn kept_disappearing(job_id: Uuid) -> Refusal {
    Refusal::serialization_failure(format!(
        "job {job_id} kept disappearing while it was being submitted"
    ))
    .hint("Retry the transaction.")
}

/// Facts naming a job's open attempt and its state as the protocol sees it.
pub fn attempt_facts(job_id: Uuid, attempt_id: Uuid, state: AttemptState) -> Facts {
    Facts {
        attempt_id: Some(*attempt_id.as_bytes()),
        attempt_state: Some(state),
        ..job_facts(job_id)
    }
}

/// Facts naming a job and its state.
pub fn job_state_facts(job_id: Uuid, state: JobState, version: i64) -> Facts {
    Facts {
        job_state: Some(state),
        version: Some(version),
        ..job_facts(job_id)
    }
}
