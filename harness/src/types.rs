//! The harness's vocabulary: what is sent to a provider ([`Prompt`], [`Request`]) and how a
//! run is set up ([`RunOptions`]), a provider ([`Provider`]) and how its call fails
//! ([`ProviderError`], [`Delivery`]), and why a run failed ([`Failure`]), with the one mapping
//! from a failure to a worker's [`WorkError`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pg_intent_client::WorkError;
use serde_json::{Map, Value, json};

use crate::{RenderChecks, RunHistory};

/// The highest temperature a run or a request may ask for: 2, the range of the OpenAI API
/// (0 to 2), which OpenAI-compatible servers follow.
pub const MAX_TEMPERATURE: f64 = 2.0;

/// The longest `Retry-After` a failure carries into [`WorkError::retryable_after`]: 30 days,
/// the most `fail_attempt` takes.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30 * 86_400);

/// `Ok` for a temperature in 0 ..= [`MAX_TEMPERATURE`]; else what is wrong with it.
pub fn check_temperature(temperature: f64) -> Result<(), String> {
    if (0.0..=MAX_TEMPERATURE).contains(&temperature) {
        Ok(())
    } else {
        Err(format!(
            "the temperature must be a number from 0 to {MAX_TEMPERATURE}, not {temperature}"
        ))
    }
}

/// A rendered prompt: what the model is told (the format, the rules) and what it is asked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    /// The system prompt.
    pub system: String,
    /// The user prompt.
    pub user: String,
}

/// One call to a provider: the rendered prompt and the sampling settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The system prompt.
    pub system: String,
    /// The user prompt.
    pub user: String,
    /// The sampling temperature.
    pub temperature: f64,
    /// The most tokens to generate, if limited.
    pub max_tokens: Option<u32>,
    /// A sampling seed, for providers that take one.
    pub seed: Option<u64>,
    /// The provider's idempotency key for this call (`Idempotency-Key`): when a worker makes
    /// the call, the attempt id or its keyed derivation ([`pg_intent_client::ProviderKeys`]), so
    /// that a [`pg_intent_client::Reconciler`] can later ask the provider what became of it.
    /// `None` for the harness's own test runs.
    pub idempotency_key: Option<String>,
}

impl Request {
    /// A request for `prompt` with the settings of `options`, without an idempotency key.
    pub fn new(prompt: &Prompt, options: &RunOptions) -> Self {
        Request {
            system: prompt.system.clone(),
            user: prompt.user.clone(),
            temperature: options.temperature,
            max_tokens: options.max_tokens,
            seed: options.seed,
            idempotency_key: None,
        }
    }

    /// The same request, sent under the idempotency key `key`.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

/// Which side of "sent" a [`ProviderError`] is on: whether the provider can have done the work.
///
/// Only `NotSent`, `Refused` and `Answered` are known outcomes after which another attempt may
/// begin ([`Failure::into_work_error`]); `Unknown` must be reconciled first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// The request never left: connection refused, DNS, TLS handshake, a connect timeout, a
    /// request that could not be built. Nothing can have happened.
    NotSent,
    /// The provider answered that it did not process the request: HTTP 3xx but 303, 4xx (429
    /// included), 501, 505, and 503 with `Retry-After`.
    Refused,
    /// The provider answered in full with a success status, and the answer is unusable (not a
    /// chat completion, no content, larger than the limit): the work is over, and this is
    /// its outcome.
    Answered,
    /// The request was, or may have been, sent and no usable answer came: a timeout after the
    /// request started, a connection reset, an error while reading the body, HTTP 500, 502,
    /// 504, any other 5xx, 503 without `Retry-After`, `303 See Other` (the request was
    /// processed, its answer is elsewhere), a redirect error, an error status reached by
    /// following a redirect. The provider may have done the work, or still be doing it.
    Unknown,
}

impl Delivery {
    /// What an HTTP status says about the request (`retry_after`: whether the answer carried a
    /// `Retry-After` header). 2xx: `Answered` (an answer, if an unusable one); 3xx but 303,
    /// 4xx, 501, 505, and 503 with `Retry-After`: `Refused`; everything else: `Unknown`
    /// (`303 See Other` included: it says the request was processed, and where its result is).
    pub fn of_status(status: u16, retry_after: bool) -> Delivery {
        match status {
            200..=299 => Delivery::Answered,
            303 => Delivery::Unknown,
            300..=499 | 501 | 505 => Delivery::Refused,
            503 if retry_after => Delivery::Refused,
            _ => Delivery::Unknown,
        }
    }

