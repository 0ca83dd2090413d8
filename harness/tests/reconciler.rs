//! The reconciler against a real server and the real test provider over loopback: attempts
//! whose outcome is unknown, resolved by asking the provider what became of the request sent
//! under the attempt id (docs/runbook.md § 2), by an operator's role, each decision once.

mod db;

use std::collections::HashMap;
use std::time::Duration;

use db::TestDb;
use pg_intent_client::reconciler::{Decision, Pass, Reconciler};
use pg_intent_client::{
    self as intent, AttemptRecord, AttemptState, BeginOptions, Completion, Connection, Error,
    JobState, NewJob, Run, Submitted, Worker,
};
use pg_intent_cluster::eventually;
use pg_intent_harness::{ContractSuite, OpenAiCompatible, Prompt, RequestLookup};
use pg_intent_test_provider::{Mode, TestProvider, captions};
use serde_json::{Value, json};
use uuid::Uuid;

const PROVIDER: &str = "gpu-a";

/// The suite a worker runs: the captions prompts; its parser is the lookup's too.
fn suite() -> ContractSuite {
    ContractSuite::new(captions::CONTRACT, |input| Prompt {
        system: captions::system_prompt(),
        user: captions::user_prompt(input),
    })
}

fn options() -> pg_intent_harness::RunOptions {
    pg_intent_harness::RunOptions::default()
        .temperature(0.1)
        .call_timeout(Duration::from_secs(30))
}

/// A database, the test provider on loopback, the client that talks to it, and a connection
/// as a role that is only an operator (`intent_operator`: SELECT on the tables, no UPDATE).
struct Setup {
    t: TestDb,
    db: Connection,
    server: TestProvider,
    gpu_a: OpenAiCompatible,
}

impl Setup {
    async fn new() -> Setup {
        let t = TestDb::new().await;
        let db = t.conn().await;
        let role = format!("rec_{}", t.name);
        db.batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE intent_operator"
        ))
        .await
        .unwrap();
        let server = TestProvider::start(Mode::WellBehaved).await.unwrap();
        let gpu_a = OpenAiCompatible::new(PROVIDER, &server.base_url(), "fake-captioner");
        Setup {
            t,
            db,
            server,
            gpu_a,
        }
    }

    /// A new connection as the operator role.
    async fn operator(&self) -> Connection {
        let role = format!("rec_{}", self.t.name);
        let (client, conn) = tokio_postgres::connect(
            &self.t.cluster.conn_str_as(&self.t.name, &role),
            tokio_postgres::NoTls,
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        Connection::new(client)
    }

    /// A reconciler asking the test provider, parsing as the suite's workers do.
    fn reconciler(&self, name: &str) -> Reconciler {
        Reconciler::new(RequestLookup::new(&suite()).provider(self.gpu_a.clone())).name(name)
    }

    async fn job(&self, key: &str, subject: &str) -> Uuid {
        let s: Submitted<Value> = intent::submit_job(
            &self.db,
            &NewJob::new("alice", key, PROVIDER, &captions::input(subject)).max_attempts(3),
        )
        .await
        .unwrap();
        s.job_id
    }

    async fn attempt(&self, id: Uuid) -> AttemptRecord {
        intent::get_attempt(&self.db, id).await.unwrap().unwrap()
    }

    async fn job_state(&self, job: Uuid) -> JobState {
        intent::get_job(&self.db, job).await.unwrap().unwrap().state
    }

    /// The job's events: (kind, attempt, detail), in order.
    async fn events(&self, job: Uuid) -> Vec<(String, Option<Uuid>, Value)> {
        self.db
            .query(
                "SELECT kind::text, attempt_id, detail FROM intent.events WHERE job_id = $1 ORDER BY id",
                &[&job],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// The one `reconciled` event of `attempt`: its detail.
    #[track_caller]
    fn reconciled(events: &[(String, Option<Uuid>, Value)], attempt: Uuid) -> &Value {
        let mine: Vec<_> = events
            .iter()
            .filter(|e| e.0 == "reconciled" && e.1 == Some(attempt))
            .collect();
        assert_eq!(mine.len(), 1, "{events:?}");
        &mine[0].2
    }

    /// Waits until the provider has `status` for the request under `key`.
    async fn provider_reaches(&self, key: Uuid, status: &str) {
        let key = key.to_string();
        assert!(
            eventually(Duration::from_secs(30), || {
                let ok = self.server.request_status(&key) == Some(status);
                async move { ok }
            })
            .await,
            "the provider never had {key} {status} (has {:?})",
            self.server.request_status(&key)
        );
    }
}

/// The one entry of `pass` for `attempt`.
#[track_caller]
fn decision_of(pass: &Pass, attempt: Uuid) -> Decision {
    assert!(pass.errors.is_empty(), "{:?}", pass.errors);
    let mine: Vec<_> = pass
        .reconciled
        .iter()
        .filter(|r| r.attempt_id == attempt)
        .collect();
    assert_eq!(mine.len(), 1, "{pass:?}");
    mine[0].decision.clone()
}

/// The worker timed out (the attempt became `unknown`) while the provider, slower than the
/// worker's timeout, went on and finished: the reconciler asks, gets the output, and completes
/// the attempt with it, which wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_attempt_the_provider_finished_is_completed_and_wins() {
    let s = Setup::new().await;
    let job = s.job("fox", "a red fox in the snow").await;
    // The worker gives up after 1 s; the model answers after 3 s.
    s.server.set_delay(Duration::from_secs(3));
    let worker = Worker::new(&s.db, Duration::from_secs(1)).name("w-1");
    let gpu_a = s.gpu_a.clone();
    let run = worker
        .run(job, None, |attempt| {
            let gpu_a = gpu_a.clone();
            async move {
                let input = captions::input("a red fox in the snow");
                suite()
                    .work_for(&gpu_a, attempt.id(), &input, &options())
                    .await
            }
        })
        .await
        .unwrap();
    let Run::Unknown { attempt, .. } = run else {
        panic!("{run:?}")
    };
    let id = attempt.id();
    assert_eq!(s.job_state(job).await, JobState::Unknown);
    // The call carried the attempt id as its idempotency key.
    let received = s.server.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].idempotency_key, Some(id.to_string()));
    s.provider_reaches(id, "succeeded").await;

    let mut op = s.operator().await;
    let pass = s.reconciler("rec-1").run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, id),
        Decision::Completed(Completion::Won),
        "{pass:?}"
    );
    let evidence = &pass.reconciled[0].evidence;
    assert_eq!(evidence["provider_says"], "done", "{evidence}");
    assert_eq!(evidence["evidence"]["http_status"], 200, "{evidence}");
    assert_eq!(evidence["evidence"]["status"], "succeeded", "{evidence}");

    // The provider's output is the job's result, from this attempt.
    let j = intent::get_job(&s.db, job).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.completed_by, Some(id));
    assert_eq!(
        j.result,
        Some(json!({
            "subject": "a red fox in the snow",
            "caption": "A photo of a red fox in the snow.",
            "confidence": 0.9
        }))
    );
    let a = s.attempt(id).await;
    assert_eq!(a.state, AttemptState::Succeeded);
    assert_eq!(a.result, j.result);
    // Asked once, and the work was done once.
    assert_eq!(s.server.lookups(), vec![id.to_string()]);
    assert_eq!(s.server.requests().len(), 1);
    // The decision and its evidence, as a reconciled event.
    let events = s.events(job).await;
    let detail = Setup::reconciled(&events, id);
    assert_eq!(detail["decision"], "completed", "{detail}");
    assert_eq!(detail["attempt_state"], "succeeded", "{detail}");
    assert_eq!(detail["evidence"]["completion"], "won", "{detail}");
    assert_eq!(detail["evidence"]["provider_says"], "done", "{detail}");
    assert_eq!(detail["evidence"]["reconciled_by"], "rec-1", "{detail}");
    assert_eq!(
        detail["evidence"]["evidence"]["http_status"], 200,
        "{detail}"
    );
    assert!(
        detail["recorded_by"]
            .as_str()
            .is_some_and(|r| r.starts_with("rec_")),
        "{detail}"
    );
    // The next pass finds nothing to do.
    let again = s.reconciler("rec-1").run_once(&mut op).await.unwrap();
    assert!(again.reconciled.is_empty(), "{again:?}");
}

