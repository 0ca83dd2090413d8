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
//! worker's [`WorkError`](pg_intent_client::WorkError):
//!
//! | failure | [`Delivery`] | outcome | [`WorkError`](pg_intent_client::WorkError) |
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

mod certify;
mod evidence;
mod history;
#[cfg(feature = "local-tokenizer")]
mod local;
#[cfg(feature = "openai")]
mod openai;
mod redact;
mod render;
mod run;
#[cfg(feature = "openai")]
mod server_tokenizer;
mod suite;
mod types;

pub use evidence::{EVIDENCE_TEXT_CHARS, HISTORY_LISTED};
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
pub use run::{CaseReport, Report, RunError, RunReport, Verdict, run};
#[cfg(feature = "openai")]
pub use server_tokenizer::{ServerTokenizer, TOKENIZER_TIMEOUT, TokenizerApi};
pub use suite::{Case, ContractSuite, parse_json};
pub use types::{
    Delivery, Failure, MAX_RETRY_AFTER, MAX_TEMPERATURE, Prompt, Provider, ProviderError, Request,
    RunOptions, check_temperature,
};