    /// Whether the outcome is known, so that another attempt may begin: everything but
    /// `Unknown`.
    pub fn outcome_known(self) -> bool {
        self != Delivery::Unknown
    }

    /// The name in the evidence: `not_sent`, `refused`, `answered` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::NotSent => "not_sent",
            Delivery::Refused => "refused",
            Delivery::Answered => "answered",
            Delivery::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::NotSent => "not sent",
            Delivery::Refused => "refused by the provider",
            Delivery::Answered => "answered",
            Delivery::Unknown => "outcome unknown",
        })
    }
}

/// A provider's call failed: it gave no answer to judge. [`ProviderError::delivery`] says
/// whether the provider can have done the work.
#[derive(Debug, Clone)]
pub struct ProviderError {
    /// Which side of "sent" the failure is on.
    pub delivery: Delivery,
    /// The HTTP status, when the provider answered with one.
    pub status: Option<u16>,
    /// How long the provider asked to wait before trying again (`Retry-After`, in seconds).
    pub retry_after: Option<Duration>,
    /// What went wrong (never a credential: see [`redact_url`](crate::redact_url)).
    pub message: String,
    pub(crate) source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl PartialEq for ProviderError {
    /// Compares what the failure says; the source errors are not compared.
    fn eq(&self, other: &Self) -> bool {
        self.delivery == other.delivery
            && self.status == other.status
            && self.retry_after == other.retry_after
            && self.message == other.message
    }
}

impl ProviderError {
    fn with(delivery: Delivery, message: impl Into<String>) -> Self {
        ProviderError {
            delivery,
            status: None,
            retry_after: None,
            message: message.into(),
            source: None,
        }
    }

    /// A failure whose delivery is not known ([`Delivery::Unknown`]): the safe default. Prefer
    /// the constructors that say what happened.
    pub fn new(message: impl Into<String>) -> Self {
        ProviderError::unknown(message)
    }

    /// The request never left ([`Delivery::NotSent`]).
    pub fn not_sent(message: impl Into<String>) -> Self {
        ProviderError::with(Delivery::NotSent, message)
    }

    /// The provider said it did not process the request ([`Delivery::Refused`]), without an
    /// HTTP status (see [`ProviderError::http`] for one).
    pub fn refused(message: impl Into<String>) -> Self {
        ProviderError::with(Delivery::Refused, message)
    }

    /// The provider answered in full, and the answer is unusable ([`Delivery::Answered`]).
    pub fn answered(message: impl Into<String>) -> Self {
        ProviderError::with(Delivery::Answered, message)
    }

    /// The request was or may have been sent, and the outcome is unknown
    /// ([`Delivery::Unknown`]).
    pub fn unknown(message: impl Into<String>) -> Self {
        ProviderError::with(Delivery::Unknown, message)
    }

    /// The provider answered with an HTTP error status, classified by
    /// [`Delivery::of_status`] (as without `Retry-After`; add it with
    /// [`ProviderError::retry_after`]).
    pub fn http(status: u16, message: impl Into<String>) -> Self {
        ProviderError {
            status: Some(status),
            ..ProviderError::with(Delivery::of_status(status, false), message)
        }
    }

    /// The provider asked to wait `retry_after` before trying again. With an HTTP status the
    /// delivery is classified again, as with `Retry-After` (a 503 becomes `Refused`).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        if let Some(status) = self.status {
            self.delivery = Delivery::of_status(status, true);
        }
        self
    }

    /// Keeps `source` as the error behind this one ([`std::error::Error::source`]). It must not
    /// display a credential (a reqwest error: call `without_url()` first).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(status) => write!(f, "HTTP {status}: {}", self.message)?,
            None => f.write_str(&self.message)?,
        }
        write!(f, " ({})", self.delivery)
    }
}

impl std::error::Error for ProviderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A model behind an API: one async call from a rendered [`Request`] to the raw text it
/// answered.
///
/// [`Provider::name`] is the name jobs use for it (`begin_attempt`'s provider) and that the
/// certification is recorded under; [`Provider::settings`] describe it in the evidence.
pub trait Provider: Send + Sync {
    /// The provider's name in pg_intent (`intent.attempts.provider`,
    /// `intent.certifications.provider`).
    fn name(&self) -> &str;

