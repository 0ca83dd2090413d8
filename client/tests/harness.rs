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

use db::TestDb;
use pg_intent_client::harness::{
    self, ContractSuite, Delivery, Failure, OpenAiCompatible, Prompt, Provider, ProviderError,
    Request, RunError, RunOptions, Verdict,
};
use pg_intent_client::{
    self as intent, Attempt, AttemptState, BeginOptions, Completion, Connection, Error, Failover,
    JobState, NewJob, Run, Submitted, WorkError, Worker,
};
use pg_intent_test_provider::{Mode, TestProvider, captions};
use serde_json::{Value, json};
use uuid::Uuid;

const CONTRACT: &str = captions::CONTRACT;

/// The checker and the contract, as an administrator defines them.
async fn define_captions(db: &Connection) {
    db.batch_execute(captions::CHECKER_SQL).await.unwrap();
    intent::define_contract(db, CONTRACT, &captions::schema(), Some(captions::CHECKER))
        .await
        .unwrap();
}

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
