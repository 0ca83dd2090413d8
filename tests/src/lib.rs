//! Test support for pg_intent's integration tests: throwaway PostgreSQL clusters, fresh
//! databases with the extension, real (tokio-postgres) connections, and typed wrappers around
//! the SQL API so that the tests read like the SPEC.
//!
//! Every test binary starts ONE cluster of its own ([`Cluster::shared`]) and gives each test a
//! database of its own ([`Cluster::fresh_db`]), so tests never see each other's rows and may run
//! in parallel. A cluster is a real `initdb` + `pg_ctl` server listening on 127.0.0.1 on a free
//! port, with its socket and data in a temporary directory that is removed when the cluster is
//! dropped — or, for the shared cluster (a `static` is never dropped), by a small guardian
//! process that stops the server once the test process has exited, however it exited.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root (as CI does) the directory
//! is given to the `postgres` user and `initdb`/`pg_ctl` run through `runuser -u postgres --`.

pub mod cron;
pub mod dump;
pub mod fixtures;
pub mod model;
pub mod reliability;
pub mod roles;

use std::fmt;
use std::fs;
use std::future::Future;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use serde_json::{self, Value, json};
pub use tokio_postgres::{self, Client};
pub use uuid::Uuid;

use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

/// Where the server binaries live: Debian's PostgreSQL 15 unless `PG_INTENT_PG_BIN` names
/// another major's `bin` directory (scripts/test.sh sets it for each supported major).
pub fn pg_bin() -> PathBuf {
    std::env::var_os("PG_INTENT_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

const NOT_INSTALLED: &str = "the pg_intent extension is not installed into the server of \
     PG_INTENT_PG_BIN (default: Debian's PostgreSQL 15): run scripts/test.sh or cargo pgrx install first";

/// How many connections the test servers accept: a test opens up to 64 at once, and tests of
/// one binary may run in parallel.
const MAX_CONNECTIONS: u32 = 300;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A process-wide unique suffix: pid, a counter, and the clock.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn running_as_root() -> bool {
    // The owner of /proc/self is the process's effective uid.
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run `id postgres`");
        assert!(
            out.status.success(),
            "running as root, but there is no `postgres` user to own the test cluster"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("numeric id")
    };
    (id("-u"), id("-g"))
}

/// Whether a process exists and is not a zombie (a killed postmaster is nobody's child once
/// pg_ctl has exited, and a container's init may never reap it).
fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name: "pid (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The major version of the server binaries in `bin`.
pub fn major_of(bin: &Path) -> u32 {
    let out = Command::new(bin.join("pg_config"))
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}/pg_config --version: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .trim_start_matches("PostgreSQL ")
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read a major version from {text:?}"))
}

/// Checks that the extension's control file is where the server of `bin` looks for it.
fn check_extension_installed(bin: &Path) {
    let out = Command::new(bin.join("pg_config"))
        .arg("--sharedir")
        .output();
    let Ok(out) = out else { return }; // no pg_config: CREATE EXTENSION will tell
    if !out.status.success() {
        return;
    }
    let share = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let control = Path::new(&share).join("extension/pg_intent.control");
    assert!(
        control.exists(),
        "{NOT_INSTALLED} ({} does not exist)",
        control.display()
    );
}

/// How to stop a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `pg_ctl -m fast`: roll back open transactions, checkpoint, exit cleanly.
    Fast,
    /// `pg_ctl -m immediate`: exit without a checkpoint; crash recovery on the next start.
    Immediate,
}

/// A throwaway PostgreSQL cluster: its own directory, data, socket and port.
pub struct Cluster {
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
    guardian: Mutex<Option<Child>>,
    /// Server settings beyond the test defaults, as `-c name=value` options.
    settings: String,
    /// The server's bin directory ([`pg_bin`] unless started otherwise).
    bin: PathBuf,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish()
    }
}