/// The worker began the attempt and lost it before the request left (here: it never sent it):
/// the provider has no record (404), so the attempt fails as retryable and the gate opens: a
/// new attempt, with the next number, runs and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_the_provider_never_received_is_failed_and_retried_under_the_gate() {
    let s = Setup::new().await;
    let job = s.job("cat", "two cats asleep on a sofa").await;
    let first = intent::begin_attempt(&s.db, job, BeginOptions::new().worker("w-1"))
        .await
        .unwrap();
    intent::mark_unknown(&s.db, first.id(), Some("the worker lost the call"))
        .await
        .unwrap();
    // The gate is shut while the outcome is unknown.
    let refused = intent::begin_attempt(&s.db, job, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::OutcomeUnknown { .. }),
        "{refused:?}"
    );

    let mut op = s.operator().await;
    let pass = s.reconciler("rec-1").run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, first.id()),
        Decision::Failed(JobState::Pending)
    );
    let a = s.attempt(first.id()).await;
    assert_eq!(a.state, AttemptState::Failed);
    let error = a.error.unwrap();
    assert_eq!(error["kind"], "reconciled", "{error}");
    assert_eq!(error["decision"], "failed", "{error}");
    assert_eq!(error["provider_says"], "never_received", "{error}");
    assert_eq!(error["reconciled_by"], "rec-1", "{error}");
    assert_eq!(error["evidence"]["http_status"], 404, "{error}");
    assert!(
        error["evidence"]["asked"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/v1/requests/{}", first.id())),
        "{error}"
    );
    assert_eq!(s.job_state(job).await, JobState::Pending);

    // The retry, under the gate: a new attempt (no. 2, another id) is allowed and wins.
    let worker = Worker::new(&s.db, Duration::from_secs(30)).name("w-2");
    let gpu_a = s.gpu_a.clone();
    let run = worker
        .run(job, None, |attempt| {
            let gpu_a = gpu_a.clone();
            async move {
                let input = captions::input("two cats asleep on a sofa");
                suite()
                    .work_for(&gpu_a, attempt.id(), &input, &options())
                    .await
            }
        })
        .await
        .unwrap();
    let Run::Completed {
        attempt: second,
        completion: Completion::Won,
        ..
    } = run
    else {
        panic!("{run:?}")
    };
    assert_eq!(second.attempt_no(), 2);
    assert_ne!(second.id(), first.id());
    let j = intent::get_job(&s.db, job).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.completed_by, Some(second.id()));
    assert_eq!(j.attempt_count, 2);
    // The provider saw only the second attempt, under its own key.
    let received = s.server.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].idempotency_key, Some(second.id().to_string()));
    // The decision and its evidence, as a reconciled event (and in the attempt's error).
    let events = s.events(job).await;
    let detail = Setup::reconciled(&events, first.id());
    assert_eq!(detail["decision"], "failed", "{detail}");
    assert_eq!(detail["attempt_state"], "failed", "{detail}");
    assert_eq!(
        detail["evidence"]["provider_says"], "never_received",
        "{detail}"
    );
    assert_eq!(
        detail["evidence"]["evidence"]["http_status"], 404,
        "{detail}"
    );
    assert!(
        events
            .iter()
            .all(|(kind, _, _)| kind == "timeout" || kind == "reconciled"),
        "{events:?}"
    );
}

/// The provider is still generating when the worker gave up: the reconciler leaves the attempt
/// (the gate stays shut), and completes it on a later pass, once the provider has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_still_running_is_left_until_it_finishes() {
    let s = Setup::new().await;
    let job = s.job("ramen", "a bowl of ramen").await;
    let attempt = intent::begin_attempt(&s.db, job, BeginOptions::new())
        .await
        .unwrap();
    // The worker's call, sent under the attempt id; the provider takes a while.
    s.server.set_delay(Duration::from_secs(3));
    let call = {
        let gpu_a = s.gpu_a.clone();
        let id = attempt.id();
        tokio::spawn(async move {
            let input = captions::input("a bowl of ramen");
            suite().ask_for(&gpu_a, id, &input, &options()).await
        })
    };
    // Once the provider has it, the worker gives up (the connection closes) and marks it.
    s.provider_reaches(attempt.id(), "running").await;
    call.abort();
    let _ = call.await;
    intent::mark_unknown(&s.db, attempt.id(), Some("timeout"))
        .await
        .unwrap();
    assert_eq!(
        s.server.request_status(&attempt.id().to_string()),
        Some("running")
    );

    let mut op = s.operator().await;
    let reconciler = s.reconciler("rec-1").abandon_after(Duration::ZERO);
    let pass = reconciler.run_once(&mut op).await.unwrap();
    assert_eq!(decision_of(&pass, attempt.id()), Decision::Running);
    assert_eq!(s.attempt(attempt.id()).await.state, AttemptState::Unknown);
    assert_eq!(s.job_state(job).await, JobState::Unknown);
    let refused = intent::begin_attempt(&s.db, job, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::OutcomeUnknown { .. }),
        "{refused:?}"
    );
    // Leaving is no decision: nothing was written.
    assert_eq!(s.events(job).await.len(), 1, "{:?}", s.events(job).await);

    s.provider_reaches(attempt.id(), "succeeded").await;
    let pass = reconciler.run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, attempt.id()),
        Decision::Completed(Completion::Won)
    );
    assert_eq!(s.job_state(job).await, JobState::Succeeded);
    assert_eq!(s.server.requests().len(), 1);
}

