//! Failure point 3, the timeout: the caller stops waiting, but the provider may still be
//! working (a GPU still generating, a container still writing to blob storage).
//!
//! rule 2 (README): a timeout makes an attempt `unknown`, never `failed`, and an unknown attempt
//! blocks the next one (IJ003) until a terminal outcome or an explicit `abandon_attempt`. A
//! started attempt past its deadline counts as unknown everywhere, swept or not.

use pg_intent_tests::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

async fn attempt_state(c: &Client, attempt_id: Uuid) -> String {
    attempt_row(c, attempt_id).await.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_unknown_makes_attempt_and_job_unknown_and_blocks_until_abandoned() {
    let db = Cluster::shared().fresh_db("timeout_mark").await;
    let c = db.connect().await;
    let s = submit(&c, "ivy", "gen-1", "gpu-east", &json!({"prompt": "x"}))
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "2 seconds").await.unwrap();

    mark_unknown(&c, a.attempt_id, Some("client gave up after 2s"))
        .await
        .unwrap();
    assert_eq!(attempt_state(&c, a.attempt_id).await, "unknown");
    let job = job_row(&c, s.job_id).await;
    assert_eq!(
        (job.state.as_str(), job.version),
        ("unknown", 1),
        "never failed; version untouched"
    );
    assert!(job.error.is_none() && job.completed_by.is_none());
    let events = event_rows(&c, s.job_id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "timeout");
    assert_eq!(events[0].attempt_id, Some(a.attempt_id));
    assert_eq!(events[0].detail["cause"], "caller_timeout");
    assert_eq!(events[0].detail["reason"], "client gave up after 2s");

    // Marking again changes nothing; a replay reports unknown; the gate stays shut (IJ003).
    let before = digest(&c).await;
    mark_unknown(&c, a.attempt_id, Some("again")).await.unwrap();
    assert_eq!(
        submit(&c, "ivy", "gen-1", "gpu-east", &json!({"prompt": "x"}))
            .await
            .unwrap()
            .state,
        "unknown"
    );
    for _ in 0..3 {
        let err = refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ003");
        assert!(err.detail().contains(&a.attempt_id.to_string()));
    }
    assert!(
        !heartbeat(&c, a.attempt_id, None).await.unwrap(),
        "an unknown attempt's worker should stop"
    );
    assert_eq!(digest(&c).await, before, "none of that wrote anything");

    // Past the original deadline it is still unknown — never failed — and still blocking.
    wait_past_deadline(&c, a.attempt_id).await;
    assert_eq!(
        sweep(&c).await.unwrap(),
        0,
        "sweep only concerns started attempts"
    );
    assert_eq!(attempt_state(&c, a.attempt_id).await, "unknown");
    assert_eq!(job_row(&c, s.job_id).await.state, "unknown");
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ003");

    // The out-of-band decision opens the gate.
    abandon(&c, a.attempt_id, "reconciler: provider has no record of it")
        .await
        .unwrap();
    assert_eq!(attempt_state(&c, a.attempt_id).await, "abandoned");
    assert_eq!(job_row(&c, s.job_id).await.state, "pending");
    let b = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    assert_eq!((b.attempt_no, b.version), (2, 1));
    let kinds: Vec<String> = event_rows(&c, s.job_id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["timeout", "abandoned"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_attempt_is_resolved_by_its_outcome() {
    let db = Cluster::shared().fresh_db("timeout_resolve").await;
    let c = db.connect().await;

    // It really finished: its result wins, and the job is over (IJ004 from then on).
    let s = submit(&c, "ivy", "late-success", "p", &json!({}))
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    mark_unknown(&c, a.attempt_id, None).await.unwrap();
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ003");
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"url": "s3://a"}))
            .await
            .unwrap(),
        "won"
    );
    let job = job_row(&c, s.job_id).await;
    assert_eq!(
        (job.state.as_str(), job.version, job.completed_by),
        ("succeeded", 2, Some(a.attempt_id))
    );
    assert_eq!(attempt_state(&c, a.attempt_id).await, "succeeded");
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ004");

    // The provider said nothing happened: a definite failure reopens the gate.
    let s = submit(&c, "ivy", "late-failure", "p", &json!({}))
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    mark_unknown(&c, a.attempt_id, None).await.unwrap();
    assert_eq!(
        fail(&c, a.attempt_id, a.version, &json!({"status": 503}), true)
            .await
            .unwrap(),
        "pending"
    );
    assert_eq!(attempt_state(&c, a.attempt_id).await, "failed");
    assert_eq!(
        begin(&c, s.job_id, None, "1 minute")
            .await
            .unwrap()
            .attempt_no,
        2
    );
}