impl Cluster {
    /// The cluster of this test binary, started on first use and stopped (by the guardian)
    /// when the test process exits; or, when `PG_INTENT_TEST_CLUSTER` is `DIR:PORT`, the
    /// running server whose socket and `server.log` are in DIR and data in DIR/data (the
    /// pg_upgrade test runs the failure points on the cluster it upgraded). An attached
    /// cluster is left running.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| match std::env::var("PG_INTENT_TEST_CLUSTER") {
            Ok(spec) => Cluster::attach(&spec),
            Err(_) => Cluster::start(),
        })
    }

    /// A running cluster this process did not start (see [`shared`](Self::shared)).
    fn attach(spec: &str) -> Cluster {
        let (dir, port) = spec
            .rsplit_once(':')
            .expect("PG_INTENT_TEST_CLUSTER is DIR:PORT");
        let dir = PathBuf::from(dir);
        Cluster {
            data: dir.join("data"),
            dir,
            port: port
                .parse()
                .expect("PG_INTENT_TEST_CLUSTER: a numeric port"),
            as_postgres: running_as_root(),
            guardian: Mutex::new(None),
            settings: String::new(),
            bin: pg_bin(),
        }
    }

    /// Creates and starts a new cluster: `initdb` into a temporary directory, then `pg_ctl start`
    /// on a free port of 127.0.0.1 with the socket in that directory. Blocks until it accepts
    /// connections. Panics with the server log if it cannot.
    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Like [`start`](Self::start), with server settings of its own (e.g.
    /// `("shared_preload_libraries", "pg_intent")`), given on the command line.
    pub fn start_with(settings: &[(&str, &str)]) -> Cluster {
        Cluster::start_in(&pg_bin(), settings)
    }

    /// Like [`start_with`](Self::start_with), with the server binaries of `bin` (another
    /// major's `bin` directory).
    pub fn start_in(bin: &Path, settings: &[(&str, &str)]) -> Cluster {
        check_extension_installed(bin);
        let as_postgres = running_as_root();
        let dir = std::env::temp_dir().join(unique("pg_intent_it"));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod 700");
        if as_postgres {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown to postgres");
        }
        let data = dir.join("data");
        let cluster = Cluster {
            dir,
            data,
            port: free_port(),
            as_postgres,
            guardian: Mutex::new(None),
            settings: settings
                .iter()
                .map(|(name, value)| format!(" -c {name}='{value}'"))
                .collect(),
            bin: bin.to_path_buf(),
        };
        cluster.spawn_guardian();

        cluster.initdb(&cluster.data, &[]);
        let mut cluster = cluster;
        cluster.start_on_a_free_port();
        cluster
    }

    /// initdb of a data directory, with this cluster's binaries.
    fn initdb(&self, data: &Path, extra: &[&str]) {
        let out = self.pg_command("initdb", |c| {
            c.arg("-D").arg(data).args(extra).args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]);
        });
        assert!(out.status.success(), "initdb failed: {}", describe(&out));
    }

    fn start_on_a_free_port(&mut self) {
        // Another process may take the port between free_port() and the bind: try a few.
        for round in 0.. {
            match self.try_start() {
                Ok(()) => break,
                Err(log) if round < 5 && log.contains("could not bind") => {
                    self.port = free_port();
                }
                Err(log) => panic!("the test server did not start:\n{log}"),
            }
        }
    }

    /// The server's major version, from `pg_config --version` of its binaries.
    pub fn major(&self) -> u32 {
        major_of(&self.bin)
    }

    /// Upgrades this cluster to the binaries of `new_bin` with `pg_upgrade`: stops it, runs
    /// initdb for the new major beside the old data directory, `pg_upgrade --check`, then
    /// `pg_upgrade`, and starts the new server on the same port, socket and log. The extension
    /// must be installed into both majors.
    pub fn upgrade_to(mut self, new_bin: &Path) -> Cluster {
        check_extension_installed(new_bin);
        self.stop(StopMode::Fast);
        let old_data = self.data.clone();
        let old_bin = self.bin.clone();
        self.bin = new_bin.to_path_buf();
        self.data = self.dir.join(format!("data{}", major_of(new_bin)));
        // pg_upgrade needs the new cluster's checksum setting to be the old one's; initdb
        // turns checksums on by default from 18 on, and our test clusters are made without.
        let extra: &[&str] = if self.major() >= 18 {
            &["--no-data-checksums"]
        } else {
            &[]
        };
        self.initdb(&self.data, extra);
        for check in [true, false] {
            let out = self.pg_command("pg_upgrade", |c| {
                c.current_dir(&self.dir)
                    .arg("-b")
                    .arg(&old_bin)
                    .arg("-B")
                    .arg(new_bin)
                    .arg("-d")
                    .arg(&old_data)
                    .arg("-D")
                    .arg(&self.data)
                    .arg("-s")
                    .arg(&self.dir)
                    .args(["-U", "postgres"])
                    .args([
                        "-p",
                        &free_port().to_string(),
                        "-P",
                        &free_port().to_string(),
                    ]);
                if check {
                    c.arg("--check");
                }
            });
            assert!(
                out.status.success(),
                "pg_upgrade{} failed: {}",
                if check { " --check" } else { "" },
                describe(&out)
            );
        }
        self.start_on_a_free_port();
        self
    }

    /// Leaves the server running after this process exits (the guardian is called off) and
    /// returns `DIR:PORT` for `PG_INTENT_TEST_CLUSTER`. Whoever uses it stops and removes it.
    pub fn keep(self) -> String {
        if let Some(mut guardian) = self.guardian.lock().unwrap().take() {
            let _ = guardian.kill();
            let _ = guardian.wait();
        }
        let spec = format!("{}:{}", self.dir.display(), self.port);
        std::mem::forget(self);
        spec
    }

    /// Runs a server binary, as `postgres` when we are root.
    fn pg_command(&self, program: &str, args: impl FnOnce(&mut Command)) -> Output {
        let bin = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        args(&mut cmd);
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }

    /// A shell process that stops the server and removes the directory once this process is
    /// gone: a `static` cluster is never dropped, and a test process may die of anything.
    fn spawn_guardian(&self) {
        // Any major's pg_ctl stops any major's server: the old one's is as good after an
        // upgrade. The data directory of the moment is read from the file the cluster keeps.
        let pg_ctl = self.bin.join("pg_ctl");
        let run_as = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let script = format!(
            "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; \
             cd /; for d in \"$3\"/data*; do {run_as}\"$2\" -D \"$d\" -m immediate stop >/dev/null 2>&1; done; \
             rm -rf \"$3\""
        );
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("pg_intent_guardian")
            .arg(std::process::id().to_string())
            .arg(&pg_ctl)
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the cleanup guardian");
        *self.guardian.lock().unwrap() = Some(child);
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The server log so far (for failure messages).
    pub fn server_log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn try_start(&self) -> Result<(), String> {
        let log_before = self.server_log().len();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections={MAX_CONNECTIONS} \
             -c shared_buffers=32MB -c max_locks_per_transaction=128{}",
            self.port,
            self.dir.display(),
            self.settings
        );
        let out = self.pg_command("pg_ctl", |c| {
            c.arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(self.log_path())
                .args(["-w", "-t", "120", "-o", &options, "start"]);
        });
        if out.status.success() {
            Ok(())
        } else {
            let log = self.server_log();
            Err(format!(
                "{}\nserver log:\n{}",
                describe(&out),
                log.get(log_before..).unwrap_or(&log)
            ))
        }
    }

    /// The TCP port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the socket, the data directory and the server log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The connection parameters of database `db`.
    pub fn config(&self, db: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(db)
            .connect_timeout(Duration::from_secs(30));
        config
    }

    /// Connects to database `db`; the connection is driven by a task on the current runtime.
    pub async fn connect(&self, db: &str) -> Client {
        self.connect_as(db, "pg_intent_tests").await
    }

    /// Connects to database `db` with an `application_name` (to find the session in
    /// `pg_stat_activity`).
    pub async fn connect_as(&self, db: &str, application_name: &str) -> Client {
        let mut config = self.config(db);
        config.application_name(application_name);
        let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to database {db} on 127.0.0.1:{}: {e}",
                self.port
            )
        });
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    /// Creates a new database and runs `CREATE EXTENSION pg_intent` in it.
    pub async fn fresh_db(&self, prefix: &str) -> Db<'_> {
        let name = unique(prefix).to_lowercase();
        let admin = self.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let db = Db {
            cluster: self,
            name: name.clone(),
        };
        let client = db.connect().await;
        if let Err(e) = client.batch_execute("CREATE EXTENSION pg_intent").await {
            let err = SqlError::from_error(&e);
            panic!("CREATE EXTENSION pg_intent failed ({err:?}): {NOT_INSTALLED}");
        }
        // Mutation checks (see tests/mutations/README.md): break the extension on purpose in
        // this throwaway database, to prove that the tests notice.
        if let Some(path) = std::env::var_os("PG_INTENT_TESTS_SABOTAGE") {
            let sql = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", Path::new(&path).display()));
            client
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("sabotage {}: {e:?}", Path::new(&path).display()));
        }
        db
    }

    /// The postmaster's process id, from `postmaster.pid` (None when the server is down).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        process_alive(pid).then_some(pid)
    }

    /// `pg_postmaster_start_time()` as seconds since the epoch (with microseconds).
    pub async fn postmaster_start_time(&self) -> f64 {
        let client = self.connect("postgres").await;
        client
            .query_one(
                "SELECT extract(epoch FROM pg_postmaster_start_time())::float8",
                &[],
            )
            .await
            .expect("pg_postmaster_start_time()")
            .get(0)
    }

    /// Stops the server with `pg_ctl stop -m fast|immediate`, waiting until it is down.
    pub fn stop(&self, mode: StopMode) {
        let mode = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        let out = self.pg_command("pg_ctl", |c| {
            c.arg("-D")
                .arg(&self.data)
                .args(["-m", mode, "-w", "-t", "120", "stop"]);
        });
        assert!(
            out.status.success(),
            "pg_ctl stop -m {mode} failed: {}",
            describe(&out)
        );
    }

    /// Kills the postmaster with SIGKILL (a crash: no checkpoint, no clean shutdown) and waits
    /// until it and every backend are gone, so that the cluster can be restarted.
    pub fn kill_postmaster(&self) {
        let pid = self
            .postmaster_pid()
            .expect("kill_postmaster: the server is not running");
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL {pid} failed");
        let deadline = Instant::now() + Duration::from_secs(60);
        while process_alive(pid) {
            assert!(
                Instant::now() < deadline,
                "postmaster {pid} survived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again (after [`stop`](Self::stop) or
    /// [`kill_postmaster`](Self::kill_postmaster)) on the same port. After a crash the
    /// orphaned backends need a moment to notice and exit; until they have, the new postmaster
    /// refuses to start, so this retries for a while.
    pub fn restart(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.try_start() {
                Ok(()) => return,
                Err(log) if Instant::now() < deadline => {
                    let _ = log;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(log) => panic!("the test server did not restart:\n{log}"),
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_command("pg_ctl", |c| {
            c.arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"]);
        });
        if let Some(mut guardian) = self.guardian.lock().unwrap().take() {
            let _ = guardian.kill();
            let _ = guardian.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A database of a test cluster with the extension created.
#[derive(Debug)]
pub struct Db<'c> {
    pub cluster: &'c Cluster,
    pub name: String,
}

impl Db<'_> {
    /// A new connection to this database.
    pub async fn connect(&self) -> Client {
        self.cluster.connect(&self.name).await
    }

    /// A new connection with an `application_name`.
    pub async fn connect_as(&self, application_name: &str) -> Client {
        self.cluster.connect_as(&self.name, application_name).await
    }

    /// `n` connections, opened concurrently, all with the same `application_name`.
    pub async fn connect_many(&self, n: usize, application_name: &str) -> Vec<Arc<Client>> {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let config = {
                let mut c = self.cluster.config(&self.name);
                c.application_name(application_name);
                c
            };
            set.spawn(async move {
                let (client, connection) = config
                    .connect(NoTls)
                    .await
                    .unwrap_or_else(|e| panic!("connection {i}: {e}"));
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Arc::new(client)
            });
        }
        let mut clients = Vec::with_capacity(n);
        while let Some(client) = set.join_next().await {
            clients.push(client.expect("connect task"));
        }
        clients
    }
}

/// Runs `call(i, client)` on every client at the same instant: one task per connection, all
/// released together by a barrier once every task is ready. Returns the answers in client order.
pub async fn stampede<T, F, Fut>(clients: &[Arc<Client>], call: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, Arc<Client>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let handles: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let barrier = barrier.clone();
            let work = call(i, client.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(handles.len());
    for handle in handles {
        answers.push(handle.await.expect("a stampede task panicked"));
    }
    answers
}

// --- errors ----------------------------------------------------------------------------------

/// What a client sees of a server error: the SQLSTATE and the fields clients match on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// The SQLSTATE exactly as it arrived (`DbError::code().code()`).
    pub code: String,
    pub severity: String,
    pub message: String,
    /// The DETAIL's sentence (its facts line, if any, is in `facts`).
    pub detail: Option<String>,
    /// The facts line of the DETAIL, parsed (`pg_intent_protocol::facts`).
    pub facts: Option<pg_intent_protocol::Facts>,
    pub hint: Option<String>,
}

impl SqlError {
    /// The server error inside a tokio-postgres error; panics if it is not one (a broken
    /// connection, a type mismatch on our side …): tests must see the server's answer.
    #[track_caller]
    pub fn from_error(e: &tokio_postgres::Error) -> SqlError {
        let db = e
            .as_db_error()
            .unwrap_or_else(|| panic!("expected a server error, got: {e:?}"));
        SqlError {
            code: db.code().code().to_string(),
            severity: db.severity().to_string(),
            message: db.message().to_string(),
            detail: db
                .detail()
                .map(|d| pg_intent_protocol::Facts::prose(d).to_string()),
            facts: db.detail().and_then(pg_intent_protocol::Facts::from_detail),
            hint: db.hint().map(str::to_string),
        }
    }

    /// The SQLSTATE of a tokio-postgres error, if it came from the server.
    pub fn code_of(e: &tokio_postgres::Error) -> Option<String> {
        e.as_db_error().map(|d| d.code().code().to_string())
    }

    /// The DETAIL, which must be present.
    #[track_caller]
    pub fn detail(&self) -> &str {
        self.detail
            .as_deref()
            .unwrap_or_else(|| panic!("{} without a DETAIL: {self:?}", self.code))
    }

    /// The HINT, which must be present.
    #[track_caller]
    pub fn hint(&self) -> &str {
        self.hint
            .as_deref()
            .unwrap_or_else(|| panic!("{} without a HINT: {self:?}", self.code))
    }
}

/// Runs a statement that must fail, and returns the server's error.
pub async fn expect_error(client: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> SqlError {
    match client.query(sql, params).await {
        Ok(rows) => panic!("expected an error from {sql}, got {} row(s)", rows.len()),
        Err(e) => SqlError::from_error(&e),
    }
}

/// Unwraps a refusal that must have the given SQLSTATE.
#[track_caller]
pub fn refusal<T: fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    expected_code: &str,
) -> SqlError {
    match result {
        Ok(v) => panic!("expected SQLSTATE {expected_code}, got success: {v:?}"),
        Err(e) => {
            let err = SqlError::from_error(&e);
            assert_eq!(err.code, expected_code, "unexpected error: {err:?}");
            err
        }
    }
}

// --- the SQL API, typed --------------------------------------------------------------------

/// Answer of `intent.submit_job`.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub job_id: Uuid,
    pub created: bool,
    pub state: String,
    pub version: i64,
    pub result: Option<Value>,
}

/// Answer of `intent.begin_attempt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begun {
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    pub version: i64,
}

/// `intent.submit_job(owner, key, provider, params)` with the defaults.
pub async fn submit(
    c: &Client,
    owner: &str,
    key: &str,
    provider: &str,
    params: &Value,
) -> Result<Submitted, tokio_postgres::Error> {
    submit_full(c, owner, key, provider, params, None, 3).await
}

/// `intent.submit_job` with every argument.
pub async fn submit_full(
    c: &Client,
    owner: &str,
    key: &str,
    provider: &str,
    params: &Value,
    contract: Option<&str>,
    max_attempts: i32,
) -> Result<Submitted, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT job_id, created, state::text, version, result
               FROM intent.submit_job($1, $2, $3, $4, $5, $6)",
            &[&owner, &key, &provider, params, &contract, &max_attempts],
        )
        .await?;
    Ok(Submitted {
        job_id: row.get(0),
        created: row.get(1),
        state: row.get(2),
        version: row.get(3),
        result: row.get(4),
    })
}

