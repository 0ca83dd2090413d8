//! Who the functions run as: `intent_owner`, bound by row-level security, with a pinned
//! search_path; define_contract reads its caller and does its work as the owner.

use crate::privileges::definer_calls;
use pg_intent_tests::roles::*;
use pg_intent_tests::*;
use std::collections::BTreeSet;

/// The functions run as a role that row-level security binds; SECURITY DEFINER code that is
/// not C pins its search_path with a SET clause (the C functions pin it inside each call;
/// `nothing_planted_in_public_or_pg_temp_is_ever_used` proves they do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_run_as_an_owner_that_row_security_binds() {
    let db = Cluster::shared().fresh_db("sec_definer").await;
    let admin = db.connect().await;
    let owner = admin
        .query_one(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = 'intent_owner'",
            &[],
        )
        .await
        .unwrap();
    // On Citus, intent.distribute() makes intent_owner LOGIN on every node: Citus connects to
    // the workers as it (docs/scale-out.md).
    let on_citus: bool = admin
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (
            owner.get::<_, bool>(0),
            owner.get::<_, bool>(1),
            owner.get::<_, bool>(2)
        ),
        (false, false, on_citus),
        "intent_owner: no superuser, no BYPASSRLS, no login (but on Citus)"
    );
    let functions = intent_functions(&admin).await;
    let mut definers = BTreeSet::new();
    for f in &functions {
        // distribute() is run by superusers only, with their rights: it stays the installing
        // superuser's, so that whoever acts as intent_owner cannot rewrite it.
        let expected_owner = if f.signature == "intent.distribute()" {
            "postgres"
        } else {
            "intent_owner"
        };
        assert_eq!(
            f.owner, expected_owner,
            "{} is owned by {}",
            f.signature, f.owner
        );
        if f.security_definer {
            definers.insert(f.name.clone());
        }
        // owner_admits (the distributed mode's policies) is not a definer and names everything
        // it uses with its schema; a SET clause would stop the planner from inlining it.
        if f.language != "c"
            && f.language != "internal"
            && f.signature != "intent.owner_admits(text)"
        {
            assert_eq!(
                f.config.as_deref(),
                Some(&["search_path=pg_catalog, pg_temp".to_string()][..]),
                "{} ({}) must pin its search_path",
                f.signature,
                f.language
            );
        }
    }
    // Every call a role is granted that reads or writes the tables runs as intent_owner: as a
    // SECURITY DEFINER function, or (define_contract, which must know its caller) by switching
    // to its owner itself (contract_definer_is_read_and_the_work_runs_as_intent_owner).
    for name in definer_calls() {
        assert!(definers.contains(name), "{name} is not SECURITY DEFINER");
    }
    assert!(
        !definers.contains("define_contract"),
        "define_contract reads its caller"
    );
    for relation in intent_relations(&admin).await {
        assert_eq!(relation.owner, "intent_owner", "{}", relation.name);
    }
    for table in ["intent.jobs", "intent.attempts", "intent.events"] {
        let row = admin
            .query_one(
                "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0) && row.get::<_, bool>(1),
            "{table}: row-level security enabled and forced"
        );
    }
}

/// README § Privileges: the API functions are C functions, SECURITY DEFINER, that pin their
/// search path to pg_catalog inside each call (no SET clause: it would cost a settings change
/// per call); every other SECURITY DEFINER function (SQL or PL/pgSQL, which could resolve names
/// at run time) must carry `SET search_path = pg_catalog, pg_temp` (and qualify every name of ours). The shadow-object
/// tests (shadows.rs) prove that the pinning holds for the C functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_security_definer_function_pins_its_search_path() {
    let db = Cluster::shared().fresh_db("sec_proconfig").await;
    let admin = db.connect().await;
    let functions = intent_functions(&admin).await;
    let unpinned: Vec<String> = functions
        .iter()
        .filter(|f| {
            f.security_definer
                && f.language != "c"
                && f.config.as_deref() != Some(&["search_path=pg_catalog, pg_temp".to_string()][..])
        })
        .map(|f| f.signature.clone())
        .collect();
    assert!(
        unpinned.is_empty(),
        "without a pinned search_path: {unpinned:?}"
    );
    // And the C ones are exactly the API, all SECURITY DEFINER.
    let c_api: Vec<&str> = functions
        .iter()
        .filter(|f| f.language == "c" && f.security_definer)
        .map(|f| f.name.as_str())
        .collect();
    for call in definer_calls() {
        assert!(
            c_api.contains(&call),
            "{call} is not a SECURITY DEFINER C function: {c_api:?}"
        );
    }
}

/// define_contract is SECURITY INVOKER (so that it knows its caller) and does its work as
/// intent_owner: an intent_admin that may not write intent.contracts itself defines a contract,
/// and the contract records it as the definer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_definer_is_read_and_the_work_runs_as_intent_owner() {
    let db = Cluster::shared().fresh_db("sec_define").await;
    let admin = db.connect().await;
    let role = create_login_role(&admin, "definer", "IN ROLE intent_admin").await;
    let c = connect_role(&db, &role).await;
    assert_eq!(
        sqlstate_of(
            &c,
            "INSERT INTO intent.contracts (name, output_schema) VALUES ('x', '{}')"
        )
        .await
        .as_deref(),
        Some("42501")
    );
    c.query("SELECT intent.define_contract('mine', '{}')", &[])
        .await
        .unwrap();
    let defined_by: String = admin
        .query_one(
            "SELECT defined_by::text FROM intent.contracts WHERE name = 'mine'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(defined_by, role);
}
