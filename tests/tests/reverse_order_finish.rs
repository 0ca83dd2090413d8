//! Failure point 4, results arriving in reverse order: attempt A times out and is abandoned,
//! attempt B begins, and then both return — in either order, or at the same instant.
//!
//! rule 3 (README): completing is a compare-and-swap on the job row; the first valid completion
//! wins whatever order the attempts began in; the loser's result stays on its own attempt row
//! (`discarded`), never reaches the job, and the race is logged (`late_result` with the winner,
//! the version the late attempt presented and the current one).

use pg_intent_tests::*;
use std::time::Duration;

/// A job whose first attempt A timed out and was abandoned, and whose second attempt B is in
/// flight.
struct TwoAttempts {
    job_id: Uuid,
    a: Begun,
    b: Begun,
}

async fn a_abandoned_b_running(c: &Client, key: &str) -> TwoAttempts {
    let s = submit(c, "olga", key, "gpu-east", &json!({"prompt": key}))
        .await
        .unwrap();
    let a = begin(c, s.job_id, None, "1 minute").await.unwrap();
    mark_unknown(c, a.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    refusal(begin(c, s.job_id, None, "1 minute").await, "IJ003");
    abandon(c, a.attempt_id, "user clicked the fallback button")
        .await
        .unwrap();
    let b = begin(c, s.job_id, None, "1 minute").await.unwrap();
    assert_eq!((a.attempt_no, b.attempt_no), (1, 2));
    assert_eq!(
        a.version, b.version,
        "beginning an attempt does not change the version"
    );
    TwoAttempts {
        job_id: s.job_id,
        a,
        b,
    }
}

/// Checks the job and both attempts after `winner` won and `loser` lost.
async fn assert_outcome(
    c: &Client,
    job_id: Uuid,
    (winner, winner_result): (&Begun, &Value),
    (loser, loser_result): (&Begun, &Value),
) {
    let job = job_row(c, job_id).await;
    assert_eq!(job.state, "succeeded");
    assert_eq!(
        job.result.as_ref(),
        Some(winner_result),
        "the job holds the winner's result"
    );
    assert_eq!(job.completed_by, Some(winner.attempt_id));
    assert_eq!(job.version, winner.version + 1, "one win, one version step");

    let w = attempt_row(c, winner.attempt_id).await;
    assert_eq!(
        (w.state.as_str(), w.result.as_ref(), w.finished),
        ("succeeded", Some(winner_result), true)
    );
    let l = attempt_row(c, loser.attempt_id).await;
    assert_eq!(
        (l.state.as_str(), l.result.as_ref(), l.finished),
        ("discarded", Some(loser_result), true),
        "the late result is kept on its own row for reconciliation"
    );

    let late: Vec<EventRow> = event_rows(c, job_id)
        .await
        .into_iter()
        .filter(|e| e.kind == "late_result")
        .collect();
    assert_eq!(late.len(), 1, "the race is logged once: {late:?}");
    assert_eq!(late[0].attempt_id, Some(loser.attempt_id));
    assert_eq!(
        late[0].detail["winner"],
        json!(winner.attempt_id.to_string())
    );
    assert_eq!(late[0].detail["presented_version"], json!(loser.version));
    assert_eq!(late[0].detail["current_version"], json!(job.version));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_returns_first_and_wins_then_a_loses() {
    let db = Cluster::shared().fresh_db("reverse_b_first").await;
    let c = db.connect().await;
    let t = a_abandoned_b_running(&c, "k").await;
    let (ra, rb) = (
        json!({"from": "A", "url": "s3://a"}),
        json!({"from": "B", "url": "s3://b"}),
    );

    assert_eq!(
        complete(&c, t.b.attempt_id, t.b.version, &rb)
            .await
            .unwrap(),
        "won"
    );
    let job_after_win = job_row_raw(&c, t.job_id).await;
    assert_eq!(
        complete(&c, t.a.attempt_id, t.a.version, &ra)
            .await
            .unwrap(),
        "lost"
    );
    assert_eq!(
        job_row_raw(&c, t.job_id).await,
        job_after_win,
        "a loss leaves the job untouched"
    );
    assert_outcome(&c, t.job_id, (&t.b, &rb), (&t.a, &ra)).await;
    assert_eq!(
        late_result_attempt_state(&c, t.job_id).await,
        "abandoned",
        "the event says what the late attempt was"
    );

    // Asking again returns the same answers and changes nothing.
    let before = digest(&c).await;
    assert_eq!(
        complete(&c, t.a.attempt_id, t.a.version, &ra)
            .await
            .unwrap(),
        "lost"
    );
    assert_eq!(
        complete(&c, t.b.attempt_id, t.b.version, &rb)
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(digest(&c).await, before);
    // And the original intent replays B's result.
    let replay = submit(&c, "olga", "k", "gpu-east", &json!({"prompt": "k"}))
        .await
        .unwrap();
    assert_eq!(
        (replay.state.as_str(), replay.result),
        ("succeeded", Some(rb))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returns_first_and_wins_then_b_loses() {
    let db = Cluster::shared().fresh_db("reverse_a_first").await;
    let c = db.connect().await;
    let t = a_abandoned_b_running(&c, "k").await;
    let (ra, rb) = (json!({"from": "A"}), json!({"from": "B"}));

    // The abandoned attempt's work really happened: returning first, it wins.
    assert_eq!(
        complete(&c, t.a.attempt_id, t.a.version, &ra)
            .await
            .unwrap(),
        "won"
    );
    let job_after_win = job_row_raw(&c, t.job_id).await;
    // B, still open, is not told to keep going and loses when it reports.
    assert!(!heartbeat(&c, t.b.attempt_id, None).await.unwrap());
    assert_eq!(
        complete(&c, t.b.attempt_id, t.b.version, &rb)
            .await
            .unwrap(),
        "lost"
    );
    assert_eq!(job_row_raw(&c, t.job_id).await, job_after_win);
    assert_outcome(&c, t.job_id, (&t.a, &ra), (&t.b, &rb)).await;
    refusal(begin(&c, t.job_id, None, "1 minute").await, "IJ004");
}

async fn late_result_attempt_state(c: &Client, job_id: Uuid) -> String {
    let e = event_rows(c, job_id)
        .await
        .into_iter()
        .find(|e| e.kind == "late_result")
        .expect("a late_result event");
    e.detail["attempt_state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A and B return at the same instant on separate connections, round after round: exactly one
/// `won`, the other `lost`, and the tables agree with the answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_completions_racing_at_once_have_exactly_one_winner() {
    let db = Cluster::shared().fresh_db("reverse_race").await;
    let c = db.connect().await;
    let racers = db.connect_many(2, "reverse_race").await;
    let mut winners = [0usize; 2];
    for round in 0..20 {
        let t = a_abandoned_b_running(&c, &format!("race-{round}")).await;
        let attempts = [t.a.clone(), t.b.clone()];
        let answers = stampede(&racers, |i, conn| {
            let attempt = attempts[i].clone();
            async move {
                complete(
                    &conn,
                    attempt.attempt_id,
                    attempt.version,
                    &json!({"from": i}),
                )
                .await
                .expect("a completion is an answer, not an error")
            }
        })
        .await;
        let won: Vec<usize> = (0..2).filter(|i| answers[*i] == "won").collect();
        assert_eq!(won.len(), 1, "round {round}: {answers:?}");
        let (w, l) = (won[0], 1 - won[0]);
        assert_eq!(answers[l], "lost");
        winners[w] += 1;
        assert_outcome(
            &c,
            t.job_id,
            (&attempts[w], &json!({"from": w})),
            (&attempts[l], &json!({"from": l})),
        )
        .await;
    }
    eprintln!("A won {} rounds, B won {}", winners[0], winners[1]);
}

/// The deterministic version of the race: both completions are queued behind a lock on the
/// job row (seen waiting in pg_stat_activity); when it is released, one wins and one loses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_completions_queued_on_the_job_row_have_exactly_one_winner() {
    let db = Cluster::shared().fresh_db("reverse_queued").await;
    let c = db.connect().await;
    let holder = db.connect().await;
    let app = "reverse_queued_racer";
    let racers = db.connect_many(2, app).await;
    let t = a_abandoned_b_running(&c, "k").await;

    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .query(
            "SELECT 1 FROM intent.jobs WHERE id = $1 FOR UPDATE",
            &[&t.job_id],
        )
        .await
        .unwrap();
    let attempts = [t.a.clone(), t.b.clone()];
    let pending = {
        let racers = racers.clone();
        let attempts = attempts.clone();
        tokio::spawn(async move {
            stampede(&racers, |i, conn| {
                let attempt = attempts[i].clone();
                async move {
                    complete(
                        &conn,
                        attempt.attempt_id,
                        attempt.version,
                        &json!({"from": i}),
                    )
                    .await
                    .unwrap()
                }
            })
            .await
        })
    };
    wait_for_lock_waiters(&c, app, 2, Duration::from_secs(60)).await;
    holder.batch_execute("COMMIT").await.unwrap();
    let answers = pending.await.unwrap();
    let mut sorted = answers.clone();
    sorted.sort();
    assert_eq!(sorted, ["lost", "won"]);
    let w = answers.iter().position(|a| a == "won").unwrap();
    assert_outcome(
        &c,
        t.job_id,
        (&attempts[w], &json!({"from": w})),
        (&attempts[1 - w], &json!({"from": 1 - w})),
    )
    .await;
}

/// The owner withdraws the intent while an attempt is out: version + 1, so the attempt loses
/// when it reports, and the race is logged with no winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_after_a_cancel_loses() {
    let db = Cluster::shared().fresh_db("reverse_cancel").await;
    let c = db.connect().await;
    let s = submit(&c, "pia", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    assert!(cancel(&c, s.job_id, Some("user withdrew")).await.unwrap());
    let job = job_row(&c, s.job_id).await;
    assert_eq!((job.state.as_str(), job.version), ("cancelled", 2));
    assert_eq!(
        complete(&c, a.attempt_id, a.version, &json!({"late": true}))
            .await
            .unwrap(),
        "lost"
    );
    let job_after = job_row(&c, s.job_id).await;
    assert_eq!(
        (job_after.state.as_str(), job_after.result),
        ("cancelled", None)
    );
    let attempt = attempt_row(&c, a.attempt_id).await;
    assert_eq!(
        (attempt.state.as_str(), attempt.result),
        ("discarded", Some(json!({"late": true})))
    );
    let late = event_rows(&c, s.job_id)
        .await
        .into_iter()
        .find(|e| e.kind == "late_result")
        .unwrap();
    assert_eq!(late.detail["winner"], Value::Null);
    assert_eq!(
        (
            late.detail["presented_version"].clone(),
            late.detail["current_version"].clone()
        ),
        (json!(1), json!(2))
    );
    assert!(
        !cancel(&c, s.job_id, None).await.unwrap(),
        "cancelling a finished job changes nothing"
    );
}

/// A worker retries its own completion (its connection dropped, say) many times at once: one
/// win, the rest the same answer, one version step, nothing logged as a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_completion_repeated_at_once_wins_once() {
    let db = Cluster::shared().fresh_db("reverse_replay").await;
    let c = db.connect().await;
    let clients = db.connect_many(16, "reverse_replay").await;
    let s = submit(&c, "pia", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 minute").await.unwrap();
    let answers = stampede(&clients, |_, conn| {
        let a = a.clone();
        async move {
            complete(&conn, a.attempt_id, a.version, &json!({"ok": true}))
                .await
                .unwrap()
        }
    })
    .await;
    assert!(answers.iter().all(|x| x == "won"), "{answers:?}");
    let job = job_row(&c, s.job_id).await;
    assert_eq!((job.state.as_str(), job.version), ("succeeded", 2));
    assert!(
        event_rows(&c, s.job_id).await.is_empty(),
        "replays are not logged"
    );
}