/// `intent.begin_attempt(job, provider, lease)`; `lease` is an interval literal ('30 seconds').
pub async fn begin(
    c: &Client,
    job_id: Uuid,
    provider: Option<&str>,
    lease: &str,
) -> Result<Begun, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT attempt_id, attempt_no, version
               FROM intent.begin_attempt($1, $2, $3::text::interval)",
            &[&job_id, &provider, &lease],
        )
        .await?;
    Ok(Begun {
        attempt_id: row.get(0),
        attempt_no: row.get(1),
        version: row.get(2),
    })
}

/// `intent.complete_attempt`: `won`, `lost` or `rejected`.
pub async fn complete(
    c: &Client,
    attempt_id: Uuid,
    version: i64,
    result: &Value,
) -> Result<String, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.complete_attempt($1, $2, $3)::text",
            &[&attempt_id, &version, result],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.fail_attempt`: the job's state afterwards.
pub async fn fail(
    c: &Client,
    attempt_id: Uuid,
    version: i64,
    error: &Value,
    retryable: bool,
) -> Result<String, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.fail_attempt($1, $2, $3, $4)::text",
            &[&attempt_id, &version, error, &retryable],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.mark_unknown`.
pub async fn mark_unknown(
    c: &Client,
    attempt_id: Uuid,
    reason: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    c.query_one(
        "SELECT intent.mark_unknown($1, $2)::text",
        &[&attempt_id, &reason],
    )
    .await?;
    Ok(())
}

