//! The distributed mode (docs/scale-out.md) on a real Citus cluster: a coordinator and two
//! workers on loopback, started by this test, with `intent.distribute()` run in each test's
//! database. What holds on one node must hold there: the four failure points, the storms (at a
//! smaller size), owner isolation — and every call on one job is one single-shard transaction.
//!
//! The cluster needs a PostgreSQL whose library directory has `citus.so` and pg_intent
//! installed: `PG_INTENT_CITUS_BIN` names its `bin` directory. Without it the Citus tests say
//! that they skipped, and pass. (The refusal of `intent.distribute()` without Citus runs
//! always, on the usual test server.)

use pg_intent_tests::roles::{connect_role, create_login_role};
use pg_intent_tests::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use tokio_postgres::{AsyncMessage, NoTls};

const SKIPPED: &str = "skipped: no Citus (set PG_INTENT_CITUS_BIN=<bin directory of a PostgreSQL whose lib directory has citus.so and pg_intent>)";

// The 1+2 cluster and the database set-up are the harness's (tests/cluster/src/citus.rs), which
// the `citus` target of every other suite uses too: one copy, one cluster per test binary.
use pg_intent_tests::citus::{Nodes, SETUP, citus_bin, citus_db, distributed_db, join_nodes};

/// The 1+2 cluster, started once for the whole test binary; None without Citus.
fn nodes() -> Option<&'static Nodes> {
    pg_intent_tests::citus::nodes()
}

/// A skip, said plainly, when there is no Citus.
macro_rules! citus_or_skip {
    () => {
        match nodes() {
            Some(n) => n,
            None => {
                eprintln!("{SKIPPED}");
                return;
            }
        }
    };
}

static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A connection whose notices (Citus's `citus.log_remote_commands`) are kept.
async fn connect_capturing(db: &Db<'_>) -> (Client, Arc<Mutex<Vec<String>>>) {
    let (client, mut connection) = db.cluster.config(&db.name).connect(NoTls).await.unwrap();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let kept = notices.clone();
    tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notice(n)) => kept.lock().unwrap().push(format!(
                    "{}\n{}",
                    n.message(),
                    n.detail().unwrap_or("")
                )),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    (client, notices)
}

/// What one call sent to the workers: the nodes (ports), the shard groups (a shard of every
/// colocated table covering the same hash range is one group) and whether it committed in two
/// phases.
#[derive(Debug)]
struct Routing {
    ports: BTreeSet<String>,
    groups: BTreeSet<String>,
    two_phase: bool,
    commands: usize,
}

async fn routing(c: &Client, notices: &[String]) -> Routing {
    let mut ports = BTreeSet::new();
    let mut shards = BTreeSet::new();
    let mut two_phase = false;
    let mut commands = 0;
    for n in notices {
        if !n.starts_with("issuing ") {
            continue;
        }
        commands += 1;
        two_phase |= n.contains("PREPARE TRANSACTION");
        if let Some(at) = n.split("@127.0.0.1:").nth(1) {
            ports.insert(at.split_whitespace().next().unwrap_or("").to_string());
        }
        for table in ["jobs", "attempts", "events", "retired_keys"] {
            let marker = format!("intent.{table}_");
            for part in n.split(&marker).skip(1) {
                let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
                if !digits.is_empty() {
                    shards.insert(digits.parse::<i64>().unwrap());
                }
            }
        }
    }
    let mut groups = BTreeSet::new();
    for shard in shards {
        let row = c
            .query_one(
                "SELECT shardminvalue FROM pg_dist_shard WHERE shardid = $1",
                &[&shard],
            )
            .await
            .unwrap();
        groups.insert(row.get::<_, String>(0));
    }
    Routing {
        ports,
        groups,
        two_phase,
        commands,
    }
}

/// Runs `sql` with the remote commands logged; what it sent where.
async fn routed(c: &Client, notices: &Arc<Mutex<Vec<String>>>, sql: &str) -> Routing {
    c.batch_execute("SET citus.log_remote_commands = on")
        .await
        .unwrap();
    notices.lock().unwrap().clear();
    let result = c.batch_execute(sql).await;
    c.batch_execute("RESET citus.log_remote_commands")
        .await
        .unwrap();
    // The notices of a statement arrive before its result.
    let seen = notices.lock().unwrap().clone();
    if let Err(e) = result {
        let code = SqlError::from_error(&e).code;
        // Refusals are answers too (IJ001, IJ002 …): their routing counts as well.
        assert!(code.starts_with("IJ"), "{sql}: {e:?}");
    }
    routing(c, &seen).await
}

#[tokio::test]
async fn distribute_refuses_without_citus_and_changes_nothing() {
    let db = Cluster::shared().fresh_db("citus_refusal").await;
    let c = db.connect().await;
    let catalog = "SELECT (SELECT string_agg(conname || ':' || pg_get_constraintdef(oid), ',' ORDER BY conname)
                             FROM pg_constraint WHERE connamespace = 'intent'::regnamespace)
                       || (SELECT string_agg(polname || ':' || pg_get_expr(polqual, polrelid), ',' ORDER BY polname)
                             FROM pg_policy)
                       || (SELECT rolcanlogin::text FROM pg_roles WHERE rolname = 'intent_owner')";
    let before: String = c.query_one(catalog, &[]).await.unwrap().get(0);
    let e = expect_error(&c, "SELECT intent.distribute()", &[]).await;
    assert_eq!(e.code, "55000", "{e:?}");
    assert!(e.message.contains("needs Citus"), "{e:?}");
    let after: String = c.query_one(catalog, &[]).await.unwrap().get(0);
    assert_eq!(before, after, "a refused distribute() changes nothing");
    // And the single-node calls work as before.
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    assert!(s.created);
}

