//! Where every run of the harness is recorded: pg_intent's schema keeps certifications only.

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::RunError;
use pg_intent_client::Executor;

/// Where [`super::run`] records every run, passed or refused ([`super::RunOptions::history`]).
///
/// pg_intent's schema records certifications only (`intent.certifications`; `intent.events`
/// belongs to jobs), and it is frozen for 0.3.0, so the runs go where the caller says: a table
/// of theirs, in the database the harness runs on, or a JSON-lines file. Each run is one record:
///
/// ```json
/// {"run_id": "…", "provider": "gpu-b", "contract": "captions-v1", "contract_version": 1,
///  "started_at": "…", "finished_at": "…", "passed": false, "certified": false,
///  "verdict": "refused: 5 of 5 cases failed (…)", "evidence": {…the run's whole evidence…}}
/// ```
///
/// `passed` says every run of every case passed; `certified` that the certification was
/// recorded (a passed run is refused when the contract was redefined during it). A certified
/// run's record goes into the table in the same transaction as the certification; into the file
/// right after the certification commits (if that append fails, [`super::run`] returns the
/// error and the certification, whose evidence lists the earlier runs, stands). A refused run's
/// record is written after the verdict.
///
/// The certification's evidence lists the runs of the same provider and contract recorded since
/// the last certified one (`"history"`): the runs it took to earn this certification. So that a
/// run recorded by another process (a CI shard running the same suite) cannot fall between two
/// certifications' lists, the store is locked from that read to the certification's own record:
///
/// * **A table** is locked `IN SHARE ROW EXCLUSIVE MODE` inside the certification's
///   transaction, before the runs are read: a run's `INSERT` elsewhere waits until the
///   certification commits (and so comes after it, in the next certification's list), and one
///   not yet committed is waited for (and so read). The harness's role needs `SELECT`, `INSERT`
///   and, for that lock, `UPDATE` on the table (or `DELETE`, `TRUNCATE`, or to own it). Runs
///   recording into the same table wait for each other's certifications, whatever their pair.
///   Inside a caller's transaction the table stays locked until that transaction ends; if it
///   is `REPEATABLE READ` or `SERIALIZABLE` the read sees its snapshot, which may predate runs
///   committed before the lock: certify from a `READ COMMITTED` one (the default), or outside
///   any.
/// * **A file** is locked with an exclusive `flock` (`File::lock`: advisory, so it holds among
///   harness runs, on every process of the machine, not against other writers) from the read of
///   the runs to the append of the record, certified or refused; reads alone take a shared one.
///   Two machines sharing the file over NFS get whatever `flock` means there: use a table.
///
/// Before any provider call [`super::run`] reads the history (the file is parsed, the table
/// queried), so a history that cannot be read fails the run before it is paid for. A record cut
/// short in the file (its JSON ends early: what a crash during an append leaves) is skipped and
/// noted in the evidence (`"history"."skipped"`, and a `log` warning); the next append starts
/// a line of its own after it. Any other line that does not parse is an error
/// ([`RunError::History`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunHistory(Store);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Store {
    /// A table; its name quoted (and schema-qualified if given so).
    Table(String),
    /// A JSON-lines file: one record per line, appended.
    JsonLines(PathBuf),
}