/// `intent.heartbeat`; `extend` is an interval literal.
pub async fn heartbeat(
    c: &Client,
    attempt_id: Uuid,
    extend: Option<&str>,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one(
            "SELECT intent.heartbeat($1, $2::text::interval)",
            &[&attempt_id, &extend],
        )
        .await?;
    Ok(row.get(0))
}

/// `intent.abandon_attempt`.
pub async fn abandon(
    c: &Client,
    attempt_id: Uuid,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    c.query_one(
        "SELECT intent.abandon_attempt($1, $2)::text",
        &[&attempt_id, &reason],
    )
    .await?;
    Ok(())
}

/// `intent.cancel_job`.
pub async fn cancel(
    c: &Client,
    job_id: Uuid,
    reason: Option<&str>,
) -> Result<bool, tokio_postgres::Error> {
    let row = c
        .query_one("SELECT intent.cancel_job($1, $2)", &[&job_id, &reason])
        .await?;
    Ok(row.get(0))
}

/// `intent.sweep()`.
pub async fn sweep(c: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = c.query_one("SELECT intent.sweep()", &[]).await?;
    Ok(row.get(0))
}

/// The job id the SPEC derives, computed client side (no database involved).
pub fn job_id_of(owner: &str, key: &str) -> Uuid {
    Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(owner, key))
}