/// The provider did the work but has forgotten it (its records expired: 410): nobody can tell.
/// Younger than the configured age, or with abandoning off, the attempt is left; older, it is
/// abandoned, with the evidence in the `abandoned` event, and a new attempt may begin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_nobody_can_tell_about_is_left_while_young_and_abandoned_when_old() {
    let s = Setup::new().await;
    let job = s.job("tower", "the Eiffel Tower at night").await;
    let attempt = intent::begin_attempt(&s.db, job, BeginOptions::new())
        .await
        .unwrap();
    let input = captions::input("the Eiffel Tower at night");
    suite()
        .ask_for(&s.gpu_a, attempt.id(), &input, &options())
        .await
        .unwrap();
    intent::mark_unknown(&s.db, attempt.id(), Some("the worker crashed"))
        .await
        .unwrap();
    s.server.forget(&attempt.id().to_string());
    let mut op = s.operator().await;

    // Young: an hour is far off.
    let young = s
        .reconciler("rec-young")
        .abandon_after(Duration::from_secs(3600))
        .run_once(&mut op)
        .await
        .unwrap();
    assert!(
        matches!(decision_of(&young, attempt.id()), Decision::TooYoung { age } if age < Duration::from_secs(3600)),
        "{young:?}"
    );
    assert_eq!(s.attempt(attempt.id()).await.state, AttemptState::Unknown);

    // Old: once the attempt is older than the age (the database's clock says so).
    let age = Duration::from_millis(500);
    let started = s.attempt(attempt.id()).await.started_at;
    assert!(
        eventually(Duration::from_secs(30), || {
            let db = &s.db;
            async move {
                db.query_one(
                    "SELECT statement_timestamp() - $1::timestamptz > interval '600 milliseconds'",
                    &[&started],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
            }
        })
        .await
    );
    // Abandoning off (the default): left, however old.
    let never = s.reconciler("rec-never").run_once(&mut op).await.unwrap();
    assert!(
        matches!(decision_of(&never, attempt.id()), Decision::TooYoung { age } if age > Duration::from_millis(600)),
        "{never:?}"
    );
    assert_eq!(s.attempt(attempt.id()).await.state, AttemptState::Unknown);

    let old = s
        .reconciler("rec-old")
        .abandon_after(age)
        .run_once(&mut op)
        .await
        .unwrap();
    assert_eq!(decision_of(&old, attempt.id()), Decision::Abandoned);
    assert_eq!(s.attempt(attempt.id()).await.state, AttemptState::Abandoned);
    assert_eq!(s.job_state(job).await, JobState::Pending);

    // The decision and its evidence, in the abandoned event.
    let events = s.events(job).await;
    let abandoned: Vec<_> = events.iter().filter(|e| e.0 == "abandoned").collect();
    assert_eq!(abandoned.len(), 1, "{events:?}");
    assert_eq!(abandoned[0].1, Some(attempt.id()));
    let detail = &abandoned[0].2;
    assert_eq!(detail["previous_state"], "unknown", "{detail}");
    let reason: Value = serde_json::from_str(detail["reason"].as_str().unwrap()).unwrap();
    assert_eq!(reason["kind"], "reconciled", "{reason}");
    assert_eq!(reason["decision"], "abandoned", "{reason}");
    assert_eq!(reason["provider_says"], "cannot_tell", "{reason}");
    assert_eq!(reason["reconciled_by"], "rec-old", "{reason}");
    assert_eq!(reason["evidence"]["http_status"], 410, "{reason}");
    assert_eq!(reason["abandon_after_s"], 0.5, "{reason}");
    assert!(reason["age_s"].as_f64().unwrap() > 0.6, "{reason}");
    let detail = Setup::reconciled(&events, attempt.id());
    assert_eq!(detail["decision"], "abandoned", "{detail}");
    assert_eq!(detail["attempt_state"], "abandoned", "{detail}");
    assert_eq!(
        detail["evidence"]["provider_says"], "cannot_tell",
        "{detail}"
    );
    // The gate is open: the next attempt may begin.
    let next = intent::begin_attempt(&s.db, job, BeginOptions::new())
        .await
        .unwrap();
    assert_eq!(next.attempt_no(), 2);
}

/// What the provider did with each request of the race.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fate {
    Done,
    NeverReceived,
    Forgotten,
}

/// Two reconcilers, in two tasks on two connections (as two processes would be), start on the
/// same work list at the same moment: each attempt is asked about once and decided once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_at_once_make_each_decision_once() {
    const EACH: usize = 8;
    let s = Setup::new().await;
    let mut fates: HashMap<Uuid, (Uuid, Fate)> = HashMap::new();
    for (i, fate) in [Fate::Done, Fate::NeverReceived, Fate::Forgotten]
        .into_iter()
        .cycle()
        .take(3 * EACH)
        .enumerate()
    {
        let job = s.job(&format!("race-{i}"), &format!("subject {i}")).await;
        let attempt = intent::begin_attempt(&s.db, job, BeginOptions::new())
            .await
            .unwrap();
        if fate != Fate::NeverReceived {
            suite()
                .ask_for(
                    &s.gpu_a,
                    attempt.id(),
                    &captions::input(&format!("subject {i}")),
                    &options(),
                )
                .await
                .unwrap();
        }
        if fate == Fate::Forgotten {
            s.server.forget(&attempt.id().to_string());
        }
        intent::mark_unknown(&s.db, attempt.id(), Some("timeout"))
            .await
            .unwrap();
        fates.insert(attempt.id(), (job, fate));
    }
    // Slow lookups: each reconciler is still asking about one attempt while the other reaches
    // it.
    s.server.set_lookup_delay(Duration::from_millis(30));

    let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let mut tasks = Vec::new();
    for name in ["rec-1", "rec-2"] {
        let mut op = s.operator().await;
        let reconciler = s.reconciler(name).abandon_after(Duration::ZERO);
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            reconciler.run_once(&mut op).await.unwrap()
        }));
    }
    let mut passes = Vec::new();
    for t in tasks {
        passes.push(t.await.unwrap());
    }

    // In the reconcilers' own reports: one decision per attempt, the other one left it to it.
    let mut decided: HashMap<Uuid, Vec<(&str, Decision)>> = HashMap::new();
    for (pass, name) in passes.iter().zip(["rec-1", "rec-2"]) {
        assert!(pass.errors.is_empty(), "{name}: {:?}", pass.errors);
        assert_eq!(pass.reconciled.len(), 3 * EACH, "{name}: {pass:?}");
        for r in &pass.reconciled {
            if r.decision.is_decision() {
                decided
                    .entry(r.attempt_id)
                    .or_default()
                    .push((name, r.decision.clone()));
            } else {
                assert!(
                    matches!(r.decision, Decision::Busy | Decision::AlreadyDecided(_)),
                    "{name}: {r:?}"
                );
            }
        }
    }
    for (attempt, (_, fate)) in &fates {
        let by = decided.get(attempt).cloned().unwrap_or_default();
        assert_eq!(
            by.len(),
            1,
            "attempt {attempt} ({fate:?}) decided by {by:?}"
        );
        let expected = match fate {
            Fate::Done => Decision::Completed(Completion::Won),
            Fate::NeverReceived => Decision::Failed(JobState::Pending),
            Fate::Forgotten => Decision::Abandoned,
        };
        assert_eq!(by[0].1, expected, "attempt {attempt} ({fate:?})");
    }
    let per_reconciler = |name: &str| {
        decided
            .values()
            .filter(|by| by.iter().any(|(n, _)| *n == name))
            .count()
    };
    println!(
        "rec-1 decided {}, rec-2 decided {}",
        per_reconciler("rec-1"),
        per_reconciler("rec-2")
    );
    assert!(per_reconciler("rec-1") > 0 && per_reconciler("rec-2") > 0);

    // The provider was asked once about each attempt.
    let mut asked: HashMap<String, usize> = HashMap::new();
    for key in s.server.lookups() {
        *asked.entry(key).or_default() += 1;
    }
    assert_eq!(asked.len(), 3 * EACH, "{asked:?}");
    assert!(asked.values().all(|&n| n == 1), "{asked:?}");

    // In the database: each attempt in its decided state, one abandoned event per abandoned
    // attempt, and no late result or late failure anywhere (no second, contradicting call).
    for (attempt, (job, fate)) in &fates {
        let (state, job_state) = match fate {
            Fate::Done => (AttemptState::Succeeded, JobState::Succeeded),
            Fate::NeverReceived => (AttemptState::Failed, JobState::Pending),
            Fate::Forgotten => (AttemptState::Abandoned, JobState::Pending),
        };
        assert_eq!(s.attempt(*attempt).await.state, state, "{fate:?}");
        assert_eq!(s.job_state(*job).await, job_state, "{fate:?}");
    }
    let counts: Vec<(String, i64)> =
        s.db.query(
            "SELECT kind::text, count(*) FROM intent.events GROUP BY kind ORDER BY kind",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counts,
        vec![
            ("abandoned".to_string(), EACH as i64),
            ("reconciled".to_string(), 3 * EACH as i64),
            ("timeout".to_string(), 3 * EACH as i64),
        ]
    );
    let per_attempt: i64 =
        s.db.query_one(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM intent.events \
             WHERE kind IN ('abandoned', 'reconciled') GROUP BY attempt_id, kind) c",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(per_attempt, 1);
}

