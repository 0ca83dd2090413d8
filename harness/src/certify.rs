//! Certification: in one transaction (a savepoint inside the caller's), on the contract version
//! tested only, with the run's record in a history table in the same transaction.

use std::time::SystemTime;

use pg_intent_client::{Executor, certify_provider};
use serde_json::{Value, json};
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::{RunError, RunHistory, RunOptions, Verdict, history};

/// The contract's version now, `None` if it is not defined.
pub(crate) async fn contract_version(
    db: &(impl Executor + ?Sized),
    contract: &str,
) -> Result<Option<i32>, RunError> {
    let row = db
        .client()
        .query_opt(
            "SELECT version FROM intent.contracts WHERE name = $1::text",
            &[&contract],
        )
        .await
        .map_err(RunError::pg)?;
    row.map(|r| r.try_get(0).map_err(RunError::decode))
        .transpose()
}

pub(crate) enum Certified {
    Yes { at: SystemTime, recorded: bool },
    No(String),
}

/// The transaction [`run`] certifies in: a savepoint inside the caller's transaction, else a
/// transaction of its own.
struct Tx<'a, D: ?Sized> {
    db: &'a D,
    savepoint: bool,
}

const SAVEPOINT: &str = "pg_intent_harness_certify";

impl<'a, D: Executor + ?Sized> Tx<'a, D> {
    async fn begin(db: &'a D) -> Result<Self, RunError> {
        // SAVEPOINT outside a transaction block fails (25P01) and changes nothing.
        match db
            .client()
            .batch_execute(&format!("SAVEPOINT {SAVEPOINT}"))
            .await
        {
            Ok(()) => Ok(Tx {
                db,
                savepoint: true,
            }),
            Err(e) if e.code() == Some(&SqlState::NO_ACTIVE_SQL_TRANSACTION) => {
                db.client()
                    .batch_execute("BEGIN")
                    .await
                    .map_err(RunError::pg)?;
                Ok(Tx {
                    db,
                    savepoint: false,
                })
            }
            Err(e) => Err(RunError::pg(e)),
        }
    }

    async fn commit(self) -> Result<(), RunError> {
        let sql = if self.savepoint {
            format!("RELEASE SAVEPOINT {SAVEPOINT}")
        } else {
            "COMMIT".to_string()
        };
        self.db
            .client()
            .batch_execute(&sql)
            .await
            .map_err(RunError::pg)
    }

    async fn rollback(self) -> Result<(), RunError> {
        let sql = if self.savepoint {
            format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}")
        } else {
            "ROLLBACK".to_string()
        };
        self.db
            .client()
            .batch_execute(&sql)
            .await
            .map_err(RunError::pg)
    }
}

/// Builds a run's record given the earlier runs read from its history (and the history).
pub(crate) type RecordOf<'a> =
    dyn Fn(Option<(&RunHistory, &history::Earlier)>) -> Value + Sync + 'a;

/// Certifies in one transaction, on the version tested only: locks a table history, reads the
/// runs since the pair's last certification and builds the record (`record_of`), re-reads the
/// contract's version, certifies, reads back the version recorded, and (with a history table)
/// records the run in the same transaction. Rolls back and answers why when the version is not
/// the one tested. Answers the record either way (its evidence is the certification's).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn certify_checked(
    db: &(impl Executor + ?Sized),
    provider: &str,
    contract: &str,
    tested: i32,
    run_id: Uuid,
    options: &RunOptions,
    locked: Option<&history::Locked>,
    record_of: &RecordOf<'_>,
) -> Result<(Certified, Value), RunError> {
    let tx = Tx::begin(db).await?;
    let mut record = Value::Null;
    let outcome = async {
        // Locked before the read: a run recorded elsewhere from now on waits for this
        // certification to commit, so it is in the next one's list, never in neither.
        record = match &options.history {
            Some(store) => {
                store.lock_table(db).await?;
                let earlier = store
                    .since_last_certified(db, locked, provider, contract)
                    .await?;
                record_of(Some((store, &earlier)))
            }
            None => record_of(None),
        };
        match contract_version(db, contract).await? {
            Some(now) if now == tested => {}
            now => {
                return Ok(Certified::No(format!(
                    "contract {contract:?} was redefined during the run: version {tested} was tested, {} is current, and the evidence counts for the version tested only; run the suite again",
                    now.map_or_else(|| "none".to_string(), |v| format!("version {v}"))
                )));
            }
        }
        let at = certify_provider(db, provider, contract, &record["evidence"], options.valid_for)
            .await?;
        let row = db
            .client()
            .query_opt(
                "SELECT contract_version FROM intent.certifications
                  WHERE provider = $1::text AND contract = $2::text AND evidence->>'run_id' = $3::text
                  ORDER BY id DESC LIMIT 1",
                &[&provider, &contract, &run_id.to_string()],
            )
            .await
            .map_err(RunError::pg)?;
        let recorded: Option<i32> = row
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(RunError::decode)?;
        if recorded != Some(tested) {
            return Ok(Certified::No(format!(
                "contract {contract:?} was redefined while certifying: version {tested} was tested, and certify_provider recorded {}; the certification was rolled back, run the suite again",
                recorded.map_or_else(|| "nothing".to_string(), |v| format!("version {v}"))
            )));
        }
        let mut recorded_here = false;
        if let Some(store) = &options.history
            && store.is_table()
        {
            record["certified"] = json!(true);
            record["verdict"] = json!(Verdict::Certified { expires_at: at }.to_string());
            store.record(db, None, &record).await?;
            recorded_here = true;
        }
        Ok(Certified::Yes {
            at,
            recorded: recorded_here,
        })
    }
    .await;
    match outcome {
        Ok(Certified::Yes { at, recorded }) => {
            tx.commit().await?;
            Ok((Certified::Yes { at, recorded }, record))
        }
        Ok(no) => {
            tx.rollback().await?;
            // Nothing of the transaction stands: the record is written again, as refused.
            record["certified"] = json!(false);
            Ok((no, record))
        }
        Err(e) => {
            // The error is what the caller needs to see; a failed rollback only adds to it.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}
