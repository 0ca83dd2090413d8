//! The contract-test harness of pg_intent: a provider earns its certification with evidence.
//!
//! Failover to a provider is allowed only while it holds a current certification for the job's
//! contract (docs/protocol.md § Contracts and failover). This crate produces that certification the
//! only honest way, on top of the client (`pg_intent_client`): it runs a suite of real inputs
//! through the real round trip — render the prompt, call the provider, parse its answer — several
//! times each at a low temperature, has **the database** check every output against the contract
//! ([`pg_intent_client::validate_result`]: the contract's JSON Schema, then its SQL checker,
//! exactly as `complete_attempt` will), checks what each case asserts about its output given its
//! input ([`ContractSuite::case_with`]), and calls [`pg_intent_client::certify_provider`] with the
//! evidence only when every run of every case passed **on the contract version it read before the
//! run**. Otherwise it certifies nothing and reports why.
//!
//! * [`Provider`]: one async call — a rendered [`Request`] in, the provider's raw text out, or a
//!   [`ProviderError`] that says which side of "sent" it is on ([`Delivery`]).
//!   [`OpenAiCompatible`] (feature `openai`, on by default) speaks the OpenAI-style
//!   `POST {base_url}/v1/chat/completions`.
//! * [`ContractSuite`]: the contract's name, the cases (named inputs, optionally with an
//!   assertion on the output), how an input is rendered into a [`Prompt`], and how an answer is
//!   parsed ([`parse_json`] unless told otherwise). [`ContractSuite::ask`] is that round trip,
//!   and [`ContractSuite::work`] the same as a [`pg_intent_client::Worker`]'s work: use it in
//!   production, so that what was certified is what runs.
//! * [`run`]: runs the suite and answers a [`Report`]: per case and run, the output and what
//!   was wrong with it ([`Failure`]), the [`Verdict`], and the evidence document. With a
//!   [`RunHistory`] every run is recorded, passed or not, and a certification's evidence lists
//!   the runs that failed before it.
//!
//! # Which side of "sent": failures and the worker
//!
//! A worker may begin another attempt (fail over) only when the first one's outcome is known:
//! if the first provider may still be generating, a second attempt is the double execution
//! pg_intent exists to prevent. So every failure says whether the provider can have done the
//! work, and [`Failure::into_work_error`] is the one mapping from a harness failure to the
//! worker's [`WorkError`]:
//!
//! | failure | [`Delivery`] | outcome | [`WorkError`] |
//! |---|---|---|---|
//! | connection refused, DNS, TLS handshake, connect timeout, a request that cannot be built (a temperature out of range, …) | `NotSent` | nothing was sent | `retryable` (`fail_attempt`) |
//! | HTTP 3xx but 303, 4xx (429 included), 501, 505, and 503 **with** `Retry-After` | `Refused` | the provider said it did not process it | `retryable`, after the `Retry-After` when given (`fail_attempt`) |
//! | a 2xx answer that is not a chat completion, has no content, or is larger than the limit | `Answered` | the provider finished, and this is its answer | `retryable` (`fail_attempt`) |
//! | [`Failure::NotJson`]: the answer came in full and does not parse | — | known: an unusable answer | `retryable` (`fail_attempt`) |
//! | [`Failure::Timeout`] (the call timeout fired), an error while sending or while reading the body, a connection reset, HTTP 500, 502, 504, any other 5xx, 503 **without** `Retry-After`, `303 See Other`, a redirect error (too many redirects), and an error status reached by following a redirect | `Unknown` | the provider may have done, or still be doing, the work | `unknown` (`mark_unknown`: reconcile first) |
//!
//! A 503 without `Retry-After` counts as unknown because proxies answer it when their upstream
//! reset the connection after the request was forwarded (Envoy's "upstream connect error or
//! disconnect/reset before headers"); a server that deliberately turns a request away says when
//! to come back. Erring towards `Unknown` costs a reconciliation; erring the other way costs a
//! double execution. A `303 See Other` answers a request that *was* processed (its result is
//! elsewhere), so it is `Unknown`; a redirect chain may hold one, so a redirect error, and an
//! error status at the end of a chain that was followed, are too. [`OpenAiCompatible`]'s own
//! client follows no redirect: every 3xx is the provider's own answer. A call timeout is
//! `Unknown` even when the request was still connecting:
//! [`OpenAiCompatible`] connects within [`DEFAULT_CONNECT_TIMEOUT`] so that an unreachable
//! provider fails as `NotSent` first — keep the call timeout longer than that, and the
//! [`pg_intent_client::Worker`]'s timeout longer than the call timeout (its timeout marks every
//! attempt unknown, even one whose call would have failed definitely).
//!
//! # What is certified, and what is recorded
//!
//! * **The contract version tested.** [`run`] reads the contract's version
//!   (`intent.contracts.version`) before the first call, and certifies in one transaction (a
//!   savepoint when `db` is already in one) that re-reads it, calls `certify_provider`, and
//!   reads back the version the certification was recorded with: if the contract was redefined
//!   during the run, or between the re-read and the certification, the transaction is rolled
//!   back and the run is refused, saying so. (`certify_provider` records the version current
//!   when it runs and takes no version; locking the contract row `FOR SHARE` would need `UPDATE`
//!   on `intent.contracts`, which `intent_admin` does not have. Reading back what was recorded
//!   checks exactly what the failover gate compares.)
//! * **Every run.** pg_intent's schema records certifications only, so the harness records runs
//!   where the caller says ([`RunOptions::history`]): a table of the caller's
//!   ([`RunHistory::table`]) or a JSON-lines file ([`RunHistory::json_lines`]). Every run that
//!   reaches a verdict is recorded there, passed or refused, with its whole evidence; a
//!   certified run's record is written in the same transaction as the certification (table), or
//!   right after it commits (file). The evidence of a certification lists the runs of the same
//!   provider and contract recorded since the last certified one (`"history"`): a flaky provider
//!   run again until it passes leaves the failures in the certification's own evidence. Runs of
//!   the same pair at once (CI shards) cannot slip a failure between two certifications' lists:
//!   the store is locked from that read to the certification's record (a table `IN SHARE ROW
//!   EXCLUSIVE MODE` in the certification's transaction, a file with an exclusive `flock`; see
//!   [`RunHistory`]). The history is read before the first provider call, so one that cannot be
//!   read fails the run before it is paid for; a file's last record cut short by a crash is
//!   skipped, and noted (`"history"."skipped"`). Without
//!   a history the evidence of a refused run is only returned ([`Report::evidence`]) for the
//!   caller to keep, and `"history"` is `null`. A run that ends with an error (the database
//!   went away) has no verdict and is not recorded.
//! * **The cases' assertions.** A case added with [`ContractSuite::case_with`] checks its output
//!   given its input after the database accepted it; a failed assertion fails the run
//!   ([`Failure::Check`]), and each run records whether it held.
//! * **No credentials.** Provider settings must never hold secrets; [`OpenAiCompatible`]
//!   records its endpoint with [`redact_url`] (userinfo and query values replaced, the URL read
//!   as reqwest reads it, so `https:///user:secret@host` loses its credentials too), never its
//!   API key, strips the URL from transport errors, and scrubs the provider's error texts of the
//!   user, the password, the query values (as written and percent-decoded) and the API key.
//!   Debug and Display show the same.
//! * **Sane settings.** A temperature that is NaN, infinite, negative or above
//!   [`MAX_TEMPERATURE`] (2, the OpenAI range) is refused before any provider call
//!   ([`RunError::Options`]; [`ContractSuite::ask`] fails with a `NotSent` provider error).
//!
//! The evidence recorded in `intent.certifications.evidence`:
//!
//! ```json
//! {
//!   "harness": "pg_intent_harness 0.4.1",
//!   "run_id": "1f0c…", "provider": "gpu-b", "contract": "captions-v1", "contract_version": 1,
//!   "settings": {"runs_per_case": 3, "temperature": 0.2, "max_tokens": null, "seed": null,
//!                "call_timeout_ms": 60000,
//!                "provider": {"model": "…", "endpoint": "https://redacted@api.example.com/v1/chat/completions?key=redacted"}},
//!   "started_at": "2026-01-31T10:00:00.000Z", "finished_at": "2026-01-31T10:00:04.210Z",
//!   "system_prompt": "You write captions …",
//!   "summary": {"cases": 5, "cases_passed": 5, "runs": 15, "runs_passed": 15},
//!   "cases": [{"name": "fox", "input": {"subject": "a red fox"}, "user_prompt": "…",
//!              "checked": true, "passed": true,
//!              "runs": [{"run": 1, "passed": true, "ms": 812, "output": {…}, "check": "passed"}, …]}],
//!   "history": {"store": "table \"public\".\"harness_runs\"", "earlier_runs": 2, "earlier_failed": 2,
//!               "runs": [{"run_id": "…", "contract_version": 1, "started_at": "…", "passed": false,
//!                         "certified": false, "verdict": "refused: 5 of 5 cases failed …",
//!                         "summary": {…}}, …],
//!               "skipped": ["line 7: a record cut short (…), skipped"]}
//! }
//! ```
//!
//! A failed run carries `"failure": {"kind": "provider" | "timeout" | "not_json" | "contract" |
//! "unstorable" | "check", …}`; a provider failure says its `"delivery"` (`not_sent`,
//! `refused`, `answered`, `unknown`). Long texts are cut to 2,000 characters, and the history
//! lists at most [`HISTORY_LISTED`] earlier runs (the counts are of all of them); `"skipped"` is
//! there only when a file history had records cut short. A case whose
//! system prompt differs from the first case's carries its own `system_prompt`.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "openai")]
//! # async fn f(db: &pg_intent_client::Connection) -> Result<(), pg_intent_harness::RunError> {
//! use std::time::Duration;
//! use pg_intent_harness::{self as harness, ContractSuite, OpenAiCompatible, Prompt, RunHistory, RunOptions};
//! use serde_json::json;
//!
//! let suite = ContractSuite::new("captions-v1", |input| Prompt {
//!     system: "Answer with one JSON object: {\"subject\": …, \"caption\": …}".into(),
//!     user: format!("Subject: {}", input["subject"].as_str().unwrap_or("")),
//! })
//! .case("fox", json!({"subject": "a red fox"}))
//! .case_with("tower", json!({"subject": "the Eiffel Tower"}), |input, output| {
//!     let (subject, caption) = (input["subject"].as_str().unwrap_or(""), output["caption"].as_str().unwrap_or(""));
//!     if caption.contains(subject) { Ok(()) } else { Err(format!("the caption does not name {subject:?}")) }
//! });
//! let provider = OpenAiCompatible::new("gpu-b", "http://127.0.0.1:8089", "captioner-2");
//! let history = RunHistory::table("public.harness_runs");
//! history.create_table(db).await?;
//! let options = RunOptions::default()
//!     .runs_per_case(3)
//!     .temperature(0.1)
//!     .valid_for(Duration::from_secs(7 * 86_400))
//!     .history(history);
//! let report = harness::run(db, &provider, &suite, &options).await?;
//! for case in &report.cases {
//!     println!("{}: {}", case.name, if case.passed() { "pass" } else { "FAIL" });
//! }
//! if !report.certified() {
//!     println!("refused: {}", report.verdict);
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use pg_intent_client::{
    Error, Executor, ProviderKeys, WorkError, certify_provider, validate_result,
};