/// An attempt of a provider the lookup does not know is not decided: nobody was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_without_a_lookup_decides_nothing() {
    let s = Setup::new().await;
    let s_job: Submitted<Value> = intent::submit_job(
        &s.db,
        &NewJob::new("alice", "elsewhere", "gpu-z", &json!({"subject": "x"})),
    )
    .await
    .unwrap();
    let attempt = intent::begin_attempt(&s.db, s_job.job_id, BeginOptions::new())
        .await
        .unwrap();
    intent::mark_unknown(&s.db, attempt.id(), None)
        .await
        .unwrap();
    let mut op = s.operator().await;
    let pass = s
        .reconciler("rec-1")
        .abandon_after(Duration::ZERO)
        .run_once(&mut op)
        .await
        .unwrap();
    assert!(
        matches!(decision_of(&pass, attempt.id()), Decision::LookupFailed(ref e) if e.contains("gpu-z")),
        "{pass:?}"
    );
    assert_eq!(s.attempt(attempt.id()).await.state, AttemptState::Unknown);
}

/// A 502 (a proxy lost the upstream's answer) leaves the outcome unknown to the worker, and the
/// provider did the work: completed. A 503 with `Retry-After` is a refusal the provider keeps:
/// an attempt left unknown after it (the worker died before reporting) is failed, retryable,
/// with the provider's error in its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_gateway_is_completed_and_a_refusal_failed() {
    let s = Setup::new().await;
    s.server.set_mode(Mode::BadGateway);
    let proxied = s.job("proxied", "ein Fahrrad im Regen").await;
    let worker = Worker::new(&s.db, Duration::from_secs(30)).name("w-1");
    let gpu_a = s.gpu_a.clone();
    let run = worker
        .run(proxied, None, |attempt| {
            let gpu_a = gpu_a.clone();
            async move {
                let input = captions::input("ein Fahrrad im Regen");
                suite()
                    .work_for(&gpu_a, attempt.id(), &input, &options())
                    .await
            }
        })
        .await
        .unwrap();
    let Run::Unknown {
        attempt: behind_proxy,
        ..
    } = run
    else {
        panic!("{run:?}")
    };

    s.server.set_mode(Mode::ServerError);
    let refused_job = s.job("refused", "a red fox").await;
    let refused = intent::begin_attempt(&s.db, refused_job, BeginOptions::new())
        .await
        .unwrap();
    let answer = suite()
        .ask_for(
            &s.gpu_a,
            refused.id(),
            &captions::input("a red fox"),
            &options(),
        )
        .await;
    assert!(answer.is_err(), "{answer:?}");
    intent::mark_unknown(&s.db, refused.id(), Some("the worker died"))
        .await
        .unwrap();

    let mut op = s.operator().await;
    let pass = s.reconciler("rec-1").run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, behind_proxy.id()),
        Decision::Completed(Completion::Won)
    );
    let j = intent::get_job(&s.db, proxied).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(j.result.unwrap()["subject"], "ein Fahrrad im Regen");

    assert_eq!(
        decision_of(&pass, refused.id()),
        Decision::Failed(JobState::Pending)
    );
    let error = s.attempt(refused.id()).await.error.unwrap();
    assert_eq!(error["provider_says"], "failed", "{error}");
    assert_eq!(error["provider_error"]["status"], 503, "{error}");
    assert_eq!(error["provider_error"]["delivery"], "refused", "{error}");
    assert_eq!(
        error["provider_error"]["message"], "the model is overloaded",
        "{error}"
    );
}

/// The provider answers "done" for a request whose output breaks the job's contract (it adds a
/// key the schema does not have): the reconciler completes the attempt with it, and the
/// database rejects it like any result — it cannot win, and the job does not succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_answer_that_breaks_the_contract_cannot_win() {
    let s = Setup::new().await;
    s.db.batch_execute(captions::CHECKER_SQL).await.unwrap();
    intent::define_contract(
        &s.db,
        captions::CONTRACT,
        &captions::schema(),
        Some(captions::CHECKER),
    )
    .await
    .unwrap();
    let input = captions::input("a red fox in the snow");
    let job: Submitted<Value> = intent::submit_job(
        &s.db,
        &NewJob::new("alice", "fox-contract", PROVIDER, &input)
            .contract(captions::CONTRACT)
            .max_attempts(3),
    )
    .await
    .unwrap();
    s.server.set_mode(Mode::HallucinatedKey);
    s.server.set_delay(Duration::from_secs(2));
    let worker = Worker::new(&s.db, Duration::from_millis(500)).name("w-1");
    let gpu_a = s.gpu_a.clone();
    let run = worker
        .run(job.job_id, None, |attempt| {
            let gpu_a = gpu_a.clone();
            let input = input.clone();
            async move {
                suite()
                    .work_for(&gpu_a, attempt.id(), &input, &options())
                    .await
            }
        })
        .await
        .unwrap();
    let Run::Unknown { attempt, .. } = run else {
        panic!("{run:?}")
    };
    s.provider_reaches(attempt.id(), "succeeded").await;
    let mut op = s.operator().await;
    let pass = s.reconciler("rec-1").run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, attempt.id()),
        Decision::Completed(Completion::Rejected),
        "{pass:?}"
    );
    let a = s.attempt(attempt.id()).await;
    assert_eq!(a.state, AttemptState::Failed, "{a:?}");
    let j = intent::get_job(&s.db, job.job_id).await.unwrap().unwrap();
    assert_ne!(j.state, JobState::Succeeded);
    assert_eq!(j.result, None);
    let kinds: Vec<String> = s
        .events(job.job_id)
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert!(kinds.iter().any(|k| k == "contract_violation"), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// Issue 24 § 3: fairness between owners, and the lock any role can take.
// ---------------------------------------------------------------------------------------------

/// The reproduction, verbatim: owner `a` leaves `n` attempts unknown on `evilprov`, a
/// provider nobody can answer for (the lookup has no entry for it: every lookup fails).
async fn hold_the_line(s: &Setup, n: i32) -> Vec<Uuid> {
    let held: i64 =
        s.db.query_one(
            "SELECT count(*) FROM (SELECT intent.mark_unknown(b.attempt_id, 'x') \
               FROM generate_series(1, $1) i, \
                    LATERAL intent.submit_job('a', 'hol-' || i, 'evilprov', '{}') s, \
                    LATERAL intent.begin_attempt(s.job_id, lease => '1 hour') b) x",
            &[&n],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, i64::from(n));
    s.db.query(
        "SELECT id FROM intent.attempts WHERE owner_id = 'a' AND state = 'unknown'",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Owner `b`'s one unknown attempt, younger than all of `a`'s, on the provider the lookup can
/// answer: the provider did the work (the worker lost the answer).
async fn bobs_attempt(s: &Setup, key: &str) -> (Uuid, Uuid) {
    let subject = format!("bob's {key}");
    let job: Submitted<Value> = intent::submit_job(
        &s.db,
        &NewJob::new("b", key, PROVIDER, &captions::input(&subject)).max_attempts(3),
    )
    .await
    .unwrap();
    let attempt = intent::begin_attempt(&s.db, job.job_id, BeginOptions::new())
        .await
        .unwrap();
    suite()
        .ask_for(
            &s.gpu_a,
            attempt.id(),
            &captions::input(&subject),
            &options(),
        )
        .await
        .unwrap();
    intent::mark_unknown(&s.db, attempt.id(), Some("timeout"))
        .await
        .unwrap();
    (job.job_id, attempt.id())
}

/// One pass of each reconciler at the same moment, in two tasks on two connections.
async fn passes_at_once(s: &Setup, reconcilers: &[Reconciler]) -> Vec<Pass> {
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(reconcilers.len()));
    let mut tasks = Vec::new();
    for r in reconcilers {
        let mut op = s.operator().await;
        let r = r.clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            r.run_once(&mut op).await.unwrap()
        }));
    }
    let mut passes = Vec::new();
    for t in tasks {
        passes.push(t.await.unwrap());
    }
    passes
}