#[tokio::test]
async fn every_call_on_a_job_is_one_single_shard_transaction() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_routing").await;
    let (c, notices) = connect_capturing(&db).await;
    let j = job_id_of("owner-r", "key-r");
    let a1 = attempt_id_of(j, 1);
    let a2 = attempt_id_of(j, 2);
    let calls = [
        "SELECT intent.submit_job('owner-r', 'key-r', 'p', '{\"x\": 1}')".to_string(),
        "SELECT intent.submit_job('owner-r', 'key-r', 'p', '{\"x\": 1}')".to_string(),
        "SELECT intent.submit_job('owner-r', 'key-r', 'p', '{\"x\": 2}')".to_string(),
        format!("SELECT intent.begin_attempt('{j}', lease => '1 hour')"),
        format!("SELECT intent.begin_attempt('{j}')"),
        format!("SELECT intent.heartbeat('{a1}')"),
        format!("SELECT intent.mark_unknown('{a1}', 'timer')"),
        format!("SELECT intent.abandon_attempt('{a1}', 'operator')"),
        format!("SELECT intent.begin_attempt('{j}')"),
        format!("SELECT intent.fail_attempt('{a2}', 1, '{{\"e\": 1}}', true, '0 seconds')"),
        format!("SELECT intent.complete_attempt('{a1}', 1, '{{\"r\": 1}}')"),
        format!("SELECT intent.complete_attempt('{a1}', 1, '{{\"r\": 1}}')"),
        format!("SELECT intent.fail_attempt('{a2}', 1, '{{\"late\": 1}}')"),
        format!("SELECT intent.cancel_job('{j}')"),
        "SELECT intent.submit_job('owner-r', 'key-r', 'p', '{\"x\": 1}')".to_string(),
    ];
    for sql in &calls {
        let r = routed(&c, &notices, sql).await;
        assert!(r.commands > 0, "{sql}: nothing was sent to a worker");
        assert_eq!(r.ports.len(), 1, "{sql}: one node, got {r:?}");
        assert_eq!(r.groups.len(), 1, "{sql}: one shard (group), got {r:?}");
        assert!(
            !r.two_phase,
            "{sql}: a single-shard transaction commits in one phase"
        );
    }
    let cancelled_job = job_id_of("owner-r", "key-c");
    for sql in [
        "SELECT intent.submit_job('owner-r', 'key-c', 'p', '{}')".to_string(),
        format!("SELECT intent.cancel_job('{cancelled_job}', 'withdrawn')"),
    ] {
        let r = routed(&c, &notices, &sql).await;
        assert_eq!((r.ports.len(), r.groups.len()), (1, 1), "{sql}: {r:?}");
    }
    // Maintenance and the views read every shard, by design (docs/scale-out.md, "Which calls
    // are routed, which fan out").
    for _ in 0..20 {
        let k = format!(
            "fan-{}",
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        submit(&c, "owner-r", &k, "p", &json!({})).await.unwrap();
    }
    for sql in [
        "SELECT * FROM intent.claim_attempts(max_jobs => 5)",
        "SELECT count(*) FROM intent.jobs_by_state",
        "SELECT intent.sweep()",
    ] {
        let r = routed(&c, &notices, sql).await;
        assert!(r.groups.len() > 1, "{sql} fans out: {r:?}");
    }
    // The plan Citus makes for a job's row: one task, on the shard its id hashes to.
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN (COSTS OFF) SELECT state FROM intent.jobs WHERE id = '{j}' FOR NO KEY UPDATE"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.trim() == "Task Count: 1"),
        "{plan:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_click_makes_one_job() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_double_click").await;
    let clients = db.connect_many(24, "citus_double_click").await;
    let observer = db.connect().await;
    for round in 0..4 {
        let (owner, key) = (format!("user-{round}"), format!("click-{round}"));
        let answers = stampede(&clients, |_, c| {
            let (owner, key) = (owner.clone(), key.clone());
            async move { submit(&c, &owner, &key, "gpu", &json!({"seed": 42})).await }
        })
        .await;
        let answers: Vec<Submitted> = answers.into_iter().map(|a| a.unwrap()).collect();
        assert!(answers.iter().all(|a| a.job_id == job_id_of(&owner, &key)));
        assert_eq!(answers.iter().filter(|a| a.created).count(), 1);
        let rows: i64 = observer
            .query_one(
                "SELECT count(*) FROM intent.jobs WHERE owner_id = $1 AND idempotency_key = $2",
                &[&owner, &key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(rows, 1, "one row per intent, without jobs_owner_key_unique");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_different_input_is_refused_and_writes_nothing() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_same_key").await;
    let c = db.connect().await;
    let first = submit(&c, "u", "order-1", "gpu", &json!({"n": 1}))
        .await
        .unwrap();
    let before = job_row(&c, first.job_id).await;
    let e = refusal(
        submit(&c, "u", "order-1", "gpu", &json!({"n": 2})).await,
        "IJ001",
    );
    assert!(
        e.detail.as_deref().unwrap_or("").contains("params"),
        "{e:?}"
    );
    let e = refusal(
        submit(&c, "u", "order-1", "cpu", &json!({"n": 1})).await,
        "IJ001",
    );
    assert!(
        e.detail.as_deref().unwrap_or("").contains("provider"),
        "{e:?}"
    );
    assert_eq!(
        job_row(&c, first.job_id).await,
        before,
        "a refusal writes nothing"
    );
    // Two different inputs at the same instant: one wins, the other is refused, never both.
    let clients = db.connect_many(16, "citus_same_key").await;
    let answers = stampede(&clients, |i, c| async move {
        submit(&c, "u", "order-2", "gpu", &json!({"n": i % 2})).await
    })
    .await;
    let created: Vec<&Submitted> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .filter(|s| s.created)
        .collect();
    assert_eq!(created.len(), 1);
    let winner = job_row(&c, created[0].job_id).await.params;
    for (i, a) in answers.iter().enumerate() {
        match a {
            Ok(_) => assert_eq!(
                json!({"n": i % 2}),
                winner,
                "a replay carries the winner's input"
            ),
            Err(e) => assert_eq!(SqlError::from_error(e).code, "IJ001"),
        }
    }
}

#[tokio::test]
async fn a_timeout_is_unknown_never_failed() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_timeout").await;
    let c = db.connect().await;
    let job = submit(&c, "u", "slow", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let a = begin(&c, job, None, "200 milliseconds").await.unwrap();
    wait_past_deadline(&c, a.attempt_id).await;
    // Nothing has written the timeout yet: the deadline rule holds anyway.
    assert_eq!(
        submit(&c, "u", "slow", "gpu", &json!({}))
            .await
            .unwrap()
            .state,
        "unknown"
    );
    let e = refusal(begin(&c, job, None, "30 seconds").await, "IJ003");
    assert!(e.message.contains("unknown"), "{e:?}");
    assert!(
        !heartbeat(&c, a.attempt_id, None).await.unwrap(),
        "a lapsed lease is never revived"
    );
    assert_eq!(attempt_row(&c, a.attempt_id).await.state, "unknown");
    assert_eq!(job_row(&c, job).await.state, "unknown");
    let events = event_rows(&c, job).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, "timeout");
    assert_eq!(events[0].detail["cause"], "lease_expired");
    // The provider did answer after all: the unknown attempt may still win.
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"ok": 1}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(job_row(&c, job).await.state, "succeeded");
    assert_eq!(sweep(&c).await.unwrap(), 0);
}

