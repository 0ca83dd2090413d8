//! The contract-test harness against a real server and real HTTP: the local OpenAI-compatible
//! test provider (`pg_intent_test_provider`), well-behaved or misbehaving on purpose, and the
//! captions contract (a JSON Schema with `additionalProperties: false`, and a SQL checker that
//! the caption names its subject).
//!
//! What these show: the harness certifies the well-behaved provider and refuses (recording
//! nothing) every misbehaving one; failover is refused before certification, allowed after,
//! and refused again after revocation and after expiry; results that break the contract are
//! `rejected` and never win; an attempt begun before its provider was revoked may still
//! complete, and its result is validated like any other.

mod db;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use db::{TestDb, define_captions};
use pg_intent_client::{
    self as intent, Attempt, AttemptState, BeginOptions, Completion, Connection, Error, Failover,
    JobState, NewJob, Run, Submitted, WorkError, Worker,
};
use pg_intent_harness::{
    self as harness, ContractSuite, Delivery, Failure, OpenAiCompatible, Prompt, Provider,
    ProviderError, Request, RunError, RunHistory, RunOptions, Verdict,
};
use pg_intent_test_provider::{Mode, TestProvider, captions};
use serde_json::{Value, json};
use uuid::Uuid;

const CONTRACT: &str = captions::CONTRACT;

/// The suite production would run: the fixture's prompts, one case per subject.
fn suite() -> ContractSuite {
    let mut suite = ContractSuite::new(CONTRACT, |input| Prompt {
        system: captions::system_prompt(),
        user: captions::user_prompt(input),
    });
    for (i, subject) in captions::SUBJECTS.iter().enumerate() {
        suite = suite.case(format!("subject-{}", i + 1), captions::input(subject));
    }
    suite
}

fn options() -> RunOptions {
    RunOptions::default()
        .runs_per_case(3)
        .temperature(0.1)
        .call_timeout(Duration::from_secs(10))
        .valid_for(Duration::from_secs(86_400))
}

/// Test providers on loopback, each with the client that talks to it.
struct Fleet {
    servers: HashMap<String, TestProvider>,
    clients: HashMap<String, OpenAiCompatible>,
}

impl Fleet {
    async fn start(specs: &[(&str, Mode)]) -> Fleet {
        let mut servers = HashMap::new();
        let mut clients = HashMap::new();
        for &(name, mode) in specs {
            let server = TestProvider::start(mode).await.unwrap();
            clients.insert(
                name.to_string(),
                OpenAiCompatible::new(name, &server.base_url(), format!("fake-{mode}")),
            );
            servers.insert(name.to_string(), server);
        }
        Fleet { servers, clients }
    }

    fn provider(&self, name: &str) -> &OpenAiCompatible {
        &self.clients[name]
    }

    fn server(&self, name: &str) -> &TestProvider {
        &self.servers[name]
    }

    async fn certify(&self, db: &Connection, name: &str, options: &RunOptions) -> SystemTime {
        let report = harness::run(db, self.provider(name), &suite(), options)
            .await
            .unwrap();
        assert!(report.certified(), "{name}: {}", report.verdict);
        report.expires_at().unwrap()
    }
}

/// What a worker does with a provider: the suite's round trip. Prose that is not JSON is
/// stored as it came (a JSON string), for the contract to judge; every other failure is
/// reported by `Failure::into_work_error` (a 503 with Retry-After: failed, retryable).
async fn answer(provider: &OpenAiCompatible, input: &Value) -> Result<Value, WorkError<Value>> {
    match suite().ask(provider, input, &options()).await {
        Ok(output) => Ok(output),
        Err(Failure::NotJson { raw, .. }) => Ok(Value::String(raw)),
        Err(other) => Err(other.into_work_error(provider.name())),
    }
}

async fn submit(db: &Connection, key: &str, provider: &str, subject: &str, max: u16) -> Uuid {
    let params = captions::input(subject);
    let s: Submitted<Value> = intent::submit_job(
        db,
        &NewJob::new("alice", key, provider, &params)
            .contract(CONTRACT)
            .max_attempts(max),
    )
    .await
    .unwrap();
    assert!(s.created);
    s.job_id
}

async fn certifications(db: &Connection) -> Vec<(String, Value, bool)> {
    db.query(
        "SELECT provider, evidence, revoked_at IS NOT NULL FROM intent.certifications ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// Asserts an IJ005 refusal for `provider`, whose DETAIL contains `why`.
fn assert_not_certified(err: &Error, provider: &str, why: &str) {
    assert!(
        matches!(err, Error::ProviderNotCertified { provider: Some(p), .. } if p == provider),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ005"));
    assert_eq!(err.http_status(), 422);
    let detail = err.detail().unwrap_or("");
    assert!(detail.contains(why), "DETAIL {detail:?} should say {why:?}");
}

/// The job's primary failed (its provider answered 503), so the next attempt is a failover.
async fn primary_fails(db: &Connection, fleet: &Fleet, job: Uuid, input: &Value) {
    let worker = Worker::new(db, Duration::from_secs(10));
    let run = worker
        .run(job, None, |_| answer(fleet.provider("gpu-a"), input))
        .await
        .unwrap();
    let Run::Failed {
        job_state, error, ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(job_state, JobState::Pending);
    assert_eq!(error["status"], 503, "{error}");
    assert_eq!(error["delivery"], "refused", "{error}");
}

#[tokio::test]
async fn the_harness_certifies_the_well_behaved_provider_and_refuses_the_others() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[
        ("gpu-good", Mode::WellBehaved),
        ("gpu-extra-key", Mode::HallucinatedKey),
        ("gpu-prose", Mode::IgnoresFormat),
        ("gpu-lazy", Mode::CheckerRejects),
        ("gpu-down", Mode::ServerError),
    ])
    .await;
    let suite = suite();
    let mut reports = HashMap::new();
    for name in [
        "gpu-good",
        "gpu-extra-key",
        "gpu-prose",
        "gpu-lazy",
        "gpu-down",
    ] {
        let report = harness::run(&db, fleet.provider(name), &suite, &options())
            .await
            .unwrap();
        assert_eq!(report.provider, name);
        assert_eq!(report.cases.len(), captions::SUBJECTS.len());
        // The real round trip: every run reached the provider, rendered, at the low temperature.
        let received = fleet.server(name).requests();
        assert_eq!(received.len(), captions::SUBJECTS.len() * 3, "{name}");
        for r in &received {
            assert_eq!(r.temperature, Some(0.1));
            assert_eq!(r.system, captions::system_prompt());
            assert!(r.user.starts_with("Caption this picture."));
            assert_eq!(
                r.model.as_deref(),
                Some(format!("fake-{}", fleet.server(name).mode()).as_str())
            );
        }
        reports.insert(name, report);
    }

    // The well-behaved provider: every run passed, certified, evidence recorded as reported.
    let good = &reports["gpu-good"];
    assert!(good.certified(), "{}", good.verdict);
    assert!(good.cases.iter().all(|c| c.passed() && c.runs.len() == 3));
    let expires = good.expires_at().unwrap();
    let now = SystemTime::now();
    assert!(
        expires > now + Duration::from_secs(86_000) && expires < now + Duration::from_secs(86_500)
    );
    let e = &good.evidence;
    assert_eq!(e["provider"], "gpu-good");
    assert_eq!(e["contract"], CONTRACT);
    assert_eq!(
        e["summary"],
        json!({"cases": 5, "cases_passed": 5, "runs": 15, "runs_passed": 15})
    );
    assert_eq!(e["settings"]["temperature"], 0.1);
    assert_eq!(e["settings"]["runs_per_case"], 3);
    assert_eq!(e["settings"]["provider"]["model"], "fake-well-behaved");
    assert_eq!(
        e["settings"]["provider"]["endpoint"],
        fleet.provider("gpu-good").endpoint()
    );
    assert_eq!(e["system_prompt"], captions::system_prompt());
    assert_eq!(
        e["cases"][0]["input"],
        captions::input(captions::SUBJECTS[0])
    );
    assert_eq!(
        e["cases"][0]["runs"][0]["output"]["subject"],
        captions::SUBJECTS[0]
    );
    assert!(e["started_at"].as_str().unwrap() <= e["finished_at"].as_str().unwrap());

    // Each misbehaviour is refused for what it is.
    let refused = |name: &str| {
        let r = &reports[name];
        assert!(!r.certified(), "{name} should be refused");
        assert!(
            matches!(&r.verdict, Verdict::Refused { reason } if reason.starts_with("5 of 5 cases failed")),
            "{:?}",
            r.verdict
        );
        assert_eq!(r.evidence["summary"]["runs_passed"], 0);
        r.cases
            .iter()
            .flat_map(|c| &c.runs)
            .map(|run| run.failure.clone().expect("every run failed"))
            .collect::<Vec<Failure>>()
    };
    for f in refused("gpu-extra-key") {
        // The schema (additionalProperties: false), judged by the database.
        let Failure::Contract { errors } = &f else {
            panic!("{f:?}")
        };
        assert!(
            errors
                .iter()
                .any(|e| e["message"].as_str().unwrap_or("").contains("reasoning")),
            "{errors:?}"
        );
    }
    for f in refused("gpu-prose") {
        assert!(
            matches!(&f, Failure::NotJson { raw, .. } if raw.starts_with("Sure!")),
            "{f:?}"
        );
    }
    for f in refused("gpu-lazy") {
        // Schema-valid, so only the checker could say no.
        let Failure::Contract { errors } = &f else {
            panic!("{f:?}")
        };
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]["checker"]
                .as_str()
                .unwrap()
                .contains("caption_mentions_subject"),
            "{errors:?}"
        );
    }
    for f in refused("gpu-down") {
        assert!(
            matches!(
                &f,
                Failure::Provider(ProviderError {
                    status: Some(503),
                    delivery: Delivery::Refused,
                    ..
                })
            ),
            "{f:?}"
        );
    }

    // Only the well-behaved provider's evidence was recorded, exactly as reported.
    let rows = certifications(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "gpu-good");
    assert_eq!(rows[0].1, good.evidence);

    // Failover: refused to each refused provider (IJ005, naming it), allowed to the certified one.
    let job = submit(&db, "c-1", "gpu-down", "a red fox", 3).await;
    for name in ["gpu-extra-key", "gpu-prose", "gpu-lazy"] {
        let err = intent::begin_attempt(&db, job, BeginOptions::new().provider(name))
            .await
            .unwrap_err();
        assert_not_certified(&err, name, "was never certified");
    }
    let rec = intent::get_job(&db, job).await.unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempt_count),
        (JobState::Pending, 0),
        "a refusal changes nothing"
    );
    let a = intent::begin_attempt(&db, job, BeginOptions::new().provider("gpu-good"))
        .await
        .unwrap();
    assert_eq!(a.attempt_no(), 1);
}