/// What every pass said of `attempt`: the decisions, and the rest.
fn said_of(passes: &[Pass], attempt: Uuid) -> (Vec<Decision>, Vec<Decision>) {
    let all: Vec<Decision> = passes
        .iter()
        .flat_map(|p| &p.reconciled)
        .filter(|r| r.attempt_id == attempt)
        .map(|r| r.decision.clone())
        .collect();
    all.into_iter().partition(Decision::is_decision)
}

/// Issue 24 § 3: owner `a` holds `held` unknown attempts (at least the batch) that no lookup can
/// decide; owner `b`'s one younger attempt is decided in the first pass of two reconcilers
/// running at once (the bound for two owners with one attempt of `b`'s: one pass), once; and
/// `a`'s own attempts take turns, each looked at within ⌈(held + 1) / batch⌉ passes of one
/// reconciler.
async fn fair_between_owners(batch: Option<u32>, held: i32) {
    let s = Setup::new().await;
    let a = hold_the_line(&s, held).await;
    let (job, bobs) = bobs_attempt(&s, "b-1").await;
    let make = |name: &str| {
        let r = s.reconciler(name);
        match batch {
            Some(n) => r.batch(n),
            None => r,
        }
    };
    let n = batch.unwrap_or(pg_intent_client::reconciler::DEFAULT_BATCH) as usize;
    assert!(a.len() >= n, "owner a must hold a whole batch");
    let (rec_1, rec_2) = (make("rec-1"), make("rec-2"));

    let passes = passes_at_once(&s, &[rec_1.clone(), rec_2.clone()]).await;
    for p in &passes {
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert!(p.reconciled.len() <= n);
    }
    let (decided, left) = said_of(&passes, bobs);
    assert_eq!(
        decided,
        vec![Decision::Completed(Completion::Won)],
        "owner b's attempt was not decided in the first pass of either reconciler, behind {} of \
         owner a's (left: {left:?})",
        a.len()
    );
    assert!(
        left.iter()
            .all(|d| matches!(d, Decision::Busy | Decision::AlreadyDecided(_))),
        "{left:?}"
    );
    assert_eq!(s.job_state(job).await, JobState::Succeeded);
    assert_eq!(s.attempt(bobs).await.state, AttemptState::Succeeded);
    let events = s.events(job).await;
    Setup::reconciled(&events, bobs);
    assert!(
        events
            .iter()
            .all(|(kind, _, _)| kind == "timeout" || kind == "reconciled"),
        "{events:?}"
    );

    // Owner a's attempts were left (the lookup cannot answer), and take turns: within
    // ⌈held / batch⌉ passes of one reconciler, every one of them was looked at.
    let mut seen: std::collections::HashSet<Uuid> =
        passes[0].reconciled.iter().map(|r| r.attempt_id).collect();
    for p in &passes {
        for r in p.reconciled.iter().filter(|r| r.attempt_id != bobs) {
            assert!(
                matches!(r.decision, Decision::LookupFailed(_) | Decision::Busy),
                "{r:?}"
            );
        }
    }
    // (The bound with two owners is ⌈held / ⌊n/2⌋⌉ passes; b's attempt took one slot of the
    // first pass only, so here ⌈(held + 1) / n⌉.)
    let mut op = s.operator().await;
    for _ in 1..(a.len() + 1).div_ceil(n) {
        let p = rec_1.run_once(&mut op).await.unwrap();
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        seen.extend(p.reconciled.iter().map(|r| r.attempt_id));
    }
    let missed: Vec<_> = a.iter().filter(|id| !seen.contains(id)).collect();
    assert!(
        missed.is_empty(),
        "{} of owner a's attempts never looked at",
        missed.len()
    );
    for id in &a {
        assert_eq!(s.attempt(*id).await.state, AttemptState::Unknown);
    }

    // Another attempt of b's, later: the next pass decides it, whoever holds what.
    let (_, later) = bobs_attempt(&s, "b-2").await;
    let passes = passes_at_once(&s, &[rec_1, rec_2]).await;
    let (decided, _) = said_of(&passes, later);
    assert_eq!(decided, vec![Decision::Completed(Completion::Won)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_undecidable_attempts_do_not_hold_another_owners_small_batch() {
    fair_between_owners(Some(5), 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_undecidable_attempts_do_not_hold_another_owners_default_batch() {
    fair_between_owners(None, 100).await;
}

/// Owner a's attempts nobody can tell about (the provider's records expired: 410) and still
/// running at the provider, a whole batch of them: owner b's attempt is still decided in the
/// first pass (what the lookup says of a's does not matter, only that it decides nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_left_as_cannot_tell_or_running_do_not_hold_another_owners() {
    let s = Setup::new().await;
    let mut held = Vec::new();
    for i in 0..4 {
        let job: Submitted<Value> = intent::submit_job(
            &s.db,
            &NewJob::new("a", &format!("a-{i}"), PROVIDER, &captions::input("x")),
        )
        .await
        .unwrap();
        let attempt = intent::begin_attempt(&s.db, job.job_id, BeginOptions::new())
            .await
            .unwrap();
        // Even: the provider forgot it (cannot tell; abandoning is off). Odd: never answered
        // here, reported as running by a lookup that says so.
        if i % 2 == 0 {
            s.server.forget(&attempt.id().to_string());
        }
        intent::mark_unknown(&s.db, attempt.id(), Some("timeout"))
            .await
            .unwrap();
        held.push(attempt.id());
    }
    let (job, bobs) = bobs_attempt(&s, "b-1").await;
    let running: std::collections::HashSet<Uuid> =
        held.iter().skip(1).step_by(2).copied().collect();
    let lookup = RequestLookup::new(&suite()).provider(s.gpu_a.clone());
    let make = |name: &str| {
        let lookup = lookup.clone();
        let running = running.clone();
        Reconciler::new(move |attempt: AttemptRecord| {
            let lookup = lookup.clone();
            let running = running.clone();
            async move {
                use pg_intent_client::StatusLookup;
                if running.contains(&attempt.id) {
                    return Ok(pg_intent_client::reconciler::Lookup::new(
                        pg_intent_client::reconciler::ProviderStatus::Running,
                    ));
                }
                lookup.lookup(&attempt).await
            }
        })
        .batch(4)
        .name(name)
    };
    let passes = passes_at_once(&s, &[make("rec-1"), make("rec-2")]).await;
    let (decided, _) = said_of(&passes, bobs);
    assert_eq!(decided, vec![Decision::Completed(Completion::Won)]);
    assert_eq!(s.job_state(job).await, JobState::Succeeded);
    for p in &passes {
        for r in p.reconciled.iter().filter(|r| r.attempt_id != bobs) {
            assert!(
                matches!(
                    r.decision,
                    Decision::Running | Decision::TooYoung { .. } | Decision::Busy
                ),
                "{r:?}"
            );
        }
    }
}

/// Issue 24 § 3, the lock: any role can take the reconciler's advisory lock of any attempt (the
/// key is `hashtext` of the attempt id, and the id is derived from the owner and the job's
/// key). An unprivileged role holds it for its session: the attempt is found busy, and decided
/// all the same once the lock has been held longer than [`Reconciler::busy_grace`], by two
/// reconcilers at once, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_any_role_holds_does_not_keep_an_attempt_undecided() {
    let s = Setup::new().await;
    let (job, bobs) = bobs_attempt(&s, "b-1").await;
    // The id is computable by anyone who knows (or guesses) the owner and the key.
    let derived = pg_intent_client::pg_intent_protocol::attempt_id(
        pg_intent_client::pg_intent_protocol::job_id("b", "b-1").unwrap(),
        1,
    )
    .unwrap();
    assert_eq!(Uuid::from_bytes(derived), bobs);

    // A role with no privilege at all, on a connection of its own.
    let role = format!("squat_{}", s.t.name);
    s.db.batch_execute(&format!("CREATE ROLE \"{role}\" LOGIN"))
        .await
        .unwrap();
    let (squatter, conn) = tokio_postgres::connect(
        &s.t.cluster.conn_str_as(&s.t.name, &role),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let held: bool = squatter
        .query_one(
            "SELECT pg_try_advisory_lock($1::int4, hashtext($2::uuid::text))",
            &[&pg_intent_client::reconciler::LOCK_CLASS, &bobs],
        )
        .await
        .unwrap()
        .get(0);
    assert!(held, "an unprivileged role takes the reconciler's lock");

    let grace = Duration::from_millis(300);
    // A reconciler found locked again after `grace` waits for the lock at most the lookup
    // timeout plus twice the lock timeout (the lookup timeout too): 1.5 s here.
    let rec = |name: &str| {
        s.reconciler(name)
            .busy_grace(grace)
            .lookup_timeout(Duration::from_millis(500))
    };
    let (rec_1, rec_2) = (rec("rec-1"), rec("rec-2"));
    // First found locked: left to the holder.
    let passes = passes_at_once(&s, &[rec_1.clone(), rec_2.clone()]).await;
    let (decided, left) = said_of(&passes, bobs);
    assert!(decided.is_empty(), "{decided:?}");
    assert_eq!(left, vec![Decision::Busy, Decision::Busy]);
    assert_eq!(s.attempt(bobs).await.state, AttemptState::Unknown);

    // Locked for longer than a reconciler would hold it: both decide without the lock, at the
    // same moment (slow lookups, so that both are asking at once); one decision stands.
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    s.server.set_lookup_delay(Duration::from_millis(300));
    let passes = passes_at_once(&s, &[rec_1.clone(), rec_2.clone()]).await;
    for p in &passes {
        assert!(p.errors.is_empty(), "{:?}", p.errors);
    }
    let (decided, left) = said_of(&passes, bobs);
    assert_eq!(
        decided,
        vec![Decision::Completed(Completion::Won)],
        "left: {left:?}"
    );
    // The other one decided it too, and rolled back when it found the first's record (or
    // found it decided already).
    println!("the other reconciler: {left:?}");
    let asked = s
        .server
        .lookups()
        .iter()
        .filter(|k| **k == bobs.to_string())
        .count();
    println!("the provider was asked {asked} times");
    assert!(
        left.iter()
            .all(|d| matches!(d, Decision::AlreadyDecided(_))),
        "{left:?}"
    );
    assert_eq!(s.job_state(job).await, JobState::Succeeded);
    assert_eq!(s.attempt(bobs).await.state, AttemptState::Succeeded);
    let events = s.events(job).await;
    let detail = Setup::reconciled(&events, bobs);
    assert!(
        detail["evidence"]["without_lock"]["held_by_another_for_s"]
            .as_f64()
            .is_some_and(|t| t >= grace.as_secs_f64()),
        "{detail}"
    );
    // Once: no late result, no late failure, one reconciled event.
    assert!(
        events
            .iter()
            .all(|(kind, _, _)| kind == "timeout" || kind == "reconciled"),
        "{events:?}"
    );
    // The squatter still holds its lock; it changed nothing.
    let still: i64 =
        s.db.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = $1::int4::oid AND objid = hashtext($2::uuid::text)::oid",
            &[&pg_intent_client::reconciler::LOCK_CLASS, &bobs],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, 1);
    // The next pass finds nothing to do.
    let again = rec_1.run_once(&mut s.operator().await).await.unwrap();
    assert!(again.reconciled.is_empty(), "{again:?}");
}

// ---------------------------------------------------------------------------------------------
// Issue 24 § 4: what a provider shared by several parties sees.
// ---------------------------------------------------------------------------------------------

/// Mallory shares the provider account and sends a request of her own under `key`, before the
/// worker of the attempt does: the provider keeps it under that key, finished, with her output.
async fn plant(s: &Setup, key: &str) {
    use pg_intent_harness::{Provider, Request};
    let prompt = Prompt {
        system: captions::system_prompt(),
        user: captions::user_prompt(&captions::input("planted by mallory")),
    };
    let request = Request::new(&prompt, &options()).idempotency_key(key);
    s.gpu_a.call(&request).await.unwrap();
    s.provider_reaches_key(key, "succeeded").await;
}

impl Setup {
    async fn provider_reaches_key(&self, key: &str, status: &str) {
        assert!(
            eventually(Duration::from_secs(30), || {
                let ok = self.server.request_status(key) == Some(status);
                async move { ok }
            })
            .await,
            "the provider never had {key} {status}"
        );
    }

    /// Bob's job and its first attempt, begun.
    async fn bobs_begun(&self, key: &str) -> (Uuid, Uuid) {
        let job: Submitted<Value> = intent::submit_job(
            &self.db,
            &NewJob::new("b", key, PROVIDER, &captions::input("bob's own")).max_attempts(3),
        )
        .await
        .unwrap();
        let attempt = intent::begin_attempt(&self.db, job.job_id, BeginOptions::new())
            .await
            .unwrap();
        (job.job_id, attempt.id())
    }
}

/// Issue 24 § 4. With the default keys (the attempt id), the hypothesis holds: a "done" planted
/// under another owner's attempt id by someone sharing the provider account completes that
/// attempt with the planter's output. With a keyed derivation (HMAC-SHA256 under a secret the
/// workers and the reconciler share) the provider key cannot be computed without the secret: a
/// "done" planted under the raw id, or under a key derived with another secret, is never taken;
/// the worker's own request is found and completes the attempt; an attempt the worker never
/// sent is failed as never received (retryable), not completed with the planted output; and an
/// attempt begun before the cut-over ([`ProviderKeys::raw_before`]) is still found under its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_planted_under_a_computable_key_is_not_taken() {
    use pg_intent_client::ProviderKeys;
    let s = Setup::new().await;
    let mut op = s.operator().await;
    let subject = |job: &intent::JobRecord| -> Value {
        job.result
            .as_ref()
            .map(|r| r["subject"].clone())
            .unwrap_or(Value::Null)
    };

    // The default: the hypothesis holds (this is the exposure the default keeps).
    let (job, attempt) = s.bobs_begun("plain").await;
    plant(&s, &attempt.to_string()).await;
    intent::mark_unknown(&s.db, attempt, Some("the worker died before sending"))
        .await
        .unwrap();
    let pass = s.reconciler("rec-raw").run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, attempt),
        Decision::Completed(Completion::Won)
    );
    let j = intent::get_job(&s.db, job).await.unwrap().unwrap();
    assert_eq!(subject(&j), json!("planted by mallory"), "{j:?}");

    // Keyed: the workers and the reconciler share a secret.
    let keys = ProviderKeys::keyed([42u8; 32]);
    let keyed = suite().provider_keys(keys.clone());
    let reconciler =
        Reconciler::new(RequestLookup::new(&keyed).provider(s.gpu_a.clone())).name("rec-keyed");
    assert_ne!(keys.key_for(attempt), attempt.to_string());

    // The worker sent its request (under the keyed key) and lost the answer; Mallory planted
    // under the raw id and under a key of her own secret.
    let (sent_job, sent) = s.bobs_begun("sent").await;
    plant(&s, &sent.to_string()).await;
    plant(&s, &ProviderKeys::keyed([7u8; 32]).key_for(sent)).await;
    keyed
        .ask_for(&s.gpu_a, sent, &captions::input("bob's own"), &options())
        .await
        .unwrap();
    let received = s.server.requests();
    assert_eq!(
        received.last().unwrap().idempotency_key,
        Some(keys.key_for(sent))
    );
    intent::mark_unknown(&s.db, sent, Some("timeout"))
        .await
        .unwrap();

    // The worker never sent its request; Mallory planted under the raw id.
    let (unsent_job, unsent) = s.bobs_begun("unsent").await;
    plant(&s, &unsent.to_string()).await;
    intent::mark_unknown(&s.db, unsent, Some("the worker died before sending"))
        .await
        .unwrap();

    let before = s.server.lookups().len();
    let pass = reconciler.run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, sent),
        Decision::Completed(Completion::Won)
    );
    let j = intent::get_job(&s.db, sent_job).await.unwrap().unwrap();
    assert_eq!(subject(&j), json!("bob's own"), "{j:?}");
    assert_eq!(
        decision_of(&pass, unsent),
        Decision::Failed(JobState::Pending),
        "the planted done was taken"
    );
    let j = intent::get_job(&s.db, unsent_job).await.unwrap().unwrap();
    assert_eq!(j.result, None);
    // Asked only under the keyed keys.
    let asked = &s.server.lookups()[before..];
    let mut asked = asked.to_vec();
    asked.sort();
    let mut expected = vec![keys.key_for(sent), keys.key_for(unsent)];
    expected.sort();
    assert_eq!(asked, expected);

    // The cut-over: an attempt begun (and sent under its id) before the switch is found under
    // its id; one begun after it, only under its keyed key.
    let (old_job, old) = s.bobs_begun("before-the-switch").await;
    suite()
        .ask_for(&s.gpu_a, old, &captions::input("bob's own"), &options())
        .await
        .unwrap();
    intent::mark_unknown(&s.db, old, Some("timeout"))
        .await
        .unwrap();
    let switch: std::time::SystemTime =
        s.db.query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
    let (_, new) = s.bobs_begun("after-the-switch").await;
    plant(&s, &new.to_string()).await;
    intent::mark_unknown(&s.db, new, Some("the worker died before sending"))
        .await
        .unwrap();
    let cut_over = Reconciler::new(
        RequestLookup::new(&keyed)
            .provider(s.gpu_a.clone())
            .provider_keys(keys.clone().raw_before(switch)),
    );
    let pass = cut_over.run_once(&mut op).await.unwrap();
    assert_eq!(
        decision_of(&pass, old),
        Decision::Completed(Completion::Won)
    );
    let j = intent::get_job(&s.db, old_job).await.unwrap().unwrap();
    assert_eq!(subject(&j), json!("bob's own"));
    assert_eq!(decision_of(&pass, new), Decision::Failed(JobState::Pending));
}