mod history;
#[cfg(feature = "local-tokenizer")]
mod local;
#[cfg(feature = "openai")]
mod openai;
mod redact;
mod render;
#[cfg(feature = "openai")]
mod server_tokenizer;

pub use history::RunHistory;
#[cfg(feature = "local-tokenizer")]
pub use local::LocalTokenizer;
#[cfg(feature = "openai")]
pub use openai::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RESPONSE_BYTES, OpenAiCompatible, RequestLookup,
};
pub use redact::redact_url;
pub use render::{
    Chat, Check as RenderCheck, DEFAULT_ANSWER_TOKENS, DEFAULT_CONTROL_TOKENS, RenderChecks,
    RenderError, Rendering, Tokenizer, TokenizerFuture, WORD_JOINER, neutralise_control_tokens,
    neutralise_with,
};
#[cfg(feature = "openai")]
pub use server_tokenizer::{ServerTokenizer, TOKENIZER_TIMEOUT, TokenizerApi};

/// How many characters of a text (a raw answer, a prompt) the evidence keeps.
pub const EVIDENCE_TEXT_CHARS: usize = 2000;

/// The highest temperature a run or a request may ask for: 2, the range of the OpenAI API
/// (0 to 2), which OpenAI-compatible servers follow.
pub const MAX_TEMPERATURE: f64 = 2.0;