#[tokio::test]
async fn failover_is_refused_before_certification_and_allowed_after() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-a", Mode::ServerError), ("gpu-b", Mode::WellBehaved)]).await;
    let input = captions::input("a red fox in the snow");
    let job = submit(&db, "c-2", "gpu-a", "a red fox in the snow", 5).await;
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_secs(5));
    let work = |attempt: Attempt| {
        let provider = fleet.provider(attempt.provider().unwrap()).clone();
        let input = input.clone();
        async move { answer(&provider, &input).await }
    };

    // gpu-a is overloaded; gpu-b was never certified: the gate refuses it and nothing runs there.
    let out = worker
        .run_failover(job, &["gpu-a", "gpu-b"], work)
        .await
        .unwrap();
    let Failover::Exhausted {
        failures,
        not_certified,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, "gpu-a");
    assert_eq!(not_certified, &["gpu-b"]);
    assert!(fleet.server("gpu-b").requests().is_empty());
    let err = intent::begin_attempt(&db, job, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap_err();
    assert_not_certified(&err, "gpu-b", "was never certified");
    assert!(
        err.hint().unwrap().contains("certify_provider"),
        "{:?}",
        err.hint()
    );

    // The harness certifies it …
    fleet.certify(&db, "gpu-b", &options()).await;
    let suite_calls = fleet.server("gpu-b").requests().len();
    assert_eq!(suite_calls, 15);

    // … and the same failover is now allowed: the real answer wins.
    let out = worker
        .run_failover(job, &["gpu-a", "gpu-b"], work)
        .await
        .unwrap();
    let Failover::Completed {
        attempt,
        completion,
        result,
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert_eq!(attempt.provider(), Some("gpu-b"));
    assert_eq!(result["subject"], "a red fox in the snow");
    assert_eq!(fleet.server("gpu-b").requests().len(), suite_calls + 1);
    let rec = intent::get_job(&db, job).await.unwrap().unwrap();
    assert_eq!(rec.state, JobState::Succeeded);
    assert_eq!(rec.completed_by, Some(attempt.id()));
    assert_eq!(rec.result.as_ref(), Some(&result));
}

#[tokio::test]
async fn failover_is_refused_again_after_revocation_and_after_expiry() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-a", Mode::ServerError), ("gpu-b", Mode::WellBehaved)]).await;
    let input = captions::input("two cats asleep on a sofa");
    let begin_b = |job| intent::begin_attempt(&db, job, BeginOptions::new().provider("gpu-b"));

    fleet.certify(&db, "gpu-b", &options()).await;
    let j1 = submit(&db, "r-1", "gpu-a", "two cats asleep on a sofa", 3).await;
    primary_fails(&db, &fleet, j1, &input).await;
    begin_b(j1).await.unwrap();

    // Revoked: refused again, and the DETAIL says so, with the reason.
    assert!(
        intent::revoke_certification(&db, "gpu-b", CONTRACT, "answers drifted in production")
            .await
            .unwrap()
    );
    let j2 = submit(&db, "r-2", "gpu-a", "two cats asleep on a sofa", 3).await;
    primary_fails(&db, &fleet, j2, &input).await;
    let err = begin_b(j2).await.unwrap_err();
    assert_not_certified(&err, "gpu-b", "was revoked");
    assert!(
        err.detail()
            .unwrap()
            .contains("answers drifted in production")
    );

    // Certified anew by the harness, for two seconds only: allowed while it lasts …
    let expires = fleet
        .certify(&db, "gpu-b", &options().valid_for(Duration::from_secs(2)))
        .await;
    begin_b(j2).await.unwrap();
    // … and refused once it has expired.
    let j3 = submit(&db, "r-3", "gpu-a", "two cats asleep on a sofa", 3).await;
    primary_fails(&db, &fleet, j3, &input).await;
    let wait = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
    let err = begin_b(j3).await.unwrap_err();
    assert_not_certified(&err, "gpu-b", "expired at");

    let rows = certifications(&db).await;
    assert_eq!(
        rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        [true, false],
        "history is kept: {rows:?}"
    );
}