// ---------------------------------------------------------------------------------------------
// An attacker's review of the reconciler (review B): fairness when owners come and go, the
// lock-less path, a tenant's open transaction.
// ---------------------------------------------------------------------------------------------

type LookupErr = Box<dyn std::error::Error + Send + Sync>;

/// An `unknown` attempt of `owner` on `provider` (no contract), made by the unbound superuser.
async fn unknown_attempt_of(s: &Setup, owner: &str, key: &str, provider: &str) -> Uuid {
    let id: Uuid =
        s.db.query_one(
            "SELECT b.attempt_id FROM intent.submit_job($1, $2, $3, '{}') s, \
                  LATERAL intent.begin_attempt(s.job_id, lease => '1 hour') b",
            &[&owner, &key, &provider],
        )
        .await
        .unwrap()
        .get(0);
    s.db.query_one("SELECT intent.mark_unknown($1, 'x')", &[&id])
        .await
        .unwrap();
    id
}

async fn owners_with_unknown_attempts(s: &Setup) -> i64 {
    s.db.query_one(
        "SELECT count(DISTINCT owner_id) FROM intent.attempts WHERE state = 'unknown'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Finding: fresh owners whose names sort between the owner cursor and a victim's name, two
/// per pass (batch 2), each decided in its pass: never more than 3 owners hold unknown
/// attempts, so the stated bound is ⌈3/2⌉·1 = 2 passes; the victim is never looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_that_come_and_go_do_not_starve_an_owner_waiting_behind_them() {
    let s = Setup::new().await;
    let victim = unknown_attempt_of(&s, "zz-victim", "v-1", "victimprov").await;
    let rec = Reconciler::new(|a: AttemptRecord| async move {
        use pg_intent_client::reconciler::{Lookup, ProviderStatus};
        Ok::<_, LookupErr>(Lookup::new(if a.provider == "evilprov" {
            ProviderStatus::NeverReceived
        } else {
            ProviderStatus::Running
        }))
    })
    .batch(2)
    .name("rec");
    let mut op = s.operator().await;
    let mut max_o = 0;
    let mut passes_without_victim = 0;
    for k in 0..10 {
        for j in ["a", "b"] {
            unknown_attempt_of(&s, &format!("y{k:04}{j}"), &format!("k{k}{j}"), "evilprov").await;
        }
        max_o = max_o.max(owners_with_unknown_attempts(&s).await);
        let p = rec.run_once(&mut op).await.unwrap();
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        max_o = max_o.max(owners_with_unknown_attempts(&s).await);
        if p.reconciled.iter().any(|r| r.attempt_id == victim) {
            break;
        }
        passes_without_victim += 1;
    }
    let bound = (max_o as usize).div_ceil(2);
    println!(
        "max O = {max_o}, stated bound = {bound} passes, victim unseen for {passes_without_victim} passes"
    );
    assert!(
        passes_without_victim < bound,
        "victim not looked at for {passes_without_victim} passes; bound {bound} (max O {max_o})"
    );
}

/// Odd owner names (empty-looking, quotes, array syntax, 255 multibyte characters): passes work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_owner_names_are_taken_in_turn() {
    let s = Setup::new().await;
    let names = [
        "\"".to_string(),
        "{a,b}".to_string(),
        "NULL".to_string(),
        "é".repeat(255),
        "😀".repeat(255),
        "a\\b".to_string(),
        " ".to_string(),
    ];
    let mut ids = Vec::new();
    for (i, n) in names.iter().enumerate() {
        ids.push(unknown_attempt_of(&s, n, &format!("k{i}"), "p").await);
    }
    let rec = Reconciler::new(|_a: AttemptRecord| async move {
        use pg_intent_client::reconciler::{Lookup, ProviderStatus};
        Ok::<_, LookupErr>(Lookup::new(ProviderStatus::Running))
    })
    .batch(2);
    let mut op = s.operator().await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..names.len().div_ceil(2) {
        let p = rec.run_once(&mut op).await.unwrap();
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        seen.extend(p.reconciled.iter().map(|r| r.attempt_id));
    }
    assert!(
        ids.iter().all(|i| seen.contains(i)),
        "seen {} of {}",
        seen.len(),
        ids.len()
    );
}