#[tokio::test]
async fn results_finishing_in_reverse_order_keep_the_first_winner() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_reverse").await;
    let c = db.connect().await;
    let job = submit(&c, "u", "race", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let first = begin(&c, job, None, "30 seconds").await.unwrap();
    mark_unknown(&c, first.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    abandon(&c, first.attempt_id, "retry it").await.unwrap();
    let second = begin(&c, job, None, "30 seconds").await.unwrap();
    assert_eq!(second.attempt_no, 2);
    assert_eq!(
        complete(&c, second.attempt_id, second.version, &json!({"by": 2}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(&c, first.attempt_id, first.version, &json!({"by": 1}))
            .await
            .unwrap(),
        "lost"
    );
    assert_eq!(
        complete(&c, first.attempt_id, first.version, &json!({"by": 1}))
            .await
            .unwrap(),
        "lost",
        "asked again: the same answer"
    );
    let row = job_row(&c, job).await;
    assert_eq!(
        (row.state.as_str(), row.result, row.completed_by),
        ("succeeded", Some(json!({"by": 2})), Some(second.attempt_id))
    );
    assert_eq!(attempt_row(&c, first.attempt_id).await.state, "discarded");
    let kinds: Vec<String> = event_rows(&c, job)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["timeout", "abandoned", "late_result"]);
    let late = event_rows(&c, job).await.pop().unwrap();
    assert_eq!(late.detail["winner"], json!(second.attempt_id.to_string()));
    assert_eq!(late.detail["current_version"], json!(2));
    let lost: i64 = c
        .query_one(
            "SELECT count(*) FROM intent.lost_races WHERE job_id = $1 AND winner_provider = 'gpu'",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        lost, 1,
        "lost_races shows the late result beside the winner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storms_of_lifecycles_and_claims_keep_every_invariant() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_storm").await;
    let clients = db.connect_many(12, "citus_storm").await;
    const KEYS: usize = 30;
    // Every client runs every intent (shifted), racing the others on submit, begin, complete.
    let answers = stampede(&clients, |i, c| async move {
        let mut won = 0;
        for k in 0..KEYS {
            let key = format!("storm-{}", (k + i) % KEYS);
            let job = submit(&c, "storm", &key, "gpu", &json!({"k": key}))
                .await
                .unwrap()
                .job_id;
            let Ok(a) = begin(&c, job, None, "30 seconds").await else {
                continue;
            };
            if complete(&c, a.attempt_id, a.version, &json!({"by": i}))
                .await
                .unwrap()
                == "won"
            {
                won += 1;
            }
        }
        won
    })
    .await;
    assert_eq!(
        answers.iter().sum::<usize>(),
        KEYS,
        "exactly one winner per intent"
    );
    let c = db.connect().await;
    let bad: i64 = c
        .query_one(
            "SELECT count(*) FROM intent.jobs j
              WHERE j.owner_id = 'storm' AND (j.state <> 'succeeded' OR j.attempt_count <>
                    (SELECT count(*) FROM intent.attempts a WHERE a.job_id = j.id)
                 OR (SELECT count(*) FROM intent.attempts a WHERE a.job_id = j.id AND a.state = 'succeeded') <> 1)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bad, 0);
    // Claimers race over a queue: disjoint jobs, every job claimed once.
    for k in 0..60 {
        submit(&c, "queue", &format!("q-{k}"), "gpu", &json!({}))
            .await
            .unwrap();
    }
    let claims = stampede(&clients, |_, c| async move {
        let mut mine = Vec::new();
        for _ in 0..20 {
            let rows = c
                .query(
                    "SELECT job_id FROM intent.claim_attempts(ARRAY['gpu'], 'w', '30 seconds', 3)",
                    &[],
                )
                .await
                .unwrap();
            mine.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
        }
        mine
    })
    .await;
    let all: Vec<Uuid> = claims.into_iter().flatten().collect();
    let distinct: BTreeSet<Uuid> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "no job claimed twice");
    assert_eq!(distinct.len(), 60, "every job claimed");
}

#[tokio::test]
async fn a_bound_session_acts_for_its_owner_only() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_owners").await;
    let c = db.connect().await;
    let theirs = submit(&c, "tenant-b", "b-1", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let their_attempt = begin(&c, theirs, None, "30 seconds").await.unwrap();
    submit(&c, "tenant-b", "b-2", "gpu", &json!({}))
        .await
        .unwrap();
    // A gateway's binding, per transaction.
    let bound = db.connect().await;
    let bind = "BEGIN; SELECT set_config('intent.owner_id', 'tenant-a', true)";
    bound.batch_execute(bind).await.unwrap();
    let e = refusal(
        submit(&bound, "tenant-b", "b-3", "gpu", &json!({})).await,
        "42501",
    );
    assert!(e.message.contains("tenant-a"), "{e:?}");
    bound.batch_execute("ROLLBACK").await.unwrap();
    for sql in [
        format!("SELECT intent.begin_attempt('{theirs}')"),
        format!("SELECT intent.cancel_job('{theirs}')"),
        format!("SELECT intent.heartbeat('{}')", their_attempt.attempt_id),
        format!("SELECT intent.mark_unknown('{}')", their_attempt.attempt_id),
        format!(
            "SELECT intent.complete_attempt('{}', 1, '{{}}')",
            their_attempt.attempt_id
        ),
        format!(
            "SELECT intent.fail_attempt('{}', 1, '{{}}')",
            their_attempt.attempt_id
        ),
    ] {
        bound.batch_execute(bind).await.unwrap();
        let e = expect_error(&bound, &sql, &[]).await;
        assert_eq!(
            e.code, "IJ007",
            "{sql}: another owner's job does not exist: {e:?}"
        );
        bound.batch_execute("ROLLBACK").await.unwrap();
    }
    bound.batch_execute(bind).await.unwrap();
    let mine = submit(&bound, "tenant-a", "a-1", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(mine.created);
    let claimed: Vec<Uuid> = bound
        .query(
            "SELECT job_id FROM intent.claim_attempts(max_jobs => 10)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        claimed,
        [mine.job_id],
        "a bound claimer takes its own owner's jobs only"
    );
    bound.batch_execute("COMMIT").await.unwrap();
    assert_eq!(job_row(&c, theirs).await.state, "running", "untouched");
    assert_eq!(
        attempt_row(&c, their_attempt.attempt_id).await.state,
        "started"
    );
}

/// Review of issue 14: purge and sweep are fan-out reads on the workers, which do not know the
/// session's binding; on one node the policies limit a bound operator to its own owner's jobs.
/// A bound purge removing another owner's finished job lets that owner's retry create a new job
/// for an intent that already ran.
#[tokio::test]
async fn a_bound_purge_or_sweep_touches_only_its_own_owners_jobs() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_bound_maint").await;
    let c = db.connect().await;
    let mut finished = Vec::new();
    for (owner, key) in [("tenant-b", "b-1"), ("tenant-a", "a-1")] {
        let job = submit(&c, owner, key, "gpu", &json!({}))
            .await
            .unwrap()
            .job_id;
        let a = begin(&c, job, None, "30 seconds").await.unwrap();
        assert_eq!(
            complete(&c, a.attempt_id, a.version, &json!({"charged": true}))
                .await
                .unwrap(),
            "won"
        );
        finished.push(job);
    }
    let lapsing = submit(&c, "tenant-b", "b-2", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let lapsing = begin(&c, lapsing, None, "1 second").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let bound = db.connect().await;
    let bind = "BEGIN; SELECT set_config('intent.owner_id', 'tenant-a', true)";
    bound.batch_execute(bind).await.unwrap();
    let purged: i64 = bound
        .query_one("SELECT intent.purge('1 millisecond')", &[])
        .await
        .unwrap()
        .get(0);
    let swept: i64 = bound
        .query_one("SELECT intent.sweep()", &[])
        .await
        .unwrap()
        .get(0);
    bound.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        purged, 1,
        "a purge bound to tenant-a removes tenant-a's job only"
    );
    assert_eq!(
        swept, 0,
        "a sweep bound to tenant-a settles none of tenant-b's attempts"
    );
    assert_eq!(
        job_row(&c, finished[0]).await.state,
        "succeeded",
        "tenant-b's job is kept"
    );
    assert_eq!(attempt_row(&c, lapsing.attempt_id).await.state, "started");
}

/// Review of issue 14: a worker added after `intent.distribute()` gets pg_intent from its
/// install script (Citus creates the extension there), so its copy of the tables keeps the
/// single-node policies (a sub-select, which Citus refuses) and `jobs_owner_key_unique`, and
/// its intent_owner is the coordinator's (NOLOGIN). The documented way to add a worker
/// (docs/scale-out.md): citus_add_node, `intent.distribute()` again, rebalance. Then bound
/// calls work on that node as on the first ones, and Citus's clean-up of the moved shards
/// finishes (the drop guard once made it fail forever).
#[tokio::test]
async fn a_worker_added_later_serves_bound_calls() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_added").await;
    let c = db.connect().await;
    let bin = citus_bin().expect("Citus");
    let extra = Cluster::start_in(
        &bin,
        &[
            ("shared_preload_libraries", "citus"),
            ("max_prepared_transactions", "100"),
        ],
    );
    // Jobs before the worker comes, to be moved onto it.
    for i in 0..16 {
        submit(&c, "tenant-a", &format!("before-{i}"), "gpu", &json!({}))
            .await
            .unwrap();
    }
    {
        let _one_at_a_time = SETUP.lock().await;
        extra
            .connect("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {}", db.name))
            .await
            .unwrap();
        extra
            .connect(&db.name)
            .await
            .batch_execute("CREATE EXTENSION citus")
            .await
            .unwrap();
        c.execute(
            "SELECT citus_add_node('127.0.0.1', $1)",
            &[&i32::from(extra.port())],
        )
        .await
        .unwrap();
        let answer: String = c
            .query_one("SELECT intent.distribute()", &[])
            .await
            .unwrap_or_else(|e| panic!("distribute() again: {:?}", SqlError::from_error(&e)))
            .get(0);
        assert_eq!(
            answer,
            format!(
                "already distributed; prepared the worker(s) 127.0.0.1:{}",
                extra.port()
            )
        );
        let again: String = c
            .query_one("SELECT intent.distribute()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            again,
            "already distributed: every worker is prepared, nothing to do"
        );
    }
    for sql in [
        "SELECT rebalance_table_shards(shard_transfer_mode => 'block_writes')",
        "CALL citus_cleanup_orphaned_resources()",
    ] {
        c.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {:?}", SqlError::from_error(&e)));
    }
    let left: i64 = c
        .query_one("SELECT count(*) FROM pg_dist_cleanup", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "Citus cleaned up every moved shard");
    let on_extra: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid)
              WHERE s.logicalrelid = 'intent.jobs'::regclass AND p.nodeport = $1",
            &[&i32::from(extra.port())],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        on_extra > 0,
        "the rebalance moved shards of jobs to the added worker"
    );
    let jobs: i64 = c
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 16, "every job survived the move");
    for (node, who) in [
        (&n.workers[0], "a first worker"),
        (&extra, "the added worker"),
    ] {
        let w = node.connect(&db.name).await;
        w.batch_execute("BEGIN; SELECT set_config('intent.owner_id', 'tenant-a', true)")
            .await
            .unwrap();
        let r = submit(
            &w,
            "tenant-a",
            &format!("k-{}", node.port()),
            "gpu",
            &json!({}),
        )
        .await;
        let job = match r {
            Ok(r) => r.job_id,
            Err(e) => panic!(
                "a bound submit_job on {who}: {:?}",
                SqlError::from_error(&e)
            ),
        };
        let a = begin(&w, job, None, "30 seconds").await.unwrap();
        assert_eq!(
            complete(&w, a.attempt_id, a.version, &json!({}))
                .await
                .unwrap(),
            "won",
            "a bound lifecycle on {who}"
        );
        w.batch_execute("COMMIT").await.unwrap();
    }
    // intent_owner logs in on every node (Citus connects to the workers as it, and keeps a
    // role the same on every node); distribute() is not intent_owner's to rewrite.
    let login = "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'intent_owner'";
    for node in std::iter::once(&n.coordinator)
        .chain(&n.workers)
        .chain([&extra])
    {
        let w = node.connect(&db.name).await;
        assert!(w.query_one(login, &[]).await.unwrap().get::<_, bool>(0));
    }
    let owner: String = c
        .query_one(
            "SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'intent.distribute()'::regprocedure",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(owner, "intent_owner");
}