#[tokio::test]
async fn results_that_break_the_contract_are_rejected_and_never_win() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[
        ("gpu-prose", Mode::IgnoresFormat),
        ("gpu-drift-key", Mode::WellBehaved),
        ("gpu-drift-lazy", Mode::WellBehaved),
        ("gpu-good", Mode::WellBehaved),
    ])
    .await;
    for name in ["gpu-drift-key", "gpu-drift-lazy", "gpu-good"] {
        fleet.certify(&db, name, &options()).await;
    }
    // After certification two providers drift: one hallucinates a key, one stops naming the
    // subject. The contract still judges every result.
    fleet
        .server("gpu-drift-key")
        .set_mode(Mode::HallucinatedKey);
    fleet
        .server("gpu-drift-lazy")
        .set_mode(Mode::CheckerRejects);

    let input = captions::input("the Eiffel Tower at night");
    let job = submit(&db, "x-1", "gpu-prose", "the Eiffel Tower at night", 4).await;
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_secs(5));
    let work = |attempt: Attempt| {
        let provider = fleet.provider(attempt.provider().unwrap()).clone();
        let input = input.clone();
        async move { answer(&provider, &input).await }
    };
    let order = ["gpu-prose", "gpu-drift-key", "gpu-drift-lazy", "gpu-good"];
    let out = worker.run_failover(job, &order, work).await.unwrap();
    let Failover::Completed {
        attempt,
        completion,
        result,
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert_eq!(attempt.provider(), Some("gpu-good"));
    assert_eq!(attempt.attempt_no(), 4);

    // Attempts 1–3 were rejected: failed, contract_violation, each for its own reason.
    let reasons = ["is not of type", "reasoning", "caption_mentions_subject"];
    for (no, why) in (1..=3).zip(reasons) {
        let id = intent::attempt_id(job, no).unwrap();
        let rec = intent::get_attempt(&db, id).await.unwrap().unwrap();
        assert_eq!(rec.state, AttemptState::Failed, "attempt {no}");
        assert_eq!(rec.provider, order[usize::from(no) - 1]);
        let error = rec.error.clone().unwrap();
        assert_eq!(error["kind"], "contract_violation");
        assert!(
            error["errors"].to_string().contains(why),
            "attempt {no}: {error}"
        );
        // Asked again: the same answer, and still no win.
        assert_eq!(
            intent::complete_attempt(&db, &rec.handle(), rec.result.as_ref().unwrap())
                .await
                .unwrap(),
            Completion::Rejected
        );
    }
    let rec = intent::get_job(&db, job).await.unwrap().unwrap();
    assert_eq!(rec.state, JobState::Succeeded);
    assert_eq!(rec.completed_by, Some(attempt.id()));
    assert_eq!(rec.result, Some(result.clone()));
    let violations: i64 = db
        .query_one(
            "SELECT count(*) FROM intent.events WHERE job_id = $1 AND kind = 'contract_violation'",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(violations, 3);

    // An abandoned attempt whose invalid answer comes back first does not win (an abandoned
    // attempt may win only with a valid result); the open attempt still can.
    let job2 = submit(&db, "x-2", "gpu-prose", "a bowl of ramen", 3).await;
    let input2 = captions::input("a bowl of ramen");
    let stuck = intent::begin_attempt(&db, job2, BeginOptions::new())
        .await
        .unwrap();
    intent::abandon_attempt(&db, stuck.id(), "gpu-prose is stuck")
        .await
        .unwrap();
    let open = intent::begin_attempt(&db, job2, BeginOptions::new().provider("gpu-good"))
        .await
        .unwrap();
    let prose = answer(fleet.provider("gpu-prose"), &input2).await.unwrap();
    assert!(prose.is_string());
    assert_eq!(
        intent::complete_attempt(&db, &stuck, &prose).await.unwrap(),
        Completion::Rejected
    );
    assert_eq!(
        intent::get_job(&db, job2).await.unwrap().unwrap().state,
        JobState::Running
    );
    let good = answer(fleet.provider("gpu-good"), &input2).await.unwrap();
    assert_eq!(
        intent::complete_attempt(&db, &open, &good).await.unwrap(),
        Completion::Won
    );

    // A late invalid answer for a finished job is rejected too; the job keeps its result.
    let job3 = submit(&db, "x-3", "gpu-drift-lazy", "a bowl of ramen", 3).await;
    let late = intent::begin_attempt(&db, job3, BeginOptions::new())
        .await
        .unwrap();
    intent::abandon_attempt(&db, late.id(), "gpu-drift-lazy is slow")
        .await
        .unwrap();
    let open = intent::begin_attempt(&db, job3, BeginOptions::new().provider("gpu-good"))
        .await
        .unwrap();
    assert_eq!(
        intent::complete_attempt(&db, &open, &good).await.unwrap(),
        Completion::Won
    );
    let lazy = answer(fleet.provider("gpu-drift-lazy"), &input2)
        .await
        .unwrap();
    assert_eq!(
        intent::complete_attempt(&db, &late, &lazy).await.unwrap(),
        Completion::Rejected
    );
    let rec = intent::get_job(&db, job3).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.result), (JobState::Succeeded, Some(good)));
}

/// protocol.md: revocation stops new failovers only. An attempt already begun on the provider
/// may complete; its result is validated against the contract like any other.
#[tokio::test]
async fn an_attempt_begun_before_revocation_completes_on_its_merits() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let admin = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-a", Mode::ServerError), ("gpu-b", Mode::WellBehaved)]).await;
    fleet.certify(&db, "gpu-b", &options()).await;
    let input = captions::input("ein Fahrrad im Regen");
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_secs(5));

    // Revoked while the provider works: the attempt completes, and its valid result wins.
    let j1 = submit(&db, "v-1", "gpu-a", "ein Fahrrad im Regen", 3).await;
    primary_fails(&db, &fleet, j1, &input).await;
    let run = worker
        .run(j1, Some("gpu-b"), |_| async {
            assert!(
                intent::revoke_certification(&admin, "gpu-b", CONTRACT, "incident 42")
                    .await
                    .unwrap()
            );
            answer(fleet.provider("gpu-b"), &input).await
        })
        .await
        .unwrap();
    let Run::Completed {
        completion,
        attempt,
        ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(completion, Completion::Won);
    assert_eq!(attempt.provider(), Some("gpu-b"));
    // New failovers to it are refused.
    let j2 = submit(&db, "v-2", "gpu-a", "ein Fahrrad im Regen", 3).await;
    primary_fails(&db, &fleet, j2, &input).await;
    let err = intent::begin_attempt(&db, j2, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap_err();
    assert_not_certified(&err, "gpu-b", "was revoked");

    // Certified again, begun, revoked, and the provider drifts: its result is validated like
    // any other — rejected — and the gate does not let it try again.
    fleet.certify(&db, "gpu-b", &options()).await;
    let a = intent::begin_attempt(&db, j2, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap();
    intent::revoke_certification(&db, "gpu-b", CONTRACT, "incident 43")
        .await
        .unwrap();
    fleet.server("gpu-b").set_mode(Mode::HallucinatedKey);
    let bad = answer(fleet.provider("gpu-b"), &input).await.unwrap();
    assert_eq!(
        intent::complete_attempt(&db, &a, &bad).await.unwrap(),
        Completion::Rejected
    );
    let rec = intent::get_job(&db, j2).await.unwrap().unwrap();
    assert_eq!(rec.state, JobState::Pending);
    let err = intent::begin_attempt(&db, j2, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap_err();
    assert_not_certified(&err, "gpu-b", "was revoked");
}

/// A provider implemented by hand: the trait is one async call.
struct Slow;

impl Provider for Slow {
    fn name(&self) -> &str {
        "gpu-slow"
    }

    async fn call(&self, _request: &Request) -> Result<String, ProviderError> {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok("{}".into())
    }
}

#[tokio::test]
async fn the_harness_records_nothing_it_cannot_show() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-good", Mode::WellBehaved)]).await;

    // An undefined contract is refused before the provider is called.
    let typo = ContractSuite::new("captions-v2", |_| Prompt::default()).case("x", json!({}));
    let err = harness::run(&db, fleet.provider("gpu-good"), &typo, &options())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RunError::Database(Error::InvalidInput { .. })),
        "{err:?}"
    );
    assert!(fleet.server("gpu-good").requests().is_empty());

    // Nothing to show: no cases, or no runs.
    let empty = ContractSuite::new(CONTRACT, |_| Prompt::default());
    let r = harness::run(&db, fleet.provider("gpu-good"), &empty, &options())
        .await
        .unwrap();
    assert!(!r.certified(), "{}", r.verdict);
    let r = harness::run(
        &db,
        fleet.provider("gpu-good"),
        &suite(),
        &options().runs_per_case(0),
    )
    .await
    .unwrap();
    assert!(!r.certified(), "{}", r.verdict);

    // Nobody listening, and a provider slower than the timeout: provider failures.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let nobody = OpenAiCompatible::new("gpu-gone", &format!("http://127.0.0.1:{closed}"), "m");
    let r = harness::run(&db, &nobody, &suite(), &options().runs_per_case(1))
        .await
        .unwrap();
    assert!(!r.certified());
    assert!(
        matches!(
            r.cases[0].first_failure(),
            Some(Failure::Provider(ProviderError {
                status: None,
                delivery: Delivery::NotSent,
                ..
            }))
        ),
        "{:?}",
        r.cases[0]
    );
    let one = suite();
    let one = ContractSuite::new(CONTRACT, move |input| one.render(input))
        .case("one", captions::input("a red fox"));
    let r = harness::run(
        &db,
        &Slow,
        &one,
        &options()
            .runs_per_case(1)
            .call_timeout(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    assert!(
        matches!(r.cases[0].first_failure(), Some(Failure::Timeout(_))),
        "{:?}",
        r.cases[0]
    );
    assert_eq!(
        r.evidence["cases"][0]["runs"][0]["failure"]["kind"],
        "timeout"
    );

    // An output the database cannot store as jsonb (a NUL character) fails its run.
    let nul = ContractSuite::new(CONTRACT, |_| Prompt::default())
        .parse_with(|_| Ok(json!({"subject": "a\u{0}b", "caption": "a\u{0}b", "confidence": 0.5})))
        .case("nul", json!({}));
    let r = harness::run(
        &db,
        fleet.provider("gpu-good"),
        &nul,
        &options().runs_per_case(1),
    )
    .await
    .unwrap();
    assert!(
        matches!(r.cases[0].first_failure(), Some(Failure::Unstorable { .. })),
        "{:?}",
        r.cases[0]
    );

    assert!(certifications(&db).await.is_empty());

    // An API key is sent, and never recorded.
    let keyed = OpenAiCompatible::new("gpu-good", &fleet.server("gpu-good").base_url(), "m")
        .api_key("sk-secret");
    let r = harness::run(&db, &keyed, &suite(), &options().runs_per_case(1))
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert!(
        fleet
            .server("gpu-good")
            .requests()
            .iter()
            .any(|q| q.authorized)
    );
    let rows = certifications(&db).await;
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].1.to_string().contains("sk-secret"));
    assert_eq!(rows[0].1["settings"]["provider"]["authenticated"], true);
}