/// How many earlier runs a certification's evidence lists by name (`"history"."runs"`); the
/// counts beside the list are of all of them.
pub const HISTORY_LISTED: usize = 100;

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
    /// What went wrong (never a credential: see [`redact_url`]).
    pub message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
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
    /// URLs through [`redact_url`].
    fn settings(&self) -> Value {
        Value::Object(Map::new())
    }

    /// Sends one request; the answer's text as the provider gave it (not yet parsed). A
    /// failure says which side of "sent" it is on ([`ProviderError::delivery`]): when in doubt,
    /// [`Delivery::Unknown`].
    fn call(&self, request: &Request)
    -> impl Future<Output = Result<String, ProviderError>> + Send;
}

/// One input of a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Names the case in reports.
    pub name: String,
    /// The input, as a job's params would carry it.
    pub input: Value,
}

type Render = dyn Fn(&Value) -> Prompt + Send + Sync;
type Parse = dyn Fn(&str) -> Result<Value, String> + Send + Sync;
type Check = dyn Fn(&Value, &Value) -> Result<(), String> + Send + Sync;

/// The contract tests of one contract: the cases, how an input is rendered into a prompt, and
/// how an answer is parsed.
#[derive(Clone)]
pub struct ContractSuite {
    contract: String,
    cases: Vec<Case>,
    /// The assertion of each case, in the order of `cases`.
    checks: Vec<Option<Arc<Check>>>,
    render: Arc<Render>,
    parse: Arc<Parse>,
    /// The provider idempotency key of an attempt ([`ContractSuite::ask_for`]).
    keys: ProviderKeys,
}

impl fmt::Debug for ContractSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContractSuite")
            .field("contract", &self.contract)
            .field("cases", &self.cases)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The default parser: the whole answer, trimmed, must be one JSON value. No Markdown fences,
/// no prose around it: a provider that ignores the format fails.
pub fn parse_json(raw: &str) -> Result<Value, String> {
    serde_json::from_str(raw.trim()).map_err(|e| e.to_string())
}

impl ContractSuite {
    /// A suite for `contract` with no cases yet, rendering each input with `render` and parsing
    /// answers with [`parse_json`].
    pub fn new(
        contract: impl Into<String>,
        render: impl Fn(&Value) -> Prompt + Send + Sync + 'static,
    ) -> Self {
        ContractSuite {
            contract: contract.into(),
            cases: Vec::new(),
            checks: Vec::new(),
            render: Arc::new(render),
            parse: Arc::new(parse_json),
            keys: ProviderKeys::default(),
        }
    }

    /// How an attempt's provider idempotency key is derived ([`ContractSuite::ask_for`]):
    /// default [`ProviderKeys::attempt_id`], the attempt id itself. Give a keyed derivation
    /// ([`ProviderKeys::keyed`], [`ProviderKeys::from_env`]) when parties that must not decide
    /// each other's attempts share a provider account ([`pg_intent_client::provider_keys`]); a
    /// [`RequestLookup`] made from this suite asks under the same keys.
    pub fn provider_keys(mut self, keys: ProviderKeys) -> Self {
        self.keys = keys;
        self
    }

    /// The derivation of [`ContractSuite::provider_keys`].
    pub fn keys(&self) -> &ProviderKeys {
        &self.keys
    }

    /// Adds a case.
    pub fn case(mut self, name: impl Into<String>, input: Value) -> Self {
        self.cases.push(Case {
            name: name.into(),
            input,
        });
        self.checks.push(None);
        self
    }

    /// Adds a case whose output must also satisfy `check(input, output)`: what the contract
    /// cannot say because it depends on the input (the caption names *this* subject, the total
    /// is *this* order's). The check runs after the database accepted the output; an `Err`
    /// fails the run with [`Failure::Check`] and its message. Each run's evidence records
    /// whether it held.
    pub fn case_with(
        mut self,
        name: impl Into<String>,
        input: Value,
        check: impl Fn(&Value, &Value) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self = self.case(name, input);
        *self.checks.last_mut().expect("a case was just added") = Some(Arc::new(check));
        self
    }

    /// Parses answers with `parse` instead of [`parse_json`] (use the parser production uses).
    pub fn parse_with(
        mut self,
        parse: impl Fn(&str) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.parse = Arc::new(parse);
        self
    }

    /// The contract's name.
    pub fn contract(&self) -> &str {
        &self.contract
    }

    /// The cases, in order.
    pub fn cases(&self) -> &[Case] {
        &self.cases
    }

    /// Whether case `index` (in [`ContractSuite::cases`]) asserts on its output.
    pub fn has_check(&self, index: usize) -> bool {
        self.checks.get(index).is_some_and(Option::is_some)
    }

    /// The prompt for `input`.
    pub fn render(&self, input: &Value) -> Prompt {
        (self.render)(input)
    }

