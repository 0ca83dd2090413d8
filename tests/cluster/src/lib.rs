//! The test-cluster harness of pg_intent: throwaway PostgreSQL clusters with the extension,
//! fresh databases, real (tokio-postgres) connections; used by the integration tests
//! (pg_intent_tests), the client's tests and benchmark, and the gateway's tests.
//!
//! A test binary starts ONE cluster of its own ([`Cluster::shared`], or [`Cluster::shared_fast`]
//! for suites that never crash a server) and gives each test a database of its own
//! ([`Cluster::fresh_db`], [`Cluster::fresh_db_copied`]), so tests never see each other's rows
//! and may run in parallel. A cluster is a real `initdb` + `pg_ctl` server listening on
//! 127.0.0.1 on a free port, with its socket and data in a temporary directory that is removed
//! when the cluster is dropped — or, for a shared cluster (a `static` is never dropped), by a
//! small guardian process that stops the server once the test process has exited, however it
//! exited.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root (as CI does) the directory
//! is given to the `postgres` user and `initdb`/`pg_ctl` run through `runuser -u postgres --`.
//!
//! The same tests run against every **target** ([`target`], `PG_INTENT_TARGET`; tests/README.md
//! § Targets), the way a driver test suite takes a driver:
//! - `native` (the default): one node, the single-node statements.
//! - `native-distributed`: every cluster this harness starts runs with
//!   `intent.force_distributed_statements=on`, so one node runs the distributed mode's
//!   statements ([`Cluster::fresh_db`] checks that the switch took effect).
//! - `citus`: [`Cluster::shared`] (and [`Cluster::shared_fast`]) is the coordinator of a real
//!   Citus cluster of one coordinator and two workers on loopback ([`citus`]), and its
//!   [`fresh_db`](Cluster::fresh_db) makes the database on every node, adds the workers,
//!   creates pg_intent and runs `SELECT intent.distribute()`. Clusters a test starts itself
//!   ([`Cluster::start_with`] …) stay single-node.
//!
//! Environment:
//! - `PG_INTENT_TARGET`: `native` (default), `native-distributed` or `citus`.
//! - `PG_INTENT_PG_BIN`: the server's `bin` directory (default: Debian's PostgreSQL 15).
//! - `PG_INTENT_CITUS_BIN`: the `bin` directory of a PostgreSQL with Citus and pg_intent, for
//!   the Citus nodes (default for the `citus` target: `PG_INTENT_PG_BIN`'s).
//! - `PG_INTENT_TEST_CLUSTER=DIR:PORT`: attach the shared cluster to a running server (see
//!   [`Cluster::keep`]) instead of starting one.
//! - `PG_INTENT_TESTS_SABOTAGE=FILE`: SQL run in every fresh database after
//!   `CREATE EXTENSION` (tests/mutations/run.sh).
//!
//! (`PG_INTENT_UPGRADE_TO_BIN` and `PG_INTENT_KEEP_UPGRADED` are read by the pg_upgrade test,
//! which calls [`Cluster::start_in`], [`Cluster::upgrade_to`] and [`Cluster::keep`].)

pub mod citus;
pub mod cron;

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

pub use tokio_postgres::{self, Client};

use tokio_postgres::NoTls;

/// Where the server binaries live: Debian's PostgreSQL 15 unless `PG_INTENT_PG_BIN` names
/// another major's `bin` directory (scripts/test.sh sets it for each supported major).
pub fn pg_bin() -> PathBuf {
    std::env::var_os("PG_INTENT_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// What the tests run against (see the crate's documentation): `PG_INTENT_TARGET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One node, the single-node statements (the default).
    Native,
    /// One node with `intent.force_distributed_statements=on`: the distributed mode's
    /// statements.
    NativeDistributed,
    /// A coordinator and two workers, the tables distributed by `intent.distribute()`.
    Citus,
}

impl Target {
    /// The name `PG_INTENT_TARGET` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Target::Native => "native",
            Target::NativeDistributed => "native-distributed",
            Target::Citus => "citus",
        }
    }
}

/// The target of this test process, from `PG_INTENT_TARGET` (unset or empty: native). Any
/// other value is a mistake, not a default.
pub fn target() -> Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let value = std::env::var("PG_INTENT_TARGET").unwrap_or_default();
        [Target::Native, Target::NativeDistributed, Target::Citus]
            .into_iter()
            .find(|t| value.is_empty() || t.name() == value)
            .unwrap_or_else(|| {
                panic!("PG_INTENT_TARGET={value:?}: one of native, native-distributed, citus")
            })
    })
}

