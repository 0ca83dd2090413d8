//! The typed values of the API: states, requests, answers and the attempt handle.

use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;
use uuid::Uuid;

/// The `max_attempts` the SQL API defaults to.
pub use pg_intent_protocol::limits::DEFAULT_MAX_ATTEMPTS;

/// The lease the SQL API defaults to.
pub const DEFAULT_LEASE: Duration =
    Duration::from_secs(pg_intent_protocol::limits::DEFAULT_LEASE_SECS);

// The states, the completion and the fingerprint fields are the protocol crate's own: the
// extension, this client and the tests read and write the very same labels.
pub use pg_intent_protocol::{AttemptState, Completion, FingerprintField, JobState, UnknownLabel};

/// An outcome a worker holds for an attempt, serialized as the database will store it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Outcome {
    /// The work's result: reported with `complete_attempt`.
    Completed {
        /// The result's JSON.
        result: Box<RawValue>,
    },
    /// A definite failure: reported with `fail_attempt`.
    Failed {
        /// The failure's JSON.
        error: Box<RawValue>,
        /// Whether another attempt may follow.
        retryable: bool,
        /// The retry delay asked for (`None`: the default backoff).
        retry_after: Option<Duration>,
    },
    /// The outcome is unknown (a timeout, a shutdown, the work said so): reported with
    /// `mark_unknown`.
    Unknown {
        /// The reason recorded.
        reason: String,
    },
}

impl Outcome {
    /// Which report this is, for messages: `result`, `failure` or `unknown outcome`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "result",
            Outcome::Failed { .. } => "failure",
            Outcome::Unknown { .. } => "unknown outcome",
        }
    }
}

/// An intent to submit: `intent.submit_job`'s arguments.
///
/// ```
/// # use pg_intent_client::NewJob;
/// let params = serde_json::json!({"prompt": "a red fox"});
/// let job = NewJob::new("alice", "click-1", "gpu-a", &params).max_attempts(5);
/// assert_eq!(job.job_id().unwrap().to_string(), "62ccd04c-f6e5-82dd-aeee-a9dac8090000");
/// ```
#[derive(Debug)]
pub struct NewJob<'a, P: ?Sized> {
    /// Whom the intent belongs to (a user or account, not a session). 1–255 characters.
    pub owner_id: &'a str,
    /// Chosen by the client for one intent. 1–255 characters.
    pub idempotency_key: &'a str,
    /// The primary target.
    pub provider: &'a str,
    /// The request, stored as `jsonb`.
    pub params: &'a P,
    /// The contract the result must satisfy, if any (needed for failover).
    pub contract: Option<&'a str>,
    /// How many attempts the job may have (1–65535; the SQL default is 3).
    pub max_attempts: u16,
}

impl<P: ?Sized> Clone for NewJob<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: ?Sized> Copy for NewJob<'_, P> {}

impl<'a, P: ?Sized> NewJob<'a, P> {
    /// An intent with no contract and the default `max_attempts`.
    pub fn new(
        owner_id: &'a str,
        idempotency_key: &'a str,
        provider: &'a str,
        params: &'a P,
    ) -> Self {
        NewJob {
            owner_id,
            idempotency_key,
            provider,
            params,
            contract: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Names the contract the result must satisfy.
    pub fn contract(mut self, contract: &'a str) -> Self {
        self.contract = Some(contract);
        self
    }

    /// Sets `max_attempts`.
    pub fn max_attempts(mut self, max_attempts: u16) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The job id the database will give this intent, computed here without asking it.
    pub fn job_id(&self) -> Result<Uuid, pg_intent_protocol::IdError> {
        crate::ids::job_id(self.owner_id, self.idempotency_key)
    }
}

/// The answer of `intent.submit_job`.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted<R> {
    /// The job, derived from owner and key.
    pub job_id: Uuid,
    /// `true` for exactly one of any number of identical submits: the one that inserted the job.
    pub created: bool,
    /// The job's current state (a replay reports it as it is).
    pub state: JobState,
    /// The job's current version (informational; the fencing token of an attempt is the one
    /// carried by its [`Attempt`]).
    pub version: i64,
    /// The result, once the job has succeeded.
    pub result: Option<R>,
}

/// The answer of `intent.validate_result`.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// Whether the result satisfies the contract (schema and checker).
    pub valid: bool,
    /// Why not: `{"path", "message"}` for each schema error (the first 20), or `{"checker"}`
    /// for the checker's refusal. Empty when valid.
    pub errors: Vec<serde_json::Value>,
}