    /// The prompt sent for `input`: [`ContractSuite::render`]'s, with the user prompt's control
    /// tokens neutralised ([`neutralise_control_tokens`]: each of [`DEFAULT_CONTROL_TOKENS`]
    /// broken by a word joiner), so that text put into the user prompt reaches the model as
    /// text, however the render assembled it. [`ContractSuite::ask`] and [`run`] send this one,
    /// and the rendering checks check it; the system prompt is sent as rendered. A tokenizer's
    /// own control tokens outside that list must be neutralised by the render
    /// ([`neutralise_with`]); the rendering checks try them.
    pub fn prompt_for(&self, input: &Value) -> Prompt {
        let mut prompt = self.render(input);
        prompt.user = neutralise_control_tokens(&prompt.user);
        prompt
    }

    /// Parses an answer.
    pub fn parse(&self, raw: &str) -> Result<Value, String> {
        (self.parse)(raw)
    }

    /// The round trip the suite tests, for production use too: renders `input`, calls
    /// `provider` (within [`RunOptions::call_timeout`]) and parses its answer.
    ///
    /// The output is not checked against the contract here: the database does that when the
    /// attempt completes (or in [`run`], with [`pg_intent_client::validate_result`]). A
    /// temperature out of range fails with a [`Delivery::NotSent`] provider error, before any
    /// call.
    pub async fn ask<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, Failure> {
        self.ask_keyed(provider, input, options, None).await
    }

    /// [`ContractSuite::ask`] for an attempt: the call carries the attempt's provider
    /// idempotency key ([`Request::idempotency_key`]: the attempt id, or its keyed derivation,
    /// [`ContractSuite::provider_keys`]), so that the provider does the work once however
    /// often it is sent, and a [`pg_intent_client::Reconciler`] can ask the provider what became
    /// of an attempt whose outcome is unknown.
    pub async fn ask_for<P: Provider>(
        &self,
        provider: &P,
        attempt_id: Uuid,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, Failure> {
        self.ask_keyed(
            provider,
            input,
            options,
            Some(self.keys.key_for(attempt_id)),
        )
        .await
    }

    async fn ask_keyed<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
        key: Option<String>,
    ) -> Result<Value, Failure> {
        check_temperature(options.temperature)
            .map_err(|e| Failure::Provider(ProviderError::not_sent(e)))?;
        let mut request = Request::new(&self.prompt_for(input), options);
        request.idempotency_key = key;
        self.ask_with(provider, &request, options.call_timeout)
            .await
    }

    /// [`ContractSuite::ask`] as a [`pg_intent_client::Worker`]'s work: the failure mapped by
    /// [`Failure::into_work_error`], so that only a known outcome is reported as failed and
    /// everything after sending is marked unknown.
    ///
    /// Give the worker a timeout longer than [`RunOptions::call_timeout`]: the call's own
    /// timeout then decides, with the reason it knows.
    pub async fn work<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, WorkError<Value>> {
        self.ask(provider, input, options)
            .await
            .map_err(|failure| failure.into_work_error(provider.name()))
    }

    /// [`ContractSuite::work`] for an attempt, its id the provider's idempotency key
    /// ([`ContractSuite::ask_for`]): what a worker should run.
    pub async fn work_for<P: Provider>(
        &self,
        provider: &P,
        attempt_id: Uuid,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, WorkError<Value>> {
        self.ask_for(provider, attempt_id, input, options)
            .await
            .map_err(|failure| failure.into_work_error(provider.name()))
    }

    async fn ask_with<P: Provider>(
        &self,
        provider: &P,
        request: &Request,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let raw = match tokio::time::timeout(timeout, provider.call(request)).await {
            Err(_) => return Err(Failure::Timeout(timeout)),
            Ok(Err(e)) => return Err(Failure::Provider(e)),
            Ok(Ok(raw)) => raw,
        };
        self.parse(&raw)
            .map_err(|error| Failure::NotJson { error, raw })
    }
}

/// How [`run`] runs a suite.
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

    /// Sets the temperature (checked by [`run`]: from 0 to [`MAX_TEMPERATURE`]).
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

    /// `Ok` when [`run`] may run with these options; else what is wrong (a temperature that is
    /// NaN, infinite, negative or above [`MAX_TEMPERATURE`]).
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
    /// ([`ContractSuite::case_with`]) refused it.
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

    fn evidence(&self) -> Value {
        match self {
            Failure::Provider(e) => {
                let mut v = json!({
                    "kind": self.kind(),
                    "delivery": e.delivery.as_str(),
                    "status": e.status,
                    "message": cut(&e.message),
                });
                if let Some(after) = e.retry_after {
                    v["retry_after_ms"] = json!(millis(after));
                }
                v
            }
            Failure::Timeout(d) => json!({"kind": self.kind(), "after_ms": millis(*d)}),
            Failure::NotJson { error, raw } => {
                json!({"kind": self.kind(), "error": error, "raw": cut(raw)})
            }
            Failure::Contract { errors } => json!({"kind": self.kind(), "errors": errors}),
            Failure::Unstorable { message } | Failure::Check { message } => {
                json!({"kind": self.kind(), "message": cut(message)})
            }
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

/// One run of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The parsed output, when the answer parsed.
    pub output: Option<Value>,
    /// What was wrong, if anything.
    pub failure: Option<Failure>,
    /// How long the provider took.
    pub elapsed: Duration,
}

impl RunReport {
    /// Whether the output satisfied the contract (and the case's check, if it has one).
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// The runs of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// The case's name.
    pub name: String,
    /// Its input.
    pub input: Value,
    /// The prompt it rendered to.
    pub prompt: Prompt,
    /// Whether the case asserts on its output ([`ContractSuite::case_with`]).
    pub checked: bool,
    /// The rendering checks ([`RunOptions::rendering`]), if made. When one failed, the
    /// provider was not called for the case (`runs` is empty).
    pub rendering: Option<Rendering>,
    /// Each run, in order.
    pub runs: Vec<RunReport>,
}

impl CaseReport {
    /// Whether every run passed (and there was at least one), and the rendering checks, if
    /// made, did.
    pub fn passed(&self) -> bool {
        self.rendering.as_ref().is_none_or(Rendering::passed)
            && !self.runs.is_empty()
            && self.runs.iter().all(RunReport::passed)
    }

    /// The first failure, if any.
    pub fn first_failure(&self) -> Option<&Failure> {
        self.runs.iter().find_map(|r| r.failure.as_ref())
    }
}

/// What [`run`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every run of every case passed on the contract version tested: the certification is
    /// recorded.
    Certified {
        /// When it expires.
        expires_at: SystemTime,
    },
    /// Something failed, there was nothing to test, or the contract changed during the run: no
    /// certification was recorded (the run is, in the [`RunHistory`] if one was given).
    Refused {
        /// Why, in a sentence.
        reason: String,
    },
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Certified { expires_at } => {
                let at = chrono::DateTime::<chrono::Utc>::from(*expires_at);
                write!(
                    f,
                    "certified until {}",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            }
            Verdict::Refused { reason } => write!(f, "refused: {reason}"),
        }
    }
}

