//! The second act of the demo: failover needs a certified provider, and the contract-test
//! harness is how a provider earns it.
//!
//! Run by `scripts/demo.sh` against its throwaway cluster (`PGHOST`, `PGPORT`, `PGUSER`,
//! `PGDATABASE`, as psql reads them); by hand:
//!
//! ```sh
//! PGHOST=/tmp/… PGPORT=5433 PGUSER=postgres cargo run -q -p pg_intent_harness --example failover_demo
//! ```
//!
//! It starts four OpenAI-compatible test providers on loopback (`pg_intent_test_provider`):
//! gpu-a is overloaded (HTTP 503), gpu-b is well-behaved, gpu-c adds a key the contract does not
//! have, gpu-d answers well but its chat template has no system role (its `/tokenize` shows
//! it). Then a job whose call outlives the worker's timeout is left `unknown` and a
//! `Reconciler` settles it by asking gpu-b what became of the request. Every answer below
//! comes from PostgreSQL or over HTTP from those providers.

use std::time::Duration;

use pg_intent_client::reconciler::Reconciler;
use pg_intent_client::{
    self as intent, Attempt, BeginOptions, Connection, Error, Failover, NewJob, Run, Submitted,
    WorkError, Worker,
};
use pg_intent_harness::{
    self as harness, ContractSuite, OpenAiCompatible, Prompt, Provider, RenderChecks,
    RequestLookup, RunOptions, TokenizerApi,
};
use pg_intent_test_provider::tokenizer::Flaw;
use pg_intent_test_provider::{Mode, TestProvider, captions};
use serde_json::Value;

type Failed = Box<dyn std::error::Error>;

fn step(title: &str) {
    let rule = 92usize.saturating_sub(title.chars().count() + 4);
    println!("\n── {title} {}", "─".repeat(rule));
}

fn say(text: &str) {
    println!("   {text}");
}

/// A refusal, the way psql prints one.
fn print_refusal(err: &Error) {
    match err.db_error() {
        Some(db) => {
            println!("ERROR:  {}", db.message());
            if let Some(detail) = db.detail() {
                println!("DETAIL:  {detail}");
            }
            if let Some(hint) = db.hint() {
                println!("HINT:  {hint}");
            }
            println!("   SQLSTATE {}", db.code().code());
        }
        None => println!("ERROR:  {err}"),
    }
}

async fn connect() -> Result<Connection, Failed> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(std::env::var("PGHOST").as_deref().unwrap_or("localhost"))
        .port(
            std::env::var("PGPORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(5432),
        )
        .user(std::env::var("PGUSER").as_deref().unwrap_or("postgres"))
        .dbname(std::env::var("PGDATABASE").as_deref().unwrap_or("postgres"))
        .application_name("failover_demo");
    let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("connection error: {e}");
        }
    });
    Ok(Connection::new(client))
}

/// The contract-test suite: the prompts production sends, one case per subject.
fn suite() -> ContractSuite {
    let mut suite = ContractSuite::new(captions::CONTRACT, |input| Prompt {
        system: captions::system_prompt(),
        user: captions::user_prompt(input),
    });
    for subject in captions::SUBJECTS {
        suite = suite.case(subject, captions::input(subject));
    }
    suite
}

/// How long one provider call may take: the harness's runs and the worker's calls alike.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The worker's own timeout: strictly longer than [`CALL_TIMEOUT`]. The call's timeout knows
/// which side of "sent" it stopped on and says so; the worker's only knows that time ran out
/// (and, with the two equal, which fires first is a race). It is the backstop for the whole
/// work (render, call, parse), and either one marks the attempt unknown, never failed.
const WORKER_TIMEOUT: Duration = Duration::from_secs(15);

fn options() -> RunOptions {
    RunOptions::default()
        .runs_per_case(3)
        .temperature(0.1)
        .call_timeout(CALL_TIMEOUT)
        .valid_for(Duration::from_secs(7 * 86_400))
}

/// The worker's call: the suite's round trip (render, call, parse), its failure reported by
/// `Failure::into_work_error`. Only a known outcome fails the attempt (gpu-a's 503 with
/// Retry-After: it did nothing); a timeout, a reset or a 502 marks it unknown, and nobody fails
/// over while the provider may still be generating.
async fn caption(
    provider: &OpenAiCompatible,
    attempt: &Attempt,
    input: &Value,
) -> Result<Value, WorkError<Value>> {
    // The attempt id is the provider's idempotency key: a reconciler can ask what became of it.
    suite()
        .work_for(provider, attempt.id(), input, &options())
        .await
}