/// Quotes one SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl RunHistory {
    /// A table of the database the harness runs on, named by the caller: `table` or
    /// `schema.table` (split at the first dot). Each part is quoted as an identifier, so it is
    /// taken as written (case included). Create it with [`RunHistory::create_table`]; the
    /// harness's role needs `SELECT`, `INSERT` and `UPDATE` on it (`UPDATE` for the lock a
    /// certification takes; the harness never updates a row).
    pub fn table(name: &str) -> Self {
        let quoted = match name.split_once('.') {
            Some((schema, table)) => format!("{}.{}", quote_ident(schema), quote_ident(table)),
            None => quote_ident(name),
        };
        RunHistory(Store::Table(quoted))
    }

    /// The JSON-lines file at `path` (created when first written).
    pub fn json_lines(path: impl Into<PathBuf>) -> Self {
        RunHistory(Store::JsonLines(path.into()))
    }

    pub(super) fn is_table(&self) -> bool {
        matches!(self.0, Store::Table(_))
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement of a table history, with its `COMMENT ON`
    /// (`None` for a file).
    pub fn create_table_sql(&self) -> Option<String> {
        let Store::Table(quoted) = &self.0 else {
            return None;
        };
        Some(format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (
                id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                run_id           uuid NOT NULL UNIQUE,
                provider         text NOT NULL,
                contract         text NOT NULL,
                contract_version integer NOT NULL,
                started_at       timestamptz NOT NULL,
                finished_at      timestamptz NOT NULL,
                passed           boolean NOT NULL,
                certified        boolean NOT NULL,
                verdict          text NOT NULL,
                evidence         jsonb NOT NULL
            );
            COMMENT ON TABLE {quoted} IS
                'pg_intent_client harness: every contract-test run of a provider, passed or not, \
                 with its evidence (the certifications list the failed runs since the last one).'"
        ))
    }

    /// Creates the table of a table history if it does not exist (nothing for a file).
    pub async fn create_table(&self, db: &(impl Executor + ?Sized)) -> Result<(), RunError> {
        match self.create_table_sql() {
            Some(sql) => db.client().batch_execute(&sql).await.map_err(RunError::pg),
            None => Ok(()),
        }
    }

    /// Every recorded run of `provider` for `contract`, oldest first, each as the record above
    /// (with its evidence). A record cut short in the file is skipped (with a `log` warning).
    pub async fn runs(
        &self,
        db: &(impl Executor + ?Sized),
        provider: &str,
        contract: &str,
    ) -> Result<Vec<Value>, RunError> {
        Ok(self.read(db, None, provider, contract, true).await?.runs)
    }

    /// The runs of the pair recorded after its last certified one, oldest first, without their
    /// evidence (its `summary` instead), read under `locked` when given (a file's).
    pub(super) async fn since_last_certified(
        &self,
        db: &(impl Executor + ?Sized),
        locked: Option<&Locked>,
        provider: &str,
        contract: &str,
    ) -> Result<Earlier, RunError> {
        let mut earlier = self.read(db, locked, provider, contract, false).await?;
        if matches!(self.0, Store::JsonLines(_)) {
            let after = earlier
                .runs
                .iter()
                .rposition(|r| r["certified"] == true)
                .map_or(0, |at| at + 1);
            earlier.runs = earlier.runs.split_off(after).iter().map(summary).collect();
        }
        Ok(earlier)
    }

    /// The pair's runs: all of them with their evidence (`all`), or those after the last
    /// certified one without it (a table's; a file's are cut by the caller).
    async fn read(
        &self,
        db: &(impl Executor + ?Sized),
        locked: Option<&Locked>,
        provider: &str,
        contract: &str,
        all: bool,
    ) -> Result<Earlier, RunError> {
        match &self.0 {
            Store::Table(quoted) => {
                let sql = if all {
                    format!(
                        "SELECT {} FROM {quoted} WHERE provider = $1 AND contract = $2 ORDER BY id",
                        record_sql(true)
                    )
                } else {
                    format!(
                        "SELECT {} FROM {quoted} WHERE provider = $1 AND contract = $2
                            AND id > coalesce((SELECT max(id) FROM {quoted}
                                                WHERE provider = $1 AND contract = $2 AND certified), 0)
                          ORDER BY id",
                        record_sql(false)
                    )
                };
                Ok(Earlier {
                    runs: query_records(db, &sql, provider, contract).await?,
                    skipped: Vec::new(),
                })
            }
            Store::JsonLines(path) => {
                let store = self.to_string();
                let bytes = match locked {
                    Some(locked) => {
                        let file = locked.file.clone();
                        blocking(&store, move || {
                            let mut bytes = Vec::new();
                            (&*file).seek(std::io::SeekFrom::Start(0))?;
                            (&*file).read_to_end(&mut bytes)?;
                            Ok(bytes)
                        })
                        .await?
                    }
                    None => {
                        let path = path.clone();
                        blocking(&store, move || match File::open(&path) {
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                            Err(e) => Err(e),
                            Ok(file) => {
                                // Shared: no append is half-way through while this reads.
                                file.lock_shared()?;
                                let mut bytes = Vec::new();
                                (&file).read_to_end(&mut bytes)?;
                                Ok(bytes)
                            }
                        })
                        .await?
                    }
                };
                let (records, skipped) = parse_lines(&bytes).map_err(|e| RunError::History {
                    store: store.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                })?;
                for note in &skipped {
                    log::warn!(target: "pg_intent_harness", "run history {store}: {note}");
                }
                Ok(Earlier {
                    runs: records
                        .into_iter()
                        .filter(|r| r["provider"] == provider && r["contract"] == contract)
                        .collect(),
                    skipped,
                })
            }
        }
    }

    /// Reads the history as a run will, before it calls the provider: a table that is not
    /// there (or not readable), a file that cannot be read or does not parse fails here.
    pub(super) async fn check(
        &self,
        db: &(impl Executor + ?Sized),
        provider: &str,
        contract: &str,
    ) -> Result<(), RunError> {
        self.since_last_certified(db, None, provider, contract)
            .await
            .map(drop)
    }

    /// A file history's exclusive lock (the file is created if need be), taken before its runs
    /// are read and held until this run's record is appended; `None` for a table, which is
    /// locked in the certification's transaction ([`RunHistory::lock_table`]).
    pub(super) async fn lock(&self) -> Result<Option<Locked>, RunError> {
        let Store::JsonLines(path) = &self.0 else {
            return Ok(None);
        };
        let path = path.clone();
        let file = blocking(&self.to_string(), move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&path)?;
            // Waits for another run's read and append of the same file.
            file.lock()?;
            Ok(file)
        })
        .await?;
        Ok(Some(Locked {
            file: Arc::new(file),
        }))
    }

    /// Locks a table history until the end of the current transaction, so that no run is
    /// recorded between the read of the runs and the certification's own record (nothing for a
    /// file).
    pub(super) async fn lock_table(&self, db: &(impl Executor + ?Sized)) -> Result<(), RunError> {
        match &self.0 {
            Store::Table(quoted) => db
                .client()
                .batch_execute(&format!("LOCK TABLE {quoted} IN SHARE ROW EXCLUSIVE MODE"))
                .await
                .map_err(RunError::pg),
            Store::JsonLines(_) => Ok(()),
        }
    }

    /// Records one run; a file's under `locked` (its lock, from [`RunHistory::lock`]).
    pub(super) async fn record(
        &self,
        db: &(impl Executor + ?Sized),
        locked: Option<&Locked>,
        record: &Value,
    ) -> Result<(), RunError> {
        match &self.0 {
            Store::Table(quoted) => {
                let sql = format!(
                    "INSERT INTO {quoted} (run_id, provider, contract, contract_version, started_at,
                                           finished_at, passed, certified, verdict, evidence)
                     VALUES ($1, $2, $3, $4, $5::text::timestamptz, $6::text::timestamptz,
                             $7, $8, $9, $10)"
                );
                let text = |key: &str| record[key].as_str().unwrap_or_default().to_string();
                let run_id = record["run_id"]
                    .as_str()
                    .and_then(|s| s.parse::<Uuid>().ok())
                    .unwrap_or_default();
                let version = record["contract_version"]
                    .as_i64()
                    .and_then(|v| i32::try_from(v).ok())
                    .unwrap_or_default();
                db.client()
                    .execute(
                        &sql,
                        &[
                            &run_id,
                            &text("provider"),
                            &text("contract"),
                            &version,
                            &text("started_at"),
                            &text("finished_at"),
                            &(record["passed"] == true),
                            &(record["certified"] == true),
                            &text("verdict"),
                            &record["evidence"],
                        ],
                    )
                    .await
                    .map_err(RunError::pg)?;
                Ok(())
            }
            Store::JsonLines(_) => {
                let owned;
                let locked = match locked {
                    Some(locked) => locked,
                    None => {
                        owned = self.lock().await?.expect("a file history");
                        &owned
                    }
                };
                let mut line = record.to_string();
                line.push('\n');
                let file = locked.file.clone();
                blocking(&self.to_string(), move || {
                    let len = file.metadata()?.len();
                    let mut last = [b'\n'];
                    if len > 0 {
                        file.read_exact_at(&mut last, len - 1)?;
                    }
                    if last[0] != b'\n' {
                        // A record cut short by a crash: this one starts a line of its own.
                        line.insert(0, '\n');
                    }
                    (&*file).write_all(line.as_bytes())?;
                    file.sync_data()
                })
                .await
            }
        }
    }
}