/// The id of attempt `n` of a job, computed client side.
pub fn attempt_id_of(job_id: Uuid, n: i64) -> Uuid {
    Uuid::from_bytes(
        pg_intent_protocol::attempt_id(*job_id.as_bytes(), n).expect("valid attempt_no"),
    )
}

// --- reading the tables ----------------------------------------------------------------------

/// One row of `intent.jobs`, as the tests look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: Uuid,
    pub state: String,
    pub version: i64,
    pub completed_by: Option<Uuid>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub attempt_count: i32,
    pub provider: String,
    pub params: Value,
    pub contract: Option<String>,
}

/// The job row (panics when there is none).
pub async fn job_row(c: &Client, job_id: Uuid) -> JobRow {
    let row = c
        .query_one(
            "SELECT id, state::text, version, completed_by, result, error, attempt_count,
                    provider, params, contract
               FROM intent.jobs WHERE id = $1",
            &[&job_id],
        )
        .await
        .unwrap_or_else(|e| panic!("read job {job_id}: {e}"));
    JobRow {
        id: row.get(0),
        state: row.get(1),
        version: row.get(2),
        completed_by: row.get(3),
        result: row.get(4),
        error: row.get(5),
        attempt_count: row.get(6),
        provider: row.get(7),
        params: row.get(8),
        contract: row.get(9),
    }
}

