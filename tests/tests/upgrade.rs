//! The upgrade chain: pg_intent installed at its first release (0.1.0, its install script
//! exactly as released, sql/releases/), filled with a job in every state, then `ALTER EXTENSION
//! pg_intent UPDATE`. Every row and every answer is intact, and the upgraded catalog — every
//! function (its definition, owner, SECURITY DEFINER, settings, grants), table, column,
//! constraint, index, policy, view (and its options), type, comment, event trigger and
//! configuration-table mark — is exactly that of a fresh install of the current version.

use pg_intent_tests::fixtures::{self, EveryState};
use pg_intent_tests::*;
use std::collections::BTreeMap;

/// The releases, oldest first; the last is the current version.
const CHAIN: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.4.1", "0.5.0"];

/// Everything of the extension a catalog query can see, keyed by object, for comparison.
async fn catalog(c: &Client) -> BTreeMap<String, String> {
    let queries = [
        // Functions: definition (with SECURITY DEFINER and SET clauses), owner, grants.
        "SELECT 'function ' || p.oid::regprocedure,
                pg_get_functiondef(p.oid) || ' owner=' || pg_get_userbyid(p.proowner)
                || ' acl=' || coalesce(p.proacl::text, '-')
                || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
           FROM pg_proc p WHERE p.pronamespace = 'intent'::regnamespace",
        // Relations: kind, owner, options, row security, grants, comment.
        "SELECT 'relation ' || c.oid::regclass,
                c.relkind::text || ' owner=' || pg_get_userbyid(c.relowner)
                || ' options=' || coalesce(c.reloptions::text, '-')
                || ' rls=' || c.relrowsecurity || '/' || c.relforcerowsecurity
                || ' acl=' || coalesce(c.relacl::text, '-')
                || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '-')
           FROM pg_class c WHERE c.relnamespace = 'intent'::regnamespace",
        // Columns.
        "SELECT 'column ' || a.attrelid::regclass || '.' || a.attname,
                format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
                || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-')
                || ' identity=' || a.attidentity::text || ' collation=' || a.attcollation::regcollation
                || ' comment=' || coalesce(col_description(a.attrelid, a.attnum), '-')
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'intent'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped",
        // Constraints (tables and domains).
        "SELECT 'constraint ' || coalesce(conrelid::regclass::text, contypid::regtype::text) || '.' || conname,
                pg_get_constraintdef(oid) || ' comment=' || coalesce(obj_description(oid, 'pg_constraint'), '-')
           FROM pg_constraint WHERE connamespace = 'intent'::regnamespace",
        // Indexes.
        "SELECT 'index ' || indexrelid::regclass, pg_get_indexdef(indexrelid)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE c.relnamespace = 'intent'::regnamespace",
        // Views.
        "SELECT 'view ' || c.oid::regclass, pg_get_viewdef(c.oid)
           FROM pg_class c WHERE c.relnamespace = 'intent'::regnamespace AND c.relkind = 'v'",
        // Policies.
        "SELECT 'policy ' || p.polrelid::regclass || '.' || p.polname,
                p.polcmd::text || ' ' || p.polpermissive || ' roles=' || p.polroles::text
                || ' using=' || coalesce(pg_get_expr(p.polqual, p.polrelid), '-')
                || ' check=' || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '-')
                || ' comment=' || coalesce(obj_description(p.oid, 'pg_policy'), '-')
           FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
          WHERE c.relnamespace = 'intent'::regnamespace",
        // Types, enum labels in order, domains.
        "SELECT 'type ' || t.oid::regtype,
                t.typtype::text || ' owner=' || pg_get_userbyid(t.typowner)
                || ' labels=' || coalesce((SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder)
                                             FROM pg_enum WHERE enumtypid = t.oid), '-')
                || ' base=' || t.typbasetype::regtype
                || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '-')
           FROM pg_type t WHERE t.typnamespace = 'intent'::regnamespace AND t.typtype IN ('e', 'd')",
        // Event triggers.
        "SELECT 'event trigger ' || evtname,
                evtevent || ' ' || evtfoid::regprocedure || ' ' || evtenabled::text
                || ' comment=' || coalesce(obj_description(oid, 'pg_event_trigger'), '-')
           FROM pg_event_trigger WHERE evtfoid IN (SELECT oid FROM pg_proc WHERE pronamespace = 'intent'::regnamespace)",
        // The schema, and the extension's configuration tables.
        "SELECT 'schema intent', pg_get_userbyid(nspowner) || ' acl=' || coalesce(nspacl::text, '-')
           FROM pg_namespace WHERE nspname = 'intent'",
        "SELECT 'extension config', (SELECT string_agg(c::regclass::text, ',' ORDER BY c::regclass::text)
                                       FROM unnest(extconfig) c) || ' ' || coalesce(extcondition::text, '-')
           FROM pg_extension WHERE extname = 'pg_intent'",
        // Membership of every object in the extension.
        "SELECT 'member ' || pg_describe_object(classid, objid, objsubid), deptype::text
           FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
            AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_intent')",
    ];
    let mut all = BTreeMap::new();
    for q in queries {
        for row in c
            .query(q, &[])
            .await
            .unwrap_or_else(|e| panic!("{q}: {:?}", SqlError::from_error(&e)))
        {
            let key: String = row.get(0);
            let value: String = row.get(1);
            assert!(all.insert(key.clone(), value).is_none(), "duplicate {key}");
        }
    }
    all
}

