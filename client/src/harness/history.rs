//! Where every run of the harness is recorded: pg_intent's schema keeps certifications only.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;
use uuid::Uuid;

use super::RunError;
use crate::exec::Executor;

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
/// Before certifying, the harness reads the runs of the same provider and contract recorded
/// since the last certified one and lists them in the evidence (`"history"`): the runs it
/// took to earn this certification.
///
/// The file is for one writer at a time (a harness run from CI, an operator's shell): appends
/// of large records from two processes at once may interleave. Use a table for more.
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
    /// harness's role needs `SELECT` and `INSERT` on it.
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

    /// The `CREATE TABLE IF NOT EXISTS` statement of a table history (`None` for a file).
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
            )"
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
    /// (with its evidence).
    pub async fn runs(
        &self,
        db: &(impl Executor + ?Sized),
        provider: &str,
        contract: &str,
    ) -> Result<Vec<Value>, RunError> {
        match &self.0 {
            Store::Table(quoted) => {
                let sql = format!(
                    "SELECT {} FROM {quoted} WHERE provider = $1 AND contract = $2 ORDER BY id",
                    record_sql(true)
                );
                query_records(db, &sql, provider, contract).await
            }
            Store::JsonLines(path) => Ok(self
                .read_file(path)
                .await?
                .into_iter()
                .filter(|r| r["provider"] == provider && r["contract"] == contract)
                .collect()),
        }
    }

    /// The runs of the pair recorded after its last certified one, oldest first, without their
    /// evidence (its `summary` instead).
    pub(super) async fn since_last_certified(
        &self,
        db: &(impl Executor + ?Sized),
        provider: &str,
        contract: &str,
    ) -> Result<Vec<Value>, RunError> {
        match &self.0 {
            Store::Table(quoted) => {
                let sql = format!(
                    "SELECT {} FROM {quoted} WHERE provider = $1 AND contract = $2
                        AND id > coalesce((SELECT max(id) FROM {quoted}
                                            WHERE provider = $1 AND contract = $2 AND certified), 0)
                      ORDER BY id",
                    record_sql(false)
                );
                query_records(db, &sql, provider, contract).await
            }
            Store::JsonLines(_) => {
                let runs = self.runs(db, provider, contract).await?;
                let after = runs
                    .iter()
                    .rposition(|r| r["certified"] == true)
                    .map_or(0, |at| at + 1);
                Ok(runs[after..].iter().map(summary).collect())
            }
        }
    }

    /// Records one run.
    pub(super) async fn record(
        &self,
        db: &(impl Executor + ?Sized),
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
            Store::JsonLines(path) => {
                let mut line = record.to_string();
                line.push('\n');
                let path = path.clone();
                let store = self.to_string();
                blocking(&store, move || {
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?;
                    file.write_all(line.as_bytes())?;
                    file.sync_data()
                })
                .await
            }
        }
    }

    async fn read_file(&self, path: &Path) -> Result<Vec<Value>, RunError> {
        let path = path.to_path_buf();
        let store = self.to_string();
        let text = blocking(&store, move || match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            other => other,
        })
        .await?;
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| RunError::History {
                    store: store.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("line {}: {e}", i + 1),
                    ),
                })
            })
            .collect()
    }
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
