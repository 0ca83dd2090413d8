//! A throwaway PostgreSQL 15 cluster for the client's tests and benchmark.
//!
//! One cluster per test binary (started on first use), one fresh database with
//! `CREATE EXTENSION pg_intent` per test. The cluster lives in a temporary directory, listens on
//! 127.0.0.1 at a free port with its socket in that directory, trusts local connections, and is
//! stopped (`-m immediate`) and deleted when dropped — for the shared one, when the test process
//! exits. As root (as CI runs) every server command runs as `postgres` via `runuser`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pg_intent_client::Connection;

/// Where initdb, pg_ctl and postgres are. `PG_INTENT_PG_BIN` overrides it, e.g. to test
/// against a packaged build (`cargo pgrx package`) laid over a copy of the installation.
fn bin_dir() -> PathBuf {
    std::env::var_os("PG_INTENT_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// A running cluster; stopped and deleted on drop.
pub struct Cluster {
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    next_db: AtomicUsize,
    template: tokio::sync::OnceCell<()>,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn check(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Cluster {
    /// initdb + start. Retries on another port if the chosen one was taken meanwhile.
    pub fn start() -> Cluster {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "pg_intent_client_{}_{}_{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        let as_postgres = is_root();
        let mut cluster = Cluster {
            dir,
            port: 0,
            as_postgres,
            next_db: AtomicUsize::new(0),
            template: tokio::sync::OnceCell::new(),
        };
        if as_postgres {
            check(
                "chown",
                Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&cluster.dir)
                    .output(),
            );
        }
        let data = cluster.data_dir();
        check(
            "initdb",
            cluster
                .server_cmd("initdb")
                .arg("-D")
                .arg(&data)
                .args([
                    "--auth=trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "-N",
                ])
                .output(),
        );
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port();
            let opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 \
                 -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                cluster.port,
                cluster.dir.display()
            );
            let out = cluster
                .server_cmd("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(cluster.dir.join("server.log"))
                .args(["-w", "-t", "60", "-o", &opts, "start"])
                .output()
                .expect("pg_ctl start");
            if out.status.success() {
                return cluster;
            }
            last = format!(
                "{}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(cluster.dir.join("server.log")).unwrap_or_default()
            );
        }
        panic!("could not start the cluster:\n{last}");
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn server_cmd(&self, program: &str) -> Command {
        let path = bin_dir().join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// The port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection string for `dbname`.
    pub fn conn_str(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname}",
            self.port
        )
    }

    /// A connection string for `dbname`, as `user` (a role a test created).
    pub fn conn_str_as(&self, dbname: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname}",
            self.port
        )
    }

    /// Connects to `dbname`, driving the connection on a spawned task.
    pub async fn connect(&self, dbname: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.conn_str(dbname), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {dbname}: {e}"));
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// Creates a fresh database with the extension installed, and returns its name.
    ///
    /// The extension is created once, in a template database that every test database is copied
    /// from: faster than `CREATE EXTENSION` per test, and it keeps concurrent tests from racing
    /// on the cluster-wide objects the extension's script creates.
    pub async fn create_db(&self) -> String {
        self.template
            .get_or_init(|| async {
                let admin = self.connect("postgres").await;
                admin
                    .batch_execute("CREATE DATABASE intent_template")
                    .await
                    .expect("CREATE DATABASE intent_template");
                let c = self.connect("intent_template").await;
                c.batch_execute("CREATE EXTENSION pg_intent")
                    .await
                    .expect("CREATE EXTENSION pg_intent");
            })
            .await;
        let name = format!("t{}", self.next_db.fetch_add(1, Ordering::Relaxed));
        let admin = self.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE intent_template"))
            .await
            .expect("CREATE DATABASE");
        name
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .server_cmd("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static SHARED: OnceLock<Mutex<Option<Arc<Cluster>>>> = OnceLock::new();

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn stop_shared() {
    if let Some(slot) = SHARED.get() {
        let cluster = slot.lock().map(|mut s| s.take());
        drop(cluster);
    }
}

/// The cluster of this test process, started on first use and stopped when the process exits.
pub fn shared() -> Arc<Cluster> {
    let slot = SHARED.get_or_init(|| Mutex::new(None));
    let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = guard.as_ref() {
        return c.clone();
    }
    let cluster = Arc::new(Cluster::start());
    *guard = Some(cluster.clone());
    // SAFETY: registering a plain `extern "C" fn()` with the C library.
    unsafe {
        atexit(stop_shared);
    }
    cluster
}

/// A fresh database in the shared cluster.
pub struct TestDb {
    pub cluster: Arc<Cluster>,
    pub name: String,
}

impl TestDb {
    /// A new database with `pg_intent` installed.
    pub async fn new() -> TestDb {
        let cluster = tokio::task::spawn_blocking(shared).await.unwrap();
        let name = cluster.create_db().await;
        TestDb { cluster, name }
    }

    /// A bare tokio-postgres client.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.cluster.connect(&self.name).await
    }

    /// A client wrapped with its statement cache.
    pub async fn conn(&self) -> Connection {
        Connection::new(self.client().await)
    }

    /// The connection string.
    pub fn conn_str(&self) -> String {
        self.cluster.conn_str(&self.name)
    }
}

/// Polls `f` until it is true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
