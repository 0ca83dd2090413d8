//! Rendering checks: what the model receives, through the provider's own tokenizer (the test
//! provider's `/tokenize` and `/detokenize`, vLLM- and llama.cpp-style) and through a local
//! `tokenizer.json` and chat template. The tokenizer is trained in the test (the test
//! provider's `tiny_tokenizer`), nothing is downloaded.
//!
//! What these show: each rendering failure (a template that drops the system role, a context
//! window too small, control tokens in the input parsed as control tokens, a tokenizer that
//! loses characters) refuses the certification before any chat call is paid for, and says
//! which check failed; each passing provider is certified, with every check in its evidence;
//! a render function that neutralises control tokens passes where the raw one fails.

mod db;

use std::time::Duration;

use db::{TestDb, define_captions};
use pg_intent_client::Connection;
use pg_intent_harness::{
    self as harness, ContractSuite, DEFAULT_CONTROL_TOKENS, LocalTokenizer, OpenAiCompatible,
    Prompt, RenderCheck, RenderChecks, Report, RunOptions, ServerTokenizer, Tokenizer,
    TokenizerApi, neutralise_control_tokens, neutralise_with,
};
use pg_intent_test_provider::tokenizer::{
    CHATML_TEMPLATE, CHATML_WITHOUT_SYSTEM, CONTROL_TOKENS, Flaw, ProviderTokenizer, tiny_tokenizer,
};
use pg_intent_test_provider::{Mode, TestProvider, captions};
use serde_json::{Value, json};

const CONTRACT: &str = captions::CONTRACT;

/// The production suite: the subject goes into the prompt as it came.
fn raw_suite() -> ContractSuite {
    suite_with(captions::user_prompt)
}

/// The same suite with its inputs' control tokens neutralised before rendering: the usual ones
/// and the tokenizer's own (the tiny tokenizer's `<unk>` is one).
fn neutralising_suite() -> ContractSuite {
    suite_with(|input| {
        let subject = input["subject"].as_str().unwrap_or_default();
        let own = DEFAULT_CONTROL_TOKENS.iter().chain(CONTROL_TOKENS.iter());
        let subject = neutralise_with(subject, own.copied());
        assert_eq!(
            neutralise_control_tokens(&subject),
            subject,
            "the defaults are a subset"
        );
        captions::user_prompt(&captions::input(&subject))
    })
}

fn suite_with(user: impl Fn(&Value) -> String + Send + Sync + 'static) -> ContractSuite {
    ContractSuite::new(CONTRACT, move |input| Prompt {
        system: captions::system_prompt(),
        user: user(input),
    })
    .case("fox", captions::input("a red fox in the snow"))
    .case("ramen", captions::input("a bowl of ramen"))
}

fn options(checks: RenderChecks) -> RunOptions {
    RunOptions::default()
        .runs_per_case(2)
        .temperature(0.1)
        .call_timeout(Duration::from_secs(10))
        .valid_for(Duration::from_secs(86_400))
        .max_tokens(256)
        .rendering(checks)
}

async fn certifications(db: &Connection, provider: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM intent.certifications WHERE provider = $1",
        &[&provider],
    )
    .await
    .unwrap()
    .get(0)
}

/// The check named `check` failed in the first case, and the verdict says so.
fn assert_refused_by(report: &Report, check: &str, detail: &str) {
    assert!(!report.certified(), "{}", report.verdict);
    let verdict = report.verdict.to_string();
    assert!(
        verdict.contains(&format!("rendering check {check} failed")),
        "{verdict}"
    );
    let rendering = report.cases[0].rendering.as_ref().expect("checked");
    let failed = rendering.first_failure().expect("a failed check");
    assert_eq!(failed.name, check, "{rendering:?}");
    assert!(failed.detail.contains(detail), "{:?}", failed.detail);
    // Recorded, and no answer was paid for.
    assert!(report.cases.iter().all(|c| c.runs.is_empty()));
    let cases = report.evidence["cases"].as_array().unwrap();
    let checks = cases[0]["rendering"]["checks"].as_array().unwrap();
    assert!(
        checks
            .iter()
            .any(|c| c["check"] == check && c["passed"] == false),
        "{checks:?}"
    );
}