/// Review of issue 14: what Citus sends a worker (its copy of the tables, the shards and their
/// policies) is parsed with that worker's search path. A database owner there who puts a
/// schema of theirs before pg_catalog, holding an `=` that is always true, is refused by
/// distribute(); with the usual path, functions planted in `public` under the names the
/// policies use change nothing: the policies name `intent.owner_admits`, on every shard.
#[tokio::test]
async fn a_workers_planted_search_path_cannot_open_the_policies() {
    let n = citus_or_skip!();
    let db = citus_db(n, "citus_planted").await;
    let c = db.connect().await;
    let w = n.workers[0].connect(&db.name).await;
    w.batch_execute(&format!(
        "SET citus.enable_ddl_propagation TO off;
         CREATE SCHEMA evil;
         CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';
         CREATE OPERATOR evil.= (leftarg = text, rightarg = text, function = evil.eq);
         CREATE FUNCTION public.owner_admits(text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         CREATE FUNCTION public.bound_owner() RETURNS text LANGUAGE sql AS 'SELECT NULL::text';
         ALTER DATABASE {} SET search_path = evil, pg_catalog",
        db.name
    ))
    .await
    .unwrap();
    let e = {
        let _one_at_a_time = SETUP.lock().await;
        expect_error(&c, "SELECT intent.distribute()", &[]).await
    };
    assert_eq!(e.code, "55000", "{e:?}");
    assert!(e.message.contains("before pg_catalog"), "{e:?}");
    assert!(e.detail().contains("evil"), "{e:?}");
    let distributed: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'intent.%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(distributed, 0, "the refusal changed nothing");

    w.batch_execute(&format!("ALTER DATABASE {} RESET search_path", db.name))
        .await
        .unwrap();
    let answer: String = {
        let _one_at_a_time = SETUP.lock().await;
        c.query_one("SELECT intent.distribute()", &[])
            .await
            .unwrap_or_else(|e| panic!("distribute(): {:?}", SqlError::from_error(&e)))
            .get(0)
    };
    assert!(answer.starts_with("distributed"), "{answer}");
    for node in &n.workers {
        let w = node.connect(&db.name).await;
        let (policies, foreign): (i64, i64) = {
            let r = w
                .query_one(
                    "SELECT count(DISTINCT p.oid) FILTER (WHERE f.oid = 'intent.owner_admits(text)'::regprocedure),
                            count(*) FILTER (WHERE f.pronamespace NOT IN ('intent'::regnamespace, 'pg_catalog'::regnamespace)
                                               OR o.oprnamespace <> 'pg_catalog'::regnamespace)
                       FROM pg_policy p
                       JOIN pg_depend d ON d.classid = 'pg_policy'::regclass AND d.objid = p.oid
                       LEFT JOIN pg_proc f ON d.refclassid = 'pg_proc'::regclass AND f.oid = d.refobjid
                       LEFT JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
                      WHERE p.polrelid::regclass::text LIKE 'intent.%'",
                    &[],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1))
        };
        assert!(
            policies > 3,
            "the shell's and the shards' policies call intent.owner_admits on {}: {policies}",
            node.port()
        );
        assert_eq!(
            foreign,
            0,
            "no policy uses a planted name on {}",
            node.port()
        );
    }
    for (owner, key) in [("tenant-b", "b-secret"), ("tenant-a", "a-1")] {
        submit(&c, owner, key, "gpu", &json!({"card": key}))
            .await
            .unwrap();
    }
    let reader =
        pg_intent_tests::roles::create_login_role(&c, "planted_reader", "IN ROLE intent_operator")
            .await;
    c.batch_execute(&format!(
        "ALTER ROLE {reader} SET intent.owner_id = 'tenant-a'"
    ))
    .await
    .unwrap();
    for node in std::iter::once(&n.coordinator).chain(&n.workers) {
        let (r, connection) = tokio_postgres::connect(&node.conn_str_as(&db.name, &reader), NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let seen: Vec<String> = r
            // concat, not ::text: Citus 13.2 fails a multi-shard read of a domain column
            // cast to its base type (42804, docs/scale-out.md).
            .query("SELECT concat(owner_id) FROM intent.jobs ORDER BY 1", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(
            seen,
            ["tenant-a"],
            "a reader bound to tenant-a, on {}",
            node.port()
        );
    }
    // After distribute(): a function of the database owner's, first on the worker's path, under
    // a name Citus's statements use plainly, never runs as intent_owner (its path there is
    // pinned).
    w.batch_execute(&format!(
        "SET citus.enable_ddl_propagation TO off;
         CREATE SCHEMA later;
         CREATE FUNCTION later.statement_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
           $f$ BEGIN RAISE EXCEPTION 'a planted statement_timestamp ran as %', current_user; END $f$;
         GRANT USAGE ON SCHEMA later TO PUBLIC;
         ALTER DATABASE {} SET search_path = later, pg_catalog",
        db.name
    ))
    .await
    .unwrap();
    let fresh = db.connect().await;
    for sql in [
        "SELECT intent.sweep()",
        "SELECT count(*) FROM intent.claim_attempts(max_jobs => 5)",
        "SELECT intent.purge('1 millisecond')",
    ] {
        fresh
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {:?}", SqlError::from_error(&e)));
    }
    w.batch_execute(&format!("ALTER DATABASE {} RESET search_path", db.name))
        .await
        .unwrap();
}

/// Third review of issue 14: `CREATE EXTENSION pg_intent` and `intent.distribute()` in one
/// transaction hung for ever (distribute() asked the workers, on connections of their own,
/// for an extension Citus had created there in the uncommitted transaction, and created it
/// again, waiting for it). It refuses instead, changing nothing, and works after COMMIT.
#[tokio::test]
async fn distribute_in_the_transaction_that_created_the_extension_refuses() {
    let n = citus_or_skip!();
    let db = citus_db(n, "citus_same_xact").await;
    let c = db.connect().await;
    c.batch_execute("DROP EXTENSION pg_intent").await.unwrap();
    let _one_at_a_time = SETUP.lock().await;
    c.batch_execute("SET statement_timeout = '60s'; BEGIN; CREATE EXTENSION pg_intent")
        .await
        .unwrap();
    let e = expect_error(&c, "SELECT intent.distribute()", &[]).await;
    assert_eq!(e.code, "55000", "{e:?}");
    assert!(e.message.contains("has committed"), "{e:?}");
    c.batch_execute("ROLLBACK; CREATE EXTENSION pg_intent")
        .await
        .unwrap();
    let answer: String = c
        .query_one("SELECT intent.distribute()", &[])
        .await
        .unwrap_or_else(|e| panic!("distribute(): {:?}", SqlError::from_error(&e)))
        .get(0);
    assert!(answer.starts_with("distributed"), "{answer}");
}

/// Second review of issue 14: with `citus.propagate_set_commands = 'local'` (any role may set
/// it) Citus replays a transaction's SET LOCAL commands — the whole query string each came in —
/// on the connections it opens later, and at once on those open; the calls' connections are
/// intent_owner's. A call after such a command is refused, a SET after a call is refused, and
/// the drop guard's read of the contracts (any role can make it run) is refused the same way:
/// nothing runs as intent_owner.
#[tokio::test]
async fn set_commands_citus_would_replay_never_run_as_intent_owner() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_replay").await;
    let c = db.connect().await;
    let job = submit(&c, "tenant-b", "b-1", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let payload = "DO $p$ BEGIN IF current_user = 'intent_owner' THEN
                       RAISE EXCEPTION 'the payload ran as intent_owner';
                   END IF; END $p$";
    let tenant =
        pg_intent_tests::roles::create_login_role(&c, "replay_tenant", "IN ROLE intent_app").await;
    let plain = pg_intent_tests::roles::create_login_role(&c, "replay_plain", "").await;
    c.batch_execute(&format!(
        "ALTER ROLE {tenant} SET intent.owner_id = 'tenant-b'"
    ))
    .await
    .unwrap();
    // Before a call: the call refuses.
    let t = pg_intent_tests::roles::connect_role(&db, &tenant).await;
    t.batch_execute("SET citus.propagate_set_commands = 'local'")
        .await
        .unwrap();
    t.batch_execute(&format!(
        "BEGIN; SET LOCAL statement_timeout = '50s'; {payload}"
    ))
    .await
    .unwrap();
    let e = expect_error(&t, &format!("SELECT intent.cancel_job('{job}')"), &[]).await;
    assert_eq!(e.code, "42501", "{e:?}");
    assert!(e.message.contains("Citus propagates"), "{e:?}");
    t.batch_execute("ROLLBACK").await.unwrap();
    // Switching propagation off again does not help: Citus keeps what it collected.
    t.batch_execute(&format!(
        "BEGIN; SET LOCAL statement_timeout = '50s'; {payload};
         SET LOCAL citus.propagate_set_commands = 'none'"
    ))
    .await
    .unwrap();
    let e = expect_error(
        &t,
        "SELECT * FROM intent.claim_attempts(max_jobs => 1)",
        &[],
    )
    .await;
    assert_eq!(e.code, "42501", "{e:?}");
    t.batch_execute("ROLLBACK").await.unwrap();
    // After a call: the SET is refused (Citus would send it at once on the call's connections).
    t.batch_execute("SET citus.propagate_set_commands = 'none'")
        .await
        .unwrap();
    t.batch_execute("BEGIN").await.unwrap();
    t.query("SELECT * FROM intent.claim_attempts(max_jobs => 1)", &[])
        .await
        .unwrap();
    t.batch_execute("SET LOCAL citus.propagate_set_commands = 'local'")
        .await
        .unwrap();
    let e = t
        .batch_execute(&format!("SET LOCAL statement_timeout = '50s'; {payload}"))
        .await
        .map_err(|e| SqlError::from_error(&e))
        .expect_err("a propagated SET after a call");
    assert_eq!(e.code, "42501", "{e:?}");
    assert!(e.message.contains("Citus would propagate"), "{e:?}");
    t.batch_execute("ROLLBACK").await.unwrap();
    // A role with no grant at all, through the drop guard (reading the contracts remotely).
    let p = pg_intent_tests::roles::connect_role(&db, &plain).await;
    for sql in [
        "CREATE FUNCTION pg_temp.g(jsonb) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
        "SET citus.enable_local_execution = off",
        "SET citus.propagate_set_commands = 'local'",
    ] {
        p.batch_execute(sql).await.unwrap();
    }
    p.batch_execute(&format!(
        "BEGIN; SET LOCAL statement_timeout = '50s'; {payload}"
    ))
    .await
    .unwrap();
    let e = p
        .batch_execute("DROP FUNCTION pg_temp.g(jsonb)")
        .await
        .map_err(|e| SqlError::from_error(&e))
        .expect_err("the guard's read after propagated SET commands");
    assert_eq!(e.code, "42501", "{e:?}");
    p.batch_execute("ROLLBACK").await.unwrap();
    // Without them, the same drop works (the guard reads the contracts as before), and so do
    // the calls.
    p.batch_execute("SET citus.propagate_set_commands = 'none'")
        .await
        .unwrap();
    p.batch_execute("DROP FUNCTION pg_temp.g(jsonb)")
        .await
        .unwrap_or_else(|e| panic!("{:?}", SqlError::from_error(&e)));
    t.query(&format!("SELECT intent.cancel_job('{job}')"), &[])
        .await
        .unwrap_or_else(|e| panic!("{:?}", SqlError::from_error(&e)));
    assert_eq!(job_row(&c, job).await.state, "cancelled");
}

/// Review of issue 14: the drop guard (an event trigger on every node) reads intent.contracts, a
/// reference table once distributed; when Citus drops shards on a worker that is a nested
/// distributed query, which Citus refuses. The application's own distributed tables must stay
/// droppable.
#[tokio::test]
async fn the_applications_distributed_tables_can_still_be_dropped() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_app_drop").await;
    let c = db.connect().await;
    for sql in [
        "CREATE TABLE public.app_items (id int PRIMARY KEY)",
        "SELECT create_distributed_table('public.app_items', 'id')",
        "CREATE INDEX app_items_idx ON public.app_items (id)",
    ] {
        c.batch_execute(sql).await.unwrap();
    }
    for sql in [
        "DROP INDEX public.app_items_idx",
        "DROP TABLE public.app_items",
    ] {
        if let Err(e) = c.batch_execute(sql).await {
            panic!("{sql}: {:?}", SqlError::from_error(&e));
        }
    }
}

#[tokio::test]
async fn an_existing_installation_is_migrated_with_its_rows() {
    let n = citus_or_skip!();
    let name = format!("citus_migrate_{}", std::process::id());
    let _one_at_a_time = SETUP.lock().await;
    for node in std::iter::once(&n.coordinator).chain(&n.workers) {
        node.connect("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
    }
    // A single-node installation with rows in every table...
    let c = n.coordinator.connect(&name).await;
    c.batch_execute("CREATE EXTENSION pg_intent").await.unwrap();
    let done = submit(&c, "u", "done", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let a = begin(&c, done, None, "30 seconds").await.unwrap();
    complete(&c, a.attempt_id, a.version, &json!({"r": 1}))
        .await
        .unwrap();
    let open = submit(&c, "u", "open", "gpu", &json!({}))
        .await
        .unwrap()
        .job_id;
    let running = begin(&c, open, None, "1 hour").await.unwrap();
    mark_unknown(&c, running.attempt_id, Some("t"))
        .await
        .unwrap();
    let other = n.coordinator.connect(&name).await;
    submit(&other, "u", "done", "gpu", &json!({}))
        .await
        .unwrap();
    // ...then Citus, the workers, and distribute().
    for node in std::iter::once(&n.coordinator).chain(&n.workers) {
        node.connect(&name)
            .await
            .batch_execute("CREATE EXTENSION citus")
            .await
            .unwrap();
    }
    join_nodes(&c, n).await;
    let answer: String = c
        .query_one("SELECT intent.distribute()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(answer.starts_with("distributed"), "{answer}");
    drop(_one_at_a_time);
    // `c` (which ran distribute()) and `other` both answered calls before: each backend's
    // cached "distributed?" must have been invalidated.
    // The rows are on the shards, and the calls carry on where they were.
    let replay = submit(&c, "u", "done", "gpu", &json!({})).await.unwrap();
    assert_eq!(
        (replay.created, replay.state.as_str(), replay.result),
        (false, "succeeded", Some(json!({"r": 1})))
    );
    assert_eq!(event_rows(&c, open).await.len(), 1);
    let again = submit(&other, "u", "done", "gpu", &json!({}))
        .await
        .unwrap();
    assert_eq!((again.created, again.state.as_str()), (false, "succeeded"));
    assert!(
        submit(&other, "u", "new", "gpu", &json!({}))
            .await
            .unwrap()
            .created
    );
    assert!(
        !submit(&other, "u", "new", "gpu", &json!({}))
            .await
            .unwrap()
            .created
    );
    assert_eq!(
        complete(
            &c,
            running.attempt_id,
            running.version,
            &json!({"late": true})
        )
        .await
        .unwrap(),
        "won"
    );
    let shells: i64 = c
        .query_one(
            "SELECT sum(pg_relation_size(t))::int8 FROM unnest(ARRAY['intent.jobs', 'intent.attempts',
                    'intent.events', 'intent.retired_keys', 'intent.contracts', 'intent.certifications']::regclass[]) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        shells, 0,
        "the coordinator's shells keep no copy of the migrated rows"
    );
    assert_eq!(
        c.query_one("SELECT intent.distribute()", &[])
            .await
            .unwrap()
            .get::<_, String>(0),
        "already distributed: every worker is prepared, nothing to do"
    );
}

#[tokio::test]
async fn contracts_failover_and_batches_work_distributed() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_contracts").await;
    let c = db.connect().await;
    c.batch_execute(
        "SELECT intent.define_contract('img', '{\"type\": \"object\", \"required\": [\"url\"]}');
         SELECT intent.define_contract('img', '{\"type\": \"object\", \"required\": [\"url\", \"w\"]}');
         SELECT intent.certify_provider('backup', 'img', '{\"ran\": 20}')",
    )
    .await
    .unwrap();
    let job = submit_full(&c, "u", "pic", "gpu", &json!({}), Some("img"), 3)
        .await
        .unwrap()
        .job_id;
    let a = begin(&c, job, None, "30 seconds").await.unwrap();
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"url": "x"}))
            .await
            .unwrap(),
        "rejected"
    );
    let b = begin(&c, job, Some("backup"), "30 seconds").await.unwrap();
    assert_eq!(
        complete(&c, b.attempt_id, b.version, &json!({"url": "x", "w": 1}))
            .await
            .unwrap(),
        "won"
    );
    let kinds: Vec<String> = event_rows(&c, job)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["contract_violation"]);
    let other = submit_full(&c, "u", "pic-2", "gpu", &json!({}), Some("img"), 3)
        .await
        .unwrap()
        .job_id;
    refusal(
        begin(&c, other, Some("uncertified"), "30 seconds").await,
        "IJ005",
    );
    c.batch_execute("SELECT intent.revoke_certification('backup', 'img', 'drifted')")
        .await
        .unwrap();
    refusal(
        begin(&c, other, Some("backup"), "30 seconds").await,
        "IJ005",
    );
    // A batch: its intents hash to several shards; a repeated key is answered as a replay.
    let batch = "SELECT created, sqlstate FROM intent.submit_jobs(ARRAY['u', 'u', 'u'], ARRAY['b-1', 'b-2', 'b-1'],
                        ARRAY['p', 'p', 'p'], ARRAY['{}', '{}', '{}']::jsonb[]) ORDER BY ordinality";
    let answers: Vec<(bool, Option<String>)> = c
        .query(batch, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(answers, [(true, None), (true, None), (false, None)]);
    let again: Vec<bool> = c
        .query(batch, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(again, [false, false, false]);
}

/// The fenced block of docs/scale-out.md whose first line is `first`: the tests below run what
/// the page tells a reader to run, not a copy of it.
fn scale_out_block(first: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/scale-out.md");
    let page =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("```") && lines.clone().next() == Some(first) {
            return lines
                .take_while(|l| !l.starts_with("```"))
                .map(|l| format!("{l}\n"))
                .collect();
        }
    }
    panic!("docs/scale-out.md has no block starting with {first:?}")
}

