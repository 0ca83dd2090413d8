//! What the database answers with that carries documents to decode into the caller's types:
//! a claimed attempt with its job's params, and the rows of `intent.jobs` and
//! `intent.attempts`.

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::Error;
use crate::types::{Attempt, AttemptState, JobState};

/// One attempt begun by `intent.claim_attempts`: its handle and the job it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedAttempt {
    /// The attempt, with its fencing token: heartbeat it, then report it.
    pub attempt: Attempt,
    /// The job's provider (the attempt runs on it).
    pub provider: String,
    /// The job's params.
    pub params: serde_json::Value,
    /// The job's contract, if any.
    pub contract: Option<String>,
}

impl ClaimedAttempt {
    /// The job.
    pub fn job_id(&self) -> Uuid {
        self.attempt.job_id()
    }

    /// The params as `P`.
    pub fn params_as<P: DeserializeOwned>(&self) -> Result<P, Error> {
        P::deserialize(&self.params).map_err(Error::Deserialize)
    }
}

/// A row of `intent.jobs` (reading it needs `SELECT` on the table).
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// The job id.
    pub id: Uuid,
    /// Whom the intent belongs to.
    pub owner_id: String,
    /// The idempotency key.
    pub idempotency_key: String,
    /// The primary provider.
    pub provider: String,
    /// The params.
    pub params: serde_json::Value,
    /// The contract, if any.
    pub contract: Option<String>,
    /// The state.
    pub state: JobState,
    /// The fencing version.
    pub version: i64,
    /// The attempt whose outcome stands.
    pub completed_by: Option<Uuid>,
    /// The result, once succeeded.
    pub result: Option<serde_json::Value>,
    /// The error, once failed.
    pub error: Option<serde_json::Value>,
    /// The most attempts allowed.
    pub max_attempts: i32,
    /// How many attempts began.
    pub attempt_count: i32,
    /// When the job was created.
    pub created_at: SystemTime,
    /// When the job last changed.
    pub updated_at: SystemTime,
}

impl JobRecord {
    /// The result as `R`.
    pub fn result_as<R: DeserializeOwned>(&self) -> Result<Option<R>, Error> {
        self.result
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(Error::Deserialize)
    }
}

/// A row of `intent.attempts` (reading it needs `SELECT` on the table).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// The attempt id.
    pub id: Uuid,
    /// Its job.
    pub job_id: Uuid,
    /// Its number.
    pub attempt_no: i32,
    /// The provider it ran on.
    pub provider: String,
    /// Its state.
    pub state: AttemptState,
    /// The version `begin_attempt` handed to it: its fencing token.
    pub version_read: i64,
    /// The worker, if named.
    pub worker: Option<String>,
    /// Its lease.
    pub lease: Duration,
    /// When it began.
    pub started_at: SystemTime,
    /// When its lease runs out.
    pub deadline: SystemTime,
    /// When its own outcome arrived.
    pub finished_at: Option<SystemTime>,
    /// Its result, if it returned one.
    pub result: Option<serde_json::Value>,
    /// Its error, if it failed.
    pub error: Option<serde_json::Value>,
}

impl AttemptRecord {
    /// A handle to report this attempt's outcome, with the fencing token read from the database:
    /// what a reconciler uses to resolve an `unknown` attempt.
    pub fn handle(&self) -> Attempt {
        Attempt {
            id: self.id,
            attempt_no: u16::try_from(self.attempt_no).unwrap_or(0),
            version: self.version_read,
            deadline: self.deadline,
            lease: self.lease,
            provider: Some(self.provider.clone()),
        }
    }
}