/// The runs a history holds, and the lines of a file it skipped (why, by line number).
pub(super) struct Earlier {
    pub(super) runs: Vec<Value>,
    pub(super) skipped: Vec<String>,
}

/// A file history's exclusive `flock`, released when dropped (the file is closed).
pub(super) struct Locked {
    file: Arc<File>,
}

/// The records of a JSON-lines file, and the notes on the lines skipped: a record cut short
/// (its JSON ends early, as a crash during an append leaves it) is skipped; any other line that
/// does not parse is an error.
fn parse_lines(bytes: &[u8]) -> Result<(Vec<Value>, Vec<String>), String> {
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    let complete = bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let count = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(record) => records.push(record),
            Err(e) if e.is_eof() || (i + 1 == count && !complete) => skipped.push(format!(
                "line {}: a record cut short ({e}; a crash during an append?), skipped",
                i + 1
            )),
            Err(e) => return Err(format!("line {}: {e}", i + 1)),
        }
    }
    Ok((records, skipped))
}

impl fmt::Display for RunHistory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Store::Table(quoted) => write!(f, "table {quoted}"),
            Store::JsonLines(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// A record without its evidence: the evidence's `summary` instead.
fn summary(record: &Value) -> Value {
    let mut out = record.clone();
    if let Some(map) = out.as_object_mut()
        && let Some(evidence) = map.remove("evidence")
    {
        map.insert("summary".into(), evidence["summary"].clone());
    }
    out
}

/// The select list building a record from a row (with its evidence, or only its summary).
fn record_sql(with_evidence: bool) -> String {
    format!(
        "jsonb_build_object('run_id', run_id, 'provider', provider, 'contract', contract,
            'contract_version', contract_version, 'started_at', evidence->>'started_at',
            'finished_at', evidence->>'finished_at', 'passed', passed, 'certified', certified,
            'verdict', verdict, {})",
        if with_evidence {
            "'evidence', evidence"
        } else {
            "'summary', evidence->'summary'"
        }
    )
}