/// Review B, M1 (b): a reconciler that once found the attempt locked (a squatter, a moment) later
/// finds it locked by another reconciler deciding it legitimately, waits less than that one holds
/// it (its own settings), and decides it without the lock (abandons it). The reconciler holding
/// the lock then completes it: its `record_reconciliation` hands back the abandon's event, and it
/// must roll back, not commit a second decision (a late result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_decision_after_a_lockless_one_rolls_back() {
    use pg_intent_client::reconciler::{Lookup, ProviderStatus};
    let s = Setup::new().await;
    let x = unknown_attempt_of(&s, "b", "x-1", "p").await;
    let job = s.attempt(x).await.job_id;
    let role = format!("squat_{}", s.t.name);
    s.db.batch_execute(&format!("CREATE ROLE \"{role}\" LOGIN"))
        .await
        .unwrap();
    let (squatter, conn) = tokio_postgres::connect(
        &s.t.cluster.conn_str_as(&s.t.name, &role),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let lock = "SELECT pg_advisory_lock($1::int4, hashtext($2::uuid::text))";
    squatter
        .execute(lock, &[&pg_intent_client::reconciler::LOCK_CLASS, &x])
        .await
        .unwrap();
    let r2 = Reconciler::new(|_a: AttemptRecord| async move {
        Ok::<_, LookupErr>(Lookup::new(ProviderStatus::CannotTell))
    })
    .abandon_after(Duration::ZERO)
    .busy_grace(Duration::from_millis(200))
    // A short lookup timeout: it waits for the lock only briefly (lookup timeout + twice the
    // lock timeout, 300 ms), less than rec-1 holds it, and decides without the lock.
    .lookup_timeout(Duration::from_millis(100))
    .name("rec-2");
    let mut op2 = s.operator().await;
    let p = r2.run_once(&mut op2).await.unwrap();
    assert_eq!(decision_of(&p, x), Decision::Busy);
    squatter
        .execute(
            "SELECT pg_advisory_unlock($1::int4, hashtext($2::uuid::text))",
            &[&pg_intent_client::reconciler::LOCK_CLASS, &x],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r1 = Reconciler::new(|_a: AttemptRecord| async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok::<_, LookupErr>(Lookup::new(ProviderStatus::Done(json!({"caption": "x"}))))
    })
    .name("rec-1");
    let mut op1 = s.operator().await;
    let h = tokio::spawn(async move { r1.run_once(&mut op1).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let p2 = r2.run_once(&mut op2).await.unwrap();
    let p1 = h.await.unwrap();
    let d1 = decision_of(&p1, x);
    let d2 = decision_of(&p2, x);
    let events = s.events(job).await;
    let a = s.attempt(x).await;
    let j = s.job_state(job).await;
    println!(
        "rec-1 (locked): {d1:?}\nrec-2 (lockless): {d2:?}\nattempt: {:?}\njob: {j:?}",
        a.state
    );
    for e in &events {
        println!("event {} {}", e.0, e.2);
    }
    let decisions = [&d1, &d2].iter().filter(|d| d.is_decision()).count();
    assert_eq!(decisions, 1, "two decisions reported");
    assert_eq!(d2, Decision::Abandoned);
    assert_eq!(d1, Decision::AlreadyDecided(AttemptState::Abandoned));
    assert_eq!(a.state, AttemptState::Abandoned);
    assert!(
        events
            .iter()
            .all(|(k, _, _)| k == "timeout" || k == "reconciled" || k == "abandoned"),
        "extra events"
    );
}

/// Review B, H1: a bound tenant keeps its own job's row lock in an open transaction (a late
/// report that never commits); the reconciler's call for that owner's unknown attempt waited for
/// ever: the pass never ended, and no other owner's attempt was decided. Now the call gives up
/// after the lock timeout, the attempt is left for a later pass, and the pass goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holding_its_job_row_does_not_wedge_the_pass() {
    use pg_intent_client::reconciler::{Lookup, ProviderStatus};
    let s = Setup::new().await;
    let a = unknown_attempt_of(&s, "a", "a-1", "p").await;
    let b = unknown_attempt_of(&s, "b", "b-1", "p").await;
    let version = s.attempt(a).await.version_read;
    let role = format!("tenant_{}", s.t.name);
    s.db.batch_execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN IN ROLE intent_app; \
         ALTER ROLE \"{role}\" SET intent.owner_id = 'a'"
    ))
    .await
    .unwrap();
    let (tenant, conn) = tokio_postgres::connect(
        &s.t.cluster.conn_str_as(&s.t.name, &role),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    tenant.batch_execute("BEGIN").await.unwrap();
    let c: String = tenant
        .query_one(
            "SELECT intent.complete_attempt($1, $2, '{\"caption\": \"late\"}')::text",
            &[&a, &version],
        )
        .await
        .unwrap()
        .get(0);
    println!("tenant's late report (uncommitted): {c}");
    let rec = Reconciler::new(|_a: AttemptRecord| async move {
        Ok::<_, LookupErr>(Lookup::new(ProviderStatus::NeverReceived))
    })
    .lookup_timeout(Duration::from_secs(1));
    let mut op = s.operator().await;
    let pass = tokio::time::timeout(Duration::from_secs(15), rec.run_once(&mut op)).await;
    println!("pass: {pass:?}");
    let pass = pass
        .unwrap_or_else(|_| {
            panic!("the pass did not end within 15 s (owner b's attempt {b} undecided)")
        })
        .unwrap();
    assert_eq!(decision_of(&pass, b), Decision::Failed(JobState::Pending));
    assert!(
        matches!(decision_of(&pass, a), Decision::Blocked(ref e) if e.contains("lock")),
        "{pass:?}"
    );
    assert_eq!(s.attempt(b).await.state, AttemptState::Failed);
    // Nothing of the blocked decision stayed; the tenant's report commits when it will.
    assert_eq!(s.attempt(a).await.state, AttemptState::Unknown);
    tenant.batch_execute("COMMIT").await.unwrap();
    assert_eq!(s.attempt(a).await.state, AttemptState::Succeeded);
}

