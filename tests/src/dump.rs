//! Test support for backups: runs `pg_dump` and `pg_restore` of the PostgreSQL 15 installation
//! against a test cluster, as the `postgres` OS user when the tests run as root (as the
//! harness does for the server itself), and reads every row of the extension's tables.

use crate::{Client, Cluster, pg_bin, postgres_command};
use std::path::Path;
use std::process::{Output, Stdio};

/// Runs a client program of the server installation (`pg_dump`, `pg_restore`, …) with the
/// connection options of `cluster` (127.0.0.1, its port, user `postgres`) followed by `args`.
pub fn run_pg_tool(cluster: &Cluster, program: &str, args: &[&str]) -> Output {
    run_pg_tool_as(cluster, "postgres", program, args)
}

/// [`run_pg_tool`] connecting as the database role `user`.
pub fn run_pg_tool_as(cluster: &Cluster, user: &str, program: &str, args: &[&str]) -> Output {
    let mut cmd = postgres_command(&pg_bin().join(program));
    let port = cluster.port().to_string();
    cmd.args(["-h", "127.0.0.1", "-p", &port, "-U", user])
        .args(args)
        .current_dir(cluster.dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// `pg_dump --format=custom` of database `db` into `file` (which the `postgres` user must be
/// able to write: put it in [`Cluster::dir`]). Panics with the tool's output if it fails.
pub fn dump(cluster: &Cluster, db: &str, file: &Path) {
    let out = run_pg_tool(
        cluster,
        "pg_dump",
        &[
            "--format=custom",
            "--file",
            file.to_str().expect("utf-8 path"),
            db,
        ],
    );
    assert!(
        out.status.success(),
        "pg_dump failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pg_restore` of `file` into the existing (empty) database `db`, stopping at the first
/// error. Panics with the tool's output if it fails or reports any error.
pub fn restore(cluster: &Cluster, db: &str, file: &Path) {
    let out = run_pg_tool(
        cluster,
        "pg_restore",
        &[
            "--exit-on-error",
            "--dbname",
            db,
            file.to_str().expect("utf-8 path"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("error"),
        "pg_restore failed: {}\n{stderr}",
        out.status
    );
}

/// Every row of the extension's tables, each as its text form, in key order, with the state of
/// the identity sequences: equal snapshots mean equal contents.
pub async fn table_rows(c: &Client) -> Vec<(String, Vec<String>)> {
    let mut all = Vec::new();
    for (table, order) in [
        ("intent.contracts", "name"),
        ("intent.certifications", "id"),
        ("intent.jobs", "id"),
        ("intent.attempts", "id"),
        ("intent.events", "id"),
        ("intent.retired_keys", "id"),
    ] {
        let rows = c
            .query(
                &format!("SELECT t::text FROM {table} t ORDER BY {order}"),
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("read {table}: {e:?}"))
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        all.push((table.to_string(), rows));
    }
    for seq in ["intent.events_id_seq", "intent.certifications_id_seq"] {
        let state: String = c
            .query_one(
                &format!("SELECT last_value || ' ' || is_called FROM {seq}"),
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("read {seq}: {e:?}"))
            .get(0);
        all.push((seq.to_string(), vec![state]));
    }
    all
}