/// The checks through `client`'s server tokenizer speaking `api`, told the tiny tokenizer's
/// own control tokens (neither API lists them).
fn server_checks(client: &OpenAiCompatible, api: TokenizerApi) -> RenderChecks {
    RenderChecks::new(client.tokenizer(api).control_tokens(CONTROL_TOKENS))
}

/// The first failed rendering check of case `name`.
#[track_caller]
fn first_failed<'r>(report: &'r Report, name: &str) -> &'r RenderCheck {
    let case = report
        .cases
        .iter()
        .find(|c| c.name == name)
        .expect("the case");
    let rendering = case.rendering.as_ref().expect("checked");
    rendering.first_failure().expect("a failed check")
}

/// A provider with the tokenizer endpoints, and its client.
async fn provider(name: &str, flaws: &[Flaw]) -> (TestProvider, OpenAiCompatible) {
    let server = TestProvider::start(Mode::WellBehaved).await.unwrap();
    server.set_flaws(flaws);
    let client = OpenAiCompatible::new(name, &server.base_url(), "fake-tiny");
    (server, client)
}

#[tokio::test]
async fn a_well_behaved_provider_is_certified_with_every_check_in_the_evidence() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    // llama.cpp's chat endpoint tokenizes the rendered prompt as one text, control tokens
    // parsed wherever they are (so does its API here): its inputs must be neutralised. A
    // vLLM-style server that tokenizes the messages' content as text passes them raw.
    for (api, suite) in [
        (TokenizerApi::Vllm, raw_suite()),
        (TokenizerApi::LlamaCpp, neutralising_suite()),
        (TokenizerApi::Tgi, raw_suite()),
    ] {
        let name = format!("gpu-good-{api:?}");
        let (server, client) = provider(&name, &[]).await;
        let checks = server_checks(&client, api);
        let report = harness::run(&db, &client, &suite, &options(checks))
            .await
            .unwrap();
        assert!(report.certified(), "{api:?}: {}", report.verdict);
        assert_eq!(server.requests().len(), 4, "two cases, two runs each");
        for case in &report.cases {
            let rendering = case.rendering.as_ref().unwrap();
            let names: Vec<&str> = rendering.checks.iter().map(|c| c.name).collect();
            assert_eq!(
                names,
                [
                    "round_trip",
                    "system_present",
                    "user_present",
                    "fits",
                    "control_tokens"
                ]
            );
            assert!(rendering.passed(), "{rendering:?}");
            assert!(rendering.tokens.unwrap() > 20);
        }
        // The certification's evidence holds the checks and the tokenizer that made them.
        let evidence: Value = db
            .query_one(
                "SELECT evidence FROM intent.certifications WHERE provider = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(evidence["rendering"]["tokenizer"]["kind"], "server");
        assert_eq!(evidence["rendering"]["answer_tokens"], 256);
        let here = evidence["rendering"]["control"]["control_tokens_here"]
            .as_array()
            .unwrap();
        assert!(
            here.iter().any(|t| t["token"] == "<|im_end|>"),
            "{evidence}"
        );
        assert_eq!(evidence["cases"][0]["rendering"]["passed"], true);
    }
}

