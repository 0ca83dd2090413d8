//! The evidence: the document a certification rests on (and a run history keeps), and the
//! bounds on what it copies of texts and outputs.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::render::{self, RenderError};
use crate::{CaseReport, ContractSuite, Failure, Provider, RunHistory, RunOptions, history};

/// How many characters of a text (a raw answer, a prompt) the evidence keeps.
pub const EVIDENCE_TEXT_CHARS: usize = 2000;

/// How many earlier runs a certification's evidence lists by name (`"history"."runs"`); the
/// counts beside the list are of all of them.
pub const HISTORY_LISTED: usize = 100;

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A text cut to [`EVIDENCE_TEXT_CHARS`] characters.
pub(crate) fn cut(text: &str) -> String {
    match text.char_indices().nth(EVIDENCE_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// A rendering's checks as the evidence keeps them (each detail cut).
impl render::Rendering {
    pub(crate) fn evidence(&self) -> Value {
        json!({
            "passed": self.passed(),
            "tokens": self.tokens,
            "checks": self.checks.iter().map(|c| json!({
                "check": c.name, "passed": c.passed, "detail": cut(&c.detail),
            })).collect::<Vec<_>>(),
        })
    }
}

/// An output as the evidence keeps it: whole, unless its JSON text is long.
pub(crate) fn kept(output: &Value) -> Value {
    let text = output.to_string();
    if text.len() <= 4 * EVIDENCE_TEXT_CHARS {
        output.clone()
    } else {
        json!({"truncated": cut(&text)})
    }
}

/// The `"history"` of the evidence: the earlier runs (summaries, oldest first) since the last
/// certified one.
pub(crate) fn history_evidence(store: &RunHistory, earlier: &history::Earlier) -> Value {
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
pub(crate) struct Run<'a> {
    pub(crate) run_id: Uuid,
    pub(crate) contract_version: i32,
    pub(crate) started_at: &'a str,
    pub(crate) finished_at: &'a str,
}

pub(crate) fn evidence<P: Provider>(
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

impl Failure {
    /// The failure as the evidence records it (`"kind"` and what it carries).
    pub(crate) fn evidence(&self) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_texts_are_cut() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(EVIDENCE_TEXT_CHARS + 10);
        assert_eq!(cut(&long).chars().count(), EVIDENCE_TEXT_CHARS + 1);
        let big = json!({"caption": "x".repeat(10 * EVIDENCE_TEXT_CHARS)});
        assert!(kept(&big).get("truncated").is_some());
        assert_eq!(kept(&json!({"a": 1})), json!({"a": 1}));
    }
}
