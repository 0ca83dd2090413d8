//! Owner isolation: a session bound to an owner sees and acts on that owner's rows only, and
//! cannot rebind itself.

use pg_intent_tests::roles::*;
use pg_intent_tests::*;
use std::collections::BTreeSet;

/// One tenant's stake: a job in each interesting state, with its ids.
pub(crate) struct Stake {
    pub(crate) running: Begun,
    pub(crate) unknown: Begun,
    pub(crate) won_job: Uuid,
    pub(crate) lost: Begun,
    pub(crate) ids: Vec<Uuid>,
}

/// As `c` (bound to `owner`), creates a running job, an unknown attempt, and a job won by one
/// attempt and lost by another (a lost race).
pub(crate) async fn stake(c: &Client, operator: &Client, owner: &str) -> Stake {
    let j1 = submit(c, owner, "running", "gpu", &json!({}))
        .await
        .unwrap();
    let running = begin(c, j1.job_id, None, "1 hour").await.unwrap();
    let j2 = submit(c, owner, "unknown", "gpu", &json!({}))
        .await
        .unwrap();
    let unknown = begin(c, j2.job_id, None, "1 hour").await.unwrap();
    mark_unknown(c, unknown.attempt_id, Some("timeout"))
        .await
        .unwrap();
    let j3 = submit(c, owner, "raced", "gpu", &json!({})).await.unwrap();
    let lost = begin(c, j3.job_id, None, "1 hour").await.unwrap();
    abandon(operator, lost.attempt_id, "stuck").await.unwrap();
    let winner = begin(c, j3.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        complete(c, winner.attempt_id, 1, &json!({"n": 1}))
            .await
            .unwrap(),
        "won"
    );
    assert_eq!(
        complete(c, lost.attempt_id, 1, &json!({"n": 2}))
            .await
            .unwrap(),
        "lost"
    );
    Stake {
        running,
        unknown,
        won_job: j3.job_id,
        lost,
        ids: vec![j1.job_id, j2.job_id, j3.job_id],
    }
}

/// The owners a session can see in each table and view.
pub(crate) async fn owners_seen(c: &Client) -> Vec<(String, BTreeSet<String>)> {
    let mut seen = Vec::new();
    for (what, sql) in [
        ("jobs", "SELECT DISTINCT owner_id FROM intent.jobs"),
        ("attempts", "SELECT DISTINCT owner_id FROM intent.attempts"),
        ("events", "SELECT DISTINCT owner_id FROM intent.events"),
        (
            "attempts_to_reconcile",
            "SELECT DISTINCT owner_id FROM intent.attempts_to_reconcile",
        ),
        (
            "lost_races",
            "SELECT DISTINCT owner_id FROM intent.lost_races",
        ),
    ] {
        let owners = c
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        seen.push((what.to_string(), owners));
    }
    seen
}

pub(crate) fn only(owner: &str) -> BTreeSet<String> {
    BTreeSet::from([owner.to_string()])
}

pub(crate) async fn bound_owner(c: &Client) -> Option<String> {
    c.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap()
        .get(0)
}

/// A login role (a member of intent_operator) bound for good to `owner`
/// (`ALTER ROLE … SET intent.owner_id`).
pub(crate) async fn tenant_role(admin: &Client, owner: &str) -> String {
    let role = create_login_role(admin, "tenant", "IN ROLE intent_operator").await;
    admin
        .batch_execute(&format!(
            "ALTER ROLE \"{role}\" SET intent.owner_id = '{owner}'"
        ))
        .await
        .unwrap();
    role
}

/// How many rows of intent.jobs a session sees.
async fn jobs_seen(c: &Client) -> i64 {
    c.query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0)
}