/// Runs `sql` with psql (the client the page's blocks are written for: `\copy`) in database
/// `db` of `node`, in directory `dir`, stopping at the first error; what it printed (`-At`).
fn psql(node: &Cluster, db: &str, sql: &str, dir: &Path) -> String {
    use std::io::Write;
    let mut child = Command::new(node.bin().join("psql"))
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d"])
        .arg(node.conn_str(db))
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "psql on {}:\n{sql}\nstdout:\n{}\nstderr:\n{}",
        node.port(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory for psql's files, removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(prefix: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Issue 25: `citus_shards` (and `citus_tables`) leave out tables an extension owns, so they
/// show nothing of pg_intent's; the query docs/scale-out.md gives instead (from
/// `pg_dist_shard` and `pg_dist_placement`) shows every table's shards, node by node.
#[tokio::test]
async fn the_documented_shard_query_shows_where_pg_intents_shards_are() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_shard_query").await;
    let c = db.connect().await;
    let in_citus_shards: i64 = c
        .query_one(
            "SELECT count(*) FROM citus_shards WHERE table_name::text LIKE 'intent.%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        in_citus_shards, 0,
        "Citus's view leaves extension tables out"
    );
    let dir = ScratchDir::new("citus_shard_query");
    let shown = psql(
        &n.coordinator,
        &db.name,
        &scale_out_block("-- Where pg_intent's shards are (on the coordinator)"),
        &dir.0,
    );
    let rows: BTreeSet<String> = shown.lines().map(str::to_string).collect();
    let shards: i32 = c
        .query_one("SHOW citus.shard_count", &[])
        .await
        .unwrap()
        .get::<_, String>(0)
        .parse()
        .unwrap();
    let mut expected = BTreeSet::new();
    for table in ["jobs", "attempts", "events", "retired_keys"] {
        // 32 shards over two workers: 16 each.
        for w in &n.workers {
            expected.insert(format!(
                "intent.{table}|127.0.0.1|{}|{}",
                w.port(),
                shards / 2
            ));
        }
    }
    for table in ["contracts", "certifications"] {
        // A reference table: one shard, a copy on every node, the coordinator's included.
        for node in std::iter::once(&n.coordinator).chain(&n.workers) {
            expected.insert(format!("intent.{table}|127.0.0.1|{}|1", node.port()));
        }
    }
    assert_eq!(rows, expected, "{shown}");
}

/// Issue 25: the way docs/scale-out.md adds a worker, run as written on a real cluster: a third
/// worker joins a database with jobs in every state the four failure points leave them in,
/// `distribute()` prepares it, the rebalance (`block_writes`: the default mode needs
/// `wal_level = logical`) moves shards onto it, and the jobs that moved behave as before:
/// a replay returns the stored result, another input under a key is refused, an unknown
/// attempt's late result still wins, a result after the winner loses, a double click makes one
/// job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_added_as_documented_takes_shards_and_the_failure_points_hold() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_add_doc").await;
    let c = db.connect().await;
    let bin = citus_bin().expect("Citus");
    let extra = Cluster::start_in(
        &bin,
        &[
            ("shared_preload_libraries", "citus"),
            ("max_prepared_transactions", "100"),
        ],
    );
    const KEYS: usize = 24;
    let mut done = Vec::new();
    let mut open = Vec::new();
    let mut raced = Vec::new();
    for i in 0..KEYS {
        // Succeeded: the replay must return this result.
        let job = submit(&c, "u", &format!("done-{i}"), "gpu", &json!({"i": i}))
            .await
            .unwrap()
            .job_id;
        let a = begin(&c, job, None, "30 seconds").await.unwrap();
        complete(&c, a.attempt_id, a.version, &json!({"r": i}))
            .await
            .unwrap();
        done.push(job);
        // Running, with a long lease: it times out after the move, and its result comes late.
        let job = submit(&c, "u", &format!("open-{i}"), "gpu", &json!({}))
            .await
            .unwrap()
            .job_id;
        open.push((job, begin(&c, job, None, "1 hour").await.unwrap()));
        // A first attempt unknown and abandoned, a second running: two results to come.
        let job = submit(&c, "u", &format!("race-{i}"), "gpu", &json!({}))
            .await
            .unwrap()
            .job_id;
        let first = begin(&c, job, None, "1 hour").await.unwrap();
        mark_unknown(&c, first.attempt_id, Some("client timeout"))
            .await
            .unwrap();
        abandon(&c, first.attempt_id, "retry it").await.unwrap();
        let second = begin(&c, job, None, "1 hour").await.unwrap();
        raced.push((job, first, second));
    }
    let jobs_before: i64 = c
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0);
    // The new worker as the page's prerequisites say: the database, Citus in it.
    extra
        .connect("postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE {}", db.name))
        .await
        .unwrap();
    extra
        .connect(&db.name)
        .await
        .batch_execute("CREATE EXTENSION citus")
        .await
        .unwrap();
    let steps =
        scale_out_block("-- On the coordinator: add the worker, prepare it, move shards onto it")
            .replace(
                "'worker-3.internal', 5432",
                &format!("'127.0.0.1', {}", extra.port()),
            );
    let dir = ScratchDir::new("citus_add_doc");
    let started = std::time::Instant::now();
    let printed = {
        let _one_at_a_time = SETUP.lock().await;
        psql(&n.coordinator, &db.name, &steps, &dir.0)
    };
    eprintln!(
        "the documented steps to add a worker took {:?}",
        started.elapsed()
    );
    assert!(
        printed.contains(&format!(
            "already distributed; prepared the worker(s) 127.0.0.1:{}",
            extra.port()
        )),
        "{printed}"
    );
    let on_extra: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
               JOIN pg_dist_shard s USING (shardid)
              WHERE s.logicalrelid = 'intent.jobs'::regclass AND n.nodeport = $1",
            &[&i32::from(extra.port())],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        on_extra > 0,
        "the rebalance moved shards of jobs to the new worker"
    );
    let left: i64 = c
        .query_one("SELECT count(*) FROM pg_dist_cleanup", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the moved shards' old copies are gone");
    // The documented shard query shows the new worker too.
    let shown = psql(
        &n.coordinator,
        &db.name,
        &scale_out_block("-- Where pg_intent's shards are (on the coordinator)"),
        &dir.0,
    );
    assert!(
        shown.contains(&format!(
            "intent.jobs|127.0.0.1|{}|{on_extra}",
            extra.port()
        )),
        "{shown}"
    );
    let jobs_after: i64 = c
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs_after, jobs_before, "every job survived the move");

    let port_of = |job: Uuid| {
        let c = &c;
        async move {
            c.query_one(
                &format!(
                    "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                      WHERE p.shardid = get_shard_id_for_distribution_column('intent.jobs', '{job}')"
                ),
                &[],
            )
            .await
            .unwrap()
            .get::<_, i32>(0)
        }
    };
    let extra_port = i32::from(extra.port());
    let mut moved = [0; 3];
    for (i, job) in done.iter().enumerate() {
        moved[0] += usize::from(port_of(*job).await == extra_port);
        let replay = submit(&c, "u", &format!("done-{i}"), "gpu", &json!({"i": i}))
            .await
            .unwrap();
        assert_eq!(
            (
                replay.job_id,
                replay.created,
                replay.state.as_str(),
                replay.result
            ),
            (*job, false, "succeeded", Some(json!({"r": i}))),
            "a replay after the move"
        );
        refusal(
            submit(&c, "u", &format!("done-{i}"), "gpu", &json!({"i": "other"})).await,
            "IJ001",
        );
    }
    for (job, a) in &open {
        moved[1] += usize::from(port_of(*job).await == extra_port);
        mark_unknown(&c, a.attempt_id, Some("timer")).await.unwrap();
        let e = refusal(begin(&c, *job, None, "30 seconds").await, "IJ003");
        assert!(e.message.contains("unknown"), "{e:?}");
        assert_eq!(
            complete(&c, a.attempt_id, a.version, &json!({"late": true}))
                .await
                .unwrap(),
            "won",
            "an unknown attempt's result still wins after the move"
        );
        assert_eq!(job_row(&c, *job).await.state, "succeeded");
    }
    for (job, first, second) in &raced {
        moved[2] += usize::from(port_of(*job).await == extra_port);
        assert_eq!(
            complete(&c, second.attempt_id, second.version, &json!({"by": 2}))
                .await
                .unwrap(),
            "won"
        );
        assert_eq!(
            complete(&c, first.attempt_id, first.version, &json!({"by": 1}))
                .await
                .unwrap(),
            "lost"
        );
        let kinds: Vec<String> = event_rows(&c, *job)
            .await
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["timeout", "abandoned", "late_result"]);
    }
    assert!(
        moved.iter().all(|&m| m > 0),
        "jobs of every kind moved to the new worker: {moved:?} of {KEYS}"
    );
    // A double click on a job whose shard is on the new worker: one job.
    let mut k = 0;
    let key = loop {
        let key = format!("click-{k}");
        if port_of(job_id_of("u", &key)).await == extra_port {
            break key;
        }
        k += 1;
    };
    let clients = db.connect_many(12, "citus_add_doc").await;
    let answers = stampede(&clients, |_, c| {
        let key = key.clone();
        async move { submit(&c, "u", &key, "gpu", &json!({"seed": 7})).await }
    })
    .await;
    let answers: Vec<Submitted> = answers.into_iter().map(|a| a.unwrap()).collect();
    assert_eq!(
        answers.iter().filter(|a| a.created).count(),
        1,
        "{answers:?}"
    );
}

