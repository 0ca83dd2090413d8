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

/// Whether a SQLSTATE says "not now": the server could not do the work at this moment and the
/// same request may well succeed later, so a service answers `503` with `Retry-After` (an
/// idempotent request, such as a submit with its key, is safe to send again):
///
/// * class `08`, connection exception;
/// * `40001` serialization_failure and `40P01` deadlock_detected (retry the transaction);
/// * class `53`, insufficient resources (`53300` too_many_connections, `53200` out_of_memory,
///   `53100` disk_full, …);
/// * `55P03` lock_not_available (`lock_timeout`);
/// * `57014` query_canceled (`statement_timeout`, `pg_cancel_backend`), `57P01`
///   admin_shutdown (`pg_terminate_backend`, a fast shutdown), `57P02` crash_shutdown,
///   `57P03` cannot_connect_now (the server is starting or stopping);
/// * `58000` system_error and `58030` io_error (the server's own I/O);
/// * `25006` read_only_sql_transaction (a standby, or the old primary after a failover: the
///   next connection may reach the new one).
///
/// Not `54000` (pg_intent's own limit: the same request fails again) nor `57P04`
/// database_dropped.
pub fn is_transient(code: &str) -> bool {
    matches!(
        code,
        "40001"
            | "40P01"
            | "55P03"
            | "57014"
            | "57P01"
            | "57P02"
            | "57P03"
            | "58000"
            | "58030"
            | "25006"
    ) || code.starts_with("08")
        || code.starts_with("53")
}

/// The HTTP status for any SQLSTATE a call can end with: the table's for pg_intent's own,
/// 503 for a transient one ([`is_transient`]: retry later), 400 for other data exceptions
/// (class `22`: a NUL byte, a `\u0000` in JSON, a malformed uuid…), 500 otherwise.
pub fn http_status(code: &str) -> u16 {
    if let Some(state) = SqlState::from_code(code) {
        return state.http_status();
    }
    match code {
        c if is_transient(c) => 503,
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

    #[test]
    fn transient_codes_are_503() {
        for code in [
            "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "08000", "08006",
            "08P01", "53000", "53100", "53200", "53300", "53400",
        ] {
            assert!(is_transient(code), "{code}");
            assert_eq!(http_status(code), 503, "{code}");
        }
        // Not transient: the same request fails again.
        for (code, status) in [
            ("54000", 500),
            ("57P04", 500),
            ("55000", 500),
            ("25P02", 500),
            ("42501", 403),
            ("IJ003", 409),
            ("22023", 400),
        ] {
            assert!(!is_transient(code), "{code}");
            assert_eq!(http_status(code), status, "{code}");
        }
        // The table agrees: its only 503 is a transient code.
        for row in SQLSTATES {
            assert_eq!(row.3 == 503, is_transient(row.1), "{row:?}");
        }
    }
}