/// The suite with one case: a single call per run.
fn one_case_suite() -> ContractSuite {
    let full = suite();
    ContractSuite::new(CONTRACT, move |input| full.render(input))
        .case("one", captions::input("a red fox"))
}

/// What the suite's round trip answers `provider` for one input.
async fn failure_of(provider: &OpenAiCompatible, options: &RunOptions) -> Failure {
    suite()
        .ask(provider, &captions::input("a red fox"), options)
        .await
        .expect_err("the call should fail")
}

/// A port nobody listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Issue 17, part 2: a provider still generating when the call times out may finish the work;
/// failing over then would run the job twice. gpu-fast is certified, so the gate would allow
/// the failover: only the timeout's classification (unknown, never failed) prevents it.
#[tokio::test]
async fn a_provider_that_answers_after_the_call_timeout_is_never_failed_over() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[
        ("gpu-slow", Mode::WellBehaved),
        ("gpu-fast", Mode::WellBehaved),
    ])
    .await;
    fleet
        .certify(&db, "gpu-fast", &options().runs_per_case(1))
        .await;
    let calls_to_fast = fleet.server("gpu-fast").requests().len();
    // gpu-slow answers, well-behaved, but only after the call timeout.
    fleet
        .server("gpu-slow")
        .set_delay(Duration::from_millis(1500));
    let subject = "a red fox in the snow";
    let input = captions::input(subject);
    let job = submit(&db, "slow-1", "gpu-slow", subject, 3).await;
    let call = options().call_timeout(Duration::from_millis(300));
    // The worker's own timeout is well above the call's: the call's timeout is what fires.
    let worker = Worker::new(&db, Duration::from_secs(10)).lease(Duration::from_secs(5));
    let suite = suite();
    let out = worker
        .run_failover(job, &["gpu-slow", "gpu-fast"], |attempt| {
            let provider = fleet.provider(attempt.provider().unwrap()).clone();
            let (suite, input, call) = (suite.clone(), input.clone(), call.clone());
            async move { suite.work(&provider, &input, &call).await }
        })
        .await
        .unwrap();
    let Failover::ReconcileFirst {
        attempt_id: Some(first),
        reason: Some(reason),
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(*first, intent::attempt_id(job, 1).unwrap());
    assert!(
        reason.starts_with("gpu-slow: no answer within 300ms"),
        "{reason}"
    );
    // The first attempt is unknown, not failed; no attempt was begun on gpu-fast, which never
    // heard of the job; gpu-slow did receive the request.
    let a1 = intent::get_attempt(&db, *first).await.unwrap().unwrap();
    assert_eq!(
        (a1.state, a1.provider.as_str()),
        (AttemptState::Unknown, "gpu-slow")
    );
    assert!(
        intent::get_attempt(&db, intent::attempt_id(job, 2).unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(fleet.server("gpu-fast").requests().len(), calls_to_fast);
    let slow = fleet.server("gpu-slow").requests();
    assert_eq!(slow.len(), 1);
    assert_eq!(slow[0].user, captions::user_prompt(&input));
    let rec = intent::get_job(&db, job).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempt_count), (JobState::Unknown, 1));
    // And the gate keeps it so until someone reconciles.
    let err = intent::begin_attempt(&db, job, BeginOptions::new().provider("gpu-fast"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
}

/// Issue 17, part 2: every provider failure says which side of "sent" it is on, over real HTTP.
#[tokio::test]
async fn provider_errors_say_which_side_of_sent_they_are_on() {
    let fleet = Fleet::start(&[
        ("gpu-overloaded", Mode::ServerError),
        ("gpu-limited", Mode::RateLimited),
        ("gpu-gateway", Mode::BadGateway),
        ("gpu-cut", Mode::CutsOffBody),
        ("gpu-hangs-up", Mode::HangsUp),
        ("gpu-slow", Mode::WellBehaved),
    ])
    .await;
    let opts = options().call_timeout(Duration::from_secs(5));
    let provider_error = |f: &Failure| match f {
        Failure::Provider(e) => e.clone(),
        other => panic!("{other:?}"),
    };
    let is_failed = |f: Failure| match f.into_work_error("p") {
        WorkError::Failed { retry_after, .. } => Some(retry_after),
        WorkError::Unknown { .. } => None,
    };

    // Nobody listening: never sent.
    let gone = OpenAiCompatible::new("p", &format!("http://127.0.0.1:{}", closed_port()), "m");
    let f = failure_of(&gone, &opts).await;
    let e = provider_error(&f);
    assert_eq!((e.delivery, e.status), (Delivery::NotSent, None), "{e}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "the reqwest error is kept"
    );
    assert_eq!(is_failed(f), Some(None));

    // 4xx: the provider did not process it.
    let base = fleet.server("gpu-overloaded").base_url();
    let lost = OpenAiCompatible::new("p", &format!("{base}/no/such/route"), "m");
    let e = provider_error(&failure_of(&lost, &opts).await);
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Refused, Some(404)),
        "{e}"
    );
    let f = failure_of(fleet.provider("gpu-limited"), &opts).await;
    let e = provider_error(&f);
    assert_eq!(
        (e.delivery, e.status, e.retry_after),
        (Delivery::Refused, Some(429), Some(Duration::from_secs(2))),
        "{e}"
    );
    assert_eq!(is_failed(f), Some(Some(Duration::from_secs(2))));
    // 503 with Retry-After: a deliberate refusal.
    let f = failure_of(fleet.provider("gpu-overloaded"), &opts).await;
    let e = provider_error(&f);
    assert_eq!(
        (e.delivery, e.status, e.retry_after),
        (Delivery::Refused, Some(503), Some(Duration::from_secs(1))),
        "{e}"
    );
    assert!(is_failed(f).is_some());

    // 502, a body that breaks off, a timeout: sent, outcome unknown.
    let f = failure_of(fleet.provider("gpu-gateway"), &opts).await;
    let e = provider_error(&f);
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Unknown, Some(502)),
        "{e}"
    );
    assert_eq!(is_failed(f), None);
    let f = failure_of(fleet.provider("gpu-cut"), &opts).await;
    let e = provider_error(&f);
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Unknown, Some(200)),
        "{e}"
    );
    assert!(e.message.starts_with("the answer broke off"), "{e}");
    assert_eq!(is_failed(f), None);
    // The connection closed after the request was sent, before any answer.
    let f = failure_of(fleet.provider("gpu-hangs-up"), &opts).await;
    let e = provider_error(&f);
    assert_eq!((e.delivery, e.status), (Delivery::Unknown, None), "{e}");
    assert_eq!(fleet.server("gpu-hangs-up").requests().len(), 1);
    assert_eq!(is_failed(f), None);
    fleet
        .server("gpu-slow")
        .set_delay(Duration::from_millis(1000));
    let f = failure_of(
        fleet.provider("gpu-slow"),
        &opts.clone().call_timeout(Duration::from_millis(200)),
    )
    .await;
    assert!(matches!(f, Failure::Timeout(_)), "{f:?}");
    assert_eq!(is_failed(f), None);
    // The same with the HTTP client's own timeout: a reqwest timeout after sending.
    let timing_out = OpenAiCompatible::new("p", &fleet.server("gpu-slow").base_url(), "m")
        .with_client(
            reqwest::Client::builder()
                .timeout(Duration::from_millis(200))
                .build()
                .unwrap(),
        );
    let f = failure_of(&timing_out, &opts).await;
    let e = provider_error(&f);
    assert_eq!((e.delivery, e.status), (Delivery::Unknown, None), "{e}");
    assert_eq!(is_failed(f), None);
    // Each of those slow requests did reach the provider.
    assert_eq!(fleet.server("gpu-slow").requests().len(), 2);
}

