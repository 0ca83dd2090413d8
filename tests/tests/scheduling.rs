//! The schedules of docs/scheduling.md, run by pg_cron (Debian's postgresql-15-cron) on a
//! real server: the scheduled sweep persists a lapsed attempt as unknown, the scheduled purge
//! removes an old finished job and never an open one, and both run as the maintenance role, as
//! cron.job_run_details shows.
//!
//! pg_cron 1.4 (Debian 12) schedules by the minute, so this test waits up to a minute and a
//! half for the first runs.

use pg_intent_tests::cron::{CronCluster, CronRun};
use pg_intent_tests::*;
use std::time::Duration;

/// The rows a database starts with: one of each kind the schedules must (not) touch.
struct Fixture {
    lapsed_job: Uuid,
    lapsed_attempt: Uuid,
    old_done: Uuid,
    old_open: Vec<Uuid>,
    recent_done: Uuid,
}

async fn backdate(c: &Client, job_id: Uuid, age: &str) {
    c.execute(
        "UPDATE intent.jobs SET created_at = created_at - $2::text::interval,
                                updated_at = updated_at - $2::text::interval
          WHERE id = $1",
        &[&job_id, &age],
    )
    .await
    .unwrap();
}

async fn done(c: &Client, key: &str) -> Uuid {
    let s = submit(c, "alice", key, "gpu-a", &json!({})).await.unwrap();
    let a = begin(c, s.job_id, None, "1 minute").await.unwrap();
    complete(c, a.attempt_id, a.version, &json!({"ok": true}))
        .await
        .unwrap();
    s.job_id
}

async fn fixture(c: &Client) -> Fixture {
    let p = json!({});
    // A worker that died: its attempt's one-second lease runs out, nobody touches the job.
    let lapsed = submit(c, "alice", "lapsed", "gpu-a", &p).await.unwrap();
    let lapsed_attempt = c
        .query_one(
            "SELECT attempt_id FROM intent.begin_attempt($1, lease => '1 second', worker => 'w-1')",
            &[&lapsed.job_id],
        )
        .await
        .unwrap()
        .get(0);
    let old_done = done(c, "old-done").await;
    backdate(c, old_done, "40 days").await;
    // Open jobs just as old: never purged.
    let pending = submit(c, "alice", "old-pending", "gpu-a", &p)
        .await
        .unwrap();
    let unknown = submit(c, "alice", "old-unknown", "gpu-a", &p)
        .await
        .unwrap();
    let ua = begin(c, unknown.job_id, None, "1 hour").await.unwrap();
    mark_unknown(c, ua.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    let running = submit(c, "alice", "old-running", "gpu-a", &p)
        .await
        .unwrap();
    begin(c, running.job_id, None, "1 hour").await.unwrap();
    let old_open = vec![pending.job_id, unknown.job_id, running.job_id];
    for job in &old_open {
        backdate(c, *job, "40 days").await;
    }
    let recent_done = done(c, "recent-done").await;
    Fixture {
        lapsed_job: lapsed.job_id,
        lapsed_attempt,
        old_done,
        old_open,
        recent_done,
    }
}

async fn check(c: &Client, f: &Fixture) {
    // The scheduled sweep: started → unknown, with the event people read.
    assert_eq!(attempt_row(c, f.lapsed_attempt).await.state, "unknown");
    assert_eq!(job_row(c, f.lapsed_job).await.state, "unknown");
    let events = event_rows(c, f.lapsed_job).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, "timeout");
    assert_eq!(events[0].detail["noticed_by"], "sweep");
    // The scheduled purge: the old finished job is gone whole, the rest is there.
    let left = |job: Uuid| async move {
        c.query_one("SELECT count(*) FROM intent.jobs WHERE id = $1", &[&job])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(left(f.old_done).await, 0, "the old finished job was purged");
    let attempts: i64 = c
        .query_one(
            "SELECT count(*) FROM intent.attempts WHERE job_id = $1",
            &[&f.old_done],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 0);
    for job in &f.old_open {
        assert_eq!(left(*job).await, 1, "open job {job} was never purged");
    }
    assert_eq!(
        left(f.recent_done).await,
        1,
        "a recent finished job is kept"
    );
}

fn assert_ran(run: &CronRun, database: &str) {
    assert_eq!(run.status, "succeeded", "{run:?}");
    assert_eq!(run.username, "intent_maintenance", "{run:?}");
    assert_eq!(run.database, database, "{run:?}");
    assert_eq!(run.return_message.as_deref(), Some("SELECT 1"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_sweep_and_purge_run_as_the_maintenance_role() {
    let cron = CronCluster::start("intent_app").await;
    cron.create_db("other_app").await;
    let admin = cron.connect("intent_app").await;
    // docs/scheduling.md, step by step.
    admin
        .batch_execute(
            "CREATE ROLE intent_maintenance LOGIN IN ROLE intent_operator;
             GRANT USAGE ON SCHEMA cron TO intent_maintenance;
             ALTER DATABASE intent_app SET intent.retention = '30 days';",
        )
        .await
        .unwrap();

    let app = cron.connect("intent_app").await;
    let other = cron.connect("other_app").await;
    let app_rows = fixture(&app).await;
    let other_rows = fixture(&other).await;
    wait_past_deadline(&app, app_rows.lapsed_attempt).await;
    wait_past_deadline(&other, other_rows.lapsed_attempt).await;

    // pg_intent in the cron database: the maintenance role schedules its own jobs.
    let maintenance = cron
        .connect_as_user("intent_app", "intent_maintenance")
        .await;
    for (name, command) in [
        ("pg_intent_sweep", "SELECT intent.sweep()"),
        ("pg_intent_purge", "SELECT intent.purge()"),
    ] {
        maintenance
            .query_one(
                "SELECT cron.schedule($1, '* * * * *', $2)",
                &[&name, &command],
            )
            .await
            .unwrap_or_else(|e| panic!("schedule {name}: {e:?}"));
    }
    // pg_intent in another database: a superuser schedules there, naming the role.
    for (name, command) in [
        ("other_app_sweep", "SELECT intent.sweep()"),
        ("other_app_purge", "SELECT intent.purge('30 days', 500)"),
    ] {
        admin
            .query_one(
                "SELECT cron.schedule_in_database($1, '* * * * *', $2, 'other_app', 'intent_maintenance')",
                &[&name, &command],
            )
            .await
            .unwrap_or_else(|e| panic!("schedule {name}: {e:?}"));
    }

    let runs = cron
        .wait_for_runs(
            &[
                "pg_intent_sweep",
                "pg_intent_purge",
                "other_app_sweep",
                "other_app_purge",
            ],
            Duration::from_secs(150),
        )
        .await;
    assert_ran(&runs[0], "intent_app");
    assert_ran(&runs[1], "intent_app");
    assert_ran(&runs[2], "other_app");
    assert_ran(&runs[3], "other_app");
    check(&app, &app_rows).await;
    check(&other, &other_rows).await;

    // Unscheduling, as the docs say.
    let removed: bool = maintenance
        .query_one("SELECT cron.unschedule('pg_intent_sweep')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(removed);
}
