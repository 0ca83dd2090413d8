//! The contract-test harness: a provider earns its certification with evidence.
//!
//! Failover to a provider is allowed only while it holds a current certification for the job's
//! contract (SPEC § Contracts and failover). This module produces that certification the only
//! honest way: it runs a suite of real inputs through the real round trip — render the prompt,
//! call the provider, parse its answer — several times each at a low temperature, has **the
//! database** check every output against the contract ([`crate::validate_result`]: the
//! contract's JSON Schema, then its SQL checker, exactly as `complete_attempt` will), and calls
//! [`crate::certify_provider`] with the evidence only when every run of every case passed.
//! Otherwise it records nothing and reports why.
//!
//! * [`Provider`]: one async call — a rendered [`Request`] in, the provider's raw text out.
//!   [`OpenAiCompatible`] (feature `openai`, on by default) speaks the OpenAI-style
//!   `POST {base_url}/v1/chat/completions`.
//! * [`ContractSuite`]: the contract's name, the cases (named inputs), how an input is
//!   rendered into a [`Prompt`], and how an answer is parsed ([`parse_json`] unless told
//!   otherwise). [`ContractSuite::ask`] is that round trip: use it in production too, so that
//!   what was certified is what runs.
//! * [`run`]: runs the suite and answers a [`Report`]: per case and run, the output and what
//!   was wrong with it ([`Failure`]), the [`Verdict`], and the evidence document.
//!
//! The evidence recorded in `intent.certifications.evidence`:
//!
//! ```json
//! {
//!   "harness": "pg_intent_client 0.1.0",
//!   "provider": "gpu-b", "contract": "captions-v1",
//!   "settings": {"runs_per_case": 3, "temperature": 0.2, "max_tokens": null, "seed": null,
//!                "call_timeout_ms": 60000, "provider": {"model": "…", "endpoint": "…"}},
//!   "started_at": "2026-01-31T10:00:00.000Z", "finished_at": "2026-01-31T10:00:04.210Z",
//!   "system_prompt": "You write captions …",
//!   "summary": {"cases": 5, "cases_passed": 5, "runs": 15, "runs_passed": 15},
//!   "cases": [{"name": "fox", "input": {"subject": "a red fox"}, "user_prompt": "…",
//!              "passed": true, "runs": [{"run": 1, "passed": true, "ms": 812, "output": {…}}, …]}]
//! }
//! ```
//!
//! A failed run carries `"failure": {"kind": "provider" | "timeout" | "not_json" | "contract" |
//! "unstorable", …}`. Long texts are cut to 2,000 characters. A case whose system prompt differs
//! from the first case's carries its own `system_prompt`.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "openai")]
//! # async fn f(db: &pg_intent_client::Connection) -> Result<(), pg_intent_client::Error> {
//! use std::time::Duration;
//! use pg_intent_client::harness::{self, ContractSuite, OpenAiCompatible, Prompt, RunOptions};
//! use serde_json::json;
//!
//! let suite = ContractSuite::new("captions-v1", |input| Prompt {
//!     system: "Answer with one JSON object: {\"subject\": …, \"caption\": …}".into(),
//!     user: format!("Subject: {}", input["subject"].as_str().unwrap_or("")),
//! })
//! .case("fox", json!({"subject": "a red fox"}))
//! .case("tower", json!({"subject": "the Eiffel Tower at night"}));
//! let provider = OpenAiCompatible::new("gpu-b", "http://127.0.0.1:8089", "captioner-2");
//! let options = RunOptions::default().runs_per_case(3).temperature(0.1).valid_for(Duration::from_secs(7 * 86_400));
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

use crate::calls::{certify_provider, validate_result};
use crate::error::Error;
use crate::exec::Executor;

#[cfg(feature = "openai")]
mod openai;
#[cfg(feature = "openai")]
pub use openai::OpenAiCompatible;