/// The outcome of [`run`].
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Names this run in the evidence (`"run_id"`) and in the [`RunHistory`].
    pub run_id: Uuid,
    /// The provider tested.
    pub provider: String,
    /// The contract.
    pub contract: String,
    /// The contract version read before the first call: the one tested, and the only one a
    /// certification may be recorded for.
    pub contract_version: i32,
    /// Each case, in the suite's order.
    pub cases: Vec<CaseReport>,
    /// Certified or refused.
    pub verdict: Verdict,
    /// The evidence document: recorded in `intent.certifications` when certified, in the
    /// [`RunHistory`] (if given) either way, and returned here.
    pub evidence: Value,
}

impl Report {
    /// Whether the certification was recorded.
    pub fn certified(&self) -> bool {
        matches!(self.verdict, Verdict::Certified { .. })
    }

    /// When the certification expires, if one was recorded.
    pub fn expires_at(&self) -> Option<SystemTime> {
        match self.verdict {
            Verdict::Certified { expires_at } => Some(expires_at),
            Verdict::Refused { .. } => None,
        }
    }

    /// The cases that failed.
    pub fn failed_cases(&self) -> impl Iterator<Item = &CaseReport> {
        self.cases.iter().filter(|c| !c.passed())
    }
}

/// Why [`run`] could not reach a verdict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The options were refused before anything was sent (a temperature out of range, …).
    #[error("invalid run options: {0}")]
    Options(String),
    /// A database call failed (an undefined contract is [`Error::InvalidInput`]; a row of the
    /// harness's own reads that does not decode is [`Error::Decode`], as the calls' are).
    #[error(transparent)]
    Database(#[from] Error),
    /// The [`RunHistory`] file could not be read or written.
    #[error("run history {store}: {source}")]
    History {
        /// The store ([`RunHistory`]'s `Display`).
        store: String,
        /// What went wrong.
        source: std::io::Error,
    },
}

impl RunError {
    /// A tokio-postgres error of a query of the harness's own, classified as the client's calls
    /// are.
    fn pg(source: tokio_postgres::Error) -> RunError {
        RunError::Database(Error::from_postgres(source))
    }

    /// A row of the harness's own reads that does not decode: the server answered, so it is
    /// [`Error::Decode`], never a connection error.
    fn decode(source: tokio_postgres::Error) -> RunError {
        RunError::Database(Error::Decode { source })
    }
}