#[tokio::test]
async fn each_rendering_failure_refuses_the_certification_before_any_call() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    // Each flaw through each API. (llama.cpp parses control tokens in any prompt: its
    // ParsesControlTokens case is raw input through it, flawed or not.)
    let flaws: [(Flaw, &str, &str); 3] = [
        (
            Flaw::DropsSystem,
            "system_present",
            "system prompt is not in what the model receives",
        ),
        (
            Flaw::SmallContext,
            "fits",
            "exceed the context window of 64",
        ),
        (
            Flaw::ParsesControlTokens,
            "control_tokens",
            "reaches the model as that control token",
        ),
    ];
    let apis = [
        TokenizerApi::Vllm,
        TokenizerApi::LlamaCpp,
        TokenizerApi::Tgi,
    ];
    let cases = flaws
        .iter()
        .flat_map(|&(flaw, check, detail)| apis.map(|api| ([flaw], api, check, detail)));
    for (i, (flaws, api, check, detail)) in cases.enumerate() {
        let name = format!("gpu-flawed-{i}");
        let (server, client) = provider(&name, &flaws).await;
        // Only the flaw under test may fail: other inputs are neutralised.
        let suite = if check == "control_tokens" {
            raw_suite()
        } else {
            neutralising_suite()
        };
        let report = harness::run(&db, &client, &suite, &options(server_checks(&client, api)))
            .await
            .unwrap();
        assert_refused_by(&report, check, detail);
        assert!(server.requests().is_empty(), "{flaws:?}: no chat call");
        assert_eq!(certifications(&db, &name).await, 0);
    }
}

#[tokio::test]
async fn a_tokenizer_that_loses_characters_is_caught() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let suite = neutralising_suite().case("brulee", captions::input("une crème brûlée"));
    // vLLM's API shows only ids: the lost characters show as a user prompt not received.
    let (_server, client) = provider("gpu-lossy-vllm", &[Flaw::Lossy]).await;
    let report = harness::run(
        &db,
        &client,
        &suite,
        &options(server_checks(&client, TokenizerApi::Vllm)),
    )
    .await
    .unwrap();
    assert!(!report.certified());
    let failed = first_failed(&report, "brulee");
    assert_eq!(failed.name, "user_present", "{failed:?}");
    // llama.cpp's shows the rendered text: it does not survive tokenization.
    let (_server, client) = provider("gpu-lossy-llama", &[Flaw::Lossy]).await;
    let report = harness::run(
        &db,
        &client,
        &suite,
        &options(server_checks(&client, TokenizerApi::LlamaCpp)),
    )
    .await
    .unwrap();
    let failed = first_failed(&report, "brulee");
    assert_eq!(failed.name, "round_trip", "{failed:?}");
    assert!(failed.detail.contains("does not survive tokenization"));
    // The ASCII cases' text survives; but the neutraliser's word joiner (U+2060) is a
    // character this tokenizer loses too: it becomes <unk>, a control token, and the
    // control_tokens check says so.
    let fox = report.cases[0].rendering.as_ref().unwrap();
    let failed: Vec<&str> = fox
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(failed, ["control_tokens"], "{fox:?}");
    assert!(fox.checks[0].passed, "round_trip: {fox:?}");
}

#[tokio::test]
async fn neutralised_inputs_pass_where_raw_ones_fail() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let (_server, client) = provider("gpu-parses", &[Flaw::ParsesControlTokens]).await;
    let checks = || server_checks(&client, TokenizerApi::Vllm);
    let raw = harness::run(&db, &client, &raw_suite(), &options(checks()))
        .await
        .unwrap();
    assert_refused_by(&raw, "control_tokens", "<|object_ref_start|>");
    let neutralised = harness::run(&db, &client, &neutralising_suite(), &options(checks()))
        .await
        .unwrap();
    assert!(neutralised.certified(), "{}", neutralised.verdict);
    assert_eq!(certifications(&db, "gpu-parses").await, 1);
}

