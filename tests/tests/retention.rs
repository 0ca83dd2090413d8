//! Bounded by default (docs/reference.md § 7 `intent.retention`, § 1.2 `intent.purge`, § 3
//! `intent.settings`), against a real server with real concurrent connections: the retention is
//! 7 days unless set, `never` keeps finished jobs for ever, every setting is readable from a
//! session that has not loaded the library, and purges that run at once (two Runners, a Runner
//! and pg_cron) skip each other's jobs and never hold up a claim.

use pg_intent_tests::roles::{connect_role, create_login_role};
use pg_intent_tests::*;
use std::time::{Duration, Instant};

/// A job that finished (cancelled by its owner), made `days` days old.
async fn old_finished(c: &Client, key: &str, days: u64) -> Uuid {
    let s = submit(c, "alice", key, "gpu-a", &json!({"k": key}))
        .await
        .unwrap();
    assert!(cancel(c, s.job_id, None).await.unwrap());
    assert_eq!(age_job(c, s.job_id, days).await.unwrap(), 1);
    s.job_id
}

async fn exists(c: &Client, job_id: Uuid) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT FROM intent.jobs WHERE id = $1)",
        &[&job_id],
    )
    .await
    .unwrap()
    .get(0)
}

async fn purge_default(c: &Client) -> Result<i64, tokio_postgres::Error> {
    c.query_one("SELECT intent.purge()", &[])
        .await
        .map(|r| r.get(0))
}