/// The captions contract again, stricter (shorter captions), which the well-behaved provider
/// still meets: version 2.
fn stricter_schema() -> Value {
    let mut schema = captions::schema();
    schema["properties"]["caption"]["maxLength"] = json!(300);
    schema
}

/// A provider whose `at`-th call first redefines the contract (as an administrator would,
/// from another session, while the run is in progress).
struct RedefinesTheContract {
    inner: OpenAiCompatible,
    admin: Connection,
    at: usize,
    calls: std::sync::atomic::AtomicUsize,
}

impl Provider for RedefinesTheContract {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn settings(&self) -> Value {
        self.inner.settings()
    }

    async fn call(&self, request: &Request) -> Result<String, ProviderError> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n == self.at {
            let v = intent::define_contract(
                &self.admin,
                CONTRACT,
                &stricter_schema(),
                Some(captions::CHECKER),
            )
            .await
            .unwrap();
            assert_eq!(v, 2);
        }
        self.inner.call(request).await
    }
}

/// Issue 17, part 5: the harness certifies exactly the contract version it tested.
#[tokio::test]
async fn a_contract_redefined_during_the_run_is_not_certified() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-b", Mode::WellBehaved)]).await;
    let one = options().runs_per_case(1);

    // Redefined (v2, which gpu-b still meets) at the third of five calls: every run passed,
    // but the first two were judged by version 1. Nothing is certified, and the report says so.
    let provider = RedefinesTheContract {
        inner: fleet.provider("gpu-b").clone(),
        admin: t.conn().await,
        at: 3,
        calls: Default::default(),
    };
    let r = harness::run(&db, &provider, &suite(), &one).await.unwrap();
    assert!(r.cases.iter().all(|c| c.passed()), "{:?}", r.cases);
    let Verdict::Refused { reason } = &r.verdict else {
        panic!("{:?}", r.verdict)
    };
    assert!(
        reason.contains("was redefined during the run: version 1 was tested, version 2 is current"),
        "{reason}"
    );
    assert_eq!(r.contract_version, 1);
    assert_eq!(r.evidence["contract_version"], 1);
    assert!(certifications(&db).await.is_empty());

    // Run again on version 2: certified, and recorded for version 2.
    let r = harness::run(&db, fleet.provider("gpu-b"), &suite(), &one)
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert_eq!(r.evidence["contract_version"], 2);
    let version: i32 = db
        .query_one(
            "SELECT contract_version FROM intent.certifications WHERE evidence->>'run_id' = $1",
            &[&r.run_id.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 2);

    // A redefinition between the harness's last look and certify_provider's own read would
    // have certify_provider record a version other than the one tested. A trigger stands in
    // for that race: the harness reads back what was recorded, and rolls it back.
    db.batch_execute(
        "CREATE FUNCTION public.skew_version() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN NEW.contract_version := NEW.contract_version + 1; RETURN NEW; END $$;
         CREATE TRIGGER skew BEFORE INSERT ON intent.certifications
           FOR EACH ROW EXECUTE FUNCTION public.skew_version();",
    )
    .await
    .unwrap();
    let before = certifications(&db).await.len();
    let r = harness::run(&db, fleet.provider("gpu-b"), &suite(), &one)
        .await
        .unwrap();
    let Verdict::Refused { reason } = &r.verdict else {
        panic!("{:?}", r.verdict)
    };
    assert!(
        reason.contains("certify_provider recorded version 3"),
        "{reason}"
    );
    assert_eq!(certifications(&db).await.len(), before, "rolled back");

    // Inside the caller's transaction the harness uses a savepoint: a refusal rolls back to
    // it and leaves the transaction usable; a certification is the caller's to commit.
    let observer = t.conn().await;
    let tx = db.transaction().await.unwrap();
    let r = harness::run(&tx, fleet.provider("gpu-b"), &suite(), &one)
        .await
        .unwrap();
    assert!(!r.certified(), "{}", r.verdict);
    let one_more: i32 = tx.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one_more, 1, "the caller's transaction is not aborted");
    tx.commit().await.unwrap();
    db.batch_execute("DROP TRIGGER skew ON intent.certifications")
        .await
        .unwrap();
    let tx = db.transaction().await.unwrap();
    let r = harness::run(&tx, fleet.provider("gpu-b"), &suite(), &one)
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert_eq!(
        certifications(&observer).await.len(),
        before,
        "not yet committed"
    );
    tx.commit().await.unwrap();
    assert_eq!(certifications(&observer).await.len(), before + 1);
}