/// How many characters of a text (a raw answer, a prompt) the evidence keeps.
pub const EVIDENCE_TEXT_CHARS: usize = 2000;

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
}

impl Request {
    /// A request for `prompt` with the settings of `options`.
    pub fn new(prompt: &Prompt, options: &RunOptions) -> Self {
        Request {
            system: prompt.system.clone(),
            user: prompt.user.clone(),
            temperature: options.temperature,
            max_tokens: options.max_tokens,
            seed: options.seed,
        }
    }
}

/// A provider's call failed: it gave no answer to judge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    /// The HTTP status, when the provider answered with an error status.
    pub status: Option<u16>,
    /// What went wrong.
    pub message: String,
}

impl ProviderError {
    /// A failure without an HTTP status (connection refused, an unreadable answer, …).
    pub fn new(message: impl Into<String>) -> Self {
        ProviderError {
            status: None,
            message: message.into(),
        }
    }

    /// The provider answered with an HTTP error status.
    pub fn http(status: u16, message: impl Into<String>) -> Self {
        ProviderError {
            status: Some(status),
            message: message.into(),
        }
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(status) => write!(f, "HTTP {status}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ProviderError {}

/// A model behind an API: one async call from a rendered [`Request`] to the raw text it
/// answered.
///
/// [`Provider::name`] is the name jobs use for it (`begin_attempt`'s provider) and that the
/// certification is recorded under; [`Provider::settings`] describe it in the evidence.
pub trait Provider: Send + Sync {
    /// The provider's name in pg_intent (`intent.attempts.provider`,
    /// `intent.certifications.provider`).
    fn name(&self) -> &str;

    /// What the evidence records about the provider: model, endpoint, … Never secrets.
    fn settings(&self) -> Value {
        Value::Object(Map::new())
    }

    /// Sends one request; the answer's text as the provider gave it (not yet parsed).
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

/// The contract tests of one contract: the cases, how an input is rendered into a prompt, and
/// how an answer is parsed.
#[derive(Clone)]
pub struct ContractSuite {
    contract: String,
    cases: Vec<Case>,
    render: Arc<Render>,
    parse: Arc<Parse>,
}

impl fmt::Debug for ContractSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContractSuite")
            .field("contract", &self.contract)
            .field("cases", &self.cases)
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
            render: Arc::new(render),
            parse: Arc::new(parse_json),
        }
    }

    /// Adds a case.
    pub fn case(mut self, name: impl Into<String>, input: Value) -> Self {
        self.cases.push(Case {
            name: name.into(),
            input,
        });
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

    /// The prompt for `input`.
    pub fn render(&self, input: &Value) -> Prompt {
        (self.render)(input)
    }

    /// Parses an answer.
    pub fn parse(&self, raw: &str) -> Result<Value, String> {
        (self.parse)(raw)
    }

    /// The round trip the suite tests, for production use too: renders `input`, calls
    /// `provider` (within [`RunOptions::call_timeout`]) and parses its answer.
    ///
    /// The output is not checked against the contract here: the database does that when the
    /// attempt completes (or in [`run`], with [`crate::validate_result`]).
    pub async fn ask<P: Provider>(
        &self,
        provider: &P,
        input: &Value,
        options: &RunOptions,
    ) -> Result<Value, Failure> {
        let request = Request::new(&self.render(input), options);
        self.ask_with(provider, &request, options.call_timeout)
            .await
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
    /// usually does, not what it did once).
    pub temperature: f64,
    /// The most tokens per answer (default: the provider's own limit).
    pub max_tokens: Option<u32>,
    /// A sampling seed (default none).
    pub seed: Option<u64>,
    /// How long one call may take before the run counts as failed (default 60 seconds).
    pub call_timeout: Duration,
    /// How long the certification is valid (default 30 days, at most 366 days).
    pub valid_for: Duration,
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
        }
    }
}

impl RunOptions {
    /// Sets how many times each case runs.
    pub fn runs_per_case(mut self, runs: u32) -> Self {
        self.runs_per_case = runs;
        self
    }