/// Issue 25: removing pg_intent from a distributed database as docs/scale-out.md says, run as
/// written: the rows copied out first, then the removal on the coordinator. Afterwards no node
/// has anything of pg_intent's (extension, schema, tables, shards, Citus's records of them),
/// the page's check says so, and the database takes pg_intent again (created and distributed
/// anew, without the old rows).
#[tokio::test]
async fn removing_it_as_documented_leaves_nothing_on_any_node() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_remove").await;
    let c = db.connect().await;
    c.batch_execute("SELECT intent.define_contract('img', '{\"type\": \"object\"}')")
        .await
        .unwrap();
    let job = submit(&c, "u", "kept", "gpu", &json!({"prompt": "a cat"}))
        .await
        .unwrap()
        .job_id;
    let a = begin(&c, job, None, "30 seconds").await.unwrap();
    complete(&c, a.attempt_id, a.version, &json!({"url": "cat.png"}))
        .await
        .unwrap();
    for i in 0..10 {
        submit(&c, "u", &format!("pending-{i}"), "gpu", &json!({}))
            .await
            .unwrap();
    }
    let dir = ScratchDir::new("citus_remove");
    psql(
        &n.coordinator,
        &db.name,
        &scale_out_block("-- On the coordinator, in psql: keep the rows (optional)"),
        &dir.0,
    );
    let lines = |table: &str| {
        std::fs::read_to_string(dir.0.join(format!("intent_{table}.csv")))
            .unwrap_or_else(|e| panic!("intent_{table}.csv: {e}"))
    };
    assert_eq!(
        lines("jobs").lines().count(),
        1 + 11,
        "a header and every job"
    );
    assert!(lines("jobs").contains("cat.png"), "with its result");
    assert_eq!(lines("attempts").lines().count(), 1 + 1);
    assert_eq!(lines("contracts").lines().count(), 1 + 1);
    for table in ["events", "retired_keys", "certifications"] {
        assert_eq!(lines(table).lines().count(), 1, "{table}: a header");
    }
    drop(c);
    psql(
        &n.coordinator,
        &db.name,
        &scale_out_block("-- On the coordinator, as a superuser: remove pg_intent from every node"),
        &dir.0,
    );
    let checked = psql(
        &n.coordinator,
        &db.name,
        &scale_out_block("-- Then, on the coordinator: every node answers 0"),
        &dir.0,
    );
    assert_eq!(
        checked.lines().collect::<Vec<_>>(),
        ["1|0", "2|0", "3|0"],
        "the page's check"
    );
    let leftovers = "SELECT concat_ws(', ',
           (SELECT string_agg(extname, ' ') FROM pg_extension WHERE extname = 'pg_intent'),
           (SELECT string_agg(nspname, ' ') FROM pg_namespace WHERE nspname = 'intent'),
           (SELECT string_agg(relname, ' ') FROM pg_class
             WHERE relname ~ '^(jobs|attempts|events|retired_keys|contracts|certifications)(_[0-9]+)?$'),
           (SELECT string_agg(evtname, ' ') FROM pg_event_trigger WHERE evtname LIKE 'intent%'),
           (SELECT string_agg(proname, ' ') FROM pg_proc WHERE proname IN ('submit_job', 'distribute', 'owner_admits')),
           (SELECT string_agg(logicalrelid::text, ' ') FROM pg_dist_partition),
           (SELECT 'shards ' || count(*) FROM pg_dist_shard HAVING count(*) > 0),
           (SELECT 'stale pg_dist_object ' || count(*) FROM pg_dist_object o
             WHERE (o.classid = 'pg_extension'::regclass AND NOT EXISTS (SELECT FROM pg_extension e WHERE e.oid = o.objid))
                OR (o.classid = 'pg_namespace'::regclass AND NOT EXISTS (SELECT FROM pg_namespace s WHERE s.oid = o.objid))
            HAVING count(*) > 0))";
    for node in std::iter::once(&n.coordinator).chain(&n.workers) {
        let left: String = node
            .connect(&db.name)
            .await
            .query_one(leftovers, &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, "", "left of pg_intent on {}", node.port());
    }
    // The database takes pg_intent again; the old rows are gone (they are in the files).
    let c = db.connect().await;
    c.batch_execute("CREATE EXTENSION pg_intent").await.unwrap();
    let answer: String = {
        let _one_at_a_time = SETUP.lock().await;
        c.query_one("SELECT intent.distribute()", &[])
            .await
            .unwrap_or_else(|e| panic!("distribute() again: {:?}", SqlError::from_error(&e)))
            .get(0)
    };
    assert!(answer.starts_with("distributed"), "{answer}");
    let again = submit(&c, "u", "kept", "gpu", &json!({"prompt": "a cat"}))
        .await
        .unwrap();
    assert!(again.created, "a new job: the old one went with the tables");
    let a = begin(&c, again.job_id, None, "30 seconds").await.unwrap();
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({}))
            .await
            .unwrap(),
        "won"
    );
}