    /// What the evidence records about the provider: model, endpoint, … Never secrets: pass
    /// URLs through [`redact_url`](crate::redact_url).
    fn settings(&self) -> Value {
        Value::Object(Map::new())
    }

    /// Sends one request; the answer's text as the provider gave it (not yet parsed). A
    /// failure says which side of "sent" it is on ([`ProviderError::delivery`]): when in doubt,
    /// [`Delivery::Unknown`].
    fn call(&self, request: &Request)
    -> impl Future<Output = Result<String, ProviderError>> + Send;
}

/// How [`run`](crate::run) runs a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// How many times each case is run (default 3). A case passes only if every run does.
    pub runs_per_case: u32,
    /// The sampling temperature (default 0.2: low, so the evidence says what the provider
    /// usually does, not what it did once). From 0 to [`MAX_TEMPERATURE`].
    pub temperature: f64,
    /// The most tokens per answer (default: the provider's own limit).
    pub max_tokens: Option<u32>,
    /// A sampling seed (default none).
    pub seed: Option<u64>,
    /// How long one call may take before the run counts as failed (default 60 seconds).
    pub call_timeout: Duration,
    /// How long the certification is valid (default 30 days, at most 366 days).
    pub valid_for: Duration,
    /// Where every run is recorded (default: nowhere; see [`RunHistory`]).
    pub history: Option<RunHistory>,
    /// What the model receives, checked through the provider's tokenizer before any call
    /// (default: not checked; see [`RenderChecks`]). A failed check refuses the certification.
    pub rendering: Option<RenderChecks>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            runs_per_case: 3,
            temperature: 0.2,
            max_tokens: None,
            seed: None,
            call_timeout: Duration::from_secs(60),
            valid_for: Duration::from_secs(30 * 86_400),
            history: None,
            rendering: None,
        }
    }
}

impl RunOptions {
    /// Sets how many times each case runs.
    pub fn runs_per_case(mut self, runs: u32) -> Self {
        self.runs_per_case = runs;
        self
    }

    /// Sets the temperature (checked by [`run`](crate::run): from 0 to [`MAX_TEMPERATURE`]).
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = temperature;
        self
    }

    /// Limits the tokens per answer.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Sets a sampling seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Sets the timeout of one call.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets how long the certification is valid.
    pub fn valid_for(mut self, valid_for: Duration) -> Self {
        self.valid_for = valid_for;
        self
    }

    /// Records every run in `history`, and lists the earlier failed runs in a certification's
    /// evidence.
    pub fn history(mut self, history: RunHistory) -> Self {
        self.history = Some(history);
        self
    }

    /// Checks what the model receives through `checks`' tokenizer, for every case, before
    /// the provider is called ([`RenderChecks`]); a failed check fails the case and refuses the
    /// certification, and every check is recorded in the evidence.
    pub fn rendering(mut self, checks: RenderChecks) -> Self {
        self.rendering = Some(checks);
        self
    }

    /// `Ok` when [`run`](crate::run) may run with these options; else what is wrong (a temperature
    /// that is NaN, infinite, negative or above [`MAX_TEMPERATURE`]).
    pub fn check(&self) -> Result<(), String> {
        check_temperature(self.temperature)
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The provider gave no answer (a connection error, an HTTP error status, …); its
    /// [`ProviderError::delivery`] says whether it can have done the work.
    Provider(ProviderError),
    /// No answer within [`RunOptions::call_timeout`]: the request may be in the provider's
    /// hands, so the outcome is unknown.
    Timeout(Duration),
    /// The answer could not be parsed (prose, Markdown, truncated JSON, …).
    NotJson {
        /// The parser's complaint.
        error: String,
        /// The answer as the provider gave it.
        raw: String,
    },
    /// The database judged the output against the contract and rejected it: the JSON Schema's
    /// errors (`{"path", "message"}`) or the checker's refusal (`{"checker"}`).
    Contract {
        /// What `intent.validate_result` said.
        errors: Vec<Value>,
    },
    /// The database refused to take the output as a `jsonb` value at all (over 1 MiB, a
    /// `\u0000` in a string, …), so no job could ever store it.
    Unstorable {
        /// What the database said.
        message: String,
    },
    /// The output met the contract, and the case's own assertion
    /// ([`ContractSuite::case_with`](crate::ContractSuite::case_with)) refused it.
    Check {
        /// What the assertion said.
        message: String,
    },
}