/// The setting the native-distributed target starts every cluster with.
const FORCE_DISTRIBUTED: (&str, &str) = ("intent.force_distributed_statements", "on");

const NOT_INSTALLED: &str = "the pg_intent extension is not installed into the server of \
     PG_INTENT_PG_BIN (default: Debian's PostgreSQL 15): run scripts/test.sh or cargo pgrx install first";

/// How many connections the test servers accept: a test opens up to 64 at once, and tests of
/// one binary may run in parallel.
const MAX_CONNECTIONS: u32 = 300;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A process-wide unique suffix: pid, a counter, and the clock.
pub(crate) fn unique(prefix: &str) -> String {
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

/// Whether this process runs as root (PostgreSQL's programs then run as `postgres`).
pub fn running_as_root() -> bool {
    // The owner of /proc/self is the process's effective uid.
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// A command running `program` (a path to a PostgreSQL program), through
/// `runuser -u postgres --` when `as_postgres`.
fn command_for(program: &Path, as_postgres: bool) -> Command {
    if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A command running `program` (a path to a PostgreSQL program, e.g. `pg_dump`), as the
/// `postgres` user when this process runs as root, as the server's own programs are run.
pub fn postgres_command(program: &Path) -> Command {
    command_for(program, running_as_root())
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
    /// The template database of [`fresh_db_copied`](Cluster::fresh_db_copied), once made.
    template: tokio::sync::OnceCell<String>,
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
    /// cluster is left running. For the `citus` target, the coordinator of [`citus::nodes`].
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        if let Some(coordinator) = Cluster::citus_target() {
            return coordinator;
        }
        SHARED.get_or_init(|| match std::env::var("PG_INTENT_TEST_CLUSTER") {
            Ok(spec) => Cluster::attach(&spec),
            Err(_) => Cluster::start(),
        })
    }

    /// For the `citus` target (unless `PG_INTENT_TEST_CLUSTER` attaches a server), the
    /// coordinator of the binary's Citus cluster.
    fn citus_target() -> Option<&'static Cluster> {
        if target() != Target::Citus || std::env::var_os("PG_INTENT_TEST_CLUSTER").is_some() {
            return None;
        }
        let nodes = citus::nodes().expect("PG_INTENT_TARGET=citus: no Citus");
        Some(&nodes.coordinator)
    }

    /// Like [`shared`](Self::shared), a cluster of this test binary, started with [`FAST`]:
    /// for suites that never crash, kill or restart their server (the client's and the
    /// gateway's tests). `PG_INTENT_TEST_CLUSTER` attaches it too; for the `citus` target it
    /// is [`shared`](Self::shared)'s coordinator.
    pub fn shared_fast() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        if let Some(coordinator) = Cluster::citus_target() {
            return coordinator;
        }
        SHARED.get_or_init(|| match std::env::var("PG_INTENT_TEST_CLUSTER") {
            Ok(spec) => Cluster::attach(&spec),
            Err(_) => Cluster::start_with(FAST),
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
            template: tokio::sync::OnceCell::new(),
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
    /// major's `bin` directory). For the `native-distributed` target, with
    /// `intent.force_distributed_statements=on` too.
    pub fn start_in(bin: &Path, settings: &[(&str, &str)]) -> Cluster {
        check_extension_installed(bin);
        let mut settings = settings.to_vec();
        if target() == Target::NativeDistributed {
            settings.push(FORCE_DISTRIBUTED);
        }
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
            template: tokio::sync::OnceCell::new(),
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
        let mut cmd = command_for(&self.bin.join(program), self.as_postgres);
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

    /// A libpq-style connection string for database `db` (as `postgres`).
    pub fn conn_str(&self, db: &str) -> String {
        self.conn_str_as(db, "postgres")
    }

    /// A connection string for database `db`, as `user` (the cluster trusts local logins).
    pub fn conn_str_as(&self, db: &str, user: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }

    /// The data directory of the moment (it changes with [`upgrade_to`](Self::upgrade_to)).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The bin directory of the server's programs.
    pub fn bin(&self) -> &Path {
        &self.bin
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

    /// Creates a new database and runs `CREATE EXTENSION pg_intent` in it, then applies
    /// `PG_INTENT_TESTS_SABOTAGE`. On the coordinator of the `citus` target: the database on
    /// every node, Citus in each, pg_intent created and `intent.distribute()` run
    /// ([`citus::distributed_db`]), then the sabotage.
    pub async fn fresh_db(&self, prefix: &str) -> Db<'_> {
        if citus::is_coordinator(self) {
            let nodes = citus::nodes().expect("the Citus nodes");
            let db = citus::distributed_db(nodes, prefix).await;
            sabotage(&db.connect().await).await;
            return db;
        }
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
            panic!(
                "CREATE EXTENSION pg_intent failed ({}): {NOT_INSTALLED}",
                server_error(&e)
            );
        }
        check_target(&client).await;
        sabotage(&client).await;
        db
    }

    /// Like [`fresh_db`](Self::fresh_db), but a copy of a template database in which
    /// `CREATE EXTENSION pg_intent` ran once for this cluster: faster, and tests that run in
    /// parallel do not race on the cluster-wide roles the extension's script creates. (On the
    /// coordinator of the `citus` target, a copy would be on one node only: [`fresh_db`].)
    ///
    /// [`fresh_db`]: Self::fresh_db
    pub async fn fresh_db_copied(&self, prefix: &str) -> Db<'_> {
        if citus::is_coordinator(self) {
            return self.fresh_db(prefix).await;
        }
        let template = self
            .template
            .get_or_init(|| async {
                let template = unique("pg_intent_template").to_lowercase();
                let admin = self.connect("postgres").await;
                admin
                    .batch_execute(&format!("CREATE DATABASE \"{template}\""))
                    .await
                    .unwrap_or_else(|e| panic!("CREATE DATABASE {template}: {e}"));
                let c = self.connect(&template).await;
                if let Err(e) = c.batch_execute("CREATE EXTENSION pg_intent").await {
                    panic!(
                        "CREATE EXTENSION pg_intent failed ({}): {NOT_INSTALLED}",
                        server_error(&e)
                    );
                }
                template
            })
            .await;
        let name = unique(prefix).to_lowercase();
        let admin = self.connect("postgres").await;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
            ))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        let db = Db {
            cluster: self,
            name,
        };
        let client = db.connect().await;
        check_target(&client).await;
        sabotage(&client).await;
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

    /// The connection string of this database (as `postgres`).
    pub fn conn_str(&self) -> String {
        self.cluster.conn_str(&self.name)
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

/// Server settings that trade crash safety for speed (no fsync, no synchronous commit, no full
/// page writes): for clusters whose server is never crashed or killed.
pub const FAST: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
];

/// For the `native-distributed` target, that the switch is pg_intent's own setting (a bool the
/// library registered, not a placeholder of a misspelt name) and on, in a database of this
/// cluster (`client`'s).
async fn check_target(client: &Client) {
    if target() != Target::NativeDistributed {
        return;
    }
    let (name, value) = FORCE_DISTRIBUTED;
    client
        .batch_execute("LOAD 'pg_intent'")
        .await
        .unwrap_or_else(|e| panic!("LOAD 'pg_intent': {}", server_error(&e)));
    let row = client
        .query_opt(
            "SELECT setting, vartype FROM pg_catalog.pg_settings WHERE name = $1",
            &[&name],
        )
        .await
        .unwrap_or_else(|e| panic!("pg_settings: {}", server_error(&e)));
    let seen = row.map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)));
    assert_eq!(
        seen,
        Some((value.to_string(), "bool".to_string())),
        "PG_INTENT_TARGET=native-distributed: {name} must be pg_intent's bool setting, on \
         (an older pg_intent without it?)"
    );
}

/// A server error as a short text (its SQLSTATE and message), or the error itself.
pub(crate) fn server_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("code: {:?}, message: {:?}", db.code().code(), db.message()),
        None => format!("{e:?}"),
    }
}

/// Mutation checks (see tests/mutations/README.md): breaks the extension on purpose in a
/// throwaway database, to prove that the tests notice.
async fn sabotage(client: &Client) {
    if let Some(path) = std::env::var_os("PG_INTENT_TESTS_SABOTAGE") {
        let sql = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", Path::new(&path).display()));
        client
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("sabotage {}: {e:?}", Path::new(&path).display()));
    }
}

/// Polls `f` until it is true or `timeout` passes; whether it became true.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
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
