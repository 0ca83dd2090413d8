//! Owner isolation through parallel workers. A parallel worker restores its leader's settings,
//! user ids and snapshot — never the leader's memory — and evaluates the row-level security
//! policies itself. So every read of `owners`, again, with every statement forced into a worker
//! (`force_parallel_mode` / `debug_parallel_query = on`, `parallel_leader_participation = off`),
//! by each kind of bound session (a role bound for good, a gateway's `SET LOCAL`), directly and
//! through the tenant's own code: a `PARALLEL SAFE` function called per row, `RETURN QUERY`, and
//! a trigger. And every call on another owner's rows, from such a session, is still "not found".

use super::owners::{Stake, bound_owner, only, owners_seen, stake, tenant_role};
use pg_intent_tests::roles::*;
use pg_intent_tests::*;

/// Forces every statement of the session (or, with `local`, of the transaction) into one
/// parallel worker, the leader only gathering.
async fn force_parallel(c: &Client, local: bool) {
    let scope = if local { "true" } else { "false" };
    c.batch_execute(&format!(
        "SELECT set_config(name, 'on', {scope}) FROM pg_settings
          WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
         SELECT set_config('parallel_leader_participation', 'off', {scope});
         SELECT set_config('parallel_setup_cost', '0', {scope});
         SELECT set_config('parallel_tuple_cost', '0', {scope});
         SELECT set_config('min_parallel_table_scan_size', '0', {scope});"
    ))
    .await
    .unwrap();
}

/// Whether `sql` ran in a parallel worker: its plan gathered from at least one launched worker.
async fn ran_in_a_worker(c: &Client, sql: &str) -> bool {
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e:?}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    plan.iter().any(|l| {
        l.trim_start()
            .strip_prefix("Workers Launched: ")
            .and_then(|n| n.trim().parse::<u32>().ok())
            .is_some_and(|n| n > 0)
    })
}

/// The tenant's own code, in schema `evil` (owned by the tenant role `owner`): a `PARALLEL
/// SAFE` function reading every table and view, a `RETURN QUERY` function, and a trigger that
/// records what it read.
async fn plant(admin: &Client, owner: &str, readers: &[&str]) {
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS public.big AS SELECT g FROM generate_series(1, 20000) g;
             GRANT SELECT ON public.big TO PUBLIC;
             CREATE SCHEMA evil AUTHORIZATION \"{owner}\";"
        ))
        .await
        .unwrap();
    let mut sql = format!(
        "SET ROLE \"{owner}\";
         CREATE FUNCTION evil.owners(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
             SELECT string_agg(DISTINCT o, ',' ORDER BY o) FROM (
                 SELECT owner_id FROM intent.jobs UNION ALL
                 SELECT owner_id FROM intent.attempts UNION ALL
                 SELECT owner_id FROM intent.events UNION ALL
                 SELECT owner_id FROM intent.attempts_to_reconcile UNION ALL
                 SELECT owner_id FROM intent.lost_races) s(o) $$;
         CREATE FUNCTION evil.each() RETURNS SETOF text LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
             BEGIN RETURN QUERY SELECT DISTINCT owner_id::text FROM intent.jobs
                                 UNION SELECT DISTINCT owner_id::text FROM intent.events; END $$;
         CREATE FUNCTION evil.each_agg(int) RETURNS text LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
             BEGIN RETURN (SELECT string_agg(x, ',' ORDER BY x) FROM evil.each() x); END $$;
         CREATE TABLE evil.inbox (x int, seen text);
         CREATE FUNCTION evil.record() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 SELECT evil.owners(g) INTO NEW.seen FROM public.big WHERE g = 1;
                 RETURN NEW;
             END $$;
         CREATE TRIGGER r BEFORE INSERT ON evil.inbox FOR EACH ROW EXECUTE FUNCTION evil.record();
         GRANT USAGE ON SCHEMA evil TO PUBLIC;"
    );
    for r in readers {
        sql.push_str(&format!(
            "GRANT INSERT, SELECT ON evil.inbox TO \"{r}\";
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO \"{r}\";"
        ));
    }
    sql.push_str("RESET ROLE;");
    admin.batch_execute(&sql).await.unwrap();
}

/// Every read route, from a session whose statements run in parallel workers: each sees
/// `owner`'s rows only. Returns how many routes ran in a worker.
async fn reads_see_only(c: &Client, owner: &str, who: &str) -> usize {
    for (what, owners) in owners_seen(c).await {
        assert_eq!(owners, only(owner), "{who} reads {what} in a worker");
    }
    let routes = [
        (
            "a PARALLEL SAFE function",
            "SELECT evil.owners(g) FROM public.big WHERE g = 1",
        ),
        (
            "RETURN QUERY in a worker",
            "SELECT evil.each_agg(g) FROM public.big WHERE g = 1",
        ),
        (
            "RETURN QUERY in the leader",
            "SELECT string_agg(x, ',' ORDER BY x) FROM evil.each() x",
        ),
    ];
    let mut in_worker = 0;
    for (what, sql) in routes {
        let seen: Option<String> = c
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{who}, {what}: {e:?}"))
            .get(0);
        assert_eq!(seen.as_deref(), Some(owner), "{who}, {what}");
        if ran_in_a_worker(c, sql).await {
            in_worker += 1;
        }
    }
    let seen: Option<String> = c
        .query_one("INSERT INTO evil.inbox (x) VALUES (1) RETURNING seen", &[])
        .await
        .unwrap_or_else(|e| panic!("{who}, a trigger: {e:?}"))
        .get(0);
    assert_eq!(seen.as_deref(), Some(owner), "{who}, a trigger");
    for sql in [
        "SELECT count(*) FROM intent.jobs",
        "SELECT count(*) FROM intent.events",
    ] {
        if ran_in_a_worker(c, sql).await {
            in_worker += 1;
        }
    }
    in_worker
}