async fn total_jobs_by_state(c: &Client) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(jobs), 0)::bigint FROM intent.jobs_by_state",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Two tenants, each a login role bound for good (`ALTER ROLE … SET intent.owner_id`). Tenant
/// A cannot read tenant B's jobs, attempts or events (tables and views), and cannot act on
/// them even knowing their ids: every call is "not found" (IJ007), a submit for B is 42501,
/// and B's rows do not change. A cannot rebind its session. An unbound session sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_and_touches_only_its_own_jobs() {
    let db = Cluster::shared().fresh_db("sec_tenants").await;
    let admin = db.connect().await;
    let mut tenants = Vec::new();
    for owner in ["tenant-a", "tenant-b"] {
        tenants.push(tenant_role(&admin, owner).await);
    }
    let a = connect_role(&db, &tenants[0]).await;
    let b = connect_role(&db, &tenants[1]).await;
    assert_eq!(bound_owner(&a).await.as_deref(), Some("tenant-a"));
    assert_eq!(bound_owner(&b).await.as_deref(), Some("tenant-b"));
    let stake_a = stake(&a, &a, "tenant-a").await;
    let stake_b = stake(&b, &b, "tenant-b").await;

    // Reading: only its own rows, in every table and view.
    for (what, owners) in owners_seen(&a).await {
        assert_eq!(owners, only("tenant-a"), "tenant A reads {what}");
    }
    for (what, owners) in owners_seen(&b).await {
        assert_eq!(owners, only("tenant-b"), "tenant B reads {what}");
    }
    assert_eq!(
        total_jobs_by_state(&a).await,
        3,
        "jobs_by_state counts A's jobs only"
    );
    for id in &stake_b.ids {
        let n: i64 = a
            .query_one("SELECT count(*) FROM intent.jobs WHERE id = $1", &[id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "A finds B's job {id} by id");
    }
    // A leaky function in A's own query sees A's rows only (the policy is applied first).
    admin
        .batch_execute(
            "CREATE FUNCTION public.leak(o text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS
                 $$ BEGIN RAISE NOTICE 'leak: %', o; RETURN true; END $$;",
        )
        .await
        .unwrap();
    let (leaky, notices) = connect_role_with(&db, &tenants[0], None).await.unwrap();
    leaky
        .query("SELECT 1 FROM intent.jobs WHERE public.leak(owner_id)", &[])
        .await
        .unwrap();
    leaky
        .query(
            "SELECT 1 FROM intent.events WHERE public.leak(owner_id)",
            &[],
        )
        .await
        .unwrap();
    let leaked: BTreeSet<String> = notices.all().into_iter().collect();
    assert_eq!(
        leaked,
        BTreeSet::from(["NOTICE: leak: tenant-a".to_string()]),
        "what a leaky function saw"
    );

    // Acting on B's job with the right ids: not found, and nothing changes.
    let before = digest(&admin).await;
    let b_job = stake_b.ids[0];
    refusal(begin(&a, b_job, None, "1 hour").await, "IJ007");
    refusal(
        heartbeat(&a, stake_b.running.attempt_id, None).await,
        "IJ007",
    );
    refusal(
        complete(&a, stake_b.running.attempt_id, 1, &json!({"stolen": true})).await,
        "IJ007",
    );
    refusal(
        fail(
            &a,
            stake_b.running.attempt_id,
            1,
            &json!({"status": 400}),
            false,
        )
        .await,
        "IJ007",
    );
    refusal(
        mark_unknown(&a, stake_b.running.attempt_id, None).await,
        "IJ007",
    );
    refusal(
        abandon(&a, stake_b.unknown.attempt_id, "mine now").await,
        "IJ007",
    );
    refusal(
        abandon(&a, stake_b.running.attempt_id, "mine now").await,
        "IJ007",
    );
    refusal(cancel(&a, b_job, None).await, "IJ007");
    refusal(cancel(&a, stake_b.won_job, None).await, "IJ007");
    refusal(
        complete(&a, stake_b.lost.attempt_id, 1, &json!({"n": 3})).await,
        "IJ007",
    );
    // Submitting for B: refused whether or not the key exists, alone or in a batch.
    refusal(
        submit(&a, "tenant-b", "running", "gpu", &json!({})).await,
        "42501",
    );
    refusal(
        submit(&a, "tenant-b", "new-key", "gpu", &json!({})).await,
        "42501",
    );
    let batch: Vec<Option<String>> = a
        .query(
            "SELECT sqlstate FROM intent.submit_jobs(ARRAY['tenant-b', 'tenant-b'],
                                                     ARRAY['running', 'batch-key'],
                                                     ARRAY['gpu', 'gpu'], ARRAY['{}', '{}']::jsonb[])
              ORDER BY ordinality",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_else(|e| vec![SqlError::code_of(&e)]);
    assert!(
        batch.iter().all(|code| code.as_deref() == Some("42501")),
        "a batch for B: {batch:?}"
    );
    assert_eq!(digest(&admin).await, before, "B's rows are untouched");

    // sweep and purge in A's session concern A's rows only.
    lapse_lease(&admin, stake_b.running.attempt_id)
        .await
        .unwrap();
    age_job(&admin, stake_b.won_job, 400).await.unwrap();
    let before = digest(&admin).await;
    assert_eq!(
        sweep(&a).await.unwrap(),
        0,
        "A's sweep skips B's lapsed attempt"
    );
    assert_eq!(
        a.query_one("SELECT intent.purge('1 day', 100)", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0,
        "A's purge skips B's old finished job"
    );
    assert_eq!(digest(&admin).await, before);
    assert_eq!(sweep(&b).await.unwrap(), 1, "B's own sweep finds it");

    // A cannot rebind its session, by SET, set_config or RESET.
    for sql in [
        "SET intent.owner_id = 'tenant-b'",
        "SET LOCAL intent.owner_id = 'tenant-b'",
        "SELECT set_config('intent.owner_id', 'tenant-b', false)",
        "SET intent.owner_id = ''",
        "RESET intent.owner_id",
        "SET SESSION AUTHORIZATION postgres",
    ] {
        let code = sqlstate_of(&a, sql).await;
        assert!(
            code.as_deref() == Some("42501") || (sql.starts_with("RESET") && code.is_none()),
            "{sql}: {code:?}"
        );
        assert_eq!(
            bound_owner(&a).await.as_deref(),
            Some("tenant-a"),
            "after {sql}"
        );
    }
    // Nor its role's setting.
    let code = sqlstate_of(
        &a,
        &format!("ALTER ROLE \"{}\" RESET intent.owner_id", tenants[0]),
    )
    .await;
    assert_eq!(code.as_deref(), Some("42501"));
    let code = sqlstate_of(
        &a,
        &format!(
            "ALTER ROLE \"{}\" SET intent.owner_id = 'tenant-b'",
            tenants[0]
        ),
    )
    .await;
    assert_eq!(code.as_deref(), Some("42501"));
    let fresh = connect_role(&db, &tenants[0]).await;
    assert_eq!(bound_owner(&fresh).await.as_deref(), Some("tenant-a"));

    // An unbound session (here the superuser; any role without the setting) sees every owner.
    for (what, owners) in owners_seen(&admin).await {
        assert_eq!(
            owners,
            BTreeSet::from(["tenant-a".to_string(), "tenant-b".to_string()]),
            "unbound session reads {what}"
        );
    }
    let _ = stake_a;
}

/// The setting can be given before the library is loaded (it is a placeholder then): the value
/// is discarded with a WARNING when the library loads, and the role's binding stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_before_the_library_loads_is_discarded() {
    let db = Cluster::shared().fresh_db("sec_preload").await;
    let admin = db.connect().await;
    submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let role = tenant_role(&admin, "tenant-a").await;
    for first in [
        "SET intent.owner_id = 'tenant-b'",
        "SELECT set_config('intent.owner_id', 'tenant-b', false)",
        "BEGIN; SET LOCAL intent.owner_id = 'tenant-b'",
    ] {
        let (c, notices) = connect_role_with(&db, &role, None).await.unwrap();
        // Nothing of the extension has run in this session yet.
        c.batch_execute(first)
            .await
            .unwrap_or_else(|e| panic!("{first}: {e:?}"));
        assert_eq!(
            bound_owner(&c).await.as_deref(),
            Some("tenant-a"),
            "after {first}"
        );
        assert!(
            notices
                .all()
                .iter()
                .any(|n| n.starts_with("WARNING") && n.contains("intent.owner_id")),
            "{first}: a WARNING says the value was discarded: {:?}",
            notices.all()
        );
        assert_eq!(
            jobs_seen(&c).await,
            0,
            "{first}: tenant-b's job stays hidden"
        );
        refusal(
            submit(&c, "tenant-b", "k", "gpu", &json!({})).await,
            "42501",
        );
    }
}

