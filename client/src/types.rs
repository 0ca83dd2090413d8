//! The typed values of the API: states, requests, answers and the attempt handle.

use std::time::{Duration, SystemTime};

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use uuid::Uuid;

use crate::Error;

/// The `max_attempts` the SQL API defaults to.
pub use pg_intent_protocol::limits::DEFAULT_MAX_ATTEMPTS;

/// The lease the SQL API defaults to.
pub const DEFAULT_LEASE: Duration =
    Duration::from_secs(pg_intent_protocol::limits::DEFAULT_LEASE_SECS);

// The states, the completion and the fingerprint fields are the protocol crate's own: the
// extension, this client and the tests read and write the very same labels.
pub use pg_intent_protocol::{AttemptState, Completion, FingerprintField, JobState, UnknownLabel};

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
        crate::job_id(self.owner_id, self.idempotency_key)
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
    /// [`Error::ProviderNotCertified`] unless certified for the job's contract.
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

/// The handle of a begun attempt, carrying its fencing token.
///
/// Only [`crate::begin_attempt`] (and [`AttemptRecord::handle`], which reads the token from the
/// database) make one, so the version presented to [`crate::complete_attempt`] and
/// [`crate::fail_attempt`] is always the one the database handed to this attempt.
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
        crate::job_of(self.id).unwrap_or(self.id)
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

// ---------------------------------------------------------------------------------------------
// Wire encodings.

/// A JSON document serialized before the call, sent as `jsonb` (or `json`).
#[derive(Debug)]
pub(crate) struct JsonArg(Vec<u8>);

impl JsonArg {
    pub(crate) fn new<T: Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        let mut buf = Vec::with_capacity(128);
        serde_json::to_writer(&mut buf, value).map_err(Error::Serialize)?;
        Ok(JsonArg(buf))
    }
}

impl ToSql for JsonArg {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.put_u8(1); // jsonb binary format version
        }
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    to_sql_checked!();
}

/// A JSON document as received, decoded by the caller into its own type.
pub(crate) struct RawJson<'a>(pub(crate) &'a [u8]);

impl<'a> FromSql<'a> for RawJson<'a> {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, rest)) => Ok(RawJson(rest)),
                _ => Err("unsupported jsonb binary format version".into()),
            }
        } else {
            Ok(RawJson(raw))
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

impl RawJson<'_> {
    pub(crate) fn decode<R: DeserializeOwned>(&self) -> Result<R, Error> {
        serde_json::from_slice(self.0).map_err(Error::Deserialize)
    }
}

/// A [`Duration`] sent as an `interval` of microseconds (rounded up, so that a positive
/// duration never becomes a zero interval; saturating, so that the server's range check
/// refuses an absurd one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntervalArg(i64);

impl IntervalArg {
    pub(crate) fn new(d: Duration) -> Self {
        let micros = d.as_nanos().div_ceil(1_000);
        IntervalArg(i64::try_from(micros).unwrap_or(i64::MAX))
    }
}

impl ToSql for IntervalArg {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.put_i64(self.0); // microseconds
        out.put_i32(0); // days
        out.put_i32(0); // months
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
    }

    to_sql_checked!();
}

/// An `interval` read back as a [`Duration`] (a month counts 30 days; negative is zero).
pub(crate) struct IntervalValue(pub(crate) Duration);

impl<'a> FromSql<'a> for IntervalValue {
    fn from_sql(
        _ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let raw: [u8; 16] = raw.try_into().map_err(|_| "interval must be 16 bytes")?;
        let micros = i64::from_be_bytes(raw[0..8].try_into().expect("8 bytes"));
        let days = i32::from_be_bytes(raw[8..12].try_into().expect("4 bytes"));
        let months = i32::from_be_bytes(raw[12..16].try_into().expect("4 bytes"));
        let total =
            i128::from(micros) + (i128::from(days) + 30 * i128::from(months)) * 86_400_000_000;
        let total = u64::try_from(total.max(0)).unwrap_or(u64::MAX);
        Ok(IntervalValue(Duration::from_micros(total)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::INTERVAL
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

    #[test]
    fn interval_encoding_never_rounds_to_zero() {
        assert_eq!(IntervalArg::new(Duration::from_nanos(1)).0, 1);
        assert_eq!(IntervalArg::new(Duration::from_millis(300)).0, 300_000);
        assert_eq!(IntervalArg::new(Duration::ZERO).0, 0);
        assert_eq!(IntervalArg::new(Duration::MAX).0, i64::MAX);
    }

    #[test]
    fn interval_decoding() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&1_500_000i64.to_be_bytes());
        raw.extend_from_slice(&1i32.to_be_bytes());
        raw.extend_from_slice(&0i32.to_be_bytes());
        let d = IntervalValue::from_sql(&Type::INTERVAL, &raw).unwrap().0;
        assert_eq!(d, Duration::from_micros(86_400_000_000 + 1_500_000));
    }
}