#[tokio::test]
async fn a_provider_described_by_its_files_is_checked_locally() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let (server, client) = provider("gpu-local", &[]).await;
    let tiny = tiny_tokenizer();
    let config = json!({
        "chat_template": CHATML_TEMPLATE,
        "bos_token": null,
        "eos_token": {"content": "<|im_end|>", "special": true},
        "model_max_length": 4096,
    })
    .to_string();
    let local = LocalTokenizer::from_config(&tiny, &config).unwrap();
    assert_eq!(local.describe()["context_window"], 4096);

    // The local rendering is the server's: the same ids as a server that parses control
    // tokens in the rendered text (as vLLM does), the same text as its template.
    let provider_tokenizer = ProviderTokenizer::new(&tiny).unwrap();
    let prompt = raw_suite().render(&captions::input("a fox <|im_end|>"));
    let chat = local.chat(&prompt).await.unwrap();
    let messages = [
        ("system".to_string(), prompt.system.clone()),
        ("user".to_string(), prompt.user.clone()),
    ];
    assert_eq!(
        chat.text.as_deref(),
        Some(provider_tokenizer.render(&messages, &[]).as_str())
    );
    assert_eq!(
        chat.ids,
        provider_tokenizer.chat_ids(&messages, &[Flaw::ParsesControlTokens])
    );

    // Locally, the template's output is tokenized as one text: raw inputs fail, neutralised
    // ones pass and are certified.
    let checks = RenderChecks::new(LocalTokenizer::from_config(&tiny, &config).unwrap());
    let raw = harness::run(&db, &client, &raw_suite(), &options(checks.clone()))
        .await
        .unwrap();
    assert_refused_by(&raw, "control_tokens", "reaches the model");
    let report = harness::run(&db, &client, &neutralising_suite(), &options(checks))
        .await
        .unwrap();
    assert!(report.certified(), "{}", report.verdict);
    assert_eq!(report.evidence["rendering"]["tokenizer"]["kind"], "local");
    assert_eq!(
        server.requests().len(),
        4,
        "only the certified run called the model"
    );

    // A template without a system role, a window too small, a window unknown.
    let no_system = LocalTokenizer::new(&tiny, CHATML_WITHOUT_SYSTEM)
        .unwrap()
        .context_window(4096);
    let report = harness::run(
        &db,
        &client,
        &neutralising_suite(),
        &options(RenderChecks::new(no_system)),
    )
    .await
    .unwrap();
    assert_refused_by(&report, "system_present", "not in what the model receives");
    let small = LocalTokenizer::new(&tiny, CHATML_TEMPLATE)
        .unwrap()
        .context_window(300);
    let report = harness::run(
        &db,
        &client,
        &neutralising_suite(),
        &options(RenderChecks::new(small)),
    )
    .await
    .unwrap();
    assert_refused_by(&report, "fits", "exceed the context window of 300");
    let unknown = LocalTokenizer::new(&tiny, CHATML_TEMPLATE).unwrap();
    let report = harness::run(
        &db,
        &client,
        &neutralising_suite(),
        &options(RenderChecks::new(unknown)),
    )
    .await
    .unwrap();
    assert_refused_by(&report, "fits", "context window is unknown");
    // A template that raises fails the render, as it would on the server.
    let raising = LocalTokenizer::new(
        &tiny,
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
    )
    .unwrap()
    .context_window(4096);
    let report = harness::run(
        &db,
        &client,
        &neutralising_suite(),
        &options(RenderChecks::new(raising)),
    )
    .await
    .unwrap();
    assert_refused_by(&report, "chat", "System role not supported");
    assert_eq!(certifications(&db, "gpu-local").await, 1);
}

#[tokio::test]
async fn a_tokenizer_that_does_not_answer_refuses_the_certification() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let (server, client) = provider("gpu-no-tokenizer", &[]).await;
    // The chat endpoint works; the tokenizer is somewhere that is not there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let tokenizer = ServerTokenizer::new(
        &format!("http://127.0.0.1:{port}"),
        "fake-tiny",
        TokenizerApi::Vllm,
    );
    let report = harness::run(
        &db,
        &client,
        &raw_suite(),
        &options(RenderChecks::new(tokenizer)),
    )
    .await
    .unwrap();
    assert_refused_by(&report, "chat", "does not answer");
    assert!(server.requests().is_empty());
    assert_eq!(certifications(&db, "gpu-no-tokenizer").await, 0);
}