/// The view's row for one setting: (setting, default_value, type, context).
async fn setting_row(c: &Client, name: &str) -> (String, String, String, String) {
    let r = c
        .query_one(
            "SELECT setting, default_value, type, context FROM intent.settings WHERE name = $1",
            &[&name],
        )
        .await
        .unwrap_or_else(|e| panic!("intent.settings has no row {name}: {e}"));
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_retention_is_seven_days_and_a_purge_without_one_uses_it() {
    let db = Cluster::shared().fresh_db("retention_default").await;
    let c = db.connect().await;
    let (setting, default, kind, context) = setting_row(&c, "intent.retention").await;
    assert_eq!((setting.as_str(), default.as_str()), ("7 days", "7 days"));
    assert_eq!((kind.as_str(), context.as_str()), ("string", "superuser"));

    let eight = old_finished(&c, "eight-days", 8).await;
    let six = old_finished(&c, "six-days", 6).await;
    // An unfinished job is never purged, however old.
    let pending = submit(&c, "alice", "pending", "gpu-a", &json!({}))
        .await
        .unwrap()
        .job_id;
    age_job(&c, pending, 400).await.unwrap();

    assert_eq!(purge_default(&c).await.unwrap(), 1, "nothing set: 7 days");
    assert!(!exists(&c, eight).await, "finished 8 days ago: purged");
    assert!(exists(&c, six).await, "finished 6 days ago: kept");
    assert!(exists(&c, pending).await, "pending: kept");
    assert_eq!(purge_default(&c).await.unwrap(), 0);

    // RESET gives the default back after a change.
    c.batch_execute("SET intent.retention = '1 day'")
        .await
        .unwrap();
    c.batch_execute("RESET intent.retention").await.unwrap();
    assert_eq!(setting_row(&c, "intent.retention").await.0, "7 days");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_keeps_finished_jobs_for_ever_and_empty_text_is_refused() {
    let db = Cluster::shared().fresh_db("retention_never").await;
    let c = db.connect().await;
    let ancient = old_finished(&c, "ancient", 3650).await;
    for never in ["never", "NEVER", " Never "] {
        c.batch_execute(&format!("SET intent.retention = '{never}'"))
            .await
            .unwrap();
        let before = digest(&c).await;
        assert_eq!(purge_default(&c).await.unwrap(), 0, "{never:?}");
        assert_eq!(digest(&c).await, before, "{never:?}: nothing written");
        assert!(exists(&c, ancient).await);
    }
    // An explicit retention is always honoured.
    assert_eq!(
        c.query_one("SELECT intent.purge('1 day')", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        1
    );
    assert!(!exists(&c, ancient).await);

    // Empty text is no retention: refused, as before.
    c.batch_execute("SET intent.retention = ''").await.unwrap();
    let e = refusal(purge_default(&c).await, "22023");
    assert!(e.hint().contains("never"), "{e:?}");
    // 'never' is a word, not a prefix.
    c.batch_execute("SET intent.retention = 'never mind'")
        .await
        .unwrap();
    refusal(purge_default(&c).await, "22007");
}

/// Every setting pg_intent registers (extension/src: the `define_*_guc` calls), but the one
/// hidden from `SHOW ALL` (`intent.transaction_binding`, internal).
const SETTINGS: [&str; 8] = [
    "intent.allow_checker_drop",
    "intent.claim_rescan",
    "intent.force_distributed_statements",
    "intent.notify",
    "intent.owner_id",
    "intent.retention",
    "intent.retry_backoff",
    "intent.retry_backoff_max",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_view_works_in_a_session_that_has_not_loaded_the_library() {
    let db = Cluster::shared().fresh_db("retention_settings").await;
    let admin = db.connect().await;
    let role = create_login_role(&admin, "app", "IN ROLE intent_app").await;
    let c = connect_role(&db, &role).await;
    // A fresh session: the library is not loaded, so PostgreSQL does not know the names
    // (docs/reference.md § 7; nothing an extension can change without preloading).
    let show = c.simple_query("SHOW intent.notify").await;
    refusal(show, "42704");
    // A value set before the library loads is a placeholder; the library takes it over.
    c.batch_execute("SET intent.retry_backoff = '3 seconds'")
        .await
        .unwrap();

    // The view, as the first use of pg_intent in the session, by an application role.
    let rows = c
        .query(
            "SELECT name, setting, default_value, type, context, description FROM intent.settings",
            &[],
        )
        .await
        .unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, SETTINGS, "every intent.* setting, by name");
    for r in &rows {
        let name: String = r.get(0);
        let description: String = r.get(5);
        assert!(description.len() > 20, "{name}: {description:?}");
    }
    assert_eq!(
        setting_row(&c, "intent.retry_backoff").await,
        (
            "3 seconds".to_string(),
            "1 second".to_string(),
            "string".to_string(),
            "user".to_string()
        ),
        "the session's value, the built-in default"
    );
    assert_eq!(setting_row(&c, "intent.notify").await.0, "off");
    assert_eq!(setting_row(&c, "intent.claim_rescan").await.0, "1000");
    // The library is loaded now: SHOW knows the names.
    let notify = c.query_one("SHOW intent.notify", &[]).await.unwrap();
    assert_eq!(notify.get::<_, String>(0), "off");

    // The view and each column say what they are.
    let row = admin
        .query_one(
            "SELECT obj_description('intent.settings'::regclass, 'pg_class'),
                    (SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
                      WHERE attrelid = 'intent.settings'::regclass AND attnum > 0
                        AND col_description(attrelid, attnum) IS NULL)",
            &[],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, Option<String>>(0)
            .is_some_and(|t| t.len() > 20)
    );
    assert_eq!(row.get::<_, Option<Vec<String>>>(1), None, "uncommented");
}

/// Two purges at once (two Runners, or a Runner and pg_cron): the second skips the jobs the
/// first holds and never waits for them, and a claim waits for neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_purges_skip_each_others_jobs_and_never_block_a_claim() {
    let db = Cluster::shared().fresh_db("retention_concurrent").await;
    let c = db.connect().await;
    for i in 0..40 {
        old_finished(&c, &format!("old-{i}"), 30).await;
    }
    for i in 0..5 {
        submit(&c, "alice", &format!("todo-{i}"), "gpu-a", &json!({}))
            .await
            .unwrap();
    }
    let first = db.connect().await;
    let second = db.connect().await;
    let claimer = db.connect().await;
    // Anything that waited for a lock would fail here at once instead.
    for s in [&second, &claimer] {
        s.batch_execute("SET lock_timeout = '200ms'; SET statement_timeout = '5s'")
            .await
            .unwrap();
    }
    // The first purge holds its batch (its transaction stays open).
    first.batch_execute("BEGIN").await.unwrap();
    let held: i64 = first
        .query_one("SELECT intent.purge(NULL, 25)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 25);

    let t = Instant::now();
    let other: i64 = second
        .query_one("SELECT intent.purge(NULL, 1000)", &[])
        .await
        .expect("the second purge skips the first one's jobs")
        .get(0);
    assert_eq!(other, 15, "the jobs the first purge does not hold");
    let claimed = claim_jobs(&claimer, "gpu-a", 10).await;
    assert_eq!(claimed.len(), 5, "a claim takes the pending jobs meanwhile");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "neither waited: {:?}",
        t.elapsed()
    );
    first.batch_execute("COMMIT").await.unwrap();
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM intent.jobs WHERE state = 'cancelled'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "between them, every old finished job");
    let retired: i64 = c
        .query_one("SELECT count(*) FROM intent.retired_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(retired, 40);
}

/// A key submitted again after its job was purged creates a new job, and says so (a NOTICE):
/// docs/reference.md § 1.1 `submit_job`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_the_retention_is_a_new_job_and_submit_job_says_so() {
    let db = Cluster::shared().fresh_db("retention_replay").await;
    let (client, connection) = db
        .cluster
        .config(&db.name)
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = notices.clone();
    tokio::spawn(async move {
        let mut connection = connection;
        while let Some(m) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notice(n)) = m {
                seen.lock().unwrap().push(format!(
                    "{} | {}",
                    n.message(),
                    n.detail().unwrap_or("")
                ));
            }
        }
    });
    let c = client;
    let first = submit(&c, "alice", "k", "gpu-a", &json!({"p": 1}))
        .await
        .unwrap();
    assert!(first.created);
    assert!(notices.lock().unwrap().is_empty(), "a first job: no notice");
    assert!(cancel(&c, first.job_id, None).await.unwrap());
    age_job(&c, first.job_id, 8).await.unwrap();
    let last_version = job_row(&c, first.job_id).await.version;
    assert_eq!(purge_default(&c).await.unwrap(), 1);

    let again = submit(&c, "alice", "k", "gpu-a", &json!({"p": 1}))
        .await
        .unwrap();
    assert!(again.created, "a new job, not a replay");
    assert_eq!(again.job_id, first.job_id, "the same derived id");
    assert_eq!(again.version, last_version + 1);
    assert_eq!(again.state, "pending");
    let seen = notices.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].contains(&first.job_id.to_string()) && seen[0].contains("purged"),
        "{seen:?}"
    );
    // A replay of the new job: no notice.
    let replay = submit(&c, "alice", "k", "gpu-a", &json!({"p": 1}))
        .await
        .unwrap();
    assert!(!replay.created);
    assert_eq!(notices.lock().unwrap().len(), 1);
}