/// Runs `suite` against `provider` and certifies it for the suite's contract when, and only
/// when, every run of every case passed on the contract version read before the run.
///
/// The options are checked first ([`RunOptions::check`]: [`RunError::Options`]), then the
/// contract's version is read. Each case is rendered once and sent
/// [`RunOptions::runs_per_case`] times; each answer is parsed, judged by the database with
/// `intent.validate_result` (schema, then checker), then by the case's own check if it has one.
/// A provider error, a timeout, an answer that does not parse, an output the contract rejects or
/// the case's check refuses fails the run, and the case. Then:
///
/// * all passed: in one transaction (a savepoint if `db` is in one already), the contract's
///   version is read again, `intent.certify_provider(provider, contract, evidence, valid_for)`
///   records the evidence, and the version it recorded is read back. If either differs from the
///   version tested, the transaction is rolled back and the run is refused ("redefined during
///   the run"); else it commits: [`Verdict::Certified`] with its expiry. Failover to the
///   provider is allowed from now on.
/// * anything failed, or the suite has no cases, or no runs: [`Verdict::Refused`], and no
///   certification is written. An earlier certification of the provider is left as it is
///   (revoke it with [`pg_intent_client::revoke_certification`] if this run shows it drifted).
///
/// With [`RunOptions::history`] the history is read before the first provider call (one that
/// cannot be read is [`RunError::History`] or a database error, before anything is paid for),
/// the run is recorded there either way, and a certification's evidence lists the runs recorded
/// since the pair's last certified one, read under the store's lock (crate documentation,
/// [`RunHistory`]).
///
/// `db` needs `intent_app` for `validate_result`, `intent_operator`'s `SELECT` on
/// `intent.contracts` and `intent.certifications`, and `intent_admin` for `certify_provider`
/// (plus the history table's: `SELECT`, `INSERT`, and `UPDATE` for its lock). Do not share it
/// with other tasks while the run
/// certifies: the transaction is the connection's. (Whether `db` is in a transaction is found
/// by trying the savepoint: outside one the server refuses it, SQLSTATE `25P01`, and its log
/// may show that once per certification.) An undefined contract is
/// [`Error::InvalidInput`] before the provider is called; other database errors end the run
/// with an error, and nothing is recorded.
pub async fn run<P: Provider>(
    db: &(impl Executor + ?Sized),
    provider: &P,
    suite: &ContractSuite,
    options: &RunOptions,
) -> Result<Report, RunError> {
    options.check().map_err(RunError::Options)?;
    // An undefined contract fails here, before any provider call is paid for.
    validate_result(db, suite.contract(), &Value::Null).await?;
    let Some(contract_version) = contract_version(db, suite.contract()).await? else {
        return Err(RunError::Options(format!(
            "contract {:?} is not defined",
            suite.contract()
        )));
    };
    // A history that cannot be read fails here too, before the calls are paid for.
    if let Some(store) = &options.history {
        store.check(db, provider.name(), suite.contract()).await?;
    }
    let run_id = Uuid::new_v4();
    let started_at = now();
    // The tokenizer's control tokens, asked once; a tokenizer that cannot answer fails every
    // case's rendering (nothing is certified that was not checked).
    let control = match &options.rendering {
        Some(checks) => Some(checks.control_ids().await),
        None => None,
    };
    let mut cases = Vec::with_capacity(suite.cases.len());
    for (index, case) in suite.cases.iter().enumerate() {
        let check = suite.checks.get(index).and_then(Option::as_deref);
        let prompt = suite.prompt_for(&case.input);
        let rendering = match (&options.rendering, &control) {
            (Some(checks), Some(Ok(control))) => Some(
                checks
                    .check(suite, &case.input, &prompt, options.max_tokens, control)
                    .await,
            ),
            (Some(_), Some(Err(e))) => Some(Rendering::unavailable(e)),
            _ => None,
        };
        let request = Request::new(&prompt, options);
        // What the model would receive is wrong: the answers cannot certify it, so none is
        // paid for.
        let runs_wanted = if rendering.as_ref().is_some_and(|r| !r.passed()) {
            0
        } else {
            options.runs_per_case
        };
        let mut runs = Vec::with_capacity(runs_wanted as usize);
        for _ in 0..runs_wanted {
            runs.push(
                run_once(
                    db,
                    provider,
                    suite,
                    &case.input,
                    check,
                    &request,
                    options.call_timeout,
                )
                .await?,
            );
        }
        cases.push(CaseReport {
            name: case.name.clone(),
            input: case.input.clone(),
            prompt,
            checked: check.is_some(),
            rendering,
            runs,
        });
    }
    let finished_at = now();

    let failed = cases.iter().filter(|c| !c.passed()).count();
    let mut refusal = if cases.is_empty() {
        Some("the suite has no cases: nothing was shown".to_string())
    } else if options.runs_per_case == 0 {
        Some("runs_per_case is 0: nothing was shown".to_string())
    } else if failed > 0 {
        let first = cases.iter().find(|c| !c.passed()).expect("a failed case");
        let rendering = first.rendering.as_ref().and_then(Rendering::first_failure);
        let why = match rendering {
            Some(check) => format!(": rendering check {} failed: {}", check.name, check.detail),
            None => first
                .first_failure()
                .map_or_else(String::new, |f| format!(": {f}")),
        };
        Some(format!(
            "{failed} of {} cases failed (first: {}{why})",
            cases.len(),
            first.name
        ))
    } else {
        None
    };
    let passed = refusal.is_none();
    let meta = Run {
        run_id,
        contract_version,
        started_at: &started_at,
        finished_at: &finished_at,
    };
    // This run's record, given the earlier runs read from the history (under its lock).
    let record_of = |earlier: Option<(&RunHistory, &history::Earlier)>| {
        let history = earlier.map(|(store, earlier)| history_evidence(store, earlier));
        json!({
            "run_id": run_id,
            "provider": provider.name(),
            "contract": suite.contract(),
            "contract_version": contract_version,
            "started_at": started_at,
            "finished_at": finished_at,
            "passed": passed,
            "certified": false,
            "verdict": "",
            "evidence": evidence(&meta, provider, suite, options, &cases, control.as_ref(), history),
        })
    };
    // A file history is locked from the read of its runs to the append of this run's record
    // (a table is locked in the certification's transaction): a run recorded meanwhile by
    // another process comes after this one, in the next certification's list.
    let locked = match &options.history {
        Some(store) => store.lock().await?,
        None => None,
    };
    let mut recorded = false;
    let mut expires_at = None;
    let mut record = if passed {
        let (certified, record) = certify_checked(
            db,
            provider.name(),
            suite.contract(),
            contract_version,
            run_id,
            options,
            locked.as_ref(),
            &record_of,
        )
        .await?;
        match certified {
            Certified::Yes { at, recorded: r } => {
                expires_at = Some(at);
                recorded = r;
            }
            Certified::No(reason) => refusal = Some(reason),
        }
        record
    } else {
        match &options.history {
            Some(store) => {
                let earlier = store
                    .since_last_certified(db, locked.as_ref(), provider.name(), suite.contract())
                    .await?;
                record_of(Some((store, &earlier)))
            }
            None => record_of(None),
        }
    };
    let verdict = match (expires_at, refusal) {
        (Some(expires_at), _) => Verdict::Certified { expires_at },
        (None, reason) => Verdict::Refused {
            reason: reason.unwrap_or_default(),
        },
    };
    if let Some(store) = &options.history
        && !recorded
    {
        record["certified"] = json!(verdict_certified(&verdict));
        record["verdict"] = json!(verdict.to_string());
        store.record(db, locked.as_ref(), &record).await?;
    }
    drop(locked);
    let Value::Object(mut record) = record else {
        unreachable!("the record is an object")
    };
    let evidence = record.remove("evidence").unwrap_or_default();
    Ok(Report {
        run_id,
        provider: provider.name().to_string(),
        contract: suite.contract().to_string(),
        contract_version,
        cases,
        verdict,
        evidence,
    })
}

fn verdict_certified(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Certified { .. })
}

/// The contract's version now, `None` if it is not defined.
async fn contract_version(
    db: &(impl Executor + ?Sized),
    contract: &str,
) -> Result<Option<i32>, RunError> {
    let row = db
        .client()
        .query_opt(
            "SELECT version FROM intent.contracts WHERE name = $1::text",
            &[&contract],
        )
        .await
        .map_err(RunError::pg)?;
    row.map(|r| r.try_get(0).map_err(RunError::decode))
        .transpose()
}