    /// Sets the temperature.
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
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The provider gave no answer (a connection error, an HTTP error status, …).
    Provider(ProviderError),
    /// No answer within [`RunOptions::call_timeout`].
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
}

impl Failure {
    /// The failure's kind in the evidence: `provider`, `timeout`, `not_json`, `contract` or
    /// `unstorable`.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Provider(_) => "provider",
            Failure::Timeout(_) => "timeout",
            Failure::NotJson { .. } => "not_json",
            Failure::Contract { .. } => "contract",
            Failure::Unstorable { .. } => "unstorable",
        }
    }

    fn evidence(&self) -> Value {
        match self {
            Failure::Provider(e) => {
                json!({"kind": self.kind(), "status": e.status, "message": cut(&e.message)})
            }
            Failure::Timeout(d) => json!({"kind": self.kind(), "after_ms": millis(*d)}),
            Failure::NotJson { error, raw } => {
                json!({"kind": self.kind(), "error": error, "raw": cut(raw)})
            }
            Failure::Contract { errors } => json!({"kind": self.kind(), "errors": errors}),
            Failure::Unstorable { message } => {
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
    /// Whether the output satisfied the contract.
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
    /// Each run, in order.
    pub runs: Vec<RunReport>,
}

impl CaseReport {
    /// Whether every run passed (and there was at least one).
    pub fn passed(&self) -> bool {
        !self.runs.is_empty() && self.runs.iter().all(RunReport::passed)
    }

    /// The first failure, if any.
    pub fn first_failure(&self) -> Option<&Failure> {
        self.runs.iter().find_map(|r| r.failure.as_ref())
    }
}

/// What [`run`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every run of every case passed: the certification is recorded.
    Certified {
        /// When it expires.
        expires_at: SystemTime,
    },
    /// Something failed (or there was nothing to test): nothing was recorded.
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
    /// The provider tested.
    pub provider: String,
    /// The contract.
    pub contract: String,
    /// Each case, in the suite's order.
    pub cases: Vec<CaseReport>,
    /// Certified or refused.
    pub verdict: Verdict,
    /// The evidence document: recorded in `intent.certifications` when certified, only
    /// returned here when refused.
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

/// Runs `suite` against `provider` and certifies it for the suite's contract when, and only
/// when, every run of every case passed.
///
/// Each case is rendered once and sent [`RunOptions::runs_per_case`] times; each answer is
/// parsed and then judged by the database with `intent.validate_result` (schema, then checker).
/// A provider error, a timeout, an answer that does not parse or an output the contract
/// rejects fails the run, and the case. Then:
///
/// * all passed: `intent.certify_provider(provider, contract, evidence, valid_for)` records the
///   evidence; [`Verdict::Certified`] with its expiry. Failover to the provider is allowed from
///   now on.
/// * anything failed, or the suite has no cases, or no runs: [`Verdict::Refused`], and nothing
///   is written. An earlier certification of the provider is left as it is (revoke it with
///   [`crate::revoke_certification`] if this run shows it drifted).
///
/// `db` needs `intent_app` for `validate_result` and `intent_admin` for `certify_provider`.
/// An undefined contract is [`Error::InvalidInput`] before the provider is called; other
/// database errors end the run with an error, and nothing is recorded.
pub async fn run<P: Provider>(
    db: &(impl Executor + ?Sized),
    provider: &P,
    suite: &ContractSuite,
    options: &RunOptions,
) -> Result<Report, Error> {
    // An undefined contract fails here, before any provider call is paid for.
    validate_result(db, suite.contract(), &Value::Null).await?;
    let started_at = now();
    let mut cases = Vec::with_capacity(suite.cases.len());
    for case in &suite.cases {
        let prompt = suite.render(&case.input);
        let request = Request::new(&prompt, options);
        let mut runs = Vec::with_capacity(options.runs_per_case as usize);
        for _ in 0..options.runs_per_case {
            runs.push(run_once(db, provider, suite, &request, options.call_timeout).await?);
        }
        cases.push(CaseReport {
            name: case.name.clone(),
            input: case.input.clone(),
            prompt,
            runs,
        });
    }
    let finished_at = now();

    let failed = cases.iter().filter(|c| !c.passed()).count();
    let refusal = if cases.is_empty() {
        Some("the suite has no cases: nothing was shown".to_string())
    } else if options.runs_per_case == 0 {
        Some("runs_per_case is 0: nothing was shown".to_string())
    } else if failed > 0 {
        let first = cases.iter().find(|c| !c.passed()).expect("a failed case");
        let why = first
            .first_failure()
            .map_or_else(String::new, |f| format!(": {f}"));
        Some(format!(
            "{failed} of {} cases failed (first: {}{why})",
            cases.len(),
            first.name
        ))
    } else {
        None
    };
    let evidence = evidence(provider, suite, options, &cases, &started_at, &finished_at);
    let verdict = match refusal {
        Some(reason) => Verdict::Refused { reason },
        None => Verdict::Certified {
            expires_at: certify_provider(
                db,
                provider.name(),
                suite.contract(),
                &evidence,
                options.valid_for,
            )
            .await?,
        },
    };
    Ok(Report {
        provider: provider.name().to_string(),
        contract: suite.contract().to_string(),
        cases,
        verdict,
        evidence,
    })
}

async fn run_once<P: Provider>(
    db: &(impl Executor + ?Sized),
    provider: &P,
    suite: &ContractSuite,
    request: &Request,
    timeout: Duration,
) -> Result<RunReport, Error> {
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
    let failure = match validate_result(db, suite.contract(), &output).await {
        Ok(v) if v.valid => None,
        Ok(v) => Some(Failure::Contract { errors: v.errors }),
        // The contract was there a moment ago, so a data exception (class 22) is about the
        // output itself: too large, or not storable as jsonb.
        Err(e) if e.code().is_some_and(|c| c.starts_with("22")) => Some(Failure::Unstorable {
            message: e.to_string(),
        }),
        Err(e) => return Err(e),
    };
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

fn evidence<P: Provider>(
    provider: &P,
    suite: &ContractSuite,
    options: &RunOptions,
    cases: &[CaseReport],
    started_at: &str,
    finished_at: &str,
) -> Value {
    let system = cases.first().map(|c| c.prompt.system.as_str());
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
                "passed": c.passed(),
                "runs": c.runs.iter().enumerate().map(|(i, r)| {
                    let mut run = json!({"run": i + 1, "passed": r.passed(), "ms": millis(r.elapsed)});
                    if let Some(output) = &r.output {
                        run["output"] = kept(output);
                    }
                    if let Some(failure) = &r.failure {
                        run["failure"] = failure.evidence();
                    }
                    run
                }).collect::<Vec<_>>(),
            });
            if Some(c.prompt.system.as_str()) != system {
                case["system_prompt"] = json!(cut(&c.prompt.system));
            }
            case
        })
        .collect();
    json!({
        "harness": concat!("pg_intent_client ", env!("CARGO_PKG_VERSION")),
        "provider": provider.name(),
        "contract": suite.contract(),
        "settings": {
            "runs_per_case": options.runs_per_case,
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "seed": options.seed,
            "call_timeout_ms": millis(options.call_timeout),
            "provider": provider.settings(),
        },
        "started_at": started_at,
        "finished_at": finished_at,
        "system_prompt": system.map(cut),
        "summary": {
            "cases": cases.len(),
            "cases_passed": cases.iter().filter(|c| c.passed()).count(),
            "runs": runs,
            "runs_passed": runs_passed,
        },
        "cases": cases_json,
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
        assert_eq!(p.to_string(), "provider error: HTTP 503: overloaded");
        assert_eq!(p.evidence()["status"], 503);
    }
}
