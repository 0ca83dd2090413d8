//! The run: [`run`] sends every case through the round trip, has the database judge each
//! output, certifies only when all passed (`certify.rs`) and answers a [`Report`].

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use pg_intent_client::{Error, Executor, validate_result};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::certify::{Certified, certify_checked, contract_version};
use crate::evidence::{Run, evidence, history_evidence, now};
use crate::suite::Check;
use crate::{
    ContractSuite, Failure, Prompt, Provider, Request, RunHistory, RunOptions, history,
    render::Rendering,
};

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
    pub(crate) fn pg(source: tokio_postgres::Error) -> RunError {
        RunError::Database(Error::from_postgres(source))
    }

    /// A row of the harness's own reads that does not decode: the server answered, so it is
    /// [`Error::Decode`], never a connection error.
    pub(crate) fn decode(source: tokio_postgres::Error) -> RunError {
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