/// The job row exactly as stored: its full text form plus its physical identity (`ctid`,
/// `xmin`), so that a comparison proves the row was not even rewritten with equal values.
pub async fn job_row_raw(c: &Client, job_id: Uuid) -> String {
    c.query_one(
        "SELECT j.ctid::text || ' xmin=' || j.xmin::text || ' ' || j::text
           FROM intent.jobs j WHERE id = $1",
        &[&job_id],
    )
    .await
    .unwrap_or_else(|e| panic!("read job {job_id}: {e}"))
    .get(0)
}

/// One row of `intent.attempts`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    pub id: Uuid,
    pub attempt_no: i32,
    pub provider: String,
    pub state: String,
    pub version_read: i64,
    pub finished: bool,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

/// The attempts of a job, by number.
pub async fn attempt_rows(c: &Client, job_id: Uuid) -> Vec<AttemptRow> {
    c.query(
        "SELECT id, attempt_no, provider, state::text, version_read, finished_at IS NOT NULL,
                result, error
           FROM intent.attempts WHERE job_id = $1 ORDER BY attempt_no",
        &[&job_id],
    )
    .await
    .expect("read attempts")
    .iter()
    .map(|r| AttemptRow {
        id: r.get(0),
        attempt_no: r.get(1),
        provider: r.get(2),
        state: r.get(3),
        version_read: r.get(4),
        finished: r.get(5),
        result: r.get(6),
        error: r.get(7),
    })
    .collect()
}