/// A client cannot displace the database's retention (the attacker's review of 0.5.0): a
/// startup option outranks the database's value, so PostgreSQL never keeps that value for the
/// library, refuses the client's (a superuser setting) when the library registers it, and falls
/// back to the built-in 7 days. Such a session's purge by the setting refuses (42501) instead
/// of purging by 7 days what the database keeps for ever; an ordinary session purges by the
/// database's value. Fails with the check in purge.rs removed: the old jobs are purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_option_cannot_displace_the_databases_retention() {
    let db = Cluster::shared().fresh_db("retention_displaced").await;
    let admin = db.connect().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET intent.retention = 'never'",
            db.name
        ))
        .await
        .unwrap();
    let old = old_finished(&admin, "kept", 30).await;
    let role = create_login_role(&admin, "app", "IN ROLE intent_app").await;
    let (forged, _) =
        pg_intent_tests::roles::connect_role_with(&db, &role, Some("-c intent.retention=1s"))
            .await
            .unwrap();
    refusal(
        forged
            .query_one("SELECT intent.purge_expired(100)", &[])
            .await,
        "42501",
    );
    assert!(exists(&admin, old).await, "the database keeps it for ever");
    let plain = connect_role(&db, &role).await;
    let n: i64 = plain
        .query_one("SELECT intent.purge_expired(100)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "'never', the database's value");
    assert!(exists(&admin, old).await);
}

/// The session's `TimeZone` cannot move a time a call computes (the attacker's review of
/// 0.5.0): PostgreSQL adds an interval's days in the session's zone, and a made-up zone with a
/// days-long daylight-saving jump inside the window would put a retry time days early (a
/// tenant's job ahead of every other owner's) or a purge's cutoff in the future. Every call
/// computes in UTC. Fails without the pin (entry.rs): the retry time is off by the jump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_time_zone_cannot_move_a_retry_time_or_a_purge() {
    let db = Cluster::shared().fresh_db("retention_time_zone").await;
    let c = db.connect().await;
    // A zone whose jump lies within the next 7 days: then now + 7 days, computed in it, is not
    // 604,800 seconds away.
    c.batch_execute(
        "DO $$ DECLARE z text; BEGIN
           FOR j IN 1..365 LOOP
             z := format('AAA+120BBB-120,J%s/0,J%s/0', j, (j + 27) % 365 + 1);
             PERFORM set_config('TimeZone', z, false);
             IF extract(epoch FROM (now() + interval '7 days') - now()) <> 604800 THEN
               PERFORM set_config('test.zone', z, false);
               EXIT;
             END IF;
           END LOOP;
           PERFORM set_config('TimeZone', 'UTC', false);
         END $$",
    )
    .await
    .unwrap();
    let zone: String = c
        .query_one(
            "SELECT coalesce(current_setting('test.zone', true), '')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!zone.is_empty(), "a zone that moves now + 7 days");
    let s = submit(&c, "tz", "k", "gpu-a", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    c.batch_execute(&format!("SET TimeZone = '{zone}'"))
        .await
        .unwrap();
    let moved: f64 = c
        .query_one(
            "SELECT extract(epoch FROM (now() + interval '7 days') - now())::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(moved, 604_800.0, "the zone moves it in the session: {zone}");
    c.query_one(
        "SELECT intent.fail_attempt($1, $2, '{}', true, interval '7 days')",
        &[&a.attempt_id, &a.version],
    )
    .await
    .unwrap();
    let gap: f64 = c
        .query_one(
            "SELECT extract(epoch FROM retry_at - updated_at)::float8 FROM intent.jobs WHERE id = $1",
            &[&s.job_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gap, 604_800.0, "7 days of 24 hours in {zone}");
    // A job that finished a minute ago is not past a retention of 7 days, in any zone.
    let recent = submit(&c, "tz", "recent", "gpu-a", &json!({}))
        .await
        .unwrap();
    assert!(cancel(&c, recent.job_id, None).await.unwrap());
    c.batch_execute("SET intent.retention = '7 days'")
        .await
        .unwrap();
    let _ = c.query_one("SELECT intent.purge()", &[]).await.unwrap();
    assert!(
        exists(&c, recent.job_id).await,
        "kept: it finished a minute ago"
    );
}
