//! The SQLSTATEs pg_intent raises, with their names and the HTTP status a service passes on
//! (`docs/reference.md` § 6). One table; the extension raises these codes, the client
//! classifies by them, the gateway answers with their statuses.

/// A SQLSTATE pg_intent raises itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlState {
    /// `IJ001`: the key was used for another intent.
    IdempotencyConflict,
    /// `IJ002`: an attempt is started and within its lease.
    AttemptInFlight,
    /// `IJ003`: an attempt's outcome is unknown.
    OutcomeUnknown,
    /// `IJ004`: the job is succeeded, failed or cancelled.
    JobFinished,
    /// `IJ005`: failover to a provider without a current certification.
    ProviderNotCertified,
    /// `IJ006`: all `max_attempts` attempts exist.
    AttemptsExhausted,
    /// `IJ007`: no such job or attempt.
    NotFound,
    /// `22023`: bad input; nothing was read or written.
    InvalidParameterValue,
    /// `42501`: acting for an owner the session is not bound to, or inside maintenance.
    InsufficientPrivilege,
    /// `54000`: a call would need more than pg_intent allows itself.
    ProgramLimitExceeded,
    /// `40001`: retry the transaction.
    SerializationFailure,
}

/// Every code, with its SQLSTATE, name and HTTP status.
pub const SQLSTATES: &[(SqlState, &str, &str, u16)] = &[
    (
        SqlState::IdempotencyConflict,
        "IJ001",
        "idempotency_conflict",
        422,
    ),
    (SqlState::AttemptInFlight, "IJ002", "attempt_in_flight", 409),
    (SqlState::OutcomeUnknown, "IJ003", "outcome_unknown", 409),
    (SqlState::JobFinished, "IJ004", "job_finished", 409),
    (
        SqlState::ProviderNotCertified,
        "IJ005",
        "provider_not_certified",
        422,
    ),
    (
        SqlState::AttemptsExhausted,
        "IJ006",
        "attempts_exhausted",
        409,
    ),
    (SqlState::NotFound, "IJ007", "not_found", 404),
    (
        SqlState::InvalidParameterValue,
        "22023",
        "invalid_parameter_value",
        400,
    ),
    (
        SqlState::InsufficientPrivilege,
        "42501",
        "insufficient_privilege",
        403,
    ),
    (
        SqlState::ProgramLimitExceeded,
        "54000",
        "program_limit_exceeded",
        // A server-side limit, not the request's fault alone (the same intents pass in
        // smaller batches): a service answers 500, as for any unexpected refusal.
        500,
    ),
    (
        SqlState::SerializationFailure,
        "40001",
        "serialization_failure",
        503,
    ),
];

impl SqlState {
    const fn row(self) -> &'static (SqlState, &'static str, &'static str, u16) {
        &SQLSTATES[self as usize]
    }

    /// The five-character code (`"IJ001"`).
    pub const fn code(self) -> &'static str {
        self.row().1
    }

    /// The condition name (`"idempotency_conflict"`).
    pub const fn name(self) -> &'static str {
        self.row().2
    }

    /// The HTTP status a service answers with.
    pub const fn http_status(self) -> u16 {
        self.row().3
    }

    /// The code a five-character SQLSTATE is, if pg_intent raises it.
    pub fn from_code(code: &str) -> Option<SqlState> {
        SQLSTATES.iter().find(|r| r.1 == code).map(|r| r.0)
    }
}

/// The HTTP status for any SQLSTATE a call can end with: the table's for pg_intent's own,
/// 503 for a deadlock (retry), 400 for other data exceptions (class `22`: a NUL byte, a
/// `\u0000` in JSON, a malformed uuid…), 500 otherwise.
pub fn http_status(code: &str) -> u16 {
    if let Some(state) = SqlState::from_code(code) {
        return state.http_status();
    }
    match code {
        "40P01" => 503,
        c if c.starts_with("22") => 400,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_declaration_order() {
        for (i, row) in SQLSTATES.iter().enumerate() {
            assert_eq!(row.0 as usize, i, "{row:?}");
            assert_eq!(SqlState::from_code(row.1), Some(row.0));
        }
        assert_eq!(http_status("22P02"), 400);
        assert_eq!(http_status("40P01"), 503);
        assert_eq!(http_status("XX000"), 500);
    }
}