/// One attempt row (panics when there is none).
pub async fn attempt_row(c: &Client, attempt_id: Uuid) -> AttemptRow {
    let job =
        Uuid::from_bytes(pg_intent_protocol::job_of(*attempt_id.as_bytes()).expect("attempt id"));
    attempt_rows(c, job)
        .await
        .into_iter()
        .find(|a| a.id == attempt_id)
        .unwrap_or_else(|| panic!("no attempt {attempt_id}"))
}

/// One row of `intent.events`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub kind: String,
    pub attempt_id: Option<Uuid>,
    pub detail: Value,
}

/// The events of a job, in order.
pub async fn event_rows(c: &Client, job_id: Uuid) -> Vec<EventRow> {
    c.query(
        "SELECT kind, attempt_id, detail FROM intent.events WHERE job_id = $1 ORDER BY id",
        &[&job_id],
    )
    .await
    .expect("read events")
    .iter()
    .map(|r| EventRow {
        kind: r.get(0),
        attempt_id: r.get(1),
        detail: r.get(2),
    })
    .collect()
}

/// Everything the extension stores, summarised: row counts and a digest of every row (with
/// its physical identity) of `intent.jobs`, `intent.attempts` and `intent.events`. Equal
/// digests before and after a call prove that the call wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub jobs: i64,
    pub attempts: i64,
    pub events: i64,
    pub md5: String,
}

/// The [`Digest`] of the database `c` is connected to.
pub async fn digest(c: &Client) -> Digest {
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM intent.jobs),
                    (SELECT count(*) FROM intent.attempts),
                    (SELECT count(*) FROM intent.events),
                    md5(coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.jobs t), '')
                     || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.attempts t), '')
                     || '#' || coalesce((SELECT string_agg(t.ctid::text || t.xmin::text || t::text, '|' ORDER BY t.id) FROM intent.events t), ''))",
            &[],
        )
        .await
        .expect("digest");
    Digest {
        jobs: row.get(0),
        attempts: row.get(1),
        events: row.get(2),
        md5: row.get(3),
    }
}

/// The backend process id of a connection.
pub async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid()")
        .get(0)
}

/// Waits until `n` sessions named `application_name` are waiting for a lock (proof that
/// concurrent calls really are queued behind one another), or panics after `timeout`.
pub async fn wait_for_lock_waiters(
    observer: &Client,
    application_name: &str,
    n: i64,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&application_name],
            )
            .await
            .expect("read pg_stat_activity")
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {waiting} of {n} sessions '{application_name}' are waiting for a lock after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sleeps until the server's clock has passed `deadline` of an attempt (read from the table),
/// so that lease tests do not depend on the two clocks agreeing.
pub async fn wait_past_deadline(c: &Client, attempt_id: Uuid) {
    let started = Instant::now();
    loop {
        let past: bool = c
            .query_one(
                "SELECT deadline < clock_timestamp() FROM intent.attempts WHERE id = $1",
                &[&attempt_id],
            )
            .await
            .expect("read deadline")
            .get(0);
        if past {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "attempt {attempt_id} never ran out of lease"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Makes sure a contract named `name` can be referenced by a job: defines it with an
/// accept-anything schema when the installed extension has `intent.define_contract` (once
/// contracts exist, a job must name a defined one); does nothing on a build without contracts.
/// Returns whether contracts are supported.
pub async fn ensure_contract(c: &Client, name: &str) -> bool {
    let supported: bool = c
        .query_one(
            "SELECT to_regprocedure('intent.define_contract(text,jsonb,regprocedure)') IS NOT NULL",
            &[],
        )
        .await
        .expect("look up intent.define_contract")
        .get(0);
    if supported {
        c.query("SELECT intent.define_contract($1, '{}'::jsonb)", &[&name])
            .await
            .unwrap_or_else(|e| panic!("define contract {name}: {e:?}"));
    }
    supported
}
