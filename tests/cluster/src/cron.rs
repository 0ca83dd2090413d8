//! pg_cron for the scheduling tests (docs/scheduling.md): a cluster of its own with pg_cron
//! preloaded, and readers of pg_cron's tables.
//!
//! pg_cron is Debian's `postgresql-15-cron` (scripts/lib.sh installs it). It must be in
//! `shared_preload_libraries`, which only a restart applies, and it keeps its jobs in one
//! database, `cron.database_name`, fixed at start. So the scheduling tests cannot use the shared
//! cluster: [`CronCluster::start`] starts a [`Cluster`], sets those with `ALTER SYSTEM`, restarts
//! it, and creates `pg_intent` and `pg_cron` in the cron database. Jobs run in background
//! workers (`cron.use_background_workers`), so no password or `pg_hba.conf` entry is involved:
//! a job runs as the role it names, with that role's privileges.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::{Client, Cluster, StopMode, pg_bin};

/// Why pg_cron cannot be used here, if it cannot.
pub fn pg_cron_missing() -> Option<String> {
    let dir = |what: &str| -> Option<String> {
        let out = Command::new(pg_bin().join("pg_config"))
            .arg(what)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let lib = dir("--pkglibdir")?;
    let share = dir("--sharedir")?;
    let so = Path::new(&lib).join("pg_cron.so");
    let control = Path::new(&share).join("extension/pg_cron.control");
    if so.exists() && control.exists() {
        None
    } else {
        Some(format!(
            "pg_cron is not installed ({} or {} is missing): apt-get install postgresql-15-cron \
             (scripts/lib.sh does it)",
            so.display(),
            control.display()
        ))
    }
}

/// One row of `cron.job_run_details`, with its job's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronRun {
    pub jobname: String,
    pub database: String,
    pub username: String,
    pub command: String,
    pub status: String,
    pub return_message: Option<String>,
}

/// A cluster running pg_cron, its jobs kept in [`CronCluster::cron_db`].
pub struct CronCluster {
    pub cluster: Cluster,
    pub cron_db: String,
}

impl CronCluster {
    /// Starts a cluster with pg_cron preloaded, keeping its jobs in `cron_db`, which is created
    /// with the `pg_intent` and `pg_cron` extensions. Panics if pg_cron is not installed.
    pub async fn start(cron_db: &str) -> CronCluster {
        if let Some(why) = pg_cron_missing() {
            panic!("{why}");
        }
        let cluster = tokio::task::spawn_blocking(Cluster::start)
            .await
            .expect("start the cluster");
        let admin = cluster.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{cron_db}\""))
            .await
            .expect("CREATE DATABASE");
        drop(admin);
        // ALTER SYSTEM knows no cron.* settings until pg_cron is loaded, and pg_cron loads only
        // at start: write them to postgresql.conf while the server is down.
        let settings = format!(
            "\n# pg_intent scheduling tests\n\
             shared_preload_libraries = 'pg_cron'\n\
             cron.database_name = '{cron_db}'\n\
             cron.use_background_workers = on\n\
             max_worker_processes = 32\n"
        );
        let cluster = tokio::task::spawn_blocking(move || {
            cluster.stop(StopMode::Fast);
            let conf = cluster.data.join("postgresql.conf");
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&conf)
                .unwrap_or_else(|e| panic!("open {}: {e}", conf.display()));
            file.write_all(settings.as_bytes())
                .unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
            drop(file);
            cluster.restart();
            cluster
        })
        .await
        .expect("restart the cluster");
        let c = cluster.connect(cron_db).await;
        c.batch_execute("CREATE EXTENSION pg_intent; CREATE EXTENSION pg_cron;")
            .await
            .unwrap_or_else(|e| panic!("create the extensions in {cron_db}: {e:?}"));
        CronCluster {
            cluster,
            cron_db: cron_db.to_string(),
        }
    }

    /// Creates another database with `pg_intent` (its jobs are scheduled from the cron
    /// database with `cron.schedule_in_database`).
    pub async fn create_db(&self, name: &str) {
        let admin = self.cluster.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .expect("CREATE DATABASE");
        self.cluster
            .connect(name)
            .await
            .batch_execute("CREATE EXTENSION pg_intent")
            .await
            .expect("CREATE EXTENSION pg_intent");
    }

    /// Connects to `db` as the superuser `postgres`.
    pub async fn connect(&self, db: &str) -> Client {
        self.cluster.connect(db).await
    }

    /// Connects to `db` as `user` (the cluster trusts local connections).
    pub async fn connect_as_user(&self, db: &str, user: &str) -> Client {
        let mut config = self.cluster.config(db);
        config.user(user);
        let (client, connection) = config
            .connect(NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {db} as {user}: {e}"));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// The finished runs of the job named `jobname` so far (any owner), oldest first.
    pub async fn runs(&self, jobname: &str) -> Vec<CronRun> {
        let c = self.connect(&self.cron_db).await;
        c.query(
            "SELECT j.jobname, d.database, d.username, d.command, d.status, d.return_message
               FROM cron.job_run_details d JOIN cron.job j USING (jobid)
              WHERE j.jobname = $1 AND d.status IN ('succeeded', 'failed')
              ORDER BY d.runid",
            &[&jobname],
        )
        .await
        .expect("read cron.job_run_details")
        .iter()
        .map(|r| CronRun {
            jobname: r.get(0),
            database: r.get(1),
            username: r.get(2),
            command: r.get(3),
            status: r.get(4),
            return_message: r.get(5),
        })
        .collect()
    }

    /// Waits until every job in `jobnames` has finished at least one run, and returns the
    /// first run of each. pg_cron 1.4 (Debian 12) schedules by the minute, so this may take
    /// up to a minute; panics with the server log after `timeout`.
    pub async fn wait_for_runs(&self, jobnames: &[&str], timeout: Duration) -> Vec<CronRun> {
        let started = Instant::now();
        loop {
            let mut first = Vec::new();
            for name in jobnames {
                if let Some(run) = self.runs(name).await.into_iter().next() {
                    first.push(run);
                }
            }
            if first.len() == jobnames.len() {
                return first;
            }
            assert!(
                started.elapsed() < timeout,
                "after {timeout:?} only {} of {jobnames:?} have run: {first:?}\nserver log:\n{}",
                first.len(),
                self.cluster.server_log()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