/// The same attempt through the connection's startup options (`PGOPTIONS='-c
/// intent.owner_id=…'`, or `options=` in a connection string): the placeholder takes the place
/// of the role's setting, is discarded with a WARNING when the library loads — and the
/// session is left *unbound*, seeing and acting on every owner's jobs — unless the library puts
/// the role's binding back when it loads, as it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_through_startup_options_does_not_unbind() {
    let db = Cluster::shared().fresh_db("sec_options").await;
    let admin = db.connect().await;
    let theirs = submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let role = tenant_role(&admin, "tenant-a").await;
    for options in ["-c intent.owner_id=tenant-b", "-c intent.owner_id="] {
        // Refusing the connection would do as well as keeping the binding.
        let Ok((c, _notices)) = connect_role_with(&db, &role, Some(options)).await else {
            continue;
        };
        assert_eq!(
            bound_owner(&c).await.as_deref(),
            Some("tenant-a"),
            "{options}"
        );
        assert_eq!(
            jobs_seen(&c).await,
            0,
            "{options}: tenant-b's job stays hidden"
        );
        refusal(cancel(&c, theirs.job_id, None).await, "IJ007");
    }
}

/// A trusted gateway on pooled connections binds each request with `SET LOCAL` (it was granted
/// SET on the parameter); the binding ends with the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_binds_each_transaction() {
    let db = Cluster::shared().fresh_db("sec_gateway").await;
    let admin = db.connect().await;
    let theirs = submit(&admin, "tenant-b", "k", "gpu", &json!({}))
        .await
        .unwrap();
    let gateway = create_login_role(&admin, "gateway", "IN ROLE intent_app").await;
    admin
        .batch_execute(&format!(
            "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
        ))
        .await
        .unwrap();
    let c = connect_role(&db, &gateway).await;
    // The very first statement of the session binds (before the library is loaded, too).
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    assert_eq!(bound_owner(&c).await.as_deref(), Some("tenant-a"));
    let mine = submit(&c, "tenant-a", "k", "gpu", &json!({}))
        .await
        .unwrap();
    assert!(mine.created);
    refusal(cancel(&c, theirs.job_id, None).await, "IJ007");
    c.batch_execute("ROLLBACK").await.unwrap();
    // Per request, each bound to its owner.
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    let mine = submit(&c, "tenant-a", "k", "gpu", &json!({}))
        .await
        .unwrap();
    refusal(
        submit(&c, "tenant-b", "k2", "gpu", &json!({})).await,
        "42501",
    );
    c.batch_execute("ROLLBACK").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
        .await
        .unwrap();
    assert!(
        submit(&c, "tenant-a", "k", "gpu", &json!({}))
            .await
            .unwrap()
            .created
    );
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-b'")
        .await
        .unwrap();
    assert!(cancel(&c, theirs.job_id, Some("withdrawn")).await.unwrap());
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("BEGIN; SET LOCAL intent.owner_id = 'tenant-b'")
        .await
        .unwrap();
    refusal(begin(&c, mine.job_id, None, "1 hour").await, "IJ007");
    c.batch_execute("ROLLBACK").await.unwrap();
    // After the transaction the session is unbound again (as the gateway's own role is).
    assert_eq!(bound_owner(&c).await, None);
    assert_eq!(job_row(&admin, theirs.job_id).await.state, "cancelled");
    assert_eq!(job_row(&admin, mine.job_id).await.state, "pending");
    // Without the grant, a role cannot bind at all.
    let app = create_login_role(&admin, "app", "IN ROLE intent_app").await;
    let c = connect_role(&db, &app).await;
    c.query_one("SELECT intent.job_id('a', 'b')", &[])
        .await
        .unwrap();
    assert_eq!(
        sqlstate_of(&c, "BEGIN; SET LOCAL intent.owner_id = 'tenant-a'")
            .await
            .as_deref(),
        Some("42501")
    );
}