/// Issue 17, part 5: every run is recorded, passed or not, and a certification's evidence
/// shows the failed runs before it: a flaky provider run until lucky cannot hide them.
#[tokio::test]
async fn every_run_is_recorded_and_a_certification_shows_the_failures_before_it() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-flaky", Mode::HallucinatedKey)]).await;
    let file = std::env::temp_dir().join(format!("pg_intent_runs_{}.jsonl", Uuid::new_v4()));
    for history in [
        RunHistory::table("public.harness_runs"),
        RunHistory::json_lines(&file),
    ] {
        history.create_table(&db).await.unwrap();
        let opts = options().runs_per_case(1).history(history.clone());
        let suite = suite();
        let run = || harness::run(&db, fleet.provider("gpu-flaky"), &suite, &opts);
        fleet.server("gpu-flaky").set_mode(Mode::HallucinatedKey);
        let fail_1 = run().await.unwrap();
        let fail_2 = run().await.unwrap();
        fleet.server("gpu-flaky").set_mode(Mode::WellBehaved);
        let lucky = run().await.unwrap();
        assert!(!fail_1.certified() && !fail_2.certified(), "{history}");
        assert!(lucky.certified(), "{history}: {}", lucky.verdict);

        // The store has all three, each with its whole evidence.
        let runs = history.runs(&db, "gpu-flaky", CONTRACT).await.unwrap();
        let field = |key: &str| runs.iter().map(|r| r[key].clone()).collect::<Vec<_>>();
        assert_eq!(
            field("run_id"),
            [fail_1.run_id, fail_2.run_id, lucky.run_id].map(|id| json!(id)),
            "{history}"
        );
        assert_eq!(field("passed"), [false, false, true].map(Value::from));
        assert_eq!(field("certified"), [false, false, true].map(Value::from));
        assert_eq!(field("contract_version"), [1, 1, 1].map(Value::from));
        assert!(
            runs[0]["verdict"]
                .as_str()
                .unwrap()
                .starts_with("refused: 5 of 5 cases failed"),
            "{}",
            runs[0]["verdict"]
        );
        assert!(
            runs[2]["verdict"]
                .as_str()
                .unwrap()
                .starts_with("certified until")
        );
        assert_eq!(runs[0]["evidence"], fail_1.evidence);
        assert_eq!(runs[2]["evidence"], lucky.evidence);

        // The certification's own evidence lists the two failures before it.
        let (_, recorded, _) = certifications(&db).await.pop().unwrap();
        assert_eq!(recorded, lucky.evidence);
        let h = &recorded["history"];
        assert_eq!(h["store"], history.to_string());
        assert_eq!(
            (&h["earlier_runs"], &h["earlier_failed"]),
            (&json!(2), &json!(2))
        );
        assert_eq!(
            h["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["run_id"].clone())
                .collect::<Vec<_>>(),
            [json!(fail_1.run_id), json!(fail_2.run_id)]
        );
        assert_eq!(h["runs"][0]["summary"]["runs_passed"], 0);
        assert_eq!(h["runs"][0]["passed"], false);

        // The next certification counts from this one: nothing failed in between.
        let again = run().await.unwrap();
        assert!(again.certified());
        assert_eq!(again.evidence["history"]["earlier_runs"], 0);
        assert_eq!(
            history
                .runs(&db, "gpu-flaky", CONTRACT)
                .await
                .unwrap()
                .len(),
            4
        );
    }
    let lines = std::fs::read_to_string(&file).unwrap();
    assert_eq!(lines.lines().count(), 4);
    std::fs::remove_file(&file).unwrap();

    // Without a history the evidence says so.
    let r = harness::run(
        &db,
        fleet.provider("gpu-flaky"),
        &suite(),
        &options().runs_per_case(1),
    )
    .await
    .unwrap();
    assert_eq!(r.evidence["history"], Value::Null);
}

/// Issue 17, part 5: a case may assert on its output given its input, and the assertion is
/// evidence. A constant caption meets a contract that only checks the shape; the assertion
/// that it names the input's subject does not let it through.
#[tokio::test]
async fn a_case_may_assert_on_its_output_given_its_input() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    const LOOSE: &str = "captions-shape-only";
    intent::define_contract(&db, LOOSE, &captions::schema(), None)
        .await
        .unwrap();
    let fleet = Fleet::start(&[
        ("gpu-constant", Mode::CheckerRejects),
        ("gpu-good", Mode::WellBehaved),
    ])
    .await;
    let names_subject = |input: &Value, output: &Value| {
        let subject = input["subject"].as_str().unwrap_or_default();
        let caption = output["caption"].as_str().unwrap_or_default();
        if caption.to_lowercase().contains(&subject.to_lowercase()) {
            Ok(())
        } else {
            Err(format!("the caption {caption:?} does not name {subject:?}"))
        }
    };
    let loose = |checked: bool| {
        let mut s = ContractSuite::new(LOOSE, |input| Prompt {
            system: captions::system_prompt(),
            user: captions::user_prompt(input),
        });
        for subject in captions::SUBJECTS {
            s = if checked {
                s.case_with(subject, captions::input(subject), names_subject)
            } else {
                s.case(subject, captions::input(subject))
            };
        }
        s
    };
    let one = options().runs_per_case(2);

    // Without the assertion the constant caption passes: the schema cannot tell.
    let r = harness::run(&db, fleet.provider("gpu-constant"), &loose(false), &one)
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert_eq!(r.evidence["cases"][0]["checked"], false);
    assert!(r.evidence["cases"][0]["runs"][0].get("check").is_none());

    // With it, every run fails, and the evidence says why.
    let r = harness::run(&db, fleet.provider("gpu-constant"), &loose(true), &one)
        .await
        .unwrap();
    assert!(!r.certified());
    for (case, subject) in r.cases.iter().zip(captions::SUBJECTS) {
        assert!(case.checked);
        for run in &case.runs {
            let Some(Failure::Check { message }) = &run.failure else {
                panic!("{run:?}")
            };
            assert!(message.contains(subject), "{message}");
        }
    }
    let run = &r.evidence["cases"][0]["runs"][1];
    assert_eq!(run["check"], "failed");
    assert_eq!(run["failure"]["kind"], "check");
    assert!(
        run["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("does not name"),
        "{run}"
    );
    assert_eq!(r.evidence["cases"][0]["checked"], true);

    // A provider that names the subject passes the same suite, and each run records it.
    let r = harness::run(&db, fleet.provider("gpu-good"), &loose(true), &one)
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert_eq!(r.evidence["cases"][4]["runs"][1]["check"], "passed");
}

/// Issue 17, part 5: temperatures outside 0 to 2 are refused before any provider call.
#[tokio::test]
async fn bad_temperatures_are_refused_before_any_call() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let fleet = Fleet::start(&[("gpu-good", Mode::WellBehaved)]).await;
    let p = fleet.provider("gpu-good");
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5, 2.5] {
        let err = harness::run(&db, p, &suite(), &options().temperature(bad))
            .await
            .unwrap_err();
        let RunError::Options(message) = &err else {
            panic!("{bad}: {err:?}")
        };
        assert!(message.contains("from 0 to 2"), "{message}");
        let f = failure_of(p, &options().temperature(bad)).await;
        assert!(
            matches!(
                &f,
                Failure::Provider(ProviderError {
                    delivery: Delivery::NotSent,
                    ..
                })
            ),
            "{f:?}"
        );
    }
    assert!(fleet.server("gpu-good").requests().is_empty());
    // The bounds themselves are fine.
    let r = harness::run(&db, p, &one_case_suite(), &options().temperature(2.0))
        .await
        .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    assert_eq!(r.evidence["settings"]["temperature"], 2.0);
    assert_eq!(
        fleet.server("gpu-good").requests()[0].temperature,
        Some(2.0)
    );
}