enum Certified {
    Yes { at: SystemTime, recorded: bool },
    No(String),
}

/// The transaction [`run`] certifies in: a savepoint inside the caller's transaction, else a
/// transaction of its own.
struct Tx<'a, D: ?Sized> {
    db: &'a D,
    savepoint: bool,
}

const SAVEPOINT: &str = "pg_intent_harness_certify";

impl<'a, D: Executor + ?Sized> Tx<'a, D> {
    async fn begin(db: &'a D) -> Result<Self, RunError> {
        // SAVEPOINT outside a transaction block fails (25P01) and changes nothing.
        match db
            .client()
            .batch_execute(&format!("SAVEPOINT {SAVEPOINT}"))
            .await
        {
            Ok(()) => Ok(Tx {
                db,
                savepoint: true,
            }),
            Err(e) if e.code() == Some(&SqlState::NO_ACTIVE_SQL_TRANSACTION) => {
                db.client()
                    .batch_execute("BEGIN")
                    .await
                    .map_err(RunError::pg)?;
                Ok(Tx {
                    db,
                    savepoint: false,
                })
            }
            Err(e) => Err(RunError::pg(e)),
        }
    }

    async fn commit(self) -> Result<(), RunError> {
        let sql = if self.savepoint {
            format!("RELEASE SAVEPOINT {SAVEPOINT}")
        } else {
            "COMMIT".to_string()
        };
        self.db
            .client()
            .batch_execute(&sql)
            .await
            .map_err(RunError::pg)
    }

    async fn rollback(self) -> Result<(), RunError> {
        let sql = if self.savepoint {
            format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}")
        } else {
            "ROLLBACK".to_string()
        };
        self.db
            .client()
            .batch_execute(&sql)
            .await
            .map_err(RunError::pg)
    }
}

/// Builds a run's record given the earlier runs read from its history (and the history).
type RecordOf<'a> = dyn Fn(Option<(&RunHistory, &history::Earlier)>) -> Value + Sync + 'a;

