//! A real Citus cluster on loopback — a coordinator and two workers — for the `citus` target
//! (where [`Cluster::shared`] is its coordinator and [`Cluster::fresh_db`] a distributed
//! database) and for the distributed mode's own tests (tests/tests/citus.rs). One copy of the
//! start-up and the database set-up serves both; a test binary starts the nodes once.
//!
//! The nodes need a PostgreSQL whose library directory has `citus.so` and pg_intent installed:
//! `PG_INTENT_CITUS_BIN` names its `bin` directory (for the `citus` target, [`pg_bin`] serves
//! when it is unset, and must have Citus).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::{Client, Cluster, Db, Target, pg_bin, server_error, target, unique};

/// The server settings of every node. Citus starts a maintenance worker (distributed deadlock
/// detection, 2PC recovery) per database: a test binary makes many databases.
pub const SETTINGS: &[(&str, &str)] = &[
    ("shared_preload_libraries", "citus"),
    ("max_prepared_transactions", "100"),
    ("max_connections", "200"),
    ("max_worker_processes", "64"),
];

/// The Citus installation: `PG_INTENT_CITUS_BIN`, or for the `citus` target [`pg_bin`]; None
/// when neither applies. A directory named that has no Citus is a mistake, not a skip.
pub fn citus_bin() -> Option<PathBuf> {
    let bin = match std::env::var_os("PG_INTENT_CITUS_BIN") {
        Some(bin) => PathBuf::from(bin),
        None if target() == Target::Citus => pg_bin(),
        None => return None,
    };
    let out = Command::new(bin.join("pg_config"))
        .arg("--pkglibdir")
        .output()
        .unwrap_or_else(|e| panic!("Citus in {}: no pg_config: {e}", bin.display()));
    let lib = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        Path::new(&lib).join("citus.so").exists(),
        "Citus in {} (PG_INTENT_CITUS_BIN, or PG_INTENT_PG_BIN for PG_INTENT_TARGET=citus): \
         {lib}/citus.so does not exist",
        bin.display()
    );
    Some(bin)
}

/// A coordinator and its workers.
pub struct Nodes {
    pub coordinator: Cluster,
    pub workers: Vec<Cluster>,
}

impl Nodes {
    /// The coordinator, then every worker.
    pub fn all(&self) -> impl Iterator<Item = &Cluster> {
        std::iter::once(&self.coordinator).chain(&self.workers)
    }
}

static NODES: OnceLock<Option<Nodes>> = OnceLock::new();

/// Databases are set up one at a time: roles are cluster-wide and Citus propagates their
/// changes to every node.
pub static SETUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The 1+2 cluster, started once for the whole test binary; None without Citus.
pub fn nodes() -> Option<&'static Nodes> {
    NODES
        .get_or_init(|| {
            let bin = citus_bin()?;
            let start = || Cluster::start_in(&bin, SETTINGS);
            Some(Nodes {
                coordinator: start(),
                workers: vec![start(), start()],
            })
        })
        .as_ref()
}

/// Whether `cluster` is the coordinator of [`nodes`] (its databases are made by
/// [`distributed_db`]).
pub(crate) fn is_coordinator(cluster: &Cluster) -> bool {
    NODES
        .get()
        .and_then(Option::as_ref)
        .is_some_and(|n| std::ptr::eq(&n.coordinator, cluster))
}

/// A new database on every node, Citus in each, the workers added, pg_intent created on the
/// coordinator (Citus creates it on the workers): not yet distributed.
pub async fn citus_db(n: &'static Nodes, prefix: &str) -> Db<'static> {
    let name = unique(prefix).to_lowercase();
    let _one_at_a_time = SETUP.lock().await;
    for node in n.all() {
        node.connect("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {}", server_error(&e)));
        node.connect(&name)
            .await
            .batch_execute("CREATE EXTENSION citus")
            .await
            .unwrap_or_else(|e| panic!("CREATE EXTENSION citus: {}", server_error(&e)));
    }
    let c = n.coordinator.connect(&name).await;
    join_nodes(&c, n).await;
    c.batch_execute("CREATE EXTENSION pg_intent")
        .await
        .unwrap_or_else(|e| panic!("CREATE EXTENSION pg_intent: {}", server_error(&e)));
    Db {
        cluster: &n.coordinator,
        name,
    }
}

/// Makes the database `c` is connected to on the coordinator a Citus cluster of the nodes.
pub async fn join_nodes(c: &Client, n: &Nodes) {
    c.execute(
        "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
        &[&i32::from(n.coordinator.port())],
    )
    .await
    .unwrap_or_else(|e| panic!("citus_set_coordinator_host: {}", server_error(&e)));
    for w in &n.workers {
        c.execute(
            "SELECT citus_add_node('127.0.0.1', $1)",
            &[&i32::from(w.port())],
        )
        .await
        .unwrap_or_else(|e| panic!("citus_add_node: {}", server_error(&e)));
    }
}

/// `SELECT intent.distribute()` in `db`, which must answer that it distributed the tables.
pub async fn distribute(db: &Db<'_>) {
    let _one_at_a_time = SETUP.lock().await;
    let answer: String = db
        .connect()
        .await
        .query_one("SELECT intent.distribute()", &[])
        .await
        .unwrap_or_else(|e| panic!("intent.distribute(): {}", server_error(&e)))
        .get(0);
    assert!(answer.starts_with("distributed"), "{answer}");
}

/// [`citus_db`], distributed.
pub async fn distributed_db(n: &'static Nodes, prefix: &str) -> Db<'static> {
    let db = citus_db(n, prefix).await;
    distribute(&db).await;
    db
}