async fn query_records(
    db: &(impl Executor + ?Sized),
    sql: &str,
    provider: &str,
    contract: &str,
) -> Result<Vec<Value>, RunError> {
    db.client()
        .query(sql, &[&provider, &contract])
        .await
        .map_err(RunError::pg)?
        .iter()
        .map(|row| row.try_get(0).map_err(RunError::decode))
        .collect()
}

async fn blocking<T: Send + 'static>(
    store: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, RunError> {
    let history = |source| RunError::History {
        store: store.to_string(),
        source,
    };
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| history(std::io::Error::other(e)))?
        .map_err(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_cut_short_are_skipped_and_other_damage_is_an_error() {
        let (r, skipped) = parse_lines(b"{\"a\":1}\n\n{\"a\":2}\n").unwrap();
        assert_eq!((r.len(), skipped.len()), (2, 0));
        // A crash mid-append: the last line is a record's start.
        let (r, skipped) = parse_lines("{\"a\":1}\n{\"a\":\"é".as_bytes()).unwrap();
        assert_eq!(r.len(), 1);
        assert!(
            skipped[0].starts_with("line 2: a record cut short"),
            "{skipped:?}"
        );
        // ... and after the next append, which started a line of its own.
        let (r, skipped) = parse_lines(b"{\"a\":1}\n{\"a\":[1,\n{\"a\":3}\n").unwrap();
        assert_eq!((r.len(), skipped.len()), (2, 1));
        // Cut inside a character.
        let (r, skipped) = parse_lines(b"{\"a\":\"\xc3\n{\"a\":3}\n").unwrap();
        assert_eq!((r.len(), skipped.len()), (1, 1));
        // A line that is no record's start is damage, not a crash's.
        let e = parse_lines(b"{\"a\":1}\nnot a record\n{\"a\":3}\n").unwrap_err();
        assert!(e.starts_with("line 2: "), "{e}");
        let e = parse_lines(b"{\"a\":1}}\n").unwrap_err();
        assert!(e.starts_with("line 1: "), "{e}");
    }
}