/// The options of `intent.begin_attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeginOptions<'a> {
    /// `None`: the job's own provider. Any other provider is a failover, refused with
    /// [`crate::Error::ProviderNotCertified`] unless certified for the job's contract.
    pub provider: Option<&'a str>,
    /// How long the attempt may run without a heartbeat (positive, at most 24 hours).
    pub lease: Duration,
    /// Who runs it (for the people reading `intent.attempts`).
    pub worker: Option<&'a str>,
}

impl Default for BeginOptions<'_> {
    fn default() -> Self {
        BeginOptions {
            provider: None,
            lease: DEFAULT_LEASE,
            worker: None,
        }
    }
}

impl<'a> BeginOptions<'a> {
    /// The SQL defaults: the job's provider, a 30-second lease, no worker name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Begins the attempt on `provider`.
    pub fn provider(mut self, provider: &'a str) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Sets the lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Names the worker.
    pub fn worker(mut self, worker: &'a str) -> Self {
        self.worker = Some(worker);
        self
    }
}

/// The options of `intent.claim_attempts` (see [`crate::claim_attempts`]).
///
/// ```
/// # use std::time::Duration;
/// # use pg_intent_client::ClaimOptions;
/// let providers = ["gpu-a", "gpu-b"];
/// let options = ClaimOptions::new().providers(&providers).worker("box-7").max_jobs(8);
/// assert_eq!(options.lease, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOptions<'a> {
    /// The providers whose jobs to claim (`None`: any provider). Each 1–255 characters.
    pub providers: Option<&'a [&'a str]>,
    /// Who runs the attempts (for the people reading `intent.attempts`).
    pub worker: Option<&'a str>,
    /// The lease of each attempt begun (positive, at most 24 hours).
    pub lease: Duration,
    /// How many jobs to claim at most (1–1000).
    pub max_jobs: u16,
}

impl Default for ClaimOptions<'_> {
    fn default() -> Self {
        ClaimOptions {
            providers: None,
            worker: None,
            lease: DEFAULT_LEASE,
            max_jobs: 1,
        }
    }
}

impl<'a> ClaimOptions<'a> {
    /// The SQL defaults: any provider, no worker name, a 30-second lease, one job.
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims only jobs of these providers.
    pub fn providers(mut self, providers: &'a [&'a str]) -> Self {
        self.providers = Some(providers);
        self
    }

    /// Names the worker.
    pub fn worker(mut self, worker: &'a str) -> Self {
        self.worker = Some(worker);
        self
    }

    /// Sets the lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how many jobs to claim at most.
    pub fn max_jobs(mut self, max_jobs: u16) -> Self {
        self.max_jobs = max_jobs;
        self
    }
}

/// The handle of a begun attempt, carrying its fencing token.
///
/// Only [`crate::begin_attempt`] (and [`AttemptRecord::handle`](crate::AttemptRecord::handle),
/// which reads the token from the database) make one, so the version presented to
/// [`crate::complete_attempt`] and [`crate::fail_attempt`] is always the one the database handed to
/// this attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub(crate) id: Uuid,
    pub(crate) attempt_no: u16,
    pub(crate) version: i64,
    pub(crate) deadline: SystemTime,
    pub(crate) lease: Duration,
    pub(crate) provider: Option<String>,
}

impl Attempt {
    /// The attempt id (the job id with the attempt number in its last two bytes).
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The job this attempt belongs to.
    pub fn job_id(&self) -> Uuid {
        crate::ids::job_of(self.id).unwrap_or(self.id)
    }

    /// 1, 2, … within its job.
    pub fn attempt_no(&self) -> u16 {
        self.attempt_no
    }

    /// The fencing token: the job's version when the attempt began.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// When the lease runs out unless a heartbeat extends it (as of the begin).
    pub fn deadline(&self) -> SystemTime {
        self.deadline
    }

    /// The lease the attempt was begun with.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The provider asked for at the begin (`None`: the job's own).
    pub fn provider(&self) -> Option<&str> {
        self.provider.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for s in [
            JobState::Pending,
            JobState::Running,
            JobState::Unknown,
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
        ] {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
            assert_eq!(s.is_terminal(), s as u8 >= 3);
        }
        assert_eq!("won".parse::<Completion>().unwrap(), Completion::Won);
        assert_eq!(
            "discarded".parse::<AttemptState>().unwrap(),
            AttemptState::Discarded
        );
        assert!("WON".parse::<Completion>().is_err());
    }
}