impl Failure {
    /// The failure's kind in the evidence: `provider`, `timeout`, `not_json`, `contract`,
    /// `unstorable` or `check`.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Provider(_) => "provider",
            Failure::Timeout(_) => "timeout",
            Failure::NotJson { .. } => "not_json",
            Failure::Contract { .. } => "contract",
            Failure::Unstorable { .. } => "unstorable",
            Failure::Check { .. } => "check",
        }
    }

    /// Whether the outcome of the call is known, so that another attempt may begin: `false`
    /// for a [`Failure::Timeout`] and a provider error of [`Delivery::Unknown`]; `true` for
    /// everything else (nothing was sent, the provider refused, or its whole answer is in
    /// hand).
    pub fn outcome_known(&self) -> bool {
        match self {
            Failure::Provider(e) => e.delivery.outcome_known(),
            Failure::Timeout(_) => false,
            Failure::NotJson { .. }
            | Failure::Contract { .. }
            | Failure::Unstorable { .. }
            | Failure::Check { .. } => true,
        }
    }

    /// How a worker reports this failure of `provider`'s call (see the crate documentation's
    /// table): an unknown outcome becomes [`WorkError::unknown`] (`mark_unknown`: reconcile
    /// before another attempt); a known one a retryable failure (`fail_attempt`), after the
    /// provider's `Retry-After` (at most [`MAX_RETRY_AFTER`]) when it gave one, whose error
    /// document is the failure's evidence with the provider's name.
    ///
    /// Every known outcome is retryable, not permanent: a 400 or a 401 from one provider says
    /// nothing about the next, and `max_attempts` bounds the retries.
    pub fn into_work_error(self, provider: &str) -> WorkError<Value> {
        if !self.outcome_known() {
            return WorkError::unknown(format!(
                "{provider}: {self}; the request may be in the provider's hands: reconcile before another attempt"
            ));
        }
        let mut error = self.evidence();
        error["provider"] = json!(provider);
        match self {
            Failure::Provider(ProviderError {
                retry_after: Some(after),
                ..
            }) => WorkError::retryable_after(error, after.min(MAX_RETRY_AFTER)),
            _ => WorkError::retryable(error),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Provider(e) => write!(f, "provider error: {e}"),
            Failure::Timeout(d) => write!(f, "no answer within {d:?}"),
            Failure::NotJson { error, raw } => {
                let start: String = raw.chars().take(60).collect();
                write!(f, "not JSON ({error}): {start:?}…")
            }
            Failure::Contract { errors } => {
                let said: Vec<String> = errors
                    .iter()
                    .map(|e| {
                        let text = e
                            .get("message")
                            .or_else(|| e.get("checker"))
                            .and_then(Value::as_str)
                            .map_or_else(|| e.to_string(), str::to_string);
                        match e.get("path").and_then(Value::as_str) {
                            Some(path) if !path.is_empty() => format!("{path}: {text}"),
                            _ => text,
                        }
                    })
                    .collect();
                write!(f, "breaks the contract: {}", said.join("; "))
            }
            Failure::Unstorable { message } => write!(f, "the database cannot store it: {message}"),
            Failure::Check { message } => write!(f, "fails the case's check: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_what_was_wrong() {
        let f = Failure::Contract {
            errors: vec![
                json!({"path": "", "message": "Additional properties are not allowed ('reasoning' was unexpected)"}),
                json!({"checker": "checker public.ok(jsonb) returned false"}),
            ],
        };
        assert_eq!(
            f.to_string(),
            "breaks the contract: Additional properties are not allowed ('reasoning' was unexpected); checker public.ok(jsonb) returned false"
        );
        assert_eq!(f.kind(), "contract");
        let p = Failure::Provider(ProviderError::http(503, "overloaded"));
        assert_eq!(
            p.to_string(),
            "provider error: HTTP 503: overloaded (outcome unknown)"
        );
        assert_eq!(p.evidence()["status"], 503);
        assert_eq!(p.evidence()["delivery"], "unknown");
    }

    #[test]
    fn http_statuses_say_whether_the_request_was_processed() {
        use Delivery::*;
        for (status, retry_after, want) in [
            (200, false, Answered),
            (301, false, Refused),
            (302, false, Refused),
            (307, false, Refused),
            (308, false, Refused),
            // 303 See Other: the request was processed, its answer is elsewhere.
            (303, false, Unknown),
            (303, true, Unknown),
            (400, false, Refused),
            (401, false, Refused),
            (404, false, Refused),
            (408, false, Refused),
            (422, false, Refused),
            (429, false, Refused),
            (429, true, Refused),
            (501, false, Refused),
            (505, false, Refused),
            (503, true, Refused),
            (503, false, Unknown),
            (500, false, Unknown),
            (500, true, Unknown),
            (502, false, Unknown),
            (504, false, Unknown),
            (507, false, Unknown),
            (599, false, Unknown),
            (101, false, Unknown),
        ] {
            assert_eq!(
                Delivery::of_status(status, retry_after),
                want,
                "HTTP {status}, Retry-After {retry_after}"
            );
        }
        assert_eq!(ProviderError::http(503, "x").delivery, Unknown);
        let told = ProviderError::http(503, "x").retry_after(Duration::from_secs(3));
        assert_eq!(
            (told.delivery, told.retry_after),
            (Refused, Some(Duration::from_secs(3)))
        );
        assert_eq!(ProviderError::new("?").delivery, Unknown);
    }

    /// Which failures may be reported as failed (and so failed over), and which must be
    /// reconciled first.
    #[test]
    fn only_known_outcomes_become_failures() {
        let failed = |f: Failure| match f.into_work_error("gpu-a") {
            WorkError::Failed {
                error,
                retryable,
                retry_after,
            } => {
                assert!(retryable);
                assert_eq!(error["provider"], "gpu-a");
                Some((error, retry_after))
            }
            WorkError::Unknown { reason } => {
                assert!(reason.starts_with("gpu-a: "), "{reason}");
                assert!(reason.contains("reconcile"), "{reason}");
                None
            }
        };
        // Never sent, refused, answered in full: a failure, retryable.
        let (e, after) = failed(Failure::Provider(ProviderError::not_sent(
            "tcp connect error: Connection refused",
        )))
        .unwrap();
        assert_eq!((e["delivery"].as_str(), after), (Some("not_sent"), None));
        let (e, after) = failed(Failure::Provider(
            ProviderError::http(429, "slow down").retry_after(Duration::from_secs(2)),
        ))
        .unwrap();
        assert_eq!(e["status"], 429);
        assert_eq!(e["retry_after_ms"], 2000);
        assert_eq!(after, Some(Duration::from_secs(2)));
        let (_, after) = failed(Failure::Provider(
            ProviderError::http(503, "overloaded").retry_after(Duration::from_secs(86_400 * 90)),
        ))
        .unwrap();
        assert_eq!(
            after,
            Some(MAX_RETRY_AFTER),
            "clamped to what the server takes"
        );
        assert!(failed(Failure::Provider(ProviderError::http(400, "bad request"))).is_some());
        assert!(failed(Failure::Provider(ProviderError::answered("too large"))).is_some());
        let (e, _) = failed(Failure::NotJson {
            error: "expected value".into(),
            raw: "Sure!".into(),
        })
        .unwrap();
        assert_eq!(e["kind"], "not_json");
        assert!(
            failed(Failure::Check {
                message: "no".into()
            })
            .is_some()
        );
        // Sent, outcome unknown: marked unknown, never failed.
        assert!(failed(Failure::Timeout(Duration::from_millis(300))).is_none());
        assert!(failed(Failure::Provider(ProviderError::http(502, "bad gateway"))).is_none());
        assert!(failed(Failure::Provider(ProviderError::http(500, "oops"))).is_none());
        assert!(
            failed(Failure::Provider(ProviderError::http(
                504,
                "gateway timeout"
            )))
            .is_none()
        );
        assert!(failed(Failure::Provider(ProviderError::http(503, "bare"))).is_none());
        assert!(failed(Failure::Provider(ProviderError::unknown("reset"))).is_none());
    }

    #[test]
    fn temperatures_outside_0_to_2_are_refused() {
        for ok in [0.0, -0.0, 0.2, 1.0, 2.0] {
            assert!(check_temperature(ok).is_ok(), "{ok}");
        }
        for bad in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.1,
            2.000_001,
            100.0,
        ] {
            let e = check_temperature(bad).unwrap_err();
            assert!(e.contains("from 0 to 2"), "{e}");
        }
        assert!(
            RunOptions::default()
                .temperature(f64::NAN)
                .check()
                .unwrap_err()
                .contains("NaN")
        );
    }
}