/// Issue 17, part 5: credentials in the endpoint URL and the API key are sent, and appear
/// nowhere: not in the evidence, the run history, Debug, Display, or a failure's message.
#[tokio::test]
async fn credentials_never_reach_the_evidence() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    define_captions(&db).await;
    let server = TestProvider::start(Mode::WellBehaved).await.unwrap();
    let secrets = ["pw-hunter2", "tk-sekrit-1", "sk-live-abc123", "alice"];
    let base = |addr: &str| format!("http://alice:pw-hunter2@{addr}/?token=tk-sekrit-1#frag");
    let p = OpenAiCompatible::new("gpu-keyed", &base(&server.addr().to_string()), "m")
        .api_key("sk-live-abc123");
    let history = RunHistory::table("harness_runs");
    history.create_table(&db).await.unwrap();
    let r = harness::run(
        &db,
        &p,
        &suite(),
        &options().runs_per_case(1).history(history.clone()),
    )
    .await
    .unwrap();
    assert!(r.certified(), "{}", r.verdict);
    // They were sent.
    let received = server.requests();
    assert_eq!(received.len(), 5);
    assert!(received.iter().all(|q| q.authorized));
    assert_eq!(
        r.evidence["settings"]["provider"]["endpoint"],
        format!(
            "http://redacted@{}/v1/chat/completions?token=redacted",
            server.addr()
        )
    );

    // A failure's message: nobody listens at this port, and reqwest's error names the URL.
    let gone = OpenAiCompatible::new(
        "gpu-gone",
        &base(&format!("127.0.0.1:{}", closed_port())),
        "m",
    )
    .api_key("sk-live-abc123");
    let failure = failure_of(&gone, &options()).await;
    let Failure::Provider(error) = &failure else {
        panic!("{failure:?}")
    };
    let mut chain = Vec::new();
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = source {
        chain.push(format!("{e} / {e:?}"));
        source = e.source();
    }

    let mut shown = vec![
        r.evidence.to_string(),
        format!("{r:?}"),
        format!("{p:?}"),
        format!("{p}"),
        p.endpoint().to_string(),
        format!("{gone:?}"),
        failure.to_string(),
        format!("{failure:?}"),
        format!("{:?}", failure.clone().into_work_error("gpu-gone")),
        serde_json::to_string(&history.runs(&db, "gpu-keyed", CONTRACT).await.unwrap()).unwrap(),
    ];
    shown.extend(chain);
    shown.extend(certifications(&db).await.iter().map(|c| c.1.to_string()));
    for text in &shown {
        for secret in secrets {
            assert!(!text.contains(secret), "{secret:?} shown in {text}");
        }
    }
}

/// Review finding 5: reqwest's URL parser skips any number of `/` and `\` after a special
/// scheme, so `https:///user:secret@host/` and `https:/user:secret@host/` send basic-auth
/// credentials; the endpoint, Display, Debug and settings (and so the evidence) must not show
/// them. The authority was taken as "after `://`, up to the first `/`", which saw none.
#[test]
fn credentials_behind_extra_slashes_are_redacted() {
    let mut leaks = Vec::new();
    for url in [
        "https:///user:s3cret-pw@api.example.com/v1",
        "https:/user:s3cret-pw@api.example.com/v1",
        "https://///user:s3cret-pw@api.example.com/v1",
        "https:\\\\user:s3cret-pw@api.example.com/v1",
    ] {
        let parsed = reqwest::Url::parse(url).unwrap();
        assert_eq!(
            parsed.password(),
            Some("s3cret-pw"),
            "{url}: reqwest sends it"
        );
        let p = OpenAiCompatible::new("p", url, "m");
        for shown in [
            harness::redact_url(url),
            p.endpoint().to_string(),
            format!("{p}"),
            format!("{p:?}"),
            p.settings().to_string(),
        ] {
            if shown.contains("s3cret-pw") {
                leaks.push(format!("{url}: shown as {shown}"));
            }
        }
        assert_eq!(
            p.endpoint(),
            "https://redacted@api.example.com/v1/chat/completions"
        );
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// Issue 17, part 5: the OpenAI-compatible provider reads at most `max_response_bytes` of an
/// answer, and fails as a provider error (answered, too large) beyond it, without buffering
/// the rest: an answer that never ends is cut off, not waited for.
#[tokio::test]
async fn answers_larger_than_the_limit_fail_without_being_buffered() {
    let fleet = Fleet::start(&[
        ("gpu-endless", Mode::EndlessBody),
        ("gpu-good", Mode::WellBehaved),
    ])
    .await;
    let opts = options().call_timeout(Duration::from_secs(60));
    let endless = OpenAiCompatible::new("p", &fleet.server("gpu-endless").base_url(), "m")
        .max_response_bytes(256 * 1024);
    let f = tokio::time::timeout(Duration::from_secs(10), failure_of(&endless, &opts))
        .await
        .expect("an endless answer is cut off at the limit, not read to its end");
    let Failure::Provider(e) = &f else {
        panic!("{f:?}")
    };
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Answered, Some(200)),
        "{e}"
    );
    assert!(e.message.contains("larger than 262144 bytes"), "{e}");
    assert!(
        matches!(f.into_work_error("p"), WorkError::Failed { .. }),
        "the whole answer was the provider's: a known outcome"
    );
    // An answer whose Content-Length passes the limit, and the default limit.
    let good = fleet.server("gpu-good").base_url();
    let tight = OpenAiCompatible::new("p", &good, "m").max_response_bytes(100);
    let e = match failure_of(&tight, &opts).await {
        Failure::Provider(e) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.delivery, Delivery::Answered);
    assert!(e.message.contains("larger than 100 bytes"), "{e}");
    assert_eq!(harness::DEFAULT_MAX_RESPONSE_BYTES, 8 << 20);
    let roomy = OpenAiCompatible::new("p", &good, "m");
    assert_eq!(roomy.settings()["max_response_bytes"], 8 << 20);
    suite()
        .ask(&roomy, &captions::input("a red fox"), &opts)
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Review of issue 17: concurrent runs, a damaged history, redirects.

/// An HTTP server that answers every `POST` with `status` and `Location: /elsewhere`, and
/// anything else with `404`; counts the `POST`s and the other requests.
async fn redirecting(
    status: u16,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (posts, others) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (p, o) = (posts.clone(), others.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (p, o) = (p.clone(), o.clone());
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let mut head = Vec::new();
                    loop {
                        let mut line = String::new();
                        if matches!(stream.read_line(&mut line).await, Ok(0) | Err(_)) {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push(line);
                    }
                    let length = head
                        .iter()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    let mut body = vec![0; length];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let answer = if head[0].starts_with("POST ") {
                        p.fetch_add(1, Ordering::SeqCst);
                        format!(
                            "HTTP/1.1 {status} Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
                        )
                    } else {
                        o.fetch_add(1, Ordering::SeqCst);
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
                    };
                    if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, posts, others)
}

/// Review finding 11: a `303 See Other` says the request was processed (the answer is
/// elsewhere), so its outcome is unknown, not refused; so is a redirect error (too many
/// redirects: a 303 may be in the chain) and an error status reached by following a redirect.
/// `OpenAiCompatible`'s own client follows no redirect, so every 3xx is the provider's own answer.
#[tokio::test]
async fn a_see_other_and_redirect_errors_are_unknown_outcomes() {
    let opts = options().call_timeout(Duration::from_secs(5));
    let provider_error = |f: Failure| match f {
        Failure::Provider(e) => e,
        other => panic!("{other:?}"),
    };
    let following = || reqwest::Client::builder().build().unwrap();

    let (base, posts, others) = redirecting(303).await;
    let e = provider_error(failure_of(&OpenAiCompatible::new("p", &base, "m"), &opts).await);
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Unknown, Some(303)),
        "{e}"
    );
    let n = |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((n(&posts), n(&others)), (1, 0), "not followed");
    // A client of the caller's that follows it: the error status after it is no refusal.
    let p = OpenAiCompatible::new("p", &base, "m").with_client(following());
    let e = provider_error(failure_of(&p, &opts).await);
    assert_eq!(e.delivery, Delivery::Unknown, "{e}");
    assert!(n(&others) >= 1, "followed");

    // Too many redirects (a 307 to itself, re-posted): unknown.
    let (base, posts, _) = redirecting(307).await;
    let p = OpenAiCompatible::new("p", &base, "m").with_client(following());
    let e = provider_error(failure_of(&p, &opts).await);
    assert_eq!((e.delivery, e.status), (Delivery::Unknown, None), "{e}");
    assert!(n(&posts) > 1);

    // Any other 3xx, not followed: the provider said where to go instead, having done nothing.
    let (base, _, others) = redirecting(301).await;
    let e = provider_error(failure_of(&OpenAiCompatible::new("p", &base, "m"), &opts).await);
    assert_eq!(
        (e.delivery, e.status),
        (Delivery::Refused, Some(301)),
        "{e}"
    );
    assert_eq!(n(&others), 0);
}