/// docs/scale-out.md § Upgrading: an installation distributed at 0.4.0 or 0.4.1 takes `ALTER
/// EXTENSION pg_intent UPDATE` to the current version on every node, with a job in flight: the
/// 0.4.1 index is on every shard, the attempt completes, and a role that knows nothing of
/// pg_intent can drop a function of one jsonb (which 0.4.x's drop guard refused on the workers).
#[tokio::test]
async fn a_distributed_installation_upgrades_with_a_job_in_flight() {
    let n = citus_or_skip!();
    let current = env!("CARGO_PKG_VERSION");
    for from in ["0.4.0", "0.4.1"] {
        let name = format!(
            "citus_upgrade_{}_{}",
            from.replace('.', "_"),
            std::process::id()
        );
        {
            let _one_at_a_time = SETUP.lock().await;
            for node in n.all() {
                node.connect("postgres")
                    .await
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .await
                    .unwrap();
                node.connect(&name)
                    .await
                    .batch_execute("CREATE EXTENSION citus")
                    .await
                    .unwrap();
            }
            let c = n.coordinator.connect(&name).await;
            join_nodes(&c, n).await;
            for sql in [
                format!("CREATE EXTENSION pg_intent VERSION '{from}'"),
                "SELECT intent.distribute()".to_string(),
            ] {
                c.batch_execute(&sql).await.unwrap_or_else(|e| {
                    panic!("{from}: {sql}: {}", SqlError::from_error(&e).message)
                });
            }
        }
        let c = n.coordinator.connect(&name).await;
        let job = submit(&c, "u", "in-flight", "gpu", &json!({}))
            .await
            .unwrap()
            .job_id;
        let a = begin(&c, job, None, "1 hour").await.unwrap();
        // A job waiting in the queue: the update gives it its retry_at (0.5.0's claim key).
        let waiting = submit(&c, "u", "waiting", "gpu", &json!({}))
            .await
            .unwrap()
            .job_id;
        c.batch_execute("ALTER EXTENSION pg_intent UPDATE")
            .await
            .unwrap_or_else(|e| panic!("UPDATE from {from}: {}", SqlError::from_error(&e).message));
        let keyed: bool = c
            .query_one(
                "SELECT retry_at IS NOT DISTINCT FROM updated_at FROM intent.jobs WHERE id = $1",
                &[&waiting],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            keyed,
            "from {from}: the waiting job keyed by the time it was claimable from"
        );
        let claimed: Vec<Uuid> = c
            .query(
                "SELECT job_id FROM intent.claim_attempts(ARRAY['gpu'], 'w', '1 hour', 5)",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("from {from}: claim: {:?}", SqlError::from_error(&e)))
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            claimed,
            vec![waiting],
            "from {from}: the waiting job is claimed after the update"
        );
        let shards: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'intent.jobs'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let mut indexed = 0;
        for node in n.all() {
            let w = node.connect(&name).await;
            let version: String = w
                .query_one(
                    "SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(version, current, "from {from}, node {}", node.port());
            // Shard indexes are named after the index with the shard id appended (and pg_class
            // shows shards only with the table visibility override off).
            w.batch_execute("SET citus.override_table_visibility = off")
                .await
                .unwrap();
            let here: i64 = w
                .query_one(
                    "SELECT count(*) FROM pg_class i JOIN pg_namespace s ON s.oid = i.relnamespace
                      WHERE s.nspname = 'intent' AND i.relkind = 'i'
                        AND i.relname ~ '^jobs_claimable_since_by_owner_[0-9]+$'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            indexed += here;
            // 0.5.0 keys the claim indexes on retry_at: the older ones are gone from every shard.
            let old: i64 = w
                .query_one(
                    "SELECT count(*) FROM pg_class i JOIN pg_namespace s ON s.oid = i.relnamespace
                      WHERE s.nspname = 'intent' AND i.relkind = 'i'
                        AND i.relname ~ '^jobs_claimable(_by_owner)?(_[0-9]+)?$'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                old,
                0,
                "from {from}, node {}: the old claim indexes dropped",
                node.port()
            );
        }
        assert_eq!(
            indexed, shards,
            "from {from}: the index on every shard of jobs"
        );
        complete(&c, a.attempt_id, a.version, &json!({"r": 1}))
            .await
            .unwrap_or_else(|e| panic!("from {from}: {e:?}"));
        let nobody = create_login_role(&c, "nobody", "").await;
        c.batch_execute(&format!(
            "CREATE SCHEMA nb_{v} AUTHORIZATION \"{nobody}\"",
            v = from.replace('.', "_")
        ))
        .await
        .unwrap();
        let db = Db {
            cluster: &n.coordinator,
            name: name.clone(),
        };
        connect_role(&db, &nobody)
            .await
            .batch_execute(&format!(
                "CREATE FUNCTION nb_{v}.h(r jsonb) RETURNS boolean LANGUAGE sql AS 'SELECT true';
                 DROP FUNCTION nb_{v}.h(jsonb)",
                v = from.replace('.', "_")
            ))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "from {from}: DROP by a plain role: {}",
                    SqlError::from_error(&e).message
                )
            });
    }
}