/// Every call on the other owner's rows, from a session in parallel mode: not found (IJ007), a
/// submit for them refused (42501), and nothing of theirs changes. In a transaction
/// (`in_transaction`), each call in a savepoint of its own (a refusal aborts what it is in).
async fn calls_refused(
    c: &Client,
    admin: &Client,
    theirs: &Stake,
    other: &str,
    in_transaction: bool,
) {
    let before = digest(admin).await;
    let savepoint = |open: bool| async move {
        if in_transaction {
            let sql = if open {
                "SAVEPOINT call"
            } else {
                "ROLLBACK TO SAVEPOINT call"
            };
            c.batch_execute(sql).await.unwrap();
        }
    };
    savepoint(true).await;
    refusal(begin(c, theirs.ids[0], None, "1 hour").await, "IJ007");
    savepoint(false).await;
    refusal(heartbeat(c, theirs.running.attempt_id, None).await, "IJ007");
    savepoint(false).await;
    refusal(
        complete(c, theirs.running.attempt_id, 1, &json!({"stolen": true})).await,
        "IJ007",
    );
    savepoint(false).await;
    refusal(
        fail(
            c,
            theirs.running.attempt_id,
            1,
            &json!({"status": 400}),
            false,
        )
        .await,
        "IJ007",
    );
    savepoint(false).await;
    refusal(
        mark_unknown(c, theirs.running.attempt_id, None).await,
        "IJ007",
    );
    savepoint(false).await;
    refusal(abandon(c, theirs.unknown.attempt_id, "mine").await, "IJ007");
    savepoint(false).await;
    refusal(cancel(c, theirs.won_job, None).await, "IJ007");
    savepoint(false).await;
    refusal(
        submit(c, other, "running", "gpu", &json!({})).await,
        "42501",
    );
    savepoint(false).await;
    assert_eq!(sweep(c).await.unwrap(), 0, "a sweep touches no other owner");
    assert_eq!(digest(admin).await, before, "the other owner's rows");
}

/// Boundary: bound tenant ↔ other owners, through parallel workers. A role bound for good and a
/// gateway's `SET LOCAL` binding: every table and view, the tenant's functions, `RETURN QUERY`
/// and a trigger read only the bound owner's rows in the workers too; every call is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_through_parallel_workers_is_bound_as_in_the_leader() {
    let db = Cluster::shared().fresh_db("sec_parallel").await;
    let admin = db.connect().await;
    let tenant_a = tenant_role(&admin, "tenant-a").await;
    let tenant_b = tenant_role(&admin, "tenant-b").await;
    let gateway = create_login_role(&admin, "gateway", "IN ROLE intent_operator").await;
    admin
        .batch_execute(&format!(
            "GRANT SET ON PARAMETER intent.owner_id TO \"{gateway}\""
        ))
        .await
        .unwrap();
    let a = connect_role(&db, &tenant_a).await;
    let b = connect_role(&db, &tenant_b).await;
    let stake_a = stake(&a, &a, "tenant-a").await;
    let stake_b = stake(&b, &b, "tenant-b").await;
    plant(&admin, &tenant_a, &[&gateway]).await;

    // A role bound for good, every statement in a worker.
    let a = connect_role(&db, &tenant_a).await;
    force_parallel(&a, false).await;
    assert_eq!(bound_owner(&a).await.as_deref(), Some("tenant-a"));
    let in_worker = reads_see_only(&a, "tenant-a", "a bound role").await;
    assert!(in_worker >= 4, "only {in_worker} routes ran in a worker");
    calls_refused(&a, &admin, &stake_b, "tenant-b", false).await;

    // A gateway binding each transaction with SET LOCAL, to each owner in turn.
    let g = connect_role(&db, &gateway).await;
    g.query_one("SELECT intent.bound_owner()", &[])
        .await
        .unwrap();
    for (owner, theirs, other) in [
        ("tenant-a", &stake_b, "tenant-b"),
        ("tenant-b", &stake_a, "tenant-a"),
    ] {
        g.batch_execute(&format!("BEGIN; SET LOCAL intent.owner_id = '{owner}'"))
            .await
            .unwrap();
        force_parallel(&g, true).await;
        let in_worker = reads_see_only(&g, owner, "a gateway's transaction").await;
        assert!(in_worker >= 4, "only {in_worker} routes ran in a worker");
        calls_refused(&g, &admin, theirs, other, true).await;
        g.batch_execute("ROLLBACK").await.unwrap();
    }
}
