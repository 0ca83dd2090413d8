//! Errors, by SQLSTATE.
//!
//! Every refusal of docs/reference.md § 6 has its own variant, chosen by the SQLSTATE alone. The
//! facts a program acts on (which fields differ, which attempt blocks) come from the DETAIL's facts
//! line (`pg_intent_protocol::facts`), never from its prose; what the server said stays reachable
//! through [`Error::db_error`]. Errors the server raised for other reasons are [`Error::Database`];
//! errors where the server said nothing (I/O, a closed connection) are [`Error::Connection`]; a
//! reply this client could not read is [`Error::Decode`]. An outcome a [`crate::Worker`] could not
//! report is [`Error::Unreported`], which keeps it.

use std::fmt;

use tokio_postgres::error::{DbError, SqlState};
use uuid::Uuid;

use crate::types::{Attempt, FingerprintField, JobState, Outcome, UnknownLabel};
use pg_intent_protocol::{Facts, SqlState as SqlStateOf};

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `IJ001` idempotency_conflict: the owner and key were already used for another intent
    /// (HTTP 422).
    #[error("IJ001 idempotency_conflict: {}", said(.source))]
    IdempotencyConflict {
        /// The job the key names.
        job_id: Uuid,
        /// The fields of the fingerprint that differ, as the DETAIL names them (empty when the
        /// conflict is a job id shared by two keys).
        fields: Vec<FingerprintField>,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ002` attempt_in_flight: an attempt is started and within its lease (HTTP 409).
    #[error("IJ002 attempt_in_flight: {}", said(.source))]
    AttemptInFlight {
        /// The job.
        job_id: Uuid,
        /// The attempt in flight, as the DETAIL names it.
        attempt_id: Option<Uuid>,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ003` outcome_unknown: an attempt's outcome is unknown; reconcile or abandon it before
    /// another attempt may begin (HTTP 409).
    #[error("IJ003 outcome_unknown: {}", said(.source))]
    OutcomeUnknown {
        /// The job.
        job_id: Uuid,
        /// The attempt whose outcome is unknown, as the DETAIL names it.
        attempt_id: Option<Uuid>,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ004` job_finished: the job is succeeded, failed or cancelled (HTTP 409).
    #[error("IJ004 job_finished: {}", said(.source))]
    JobFinished {
        /// The job.
        job_id: Uuid,
        /// Its terminal state, as the DETAIL names it.
        state: Option<JobState>,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ005` provider_not_certified: failover to a provider without a current certification
    /// for the job's contract (HTTP 422).
    #[error("IJ005 provider_not_certified: {}", said(.source))]
    ProviderNotCertified {
        /// The job.
        job_id: Uuid,
        /// The provider asked for.
        provider: Option<String>,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ006` attempts_exhausted: `max_attempts` attempts exist (HTTP 409).
    #[error("IJ006 attempts_exhausted: {}", said(.source))]
    AttemptsExhausted {
        /// The job.
        job_id: Uuid,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `IJ007` not_found: no such job or attempt (HTTP 404).
    #[error("IJ007 not_found: {}", said(.source))]
    NotFound {
        /// The id that names nothing.
        id: Uuid,
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// `22023` invalid_parameter_value: bad input (an empty or over-long name, a non-positive
    /// lease, a version that is not the attempt's, …). Nothing was written (HTTP 400).
    #[error("22023 invalid_parameter_value: {}", said(.source))]
    InvalidInput {
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// Any other error the server raised (a serialization failure `40001`, a missing privilege
    /// `42501`, an aborted transaction `25P02`, …): see [`Error::code`].
    #[error("database error {}: {}", code_of(.source), said(.source))]
    Database {
        /// What the server raised.
        source: tokio_postgres::Error,
    },

    /// The server said nothing: the connection failed, closed or timed out. Whether a call
    /// that was sent took effect is unknown; repeating pg_intent's calls is safe.
    #[error("connection error: {source}")]
    Connection {
        /// The tokio-postgres error.
        source: tokio_postgres::Error,
    },

    /// A call got no answer within the time it was given ([`crate::Worker::call_timeout`]):
    /// its connection is taken as broken (a network path gone dark answers nothing and reports
    /// no error for many minutes). Whether the call took effect is unknown; repeating
    /// pg_intent's reports is safe.
    #[error("no answer from the server within {0:?}")]
    Timeout(std::time::Duration),

    /// The server answered, but the client could not read the answer into the type asked for
    /// (a column of another type, an unexpected number of rows), or could not encode a
    /// parameter: a mismatch between this client and the extension, not a connection problem.
    /// Repeating the call gives the same error.
    #[error("could not read the server's reply: {source}")]
    Decode {
        /// The tokio-postgres error.
        source: tokio_postgres::Error,
    },

    /// A [`crate::Worker`] had an outcome in hand — a result, a definite failure, or an
    /// unknown outcome — and could not report it, after retrying on fresh connections for as
    /// long as it was allowed to. The outcome is kept here (and was logged, `log` target
    /// `pg_intent_client`): report it with [`crate::Unreported::report`] once the database is back.
    /// Until then the attempt stays `started`, its lease runs out and it counts as `unknown`:
    /// no other attempt begins behind its back.
    #[error("{0}")]
    Unreported(Box<Unreported>),

    /// Params, a result or an error could not be serialized to JSON (nothing was sent).
    #[error("could not serialize to JSON: {0}")]
    Serialize(#[source] serde_json::Error),

    /// A JSON document from the database does not deserialize into the type asked for.
    #[error("could not deserialize JSON from the database: {0}")]
    Deserialize(#[source] serde_json::Error),

    /// The database answered with a label this client does not know (a newer extension).
    #[error(transparent)]
    UnknownLabel(#[from] UnknownLabel),
}

fn said(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail().map(|d| {
            if carries_facts(db) {
                Facts::prose(d)
            } else {
                d
            }
        }) {
            Some(detail) => format!("{} ({detail})", db.message()),
            None => db.message().to_string(),
        },
        None => e.to_string(),
    }
}

fn code_of(e: &tokio_postgres::Error) -> &str {
    e.code().map_or("?????", SqlState::code)
}

/// What a call knew about its target, to fill in the facts of a refusal.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Context<'a> {
    /// The job the call is about.
    pub job_id: Uuid,
    /// The id the call was given (a job id or an attempt id).
    pub id: Uuid,
    /// The provider asked for.
    pub provider: Option<&'a str>,
}

impl Context<'_> {
    pub(crate) fn job(job_id: Uuid) -> Self {
        Context {
            job_id,
            id: job_id,
            provider: None,
        }
    }

    pub(crate) fn attempt(attempt_id: Uuid) -> Self {
        Context {
            job_id: crate::ids::job_of(attempt_id).unwrap_or(attempt_id),
            id: attempt_id,
            provider: None,
        }
    }
}

/// Whether pg_intent itself raised this error with a facts line: a refusal whose code carries
/// facts, raised by the extension (its errors name the file `pg_intent`; a contract checker's
/// error that pg_intent passes through names the file of the code that raised it).
fn carries_facts(db: &DbError) -> bool {
    db.file() == Some("pg_intent")
        && matches!(
            SqlStateOf::from_code(db.code().code()),
            Some(
                SqlStateOf::IdempotencyConflict
                    | SqlStateOf::AttemptInFlight
                    | SqlStateOf::OutcomeUnknown
                    | SqlStateOf::JobFinished
                    | SqlStateOf::AttemptsExhausted
            )
        )
}

/// The facts of an error: its facts line when pg_intent raised one, else what an extension
/// older than the facts line (0.2.0 and before) said in the DETAIL's sentence.
fn facts_of_error(db: &DbError) -> Facts {
    let detail = db.detail().unwrap_or("");
    if carries_facts(db)
        && let Some(facts) = Facts::from_detail(detail)
    {
        return facts;
    }
    match SqlStateOf::from_code(db.code().code()) {
        Some(SqlStateOf::IdempotencyConflict) => Facts {
            fields: Some(older::differing_fields(detail)),
            ..Facts::default()
        },
        Some(SqlStateOf::AttemptInFlight | SqlStateOf::OutcomeUnknown) => Facts {
            attempt_id: older::first_uuid(detail).map(|u| *u.as_bytes()),
            ..Facts::default()
        },
        Some(SqlStateOf::JobFinished) => Facts {
            job_state: older::terminal_state(detail),
            ..Facts::default()
        },
        _ => Facts::default(),
    }
}

/// How facts were read from the DETAIL's sentence before the facts line: kept for servers with
/// an extension older than the facts line, and used only when an error has no facts line.
mod older {
    use super::*;

    /// The fields named after "different" in an IJ001 DETAIL (`Job … exists with a
    /// different provider, params.`).
    pub(super) fn differing_fields(detail: &str) -> Vec<FingerprintField> {
        let Some(at) = detail.find("different") else {
            return Vec::new();
        };
        let mut fields: Vec<FingerprintField> = detail[at..]
            .split(|c: char| !c.is_ascii_alphabetic() && c != '_')
            .filter_map(|w| w.parse().ok())
            .collect();
        fields.dedup();
        fields
    }

    /// The first UUID written in a text.
    pub(super) fn first_uuid(text: &str) -> Option<Uuid> {
        let bytes = text.as_bytes();
        (0..bytes.len().saturating_sub(35)).find_map(|i| {
            let window = text.get(i..i + 36)?;
            let standalone = i == 0 || !bytes[i - 1].is_ascii_hexdigit();
            if standalone {
                Uuid::try_parse(window).ok()
            } else {
                None
            }
        })
    }

    /// The first terminal job state named in a text.
    pub(super) fn terminal_state(text: &str) -> Option<JobState> {
        text.split(|c: char| !c.is_ascii_alphabetic())
            .filter_map(|w| w.parse::<JobState>().ok())
            .find(|s| s.is_terminal())
    }
}

impl Error {
    /// Classifies a tokio-postgres error by its SQLSTATE.
    pub(crate) fn from_pg(source: tokio_postgres::Error, cx: Context<'_>) -> Error {
        let Some(db) = source.as_db_error() else {
            return if is_codec(&source) {
                Error::Decode { source }
            } else {
                Error::Connection { source }
            };
        };
        let facts = facts_of_error(db);
        let attempt_id = facts.attempt_id.map(Uuid::from_bytes);
        let Some(code) = SqlStateOf::from_code(db.code().code()) else {
            return Error::Database { source };
        };
        match code {
            SqlStateOf::IdempotencyConflict => Error::IdempotencyConflict {
                job_id: cx.job_id,
                fields: facts.fields.unwrap_or_default(),
                source,
            },
            SqlStateOf::AttemptInFlight => Error::AttemptInFlight {
                job_id: cx.job_id,
                attempt_id,
                source,
            },
            SqlStateOf::OutcomeUnknown => Error::OutcomeUnknown {
                job_id: cx.job_id,
                attempt_id,
                source,
            },
            SqlStateOf::JobFinished => Error::JobFinished {
                job_id: cx.job_id,
                state: facts.job_state.filter(|s| s.is_terminal()),
                source,
            },
            SqlStateOf::ProviderNotCertified => Error::ProviderNotCertified {
                job_id: cx.job_id,
                provider: cx.provider.map(str::to_string),
                source,
            },
            SqlStateOf::AttemptsExhausted => Error::AttemptsExhausted {
                job_id: cx.job_id,
                source,
            },
            SqlStateOf::NotFound => Error::NotFound { id: cx.id, source },
            SqlStateOf::InvalidParameterValue => Error::InvalidInput { source },
            _ => Error::Database { source },
        }
    }

    /// Classifies an error of a query of your own (a table read beside the calls, as the
    /// contract-test harness makes) exactly as the calls' errors are: by SQLSTATE, else as a
    /// connection or a decode error. Without a call's context, the ids a refusal's variant
    /// carries are nil.
    pub fn from_postgres(source: tokio_postgres::Error) -> Error {
        Error::from_pg(source, Context::default())
    }

    /// The tokio-postgres error behind this one, if any.
    pub fn pg_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Error::IdempotencyConflict { source, .. }
            | Error::AttemptInFlight { source, .. }
            | Error::OutcomeUnknown { source, .. }
            | Error::JobFinished { source, .. }
            | Error::ProviderNotCertified { source, .. }
            | Error::AttemptsExhausted { source, .. }
            | Error::NotFound { source, .. }
            | Error::InvalidInput { source }
            | Error::Database { source }
            | Error::Connection { source }
            | Error::Decode { source } => Some(source),
            Error::Unreported(u) => u.error().pg_error(),
            Error::Serialize(_)
            | Error::Deserialize(_)
            | Error::UnknownLabel(_)
            | Error::Timeout(_) => None,
        }
    }

    /// What the server raised: message, DETAIL, HINT and more. `None` when the server said
    /// nothing.
    pub fn db_error(&self) -> Option<&DbError> {
        self.pg_error().and_then(tokio_postgres::Error::as_db_error)
    }

    /// The SQLSTATE the server raised (`"IJ001"`, `"22023"`, `"40001"`, …).
    pub fn code(&self) -> Option<&str> {
        self.db_error().map(|db| db.code().code())
    }

    /// The server's DETAIL, as a sentence for people (the facts line of a pg_intent refusal
    /// left out: see [`Error::facts`]).
    pub fn detail(&self) -> Option<&str> {
        let db = self.db_error()?;
        let detail = db.detail()?;
        Some(if carries_facts(db) {
            Facts::prose(detail)
        } else {
            detail
        })
    }

    /// The facts the refusal carries: from its facts line, or, from an extension older than
    /// the facts line, as far as its DETAIL's sentence says them. Empty for other errors: a
    /// facts line in the DETAIL of an error pg_intent did not raise itself (a contract
    /// checker's, passed through) is not believed.
    pub fn facts(&self) -> Facts {
        self.db_error().map(facts_of_error).unwrap_or_default()
    }

    /// The server's HINT: what to do next.
    pub fn hint(&self) -> Option<&str> {
        self.db_error().and_then(DbError::hint)
    }

    /// The HTTP status the README's table of errors (and `pg_intent_protocol::sqlstate`) pairs with
    /// the error, for services that pass it on: 422, 409, 404 and 400 for the refusals, 400 for any
    /// other data exception (SQLSTATE class `22`), 403 for a missing privilege (`42501`, e.g. a
    /// submit for another owner than the one the session is bound to), 503 for a connection error
    /// or a transient SQLSTATE (retry later: a serialization failure or deadlock, a cancelled
    /// statement, a terminated backend, a lock timeout, classes `08` and `53`;
    /// `pg_intent_protocol::sqlstate::is_transient`), 500 otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Serialize(_) => 400,
            Error::Connection { .. } | Error::Timeout(_) => 503,
            Error::Unreported(u) => u.error().http_status(),
            // The table every layer shares (pg_intent_protocol::sqlstate): other data
            // exceptions are bad input too (a NUL byte in a text, 22021; a \u0000 in a JSON
            // string that jsonb cannot store, 22P05), a deadlock is retried like 40001.
            _ => self
                .code()
                .map_or(500, pg_intent_protocol::sqlstate::http_status),
        }
    }

    /// A serialization failure (`40001`) or deadlock (`40P01`): retry the whole transaction.
    pub fn is_retryable(&self) -> bool {
        matches!(self.code(), Some("40001" | "40P01"))
    }

    /// Whether the same call may succeed if it is simply made again, on a fresh connection:
    /// the connection failed or closed ([`Error::Connection`]), or the server refused or lost
    /// the call for a reason outside it — a connection exception, insufficient resources, the
    /// backend terminated or the server shutting down, a statement timeout or cancel, a lock
    /// not available, a serialization failure or deadlock, a server I/O error
    /// (`pg_intent_protocol::sqlstate::is_transient`, the same list the gateway answers 503
    /// for). pg_intent's reports (`complete_attempt`, `fail_attempt`, `mark_unknown`,
    /// `heartbeat`) may be repeated safely; a [`crate::Worker`] repeats them on these errors.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Connection { .. } | Error::Timeout(_) => true,
            Error::Unreported(u) => u.error().is_transient(),
            _ => self
                .code()
                .is_some_and(pg_intent_protocol::sqlstate::is_transient),
        }
    }
}