/// The drop guard on every node (docs/scale-out.md § The event trigger): a role that knows
/// nothing of pg_intent drops its own function of one `jsonb` through the coordinator (Citus
/// runs the DROP on the workers too, where the guard reads its node's copy of the contracts),
/// and a checker's owner cannot drop the checker on any node — through the coordinator, or on a
/// worker directly with Citus's propagation off, which calls made on that worker would use.
#[tokio::test]
async fn the_drop_guard_holds_on_every_node() {
    let n = citus_or_skip!();
    let db = distributed_db(n, "citus_drop_guard").await;
    let c = db.connect().await;
    let nobody = create_login_role(&c, "nobody", "").await;
    let owner = create_login_role(&c, "checker_owner", "IN ROLE intent_admin").await;
    c.batch_execute(&format!(
        "CREATE SCHEMA nb AUTHORIZATION \"{nobody}\"; CREATE SCHEMA ck AUTHORIZATION \"{owner}\""
    ))
    .await
    .unwrap();
    connect_role(&db, &nobody)
        .await
        .batch_execute(
            "CREATE FUNCTION nb.h(r jsonb) RETURNS boolean LANGUAGE sql AS 'SELECT true';
             DROP FUNCTION nb.h(jsonb)",
        )
        .await
        .unwrap_or_else(|e| panic!("DROP by a plain role: {:?}", SqlError::from_error(&e)));
    let o = connect_role(&db, &owner).await;
    o.batch_execute(
        "CREATE FUNCTION ck.chk(r jsonb) RETURNS boolean LANGUAGE sql STABLE
             SET search_path = pg_catalog, pg_temp AS $$ SELECT (r->>'ok')::boolean $$;
         SELECT intent.define_contract('guarded', '{\"type\": \"object\"}', 'ck.chk(jsonb)')",
    )
    .await
    .unwrap();
    let refused = |e: tokio_postgres::Error| SqlError::from_error(&e).code;
    assert_eq!(
        o.batch_execute("DROP FUNCTION ck.chk(jsonb)")
            .await
            .map_err(refused)
            .err()
            .as_deref(),
        Some("2BP01"),
        "through the coordinator"
    );
    for w in &n.workers {
        let on_worker = Db {
            cluster: w,
            name: db.name.clone(),
        };
        let wc = connect_role(&on_worker, &owner).await;
        assert_eq!(
            wc.batch_execute("SET citus.enable_ddl_propagation = off; DROP FUNCTION ck.chk(jsonb)")
                .await
                .map_err(refused)
                .err()
                .as_deref(),
            Some("2BP01"),
            "on worker {} directly",
            w.port()
        );
        let valid: bool = wc
            .query_one(
                "SELECT valid FROM intent.validate_result('guarded', '{\"ok\": true}')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(valid, "the checker still runs on worker {}", w.port());
    }
}