/// Certifies in one transaction, on the version tested only: locks a table history, reads the
/// runs since the pair's last certification and builds the record (`record_of`), re-reads the
/// contract's version, certifies, reads back the version recorded, and (with a history table)
/// records the run in the same transaction. Rolls back and answers why when the version is not
/// the one tested. Answers the record either way (its evidence is the certification's).
#[allow(clippy::too_many_arguments)]
async fn certify_checked(
    db: &(impl Executor + ?Sized),
    provider: &str,
    contract: &str,
    tested: i32,
    run_id: Uuid,
    options: &RunOptions,
    locked: Option<&history::Locked>,
    record_of: &RecordOf<'_>,
) -> Result<(Certified, Value), RunError> {
    let tx = Tx::begin(db).await?;
    let mut record = Value::Null;
    let outcome = async {
        // Locked before the read: a run recorded elsewhere from now on waits for this
        // certification to commit, so it is in the next one's list, never in neither.
        record = match &options.history {
            Some(store) => {
                store.lock_table(db).await?;
                let earlier = store
                    .since_last_certified(db, locked, provider, contract)
                    .await?;
                record_of(Some((store, &earlier)))
            }
            None => record_of(None),
        };
        match contract_version(db, contract).await? {
            Some(now) if now == tested => {}
            now => {
                return Ok(Certified::No(format!(
                    "contract {contract:?} was redefined during the run: version {tested} was tested, {} is current, and the evidence counts for the version tested only; run the suite again",
                    now.map_or_else(|| "none".to_string(), |v| format!("version {v}"))
                )));
            }
        }
        let at = certify_provider(db, provider, contract, &record["evidence"], options.valid_for)
            .await?;
        let row = db
            .client()
            .query_opt(
                "SELECT contract_version FROM intent.certifications
                  WHERE provider = $1::text AND contract = $2::text AND evidence->>'run_id' = $3::text
                  ORDER BY id DESC LIMIT 1",
                &[&provider, &contract, &run_id.to_string()],
            )
            .await
            .map_err(RunError::pg)?;
        let recorded: Option<i32> = row
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(RunError::decode)?;
        if recorded != Some(tested) {
            return Ok(Certified::No(format!(
                "contract {contract:?} was redefined while certifying: version {tested} was tested, and certify_provider recorded {}; the certification was rolled back, run the suite again",
                recorded.map_or_else(|| "nothing".to_string(), |v| format!("version {v}"))
            )));
        }
        let mut recorded_here = false;
        if let Some(store) = &options.history
            && store.is_table()
        {
            record["certified"] = json!(true);
            record["verdict"] = json!(Verdict::Certified { expires_at: at }.to_string());
            store.record(db, None, &record).await?;
            recorded_here = true;
        }
        Ok(Certified::Yes {
            at,
            recorded: recorded_here,
        })
    }
    .await;
    match outcome {
        Ok(Certified::Yes { at, recorded }) => {
            tx.commit().await?;
            Ok((Certified::Yes { at, recorded }, record))
        }
        Ok(no) => {
            tx.rollback().await?;
            // Nothing of the transaction stands: the record is written again, as refused.
            record["certified"] = json!(false);
            Ok((no, record))
        }
        Err(e) => {
            // The error is what the caller needs to see; a failed rollback only adds to it.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_once<P: Provider>(
    db: &(impl Executor + ?Sized),
    provider: &P,
    suite: &ContractSuite,
    input: &Value,
    check: Option<&Check>,
    request: &Request,
    timeout: Duration,
) -> Result<RunReport, RunError> {
    let start = Instant::now();
    let answer = suite.ask_with(provider, request, timeout).await;
    let elapsed = start.elapsed();
    let output = match answer {
        Ok(output) => output,
        Err(failure) => {
            return Ok(RunReport {
                output: None,
                failure: Some(failure),
                elapsed,
            });
        }
    };
    let mut failure = match validate_result(db, suite.contract(), &output).await {
        Ok(v) if v.valid => None,
        Ok(v) => Some(Failure::Contract { errors: v.errors }),
        // The contract was there a moment ago, so a data exception (class 22) is about the
        // output itself: too large, or not storable as jsonb.
        Err(e) if e.code().is_some_and(|c| c.starts_with("22")) => Some(Failure::Unstorable {
            message: e.to_string(),
        }),
        Err(e) => return Err(e.into()),
    };
    if failure.is_none()
        && let Some(check) = check
        && let Err(message) = check(input, &output)
    {
        failure = Some(Failure::Check { message });
    }
    Ok(RunReport {
        output: Some(output),
        failure,
        elapsed,
    })
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A text cut to [`EVIDENCE_TEXT_CHARS`] characters.
fn cut(text: &str) -> String {
    match text.char_indices().nth(EVIDENCE_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// An output as the evidence keeps it: whole, unless its JSON text is long.
fn kept(output: &Value) -> Value {
    let text = output.to_string();
    if text.len() <= 4 * EVIDENCE_TEXT_CHARS {
        output.clone()
    } else {
        json!({"truncated": cut(&text)})
    }
}

/// The `"history"` of the evidence: the earlier runs (summaries, oldest first) since the last
/// certified one.
fn history_evidence(store: &RunHistory, earlier: &history::Earlier) -> Value {
    let runs = &earlier.runs;
    let failed = runs.iter().filter(|r| r["passed"] != json!(true)).count();
    let listed = &runs[runs.len().saturating_sub(HISTORY_LISTED)..];
    let mut history = json!({
        "store": store.to_string(),
        "earlier_runs": runs.len(),
        "earlier_failed": failed,
        "runs": listed,
    });
    if !earlier.skipped.is_empty() {
        history["skipped"] = json!(earlier.skipped);
    }
    history
}

/// What names one run in its evidence.
struct Run<'a> {
    run_id: Uuid,
    contract_version: i32,
    started_at: &'a str,
    finished_at: &'a str,
}

fn evidence<P: Provider>(
    run: &Run<'_>,
    provider: &P,
    suite: &ContractSuite,
    options: &RunOptions,
    cases: &[CaseReport],
    control: Option<&Result<render::ControlTokens, RenderError>>,
    history: Option<Value>,
) -> Value {
    let system = cases.first().map(|c| c.prompt.system.as_str());
    // What was checked, through which tokenizer (`null`: rendering was not checked).
    let rendering = options.rendering.as_ref().map(|checks| {
        let mut described = checks.describe(options.max_tokens);
        described["control"] = match control {
            Some(Ok(control)) => control.evidence(),
            Some(Err(e)) => json!({"error": cut(&e.to_string())}),
            None => Value::Null,
        };
        described
    });
    let runs: usize = cases.iter().map(|c| c.runs.len()).sum();
    let runs_passed: usize = cases
        .iter()
        .map(|c| c.runs.iter().filter(|r| r.passed()).count())
        .sum();
    let cases_json: Vec<Value> = cases
        .iter()
        .map(|c| {
            let mut case = json!({
                "name": c.name,
                "input": c.input,
                "user_prompt": cut(&c.prompt.user),
                "checked": c.checked,
                "passed": c.passed(),
                "runs": c.runs.iter().enumerate().map(|(i, r)| {
                    let mut run = json!({"run": i + 1, "passed": r.passed(), "ms": millis(r.elapsed)});
                    if let Some(output) = &r.output {
                        run["output"] = kept(output);
                    }
                    if let Some(failure) = &r.failure {
                        run["failure"] = failure.evidence();
                    }
                    if c.checked {
                        // Checked only once the database accepted the output.
                        run["check"] = json!(match &r.failure {
                            None => "passed",
                            Some(Failure::Check { .. }) => "failed",
                            Some(_) => "not_run",
                        });
                    }
                    run
                }).collect::<Vec<_>>(),
            });
            if Some(c.prompt.system.as_str()) != system {
                case["system_prompt"] = json!(cut(&c.prompt.system));
            }
            if let Some(rendering) = &c.rendering {
                case["rendering"] = rendering.evidence();
            }
            case
        })
        .collect();
    json!({
        "harness": concat!(env!("CARGO_PKG_NAME"), " ", env!("CARGO_PKG_VERSION")),
        "run_id": run.run_id,
        "provider": provider.name(),
        "contract": suite.contract(),
        "contract_version": run.contract_version,
        "settings": {
            "runs_per_case": options.runs_per_case,
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "seed": options.seed,
            "call_timeout_ms": millis(options.call_timeout),
            "provider": provider.settings(),
        },
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "system_prompt": system.map(cut),
        "summary": {
            "cases": cases.len(),
            "cases_passed": cases.iter().filter(|c| c.passed()).count(),
            "runs": runs,
            "runs_passed": runs_passed,
        },
        "cases": cases_json,
        "rendering": rendering,
        "history": history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_parser_is_strict() {
        assert_eq!(parse_json(" {\"a\": 1}\n").unwrap(), json!({"a": 1}));
        assert!(parse_json("```json\n{\"a\": 1}\n```").is_err());
        assert!(parse_json("Sure! {\"a\": 1}").is_err());
        assert!(parse_json("{\"a\": 1} and more").is_err());
    }

    #[test]
    fn evidence_texts_are_cut() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(EVIDENCE_TEXT_CHARS + 10);
        assert_eq!(cut(&long).chars().count(), EVIDENCE_TEXT_CHARS + 1);
        let big = json!({"caption": "x".repeat(10 * EVIDENCE_TEXT_CHARS)});
        assert!(kept(&big).get("truncated").is_some());
        assert_eq!(kept(&json!({"a": 1})), json!({"a": 1}));
    }

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