/// Whether a tokio-postgres error without a SQLSTATE is about converting values (a parameter,
/// a column, the row count), not about the connection. tokio-postgres does not expose its
/// error kinds; their messages are stable (`tokio_postgres::error::Kind`'s Display).
fn is_codec(e: &tokio_postgres::Error) -> bool {
    let text = e.to_string();
    [
        "error serializing parameter",
        "error deserializing column",
        "invalid column",
        "expected ",
        "query returned an unexpected number of rows",
        "query returned an unexpected number of columns",
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix))
}

/// An outcome that could not be reported: it is kept here, with the attempt (and so its
/// fencing token) it belongs to and the last error. See [`Error::Unreported`].
#[derive(Debug)]
pub struct Unreported {
    attempt: Attempt,
    outcome: Outcome,
    tries: u32,
    error: Error,
}

/// How much of an outcome's JSON the message of an [`Unreported`] shows.
const SHOWN_CHARS: usize = 2000;

impl Unreported {
    pub(crate) fn new(attempt: Attempt, outcome: Outcome, tries: u32, error: Error) -> Self {
        let unreported = Unreported {
            attempt,
            outcome,
            tries,
            error,
        };
        log::error!(target: "pg_intent_client", "{unreported}");
        unreported
    }

    /// The attempt, with the version to report it with.
    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// The outcome that was not reported.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// How many times the report was tried.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The last error.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The attempt and its outcome.
    pub fn into_parts(self) -> (Attempt, Outcome, Error) {
        (self.attempt, self.outcome, self.error)
    }
}