/// No mark_unknown at all: the lease simply runs out. The deadline rule applies without anyone
/// sweeping: begin_attempt says IJ003 (not IJ002), a replay says unknown (writing nothing), and
/// the heartbeat tells the worker to stop and persists the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_running_out_counts_as_unknown() {
    let db = Cluster::shared().fresh_db("timeout_lease").await;
    let c = db.connect().await;
    let s = submit(&c, "jack", "gen", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "700 milliseconds").await.unwrap();
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ002");

    wait_past_deadline(&c, a.attempt_id).await;
    let before = digest(&c).await;
    let replay = submit(&c, "jack", "gen", "p", &json!({})).await.unwrap();
    assert_eq!((replay.created, replay.state.as_str()), (false, "unknown"));
    let err = refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ003");
    assert!(
        err.detail().contains(&a.attempt_id.to_string()) && err.detail().contains("lease ran out"),
        "{err:?}"
    );
    assert_eq!(
        digest(&c).await,
        before,
        "reading under the deadline rule writes nothing"
    );
    assert_eq!(
        attempt_state(&c, a.attempt_id).await,
        "started",
        "not persisted yet"
    );

    // The worker's heartbeat comes too late: stop, and the tables now say so.
    assert!(!heartbeat(&c, a.attempt_id, Some("1 minute")).await.unwrap());
    assert_eq!(attempt_state(&c, a.attempt_id).await, "unknown");
    assert_eq!(job_row(&c, s.job_id).await.state, "unknown");
    let events = event_rows(&c, s.job_id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "timeout");
    assert_eq!(events[0].detail["cause"], "lease_expired");
    assert_eq!(events[0].detail["noticed_by"], "heartbeat");
    // A lapsed lease is never revived.
    assert!(!heartbeat(&c, a.attempt_id, None).await.unwrap());
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ003");
    assert_eq!(event_rows(&c, s.job_id).await.len(), 1, "logged once");
    assert_ne!(job_row(&c, s.job_id).await.state, "failed");
}

/// A started attempt past its deadline may still win: its work happened. Completing it
/// persists the timeout first (noticed by complete_attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_after_the_lease_ran_out_still_wins() {
    let db = Cluster::shared().fresh_db("timeout_late_win").await;
    let c = db.connect().await;
    let s = submit(&c, "jack", "slow", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "300 milliseconds").await.unwrap();
    wait_past_deadline(&c, a.attempt_id).await;
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"done": 1}))
            .await
            .unwrap(),
        "won"
    );
    let job = job_row(&c, s.job_id).await;
    assert_eq!(
        (job.state.as_str(), job.result),
        ("succeeded", Some(json!({"done": 1})))
    );
    let events = event_rows(&c, s.job_id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].detail["noticed_by"], "complete_attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_lease_alive() {
    let db = Cluster::shared().fresh_db("timeout_heartbeat").await;
    let c = db.connect().await;
    let s = submit(&c, "kim", "long", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 second").await.unwrap();
    assert!(
        heartbeat(&c, a.attempt_id, Some("30 seconds"))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Beyond the original lease, still in flight: IJ002, not IJ003.
    refusal(begin(&c, s.job_id, None, "1 minute").await, "IJ002");
    assert!(heartbeat(&c, a.attempt_id, None).await.unwrap());
    mark_unknown(&c, a.attempt_id, None).await.unwrap();
    assert!(!heartbeat(&c, a.attempt_id, None).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_persists_every_lapsed_lease_and_logs_it() {
    let db = Cluster::shared().fresh_db("timeout_sweep").await;
    let c = db.connect().await;
    let mut lapsed = Vec::new();
    for k in ["a", "b", "c"] {
        let s = submit(&c, "lee", k, "p", &json!({})).await.unwrap();
        lapsed.push((
            s.job_id,
            begin(&c, s.job_id, None, "300 milliseconds").await.unwrap(),
        ));
    }
    let live = submit(&c, "lee", "live", "p", &json!({})).await.unwrap();
    let live_attempt = begin(&c, live.job_id, None, "1 hour").await.unwrap();
    for (_, a) in &lapsed {
        wait_past_deadline(&c, a.attempt_id).await;
    }

    assert_eq!(sweep(&c).await.unwrap(), 3);
    for (job_id, a) in &lapsed {
        assert_eq!(attempt_state(&c, a.attempt_id).await, "unknown");
        assert_eq!(job_row(&c, *job_id).await.state, "unknown");
        let events = event_rows(&c, *job_id).await;
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].kind.as_str(), events[0].attempt_id),
            ("timeout", Some(a.attempt_id))
        );
        assert_eq!(events[0].detail["cause"], "lease_expired");
        assert_eq!(events[0].detail["noticed_by"], "sweep");
        refusal(begin(&c, *job_id, None, "1 minute").await, "IJ003");
    }
    assert_eq!(attempt_state(&c, live_attempt.attempt_id).await, "started");
    assert_eq!(
        sweep(&c).await.unwrap(),
        0,
        "nothing left to sweep; nothing logged twice"
    );
    assert_eq!(digest(&c).await.events, 3);
}