/// Review B, M1 (a): two reconcilers, no other role. rec-2 finds the attempt locked by rec-1 in
/// two passes more than `busy_grace` apart (never continuously): it decided without the lock
/// (asked the provider) while rec-1 held it and was deciding. It must wait for rec-1 instead,
/// and find the attempt decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_alone_never_decide_without_the_lock() {
    use pg_intent_client::reconciler::{Lookup, ProviderStatus};
    let s = Setup::new().await;
    let x = unknown_attempt_of(&s, "b", "x-1", "p").await;
    let job = s.attempt(x).await.job_id;
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let make = |name: &str| {
        let asked = asked.clone();
        Reconciler::new(move |_a: AttemptRecord| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(600)).await;
                Ok::<_, LookupErr>(Lookup::new(ProviderStatus::NeverReceived))
            }
        })
        .busy_grace(Duration::from_millis(300))
        .name(name)
    };
    let (r1, r2) = (make("rec-1"), make("rec-2"));
    // Pass 1: rec-1 holds the attempt (its provider says "still running"); rec-2, 100 ms
    // later, finds it busy.
    let r1_running = Reconciler::new(|_a: AttemptRecord| async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        Ok::<_, LookupErr>(Lookup::new(ProviderStatus::Running))
    })
    .name("rec-1");
    let mut op1 = s.operator().await;
    let mut op2 = s.operator().await;
    let h = tokio::spawn(async move { r1_running.run_once(&mut op1).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let p = r2.run_once(&mut op2).await.unwrap();
    assert_eq!(decision_of(&p, x), Decision::Busy);
    let mut op1 = s.operator().await;
    let _ = h.await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Pass 2, the same timing: rec-1 holds it (legitimately, for one lookup and one call);
    // rec-2, which found it busy more than `busy_grace` ago, must not go lock-less.
    let h = tokio::spawn(async move { r1.run_once(&mut op1).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let p2 = r2.run_once(&mut op2).await.unwrap();
    let p1 = h.await.unwrap();
    println!(
        "rec-1: {:?}\nrec-2: {:?}",
        decision_of(&p1, x),
        decision_of(&p2, x)
    );
    for e in s.events(job).await {
        println!("event {} {}", e.0, e.2);
    }
    // Only rec-1 (the `make` one) asked; rec-2 never did: it did not decide without the lock.
    let asked = asked.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        asked,
        1,
        "rec-2 decided without the lock while rec-1 held it for < 1 s: {:?}",
        decision_of(&p2, x)
    );
    assert_eq!(decision_of(&p1, x), Decision::Failed(JobState::Pending));
    assert!(!decision_of(&p2, x).is_decision());
    let events = s.events(job).await;
    assert!(
        events
            .iter()
            .all(|(_, _, d)| d["evidence"].get("without_lock").is_none()),
        "{events:?}"
    );
}