async fn certify(db: &Connection, provider: &OpenAiCompatible) -> Result<(), Failed> {
    // What the model receives is checked first, through the provider's own tokenizer
    // (vLLM-style /tokenize and /detokenize); answers are paid for only if it is right.
    let options = options()
        .max_tokens(256)
        .rendering(RenderChecks::new(provider.tokenizer(TokenizerApi::Vllm)));
    say(&format!(
        "first the prompts through {}'s own tokenizer, then {} cases × {} runs at temperature {}, \
         each output checked by intent.validate_result():",
        provider.name(),
        captions::SUBJECTS.len(),
        options.runs_per_case,
        options.temperature
    ));
    let report = harness::run(db, provider, &suite(), &options).await?;
    if let Some(rendering) = report.cases.first().and_then(|c| c.rendering.as_ref()) {
        let checks: Vec<String> = rendering
            .checks
            .iter()
            .map(|c| format!("{} {}", c.name, if c.passed { "ok" } else { "FAILED" }))
            .collect();
        say(&format!(
            "  rendering ({} tokens): {}",
            rendering.tokens.unwrap_or(0),
            checks.join(", ")
        ));
        if let Some(failed) = rendering.first_failure() {
            say(&format!("  {}: {}", failed.name, failed.detail));
        }
    }
    for case in &report.cases {
        if case.runs.is_empty() {
            continue;
        }
        let marks: Vec<&str> = case
            .runs
            .iter()
            .map(|r| if r.passed() { "pass" } else { "FAIL" })
            .collect();
        let said = match (
            case.first_failure(),
            case.runs.first().and_then(|r| r.output.as_ref()),
        ) {
            (Some(failure), _) => failure.to_string(),
            (None, Some(output)) => output["caption"].to_string(),
            (None, None) => String::new(),
        };
        say(&format!("  {:<28} {}  {said}", case.name, marks.join(" ")));
    }
    if report.certified() {
        say(&format!("→ {} {}", provider.name(), report.verdict));
    } else if report.cases.iter().all(|c| c.runs.is_empty()) {
        say(&format!(
            "→ {} refused before any answer was paid for; nothing was recorded",
            provider.name()
        ));
    } else {
        say(&format!(
            "→ {} refused: {} of {} cases failed; nothing was recorded",
            provider.name(),
            report.failed_cases().count(),
            report.cases.len()
        ));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failed> {
    let db = connect().await?;

    println!(
        "\n══ Act 2: failover needs a provider certified for the job's contract ═════════════════════"
    );

    step("13. The captions contract: its shape, and what business logic needs.");
    db.batch_execute(captions::CHECKER_SQL).await?;
    let version = intent::define_contract(
        &db,
        captions::CONTRACT,
        &captions::schema(),
        Some(captions::CHECKER),
    )
    .await?;
    say(&format!("schema:  {}", captions::schema()));
    say(&format!(
        "checker: {} (the caption must name its subject)",
        captions::CHECKER
    ));
    say(&format!(
        "intent.define_contract('{}', …) → version {version}",
        captions::CONTRACT
    ));

    step("14. Four providers speak the OpenAI chat-completions API on loopback.");
    let a = TestProvider::start(Mode::ServerError).await?;
    let b = TestProvider::start(Mode::WellBehaved).await?;
    let c = TestProvider::start(Mode::HallucinatedKey).await?;
    let d = TestProvider::start(Mode::WellBehaved).await?;
    d.set_flaws(&[Flaw::DropsSystem]);
    let gpu_a = OpenAiCompatible::new("gpu-a", &a.base_url(), "captioner-1");
    let gpu_b = OpenAiCompatible::new("gpu-b", &b.base_url(), "captioner-2");
    let gpu_c = OpenAiCompatible::new("gpu-c", &c.base_url(), "captioner-3");
    let gpu_d = OpenAiCompatible::new("gpu-d", &d.base_url(), "captioner-4");
    say(&format!(
        "gpu-a  {}  overloaded: answers 503 with Retry-After",
        gpu_a.endpoint()
    ));
    say(&format!("gpu-b  {}  well-behaved", gpu_b.endpoint()));
    say(&format!(
        "gpu-c  {}  adds a top-level key of its own",
        gpu_c.endpoint()
    ));
    say(&format!(
        "gpu-d  {}  answers well, but its chat template has no system role",
        gpu_d.endpoint()
    ));
    let by_name = |name: &str| match name {
        "gpu-a" => gpu_a.clone(),
        "gpu-b" => gpu_b.clone(),
        _ => gpu_c.clone(),
    };

    step("15. Bob asks for a caption. gpu-a answers 503: nothing happened, so he may fail over.");
    let input = captions::input("a red fox in the snow");
    let submitted: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("bob", "caption-1", "gpu-a", &input).contract(captions::CONTRACT),
    )
    .await?;
    let job = submitted.job_id;
    say(&format!(
        "submit_job('bob', 'caption-1', 'gpu-a', {input}, contract => '{}')",
        captions::CONTRACT
    ));
    let worker = Worker::new(&db, WORKER_TIMEOUT).name("demo-worker");
    let work = |attempt: Attempt| {
        let provider = by_name(attempt.provider().unwrap_or("gpu-a"));
        let input = input.clone();
        async move { caption(&provider, &attempt, &input).await }
    };
    match worker.run(job, None, work).await? {
        Run::Failed {
            attempt,
            error,
            job_state,
            ..
        } => say(&format!(
            "attempt {} on gpu-a: failed {error}; the job is {job_state}",
            attempt.attempt_no()
        )),
        other => say(&format!("unexpected: {other:?}")),
    }

    step("16. Failover to gpu-b: refused. Nobody has shown that gpu-b meets the contract.");
    match intent::begin_attempt(&db, job, BeginOptions::new().provider("gpu-b")).await {
        Err(e) => print_refusal(&e),
        Ok(a) => say(&format!("unexpected: attempt {} began", a.attempt_no())),
    }

    step("17. The contract-test harness tries gpu-c; the database judges every answer.");
    certify(&db, &gpu_c).await?;

    step("18. The harness tries gpu-d: the model would never see the instructions.");
    certify(&db, &gpu_d).await?;
    say(&format!(
        "  (gpu-d received {} chat calls)",
        d.requests().len()
    ));

    step("19. The harness tries gpu-b: every check and run passes, so the evidence is recorded.");
    certify(&db, &gpu_b).await?;

    step("20. The same failover is now allowed; gpu-b's answer is checked against the contract.");
    match worker.run_failover(job, &["gpu-b"], work).await? {
        Failover::Completed {
            attempt,
            completion,
            result,
        } => say(&format!(
            "attempt {} on {}: {completion}  {result}",
            attempt.attempt_no(),
            attempt.provider().unwrap_or("?")
        )),
        other => say(&format!("unexpected: {other:?}")),
    }
    let job_row = intent::get_job(&db, job).await?.expect("the job exists");
    say(&format!(
        "the job is {}, version {}",
        job_row.state, job_row.version
    ));

    step("21. Carol's caption on gpu-b: the model takes 3 s, the worker gives up after 1 s.");
    let input = captions::input("a bowl of ramen");
    let carol: Submitted<Value> = intent::submit_job(
        &db,
        &NewJob::new("carol", "caption-2", "gpu-b", &input).contract(captions::CONTRACT),
    )
    .await?;
    b.set_delay(Duration::from_secs(3));
    let impatient = Worker::new(&db, Duration::from_secs(1)).name("demo-worker");
    let work = |attempt: Attempt| {
        let provider = gpu_b.clone();
        let input = input.clone();
        async move { caption(&provider, &attempt, &input).await }
    };
    let unknown = match impatient.run(carol.job_id, None, work).await? {
        Run::Unknown { attempt, .. } => {
            say(&format!(
                "attempt {} on gpu-b: unknown (a timeout is never a failure); its id was the \
                 request's Idempotency-Key",
                attempt.attempt_no(),
            ));
            attempt.id()
        }
        other => return Err(format!("unexpected: {other:?}").into()),
    };
    match intent::begin_attempt(&db, carol.job_id, BeginOptions::new().provider("gpu-b")).await {
        Err(e) => print_refusal(&e),
        Ok(a) => say(&format!("unexpected: attempt {} began", a.attempt_no())),
    }

    step("22. A Reconciler asks gpu-b what became of the request, and settles the attempt.");
    // The provider finishes the request it kept under the attempt id.
    while b
        .request_status(&unknown.to_string())
        .is_none_or(|s| s == "running")
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut operator = connect().await?;
    let reconciler = Reconciler::new(RequestLookup::new(&suite()).provider(gpu_b.clone()))
        .name("demo-reconciler");
    let pass = reconciler.run_once(&mut operator).await?;
    for r in &pass.reconciled {
        say(&format!(
            "attempt {} on {}: the provider says {} → {}",
            r.attempt_id, r.provider, r.evidence["provider_says"], r.decision
        ));
    }
    let carol_job = intent::get_job(&db, carol.job_id)
        .await?
        .expect("the job exists");
    say(&format!(
        "carol's job is {}: {}",
        carol_job.state,
        carol_job.result.unwrap_or_default()
    ));
    say(&format!(
        "gpu-b did the work {} time(s) for it; the reconciler asked {} time(s)",
        b.requests()
            .iter()
            .filter(|r| r.idempotency_key == Some(unknown.to_string()) && !r.replayed)
            .count(),
        b.lookups().len()
    ));
    Ok(())
}