/// Every row of the extension's tables, with the columns of 0.1.0 only.
async fn rows_of_0_1(c: &Client) -> Vec<(String, Vec<String>)> {
    let mut rows = pg_intent_tests::dump::table_rows(c).await;
    let contracts = c
        .query(
            // The checker by identity: 0.2.0 stores it so (pg_upgrade keeps no function oids).
            "SELECT (name, output_schema,
                     (pg_identify_object('pg_proc'::regclass, checker::text::regprocedure, 0)).identity,
                     version, created_at, updated_at)::text
               FROM intent.contracts ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The columns of 0.1.0 (0.3.0 added retry_at, NULL for every job the upgrade finds).
    let jobs = c
        .query(
            "SELECT (id, owner_id, idempotency_key, provider, params, contract, state, version,
                     completed_by, result, error, max_attempts, attempt_count, created_at, updated_at)::text
               FROM intent.jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (mut contracts, mut jobs) = (Some(contracts), Some(jobs));
    for (table, r) in rows.iter_mut() {
        match table.as_str() {
            "intent.contracts" => *r = contracts.take().unwrap(),
            "intent.jobs" => *r = jobs.take().unwrap(),
            _ => {}
        }
    }
    rows
}

/// What differs between two catalogs, object by object.
fn differences(
    upgraded: &BTreeMap<String, String>,
    fresh: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in fresh {
        match upgraded.get(k) {
            None => out.push(format!("missing after the upgrade: {k}")),
            Some(u) if u != v => out.push(format!("{k}\n  upgraded: {u}\n  fresh:    {v}")),
            _ => {}
        }
    }
    for k in upgraded.keys().filter(|k| !fresh.contains_key(*k)) {
        out.push(format!("left over after the upgrade: {k}"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_release_upgrades_to_exactly_a_fresh_install_with_every_row_intact() {
    let cluster = Cluster::shared();
    let fresh_db = cluster.fresh_db("upgrade_fresh").await;
    let fresh = catalog(&fresh_db.connect().await).await;
    let current: String = fresh_db
        .connect()
        .await
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        &current,
        CHAIN.last().unwrap(),
        "CHAIN ends at the current version"
    );

    // From each release: through every later release in turn, and by the path ALTER EXTENSION
    // UPDATE picks itself (the shortest: 0.4.0 → 0.5.0 has a script of its own).
    let ways = CHAIN[..CHAIN.len() - 1]
        .iter()
        .enumerate()
        .flat_map(|(i, from)| [(i, from, false), (i, from, true)]);
    for (i, from, direct) in ways {
        let name = format!(
            "upgrade_from_{}_{}_{}",
            from.replace('.', "_"),
            if direct { "direct" } else { "stepwise" },
            std::process::id()
        );
        let admin = cluster.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        let c = cluster.connect(&name).await;
        c.batch_execute(&format!("CREATE EXTENSION pg_intent VERSION '{from}'"))
            .await
            .unwrap_or_else(|e| panic!("install {from}: {:?}", SqlError::from_error(&e)));
        let EveryState {
            running,
            running_attempt,
            rejected_attempt,
        } = fixtures::every_state(&c).await;
        let rows_before = rows_of_0_1(&c).await;
        if direct {
            c.batch_execute("ALTER EXTENSION pg_intent UPDATE")
                .await
                .unwrap_or_else(|e| panic!("{from} → current: {:?}", SqlError::from_error(&e)));
        } else {
            for to in &CHAIN[i + 1..] {
                c.batch_execute(&format!("ALTER EXTENSION pg_intent UPDATE TO '{to}'"))
                    .await
                    .unwrap_or_else(|e| panic!("{from} → {to}: {:?}", SqlError::from_error(&e)));
            }
        }
        let c = cluster.connect(&name).await;
        let diff = differences(&catalog(&c).await, &fresh);
        assert!(diff.is_empty(), "{from} → {current}:\n{}", diff.join("\n"));
        assert_eq!(
            rows_before,
            rows_of_0_1(&c).await,
            "{from} → {current}: every row intact"
        );
        // 0.5.0 keys the claimable queue on retry_at: the claimable jobs (pending, attempts
        // left) get one, the time they were claimable from before (when they last changed, none
        // of them having failed); every other job has none.
        let retry_times: Vec<(String, String, bool)> = c
            .query(
                "SELECT idempotency_key::text, state::text, retry_at IS NOT DISTINCT FROM
                        CASE WHEN state = 'pending' AND attempt_count < max_attempts THEN updated_at END
                   FROM intent.jobs ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert!(
            retry_times.iter().all(|(_, _, right)| *right)
                && retry_times.iter().any(|(_, state, _)| state == "pending"),
            "{from} → {current}: a retry time exactly for the claimable jobs: {retry_times:?}"
        );
        // 0.2.0 records who a checker runs as: the upgrade from 0.1.0 records its owner and no
        // definer; from 0.2.0 on, define_contract recorded its caller.
        let recorded: Vec<(String, Option<String>, Option<String>)> = c
            .query(
                "SELECT name::text, checker_owner::text, defined_by::text FROM intent.contracts ORDER BY name",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let definer = (*from != "0.1.0").then(|| "postgres".to_string());
        assert_eq!(
            recorded,
            [
                ("loose".to_string(), None, definer.clone()),
                ("shape".to_string(), Some("postgres".to_string()), definer)
            ],
            "{from} → {current}"
        );
        // Every answer intact: replays, the gate, the winner, the contract's checker.
        let replay = submit(&c, "alice", "running", "gpu", &json!({}))
            .await
            .unwrap();
        assert_eq!(
            (replay.job_id, replay.created, replay.state.as_str()),
            (running.job_id, false, "running")
        );
        refusal(begin(&c, running.job_id, None, "1 hour").await, "IJ002");
        let won = submit_full(&c, "alice", "won", "gpu", &json!({}), Some("shape"), 5)
            .await
            .unwrap();
        assert_eq!(won.result, Some(json!({"n": 3})));
        refusal(
            submit(&c, "alice", "won", "gpu", &json!({"other": 1})).await,
            "IJ001",
        );
        assert_eq!(
            complete(&c, rejected_attempt.attempt_id, 1, &json!({"x": 1}))
                .await
                .unwrap(),
            "rejected",
            "asked again after the upgrade: the same answer"
        );
        assert_eq!(
            complete(
                &c,
                running_attempt.attempt_id,
                running_attempt.version,
                &json!({"n": 9})
            )
            .await
            .unwrap(),
            "won"
        );
        let reused = submit(&c, "dave", "purged", "gpu", &json!({}))
            .await
            .unwrap();
        assert!(
            reused.created && reused.version > 1,
            "retired keys kept: {reused:?}"
        );
    }
}

/// The one-step script from 0.4.0 skips its index only where the index of `intent.jobs` is
/// already there (a Citus worker): any other relation of that name makes the update fail, as the
/// two-step path does, rather than leave bound claims without their index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_step_update_from_0_4_0_is_not_fooled_by_a_relation_of_its_index_name() {
    let cluster = Cluster::shared();
    let name = format!("upgrade_planted_{}", std::process::id());
    cluster
        .connect("postgres")
        .await
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap();
    let c = cluster.connect(&name).await;
    c.batch_execute(
        "CREATE EXTENSION pg_intent VERSION '0.4.0';
         SET ROLE intent_owner;
         CREATE INDEX jobs_claimable_by_owner ON intent.contracts (name);
         RESET ROLE;",
    )
    .await
    .unwrap();
    let e = c
        .batch_execute("ALTER EXTENSION pg_intent UPDATE")
        .await
        .expect_err("the update must fail");
    assert_eq!(SqlError::from_error(&e).code, "42P07", "{e:?}");
    let version: String = c
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_intent'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, "0.4.0", "nothing changed");
}