/// sweep never waits for a job someone else holds (SKIP LOCKED): the holder applies the
/// deadline rule itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_skips_a_locked_job_without_waiting() {
    let db = Cluster::shared().fresh_db("timeout_sweep_locked").await;
    let c = db.connect().await;
    let holder = db.connect().await;
    let s = submit(&c, "max", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "300 milliseconds").await.unwrap();
    wait_past_deadline(&c, a.attempt_id).await;

    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .query(
            "SELECT 1 FROM intent.jobs WHERE id = $1 FOR UPDATE",
            &[&s.job_id],
        )
        .await
        .unwrap();
    c.batch_execute("SET statement_timeout = '10s'")
        .await
        .unwrap();
    assert_eq!(sweep(&c).await.unwrap(), 0, "skipped, not waited for");
    assert_eq!(attempt_state(&c, a.attempt_id).await, "started");
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(sweep(&c).await.unwrap(), 1);
    assert_eq!(attempt_state(&c, a.attempt_id).await, "unknown");
}

/// Many workers hammer begin_attempt while the attempt is unknown: all refused with IJ003 (and
/// the job is never handed a second attempt behind the unknown one's back); once an operator
/// abandons it, exactly one of them gets attempt 2 and the rest see IJ002.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_begins_wait_for_the_abandon() {
    const WORKERS: usize = 16;
    let db = Cluster::shared().fresh_db("timeout_hammer").await;
    let c = db.connect().await;
    let s = submit(&c, "nia", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    mark_unknown(&c, a.attempt_id, None).await.unwrap();

    let clients = db.connect_many(WORKERS, "timeout_hammer").await;
    // Each call records whether the abandon had begun when it returned, and stops once a call
    // started after the abandon had committed.
    let abandon_started = Arc::new(AtomicBool::new(false));
    let abandon_done = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (started, done) = (abandon_started.clone(), abandon_done.clone());
        let clients = clients.clone();
        let job_id = s.job_id;
        tokio::spawn(async move {
            stampede(&clients, |_, c| {
                let (started, done) = (started.clone(), done.clone());
                async move {
                    let mut seen = Vec::new();
                    loop {
                        let after_abandon = done.load(Ordering::SeqCst);
                        let r = begin(&c, job_id, None, "1 minute").await;
                        let before_abandon = !started.load(Ordering::SeqCst);
                        seen.push((before_abandon, r.map_err(|e| SqlError::from_error(&e).code)));
                        if after_abandon {
                            return seen;
                        }
                    }
                }
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    abandon_started.store(true, Ordering::SeqCst);
    abandon(
        &c,
        a.attempt_id,
        "operator: provider confirmed nothing is running",
    )
    .await
    .unwrap();
    abandon_done.store(true, Ordering::SeqCst);
    let seen: Vec<_> = hammer.await.unwrap().into_iter().flatten().collect();

    let wins: Vec<&Begun> = seen.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    assert_eq!(wins.len(), 1, "exactly one new attempt");
    assert_eq!(wins[0].attempt_no, 2);
    let before: Vec<_> = seen.iter().filter(|(before, _)| *before).collect();
    assert!(
        before.len() > WORKERS,
        "the hammer really ran before the abandon"
    );
    for (before, r) in &seen {
        match r {
            Err(code) if *before => assert_eq!(code, "IJ003", "before the abandon, only IJ003"),
            Ok(_) => assert!(!before, "no attempt began before the abandon"),
            Err(code) => assert!(code == "IJ003" || code == "IJ002", "{code}"),
        }
    }
    assert_eq!(attempt_rows(&c, s.job_id).await.len(), 2);
}

/// The caller's timer fires at the very moment the result arrives, on two connections, round
/// after round. Whichever lands first, the result is never lost and nothing is ever `failed`:
/// the result wins, and the timeout is either recorded before it or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_racing_the_result_never_loses_it() {
    let db = Cluster::shared().fresh_db("timeout_race").await;
    let c = db.connect().await;
    let racers = db.connect_many(2, "timeout_race").await;
    let mut timeout_first = 0;
    for round in 0..20 {
        let s = submit(&c, "oli", &format!("k{round}"), "p", &json!({}))
            .await
            .unwrap();
        let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
        let answers = stampede(&racers, |i, conn| {
            let a = a.clone();
            async move {
                if i == 0 {
                    mark_unknown(&conn, a.attempt_id, Some("timer"))
                        .await
                        .map(|_| "marked".to_string())
                } else {
                    complete(&conn, a.attempt_id, a.version, &json!({"round": round})).await
                }
            }
        })
        .await;
        assert_eq!(answers[0].as_deref().unwrap(), "marked");
        assert_eq!(answers[1].as_deref().unwrap(), "won", "round {round}");
        let job = job_row(&c, s.job_id).await;
        assert_eq!(
            (job.state.as_str(), job.result),
            ("succeeded", Some(json!({"round": round})))
        );
        assert_eq!(attempt_state(&c, a.attempt_id).await, "succeeded");
        let kinds: Vec<String> = event_rows(&c, s.job_id)
            .await
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert!(kinds.is_empty() || kinds == ["timeout"], "{kinds:?}");
        timeout_first += kinds.len();
    }
    eprintln!("the timer landed first in {timeout_first} of 20 rounds");
}