/// A provider that always gives the same answer, and counts its calls.
struct Fixed {
    answer: &'static str,
    calls: std::sync::atomic::AtomicUsize,
}

impl Fixed {
    fn new(answer: &'static str) -> Self {
        Fixed {
            answer,
            calls: Default::default(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Provider for Fixed {
    fn name(&self) -> &str {
        "gpu-x"
    }

    async fn call(&self, _: &Request) -> Result<String, ProviderError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(self.answer.to_string())
    }
}

/// How many sessions of this database wait for a lock.
async fn waiting_for_locks(db: &Connection) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Whether a process waits for a `flock` on the file whose inode is `inode` (Linux's
/// /proc/locks lists blocked waiters with `->`).
fn flock_waited_for(inode: u64) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        l.contains("->")
            && l.contains("FLOCK")
            && l.split_whitespace().any(|f| {
                f.rsplit(':').next().and_then(|i| i.parse::<u64>().ok()) == Some(inode)
                    && f.contains(':')
            })
    })
}

/// Review finding 4: a failed run recorded while another run of the same pair certifies is in
/// some certification's evidence. The certifying run read "the runs since the last
/// certification" outside any lock, before its transaction; a failure recorded after that read
/// and before the certification's own record fell between two windows and was listed by
/// neither. Run the flaky provider's suite concurrently (CI shards do) and the failures fall into
/// that gap. Sequenced here with a lock on intent.certifications, which holds the certifying run
/// (B) inside its certification while the failing run (A) is recorded; A may wait for B (the
/// history is locked while B certifies), so the lock is released once A is done or waits.
#[tokio::test]
async fn a_failure_recorded_during_a_certification_is_in_some_certifications_evidence() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    intent::define_contract(&admin, "c-x", &json!({}), None)
        .await
        .unwrap();
    let file = std::env::temp_dir().join(format!("pg_intent_runs_{}.jsonl", Uuid::new_v4()));
    std::fs::write(&file, "").unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
    for history in [
        RunHistory::table("public.harness_runs"),
        RunHistory::json_lines(&file),
    ] {
        admin
            .batch_execute("DELETE FROM intent.certifications")
            .await
            .unwrap();
        history.create_table(&admin).await.unwrap();
        let suite = ContractSuite::new("c-x", |_| Prompt::default()).case("one", json!({}));
        let opts = RunOptions::default()
            .runs_per_case(1)
            .call_timeout(Duration::from_secs(5))
            .history(history.clone());

        let locker = t.conn().await;
        locker
            .batch_execute("BEGIN; LOCK TABLE intent.certifications IN EXCLUSIVE MODE")
            .await
            .unwrap();
        let db_b = t.conn().await;
        let (suite_b, opts_b) = (suite.clone(), opts.clone());
        let b = tokio::spawn(async move {
            harness::run(&db_b, &Fixed::new("{}"), &suite_b, &opts_b)
                .await
                .unwrap()
        });
        // B is certifying (its certify_provider waits for the lock).
        while waiting_for_locks(&admin).await < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A fails, and is recorded (or waits to be, until B is done).
        let db_a = t.conn().await;
        let (suite_a, opts_a) = (suite.clone(), opts.clone());
        let a = tokio::spawn(async move {
            harness::run(&db_a, &Fixed::new("not json"), &suite_a, &opts_a)
                .await
                .unwrap()
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !a.is_finished()
            && waiting_for_locks(&admin).await < 2
            && !flock_waited_for(inode)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        locker.batch_execute("COMMIT").await.unwrap();
        let a = a.await.unwrap();
        assert!(!a.certified());
        let b = b.await.unwrap();
        assert!(b.certified(), "{history}: {}", b.verdict);
        // A later certification of the same pair.
        let c = harness::run(&admin, &Fixed::new("{}"), &suite, &opts)
            .await
            .unwrap();
        assert!(c.certified(), "{history}: {}", c.verdict);

        let listed: Vec<Value> = admin
            .query(
                "SELECT evidence FROM intent.certifications WHERE provider = 'gpu-x' ORDER BY id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, Value>(0)["history"].clone())
            .collect();
        let runs = history.runs(&admin, "gpu-x", "c-x").await.unwrap();
        let order: Vec<(Value, Value)> = runs
            .iter()
            .map(|r| (r["run_id"].clone(), r["passed"].clone()))
            .collect();
        let a_id = json!(a.run_id);
        assert!(
            listed.iter().any(|h| h["runs"]
                .as_array()
                .is_some_and(|runs| runs.iter().any(|r| r["run_id"] == a_id))),
            "{history}: the failed run {} is recorded (history order {order:?}) but listed in \
             no certification's evidence: {listed:#?}",
            a.run_id
        );
    }
    std::fs::remove_file(&file).unwrap();
}

/// Review finding 13: a crash in the middle of an append leaves the file's last line cut short.
/// That line is skipped (and the evidence says so), the next record starts on a line of its own,
/// and the runs after it read the file as before. A line that is damaged otherwise fails the run
/// before any provider call is paid for.
#[tokio::test]
async fn a_history_file_cut_short_by_a_crash_is_read_and_a_damaged_one_fails_first() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    intent::define_contract(&db, "c-x", &json!({}), None)
        .await
        .unwrap();
    let file = std::env::temp_dir().join(format!("pg_intent_runs_{}.jsonl", Uuid::new_v4()));
    let history = RunHistory::json_lines(&file);
    let suite = ContractSuite::new("c-x", |_| Prompt::default()).case("one", json!({}));
    let opts = RunOptions::default()
        .runs_per_case(1)
        .call_timeout(Duration::from_secs(5))
        .history(history.clone());
    let failing = Fixed::new("not json");
    let first = harness::run(&db, &failing, &suite, &opts).await.unwrap();
    assert!(!first.certified());
    // The crash: half a record, no newline.
    let whole = std::fs::read_to_string(&file).unwrap();
    let cut = &whole[..whole.len() / 2];
    std::fs::write(&file, format!("{whole}{cut}")).unwrap();

    let good = Fixed::new("{}");
    let r = harness::run(&db, &good, &suite, &opts)
        .await
        .expect("a history cut short by a crash is read, its last line skipped");
    assert!(r.certified(), "{}", r.verdict);
    let h = &r.evidence["history"];
    assert_eq!(h["earlier_runs"], 1, "{h}");
    assert_eq!(h["runs"][0]["run_id"], json!(first.run_id));
    let skipped = h["skipped"].to_string();
    assert!(skipped.contains("line 2"), "the skipped line is noted: {h}");
    // The new record is on a line of its own, and the file reads as before.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.ends_with('\n'));
    assert_eq!(text.lines().count(), 3, "{text}");
    let again = harness::run(&db, &good, &suite, &opts).await.unwrap();
    assert!(again.certified(), "{}", again.verdict);
    assert_eq!(again.evidence["history"]["earlier_runs"], 0);
    let runs = history.runs(&db, "gpu-x", "c-x").await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r["run_id"].clone()).collect::<Vec<_>>(),
        [first.run_id, r.run_id, again.run_id].map(|id| json!(id))
    );

    // A line damaged in the middle of the file is not a crash's: the run fails, before any call.
    std::fs::write(&file, format!("{whole}not a record\n{whole}")).unwrap();
    let before = good.calls();
    let err = harness::run(&db, &good, &suite, &opts).await.unwrap_err();
    assert!(
        matches!(&err, RunError::History { source, .. } if source.to_string().contains("line 2")),
        "{err:?}"
    );
    assert_eq!(good.calls(), before, "no provider call is paid for");
    std::fs::remove_file(&file).unwrap();
}