impl fmt::Display for Unreported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} of attempt {} (version {}) could not be reported after {} tries: {}; ",
            self.outcome.kind(),
            self.attempt.id(),
            self.attempt.version(),
            self.tries,
            self.error
        )?;
        let shown = |json: &str| match json.char_indices().nth(SHOWN_CHARS) {
            Some((at, _)) => format!("{}…", &json[..at]),
            None => json.to_string(),
        };
        match &self.outcome {
            Outcome::Completed { result } => write!(f, "result: {}", shown(result.get())),
            Outcome::Failed {
                error, retryable, ..
            } => write!(
                f,
                "failure (retryable: {retryable}): {}",
                shown(error.get())
            ),
            // Quoted and escaped: a reason holding a newline cannot forge a log line.
            Outcome::Unknown { reason } => write!(f, "reason: {:?}", shown(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_facts_of_a_detail() {
        let detail = "Job 62ccd04c-f6e5-82dd-aeee-a9dac8090000 exists with a different provider, params.\n\
                      Facts: job_id=62ccd04c-f6e5-82dd-aeee-a9dac8090000 fields=provider,params";
        let facts = Facts::from_detail(detail).unwrap_or_default();
        assert_eq!(
            facts.fields,
            Some(vec![FingerprintField::Provider, FingerprintField::Params])
        );
        assert_eq!(
            Facts::prose(detail),
            "Job 62ccd04c-f6e5-82dd-aeee-a9dac8090000 exists with a different provider, params."
        );
        assert_eq!(Facts::from_detail("no facts here"), None);
    }

    #[test]
    fn reads_an_older_extensions_sentence() {
        assert_eq!(
            older::differing_fields(
                "Job 62ccd04c-f6e5-82dd-aeee-a9dac8090000 exists with a different provider, params."
            ),
            vec![FingerprintField::Provider, FingerprintField::Params]
        );
        assert!(older::differing_fields("Two different keys derived the same job id.").is_empty());
        assert_eq!(
            older::first_uuid("Attempt 62ccd04c-f6e5-82dd-aeee-a9dac8090001 (no. 1) is started"),
            Some(Uuid::parse_str("62ccd04c-f6e5-82dd-aeee-a9dac8090001").unwrap())
        );
        assert_eq!(
            older::terminal_state("Job x is cancelled (version 2)."),
            Some(JobState::Cancelled)
        );
    }
}
