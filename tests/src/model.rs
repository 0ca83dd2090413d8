//! A reference model of the pg_intent protocol, for the model-checked test
//! (`tests/model_check.rs`).
//!
//! Written from `docs/reference.md` and `docs/protocol.md` only — never from the extension's source — so
//! that the two are independent: a random sequence of calls is applied to the real server and to
//! this model, and both must give the same answer (values and SQLSTATEs) at every step and hold
//! the same rows. Where the documents leave a choice open, the comment says which reading the
//! model takes.
//!
//! The model is plain data: no clock, no database. Time only matters through the deadline rule,
//! so an attempt carries a `lapsed` flag instead of a deadline; the test sets it with the
//! [`Call::LeaseRunsOut`] step, which on the real server moves the attempt's deadline into the
//! past (simulating time passing without waiting for it).

use serde_json::{Value, json};
use std::collections::BTreeMap;
use uuid::Uuid;

// --- the calls and their answers ------------------------------------------------------------

/// A contract definition the tests use (the model interprets each one itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContractDef {
    /// `{"type": "object", "required": ["ok"]}`
    ShapeLoose,
    /// `{"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}`
    ShapeStrict,
    /// `{"type": "object"}` with the checker `public.n_is_even(jsonb)`:
    /// `(r->>'n')::int % 2 = 0` (NULL when `n` is missing, an error when it is not a number).
    EvenChecker,
}

impl ContractDef {
    /// The JSON Schema to pass to `intent.define_contract`.
    pub fn schema(self) -> Value {
        match self {
            ContractDef::ShapeLoose => json!({"type": "object", "required": ["ok"]}),
            ContractDef::ShapeStrict => json!({
                "type": "object",
                "required": ["ok"],
                "properties": {"ok": {"type": "boolean"}}
            }),
            ContractDef::EvenChecker => json!({"type": "object"}),
        }
    }

    /// The checker to pass to `intent.define_contract` (a regprocedure literal).
    pub fn checker(self) -> Option<&'static str> {
        match self {
            ContractDef::EvenChecker => Some("public.n_is_even(jsonb)"),
            _ => None,
        }
    }

    /// Whether `result` satisfies the contract: schema first, then checker (anything but
    /// `true` rejects).
    pub fn accepts(self, result: &Value) -> bool {
        let Some(obj) = result.as_object() else {
            return false;
        };
        match self {
            ContractDef::ShapeLoose => obj.contains_key("ok"),
            ContractDef::ShapeStrict => obj.get("ok").is_some_and(Value::is_boolean),
            ContractDef::EvenChecker => obj
                .get("n")
                .and_then(Value::as_i64)
                .is_some_and(|n| n % 2 == 0),
        }
    }
}

/// One call with concrete arguments, exactly as it is sent to the server. Intervals are whole
/// seconds.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Submit {
        owner: String,
        key: String,
        provider: String,
        params: Value,
        contract: Option<String>,
        max_attempts: i32,
    },
    /// `submit_jobs`: every element a [`Call::Submit`].
    SubmitBatch(Vec<Call>),
    Begin {
        job_id: Uuid,
        provider: Option<String>,
        lease_secs: i64,
    },
    Complete {
        attempt_id: Uuid,
        version: i64,
        result: Value,
    },
    Fail {
        attempt_id: Uuid,
        version: i64,
        error: Value,
        retryable: bool,
    },
    MarkUnknown {
        attempt_id: Uuid,
        reason: Option<String>,
    },
    Heartbeat {
        attempt_id: Uuid,
        extend_secs: Option<i64>,
    },
    Abandon {
        attempt_id: Uuid,
        reason: Option<String>,
    },
    Cancel {
        job_id: Uuid,
        reason: Option<String>,
    },
    Sweep,
    /// Not an API call: time passes until the job's started attempt (if any) is past its
    /// deadline. The real side moves the deadline into the past with a superuser UPDATE.
    LeaseRunsOut {
        job_id: Uuid,
    },
    DefineContract {
        name: String,
        def: ContractDef,
    },
    Certify {
        provider: String,
        contract: String,
    },
    Revoke {
        provider: String,
        contract: String,
        reason: String,
    },
    /// Not an API call: the newest certification of (provider, contract) expires. The real
    /// side moves its `certified_at` and `expires_at` into the past.
    CertificationExpires {
        provider: String,
        contract: String,
    },
}

/// What a call answers, as a client sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Submitted {
        job_id: Uuid,
        created: bool,
        state: String,
        version: i64,
        result: Option<Value>,
    },
    Begun {
        attempt_id: Uuid,
        attempt_no: i32,
        version: i64,
    },
    /// `complete_attempt`: won, lost or rejected.
    Completion(String),
    /// `fail_attempt`: the job's state.
    JobState(String),
    /// A call returning `void` (mark_unknown, abandon_attempt) or a timestamp we do not compare
    /// (certify_provider).
    Done,
    Bool(bool),
    /// `sweep()`, or rows changed by a simulated step.
    Count(i64),
    /// `define_contract`: the contract's version.
    Version(i32),
    /// The call was refused with this SQLSTATE.
    Refused(String),
    /// `submit_jobs`: one answer per intent, in order.
    Batch(Vec<Answer>),
}

fn refused(code: &str) -> Answer {
    Answer::Refused(code.to_string())
}

// --- the state ---------------------------------------------------------------------------------

// The states are the protocol crate's: the model, the client and the extension share them.
use pg_intent_protocol::limits::{MAX_LEASE_MICROS, MAX_NAME_CHARS, MAX_REASON_CHARS};
pub use pg_intent_protocol::{AttemptState, JobState};

#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub id: Uuid,
    pub no: i32,
    pub provider: String,
    pub state: AttemptState,
    pub version_read: i64,
    /// Its deadline has passed (only meaningful while `started`).
    pub lapsed: bool,
    pub finished: bool,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

impl Attempt {
    fn rejected(&self) -> bool {
        self.state == AttemptState::Failed
            && self
                .error
                .as_ref()
                .is_some_and(|e| e["kind"] == "contract_violation")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: Uuid,
    pub owner: String,
    pub key: String,
    pub provider: String,
    pub params: Value,
    pub contract: Option<String>,
    pub state: JobState,
    pub version: i64,
    pub completed_by: Option<Uuid>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub max_attempts: i32,
    pub attempts: Vec<Attempt>,
    /// (kind, attempt) in the order logged.
    pub events: Vec<(String, Option<Uuid>)>,
}

impl Job {
    fn open_attempt(&self) -> Option<usize> {
        self.attempts.iter().position(|a| a.state.is_open())
    }

    /// The state as the protocol reports it: a running job whose attempt is past its deadline
    /// counts as unknown (the deadline rule), swept or not.
    fn effective_state(&self) -> JobState {
        match self.open_attempt() {
            Some(i)
                if self.state == JobState::Running
                    && self.attempts[i].state == AttemptState::Started
                    && self.attempts[i].lapsed =>
            {
                JobState::Unknown
            }
            _ => self.state,
        }
    }

    fn log(&mut self, kind: &str, attempt: Option<Uuid>) {
        self.events.push((kind.to_string(), attempt));
    }

    /// Logs a late report unless this attempt's late report of that kind is already logged:
    /// the same attempt reporting again is a replay (docs/reference.md § 1.1: "calling again for the same attempt
    /// returns the same answer and changes nothing"), and replays are never logged.
    fn log_late(&mut self, kind: &str, attempt: Uuid) {
        if !self
            .events
            .iter()
            .any(|(k, a)| k == kind && *a == Some(attempt))
        {
            self.log(kind, Some(attempt));
        }
    }

    /// The deadline rule, persisted: the attempt (started, past its deadline) becomes
    /// `unknown`, and so does its job if it was running; a `timeout` event is logged.
    fn persist_lapse(&mut self, i: usize) {
        debug_assert!(self.attempts[i].state == AttemptState::Started && self.attempts[i].lapsed);
        self.attempts[i].state = AttemptState::Unknown;
        if self.state == JobState::Running {
            self.state = JobState::Unknown;
        }
        let id = self.attempts[i].id;
        self.log("timeout", Some(id));
    }

    /// The compare-and-swap of rule 3 (README). Returns whether it changed the job.
    fn cas(&mut self, presented: i64, to: JobState, attempt: Uuid, error: Option<Value>) -> bool {
        if self.version != presented || self.completed_by.is_some() {
            return false;
        }
        // While the job is open every attempt holds the job's version: the version only moves
        // when the job ends.
        debug_assert!(!self.state.is_terminal() || self.state == JobState::Cancelled);
        if self.state.is_terminal() {
            return false;
        }
        self.state = to;
        self.completed_by = Some(attempt);
        self.version += 1;
        self.error = error;
        true
    }

    /// What happens to the job after attempt `i` failed definitely (by `fail_attempt`, or by a
    /// rejected result, which counts as a retryable failure). `was_abandoned`: the attempt had
    /// been abandoned before it failed.
    fn settle_failure(&mut self, i: usize, retryable: bool, was_abandoned: bool) {
        let attempt = self.attempts[i].id;
        let presented = self.attempts[i].version_read;
        let error = self.attempts[i].error.clone();
        let another_open = self.open_attempt().is_some();
        if was_abandoned && another_open {
            // The job is the open attempt's, unless this failure says nothing can be retried.
            if !retryable {
                self.cas(presented, JobState::Failed, attempt, error);
            }
            return;
        }
        if retryable && (self.attempts.len() as i32) < self.max_attempts {
            self.state = JobState::Pending;
        } else {
            self.cas(presented, JobState::Failed, attempt, error);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Contract {
    pub def: ContractDef,
    pub version: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Certification {
    pub provider: String,
    pub contract: String,
    pub contract_version: i32,
    pub revoked: bool,
    pub expired: bool,
}

/// The whole database, as docs/reference.md and docs/protocol.md describe it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Model {
    pub jobs: BTreeMap<Uuid, Job>,
    pub contracts: BTreeMap<String, Contract>,
    /// In the order recorded (the newest of a (provider, contract) decides).
    pub certifications: Vec<Certification>,
}

fn name_ok(s: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&s.chars().count())
}

fn reason_ok(reason: Option<&str>, required: bool) -> bool {
    match reason {
        None => !required,
        Some(r) => (1..=MAX_REASON_CHARS).contains(&r.chars().count()),
    }
}

fn interval_ok(secs: i64) -> bool {
    (1..=(MAX_LEASE_MICROS / 1_000_000) as i64).contains(&secs)
}

/// The job id of an attempt id: its last two bytes zeroed (docs/reference.md § 1.4).
pub fn job_of(attempt_id: Uuid) -> (Uuid, i32) {
    let mut b = *attempt_id.as_bytes();
    let no = i32::from(u16::from_be_bytes([b[14], b[15]]));
    b[14] = 0;
    b[15] = 0;
    (Uuid::from_bytes(b), no)
}

/// The derivations of docs/reference.md § 1.4, through the shared id crate (not the extension).
pub fn job_id(owner: &str, key: &str) -> Uuid {
    Uuid::from_bytes(pg_intent_protocol::job_id_unchecked(owner, key))
}

pub fn attempt_id(job_id: Uuid, no: i64) -> Uuid {
    Uuid::from_bytes(pg_intent_protocol::attempt_id(*job_id.as_bytes(), no).expect("attempt_no"))
}

/// The error kept for a rejected result, as far as the model knows it (the extension adds the
/// validator's `errors`, which [`normalize_error`] leaves out of comparisons).
fn violation(contract: &str, version: i32) -> Value {
    json!({"kind": "contract_violation", "contract": contract, "contract_version": version})
}

/// Errors as compared between the model and the server: a contract violation by its kind,
/// contract and version (the validator's messages are the extension's business); anything else
/// exactly as reported.
pub fn normalize_error(e: &Value) -> Value {
    if e["kind"] == "contract_violation" {
        json!({
            "kind": "contract_violation",
            "contract": e["contract"],
            "contract_version": e["contract_version"],
        })
    } else {
        e.clone()
    }
}

impl Model {
    /// A model holding the given contracts (each at version 1) and nothing else.
    pub fn with_contracts(contracts: &[(&str, ContractDef)]) -> Model {
        Model {
            contracts: contracts
                .iter()
                .map(|(n, d)| {
                    (
                        n.to_string(),
                        Contract {
                            def: *d,
                            version: 1,
                        },
                    )
                })
                .collect(),
            ..Model::default()
        }
    }

    /// The job and the index of the attempt an attempt id names, if both exist.
    fn find_attempt(&mut self, attempt_id: Uuid) -> Option<(&mut Job, usize)> {
        let (job_id, no) = job_of(attempt_id);
        let job = self.jobs.get_mut(&job_id)?;
        let i = usize::try_from(no).ok()?.checked_sub(1)?;
        (i < job.attempts.len()).then_some((job, i))
    }

    /// Why failover of `job` to `provider` is refused (IJ005), if it is.
    fn failover_refused(&self, contract: Option<&str>, provider: &str) -> bool {
        let Some(contract) = contract else {
            return true;
        };
        let current_version = self.contracts.get(contract).map(|c| c.version);
        match self
            .certifications
            .iter()
            .rev()
            .find(|c| c.provider == provider && c.contract == contract)
        {
            None => true,
            Some(c) => c.revoked || c.expired || Some(c.contract_version) != current_version,
        }
    }

    /// Applies one call and returns what docs/reference.md says it answers.
    pub fn apply(&mut self, call: &Call) -> Answer {
        match call {
            Call::Submit {
                owner,
                key,
                provider,
                params,
                contract,
                max_attempts,
            } => self.submit(
                owner,
                key,
                provider,
                params,
                contract.as_deref(),
                *max_attempts,
            ),
            // docs/protocol.md § submit_jobs: each intent gets the answer submit_job would give
            // it, in order (a key repeated later in the batch is a second submit); one bad
            // intent does not stop the others.
            Call::SubmitBatch(submits) => {
                Answer::Batch(submits.iter().map(|s| self.apply(s)).collect())
            }
            Call::Begin {
                job_id,
                provider,
                lease_secs,
            } => self.begin(*job_id, provider.as_deref(), *lease_secs),
            Call::Complete {
                attempt_id,
                version,
                result,
            } => self.complete(*attempt_id, *version, result),
            Call::Fail {
                attempt_id,
                version,
                error,
                retryable,
            } => self.fail(*attempt_id, *version, error, *retryable),
            Call::MarkUnknown { attempt_id, reason } => {
                if !reason_ok(reason.as_deref(), false) {
                    return refused("22023");
                }
                let Some((job, i)) = self.find_attempt(*attempt_id) else {
                    return refused("IJ007");
                };
                // Only a started attempt becomes unknown; otherwise nothing happens. A job that
                // has already ended keeps its state.
                if job.attempts[i].state == AttemptState::Started {
                    job.attempts[i].state = AttemptState::Unknown;
                    if job.state == JobState::Running {
                        job.state = JobState::Unknown;
                    }
                    job.log("timeout", Some(*attempt_id));
                }
                Answer::Done
            }
            Call::Heartbeat {
                attempt_id,
                extend_secs,
            } => {
                if extend_secs.is_some_and(|s| !interval_ok(s)) {
                    return refused("22023");
                }
                let Some((job, i)) = self.find_attempt(*attempt_id) else {
                    return refused("IJ007");
                };
                let a = &job.attempts[i];
                if a.state == AttemptState::Started && a.lapsed {
                    // A lapsed lease is never revived: the attempt becomes unknown for good.
                    job.persist_lapse(i);
                    return Answer::Bool(false);
                }
                // A live lease is extended (the model has no deadlines to move); the worker of an
                // attempt that is not started, or whose job ended, should stop.
                Answer::Bool(a.state == AttemptState::Started && !job.state.is_terminal())
            }
            Call::Abandon { attempt_id, reason } => {
                if !reason_ok(reason.as_deref(), true) {
                    return refused("22023");
                }
                let Some((job, i)) = self.find_attempt(*attempt_id) else {
                    return refused("IJ007");
                };
                // Only a started (lapsed or not) or unknown attempt can be abandoned; its own
                // outcome is recorded directly, without a timeout first.
                if job.attempts[i].state.is_open() {
                    job.attempts[i].state = AttemptState::Abandoned;
                    if !job.state.is_terminal() {
                        job.state = JobState::Pending;
                    }
                    job.log("abandoned", Some(*attempt_id));
                }
                Answer::Done
            }
            Call::Cancel { job_id, reason } => {
                if !reason_ok(reason.as_deref(), false) {
                    return refused("22023");
                }
                let Some(job) = self.jobs.get_mut(job_id) else {
                    return refused("IJ007");
                };
                if job.state.is_terminal() {
                    return Answer::Bool(false);
                }
                if let Some(i) = job.open_attempt()
                    && job.attempts[i].state == AttemptState::Started
                    && job.attempts[i].lapsed
                {
                    job.persist_lapse(i);
                }
                job.state = JobState::Cancelled;
                job.version += 1;
                job.log("cancelled", None);
                Answer::Bool(true)
            }
            Call::Sweep => {
                let mut n = 0;
                for job in self.jobs.values_mut() {
                    for i in 0..job.attempts.len() {
                        if job.attempts[i].state == AttemptState::Started && job.attempts[i].lapsed
                        {
                            job.persist_lapse(i);
                            n += 1;
                        }
                    }
                }
                Answer::Count(n)
            }
            Call::LeaseRunsOut { job_id } => {
                let mut n = 0;
                if let Some(job) = self.jobs.get_mut(job_id) {
                    for a in &mut job.attempts {
                        if a.state == AttemptState::Started {
                            a.lapsed = true;
                            n += 1;
                        }
                    }
                }
                Answer::Count(n)
            }
            Call::DefineContract { name, def } => match self.contracts.get_mut(name) {
                None => {
                    self.contracts.insert(
                        name.clone(),
                        Contract {
                            def: *def,
                            version: 1,
                        },
                    );
                    Answer::Version(1)
                }
                Some(c) => {
                    // The same definition changes nothing; another one bumps the version.
                    if c.def != *def {
                        c.def = *def;
                        c.version += 1;
                    }
                    Answer::Version(c.version)
                }
            },
            Call::Certify { provider, contract } => {
                let Some(c) = self.contracts.get(contract) else {
                    return refused("22023");
                };
                self.certifications.push(Certification {
                    provider: provider.clone(),
                    contract: contract.clone(),
                    contract_version: c.version,
                    revoked: false,
                    expired: false,
                });
                Answer::Done
            }
            Call::Revoke {
                provider,
                contract,
                reason: _,
            } => {
                let current = self.contracts.get(contract).map(|c| c.version);
                let of_pair =
                    |c: &Certification| &c.provider == provider && &c.contract == contract;
                let standing = |c: &Certification| !c.revoked && !c.expired;
                // "false when there was no current certification"; current as in
                // docs/reference.md § 1.3: the newest of the pair, not revoked, not expired, earned on the
                // contract's current version. Revoking withdraws every standing one.
                let newest_current = self
                    .certifications
                    .iter()
                    .rev()
                    .find(|c| of_pair(c))
                    .is_some_and(|c| standing(c) && Some(c.contract_version) == current);
                let withdraw = newest_current;
                if withdraw {
                    for c in self.certifications.iter_mut() {
                        if of_pair(c) && standing(c) {
                            c.revoked = true;
                        }
                    }
                }
                Answer::Bool(withdraw)
            }
            Call::CertificationExpires { provider, contract } => {
                match self
                    .certifications
                    .iter_mut()
                    .rev()
                    .find(|c| &c.provider == provider && &c.contract == contract)
                {
                    Some(c) => {
                        c.expired = true;
                        Answer::Count(1)
                    }
                    None => Answer::Count(0),
                }
            }
        }
    }

    fn submit(
        &mut self,
        owner: &str,
        key: &str,
        provider: &str,
        params: &Value,
        contract: Option<&str>,
        max_attempts: i32,
    ) -> Answer {
        if !name_ok(owner)
            || !name_ok(key)
            || !name_ok(provider)
            || contract.is_some_and(|c| !name_ok(c))
            || !(1..=pg_intent_protocol::MAX_ATTEMPT_NO as i32).contains(&max_attempts)
        {
            return refused("22023");
        }
        // A contract that is not defined is bad input (a typo fails at submit).
        if contract.is_some_and(|c| !self.contracts.contains_key(c)) {
            return refused("22023");
        }
        let id = job_id(owner, key);
        if let Some(job) = self.jobs.get(&id) {
            // Same key: the fingerprint (provider, params, contract) decides. max_attempts is
            // not part of it. A replay writes nothing.
            if job.provider != provider
                || &job.params != params
                || job.contract.as_deref() != contract
            {
                return refused("IJ001");
            }
            return Answer::Submitted {
                job_id: id,
                created: false,
                state: job.effective_state().as_str().to_string(),
                version: job.version,
                result: job.result.clone(),
            };
        }
        self.jobs.insert(
            id,
            Job {
                id,
                owner: owner.to_string(),
                key: key.to_string(),
                provider: provider.to_string(),
                params: params.clone(),
                contract: contract.map(str::to_string),
                state: JobState::Pending,
                version: 1,
                completed_by: None,
                result: None,
                error: None,
                max_attempts,
                attempts: Vec::new(),
                events: Vec::new(),
            },
        );
        Answer::Submitted {
            job_id: id,
            created: true,
            state: "pending".to_string(),
            version: 1,
            result: None,
        }
    }

    fn begin(&mut self, job_id: Uuid, provider: Option<&str>, lease_secs: i64) -> Answer {
        if provider.is_some_and(|p| !name_ok(p)) || !interval_ok(lease_secs) {
            return refused("22023");
        }
        // Checks in the documented order: exists, terminal, open attempt, exhausted, failover.
        let Some(job) = self.jobs.get(&job_id) else {
            return refused("IJ007");
        };
        if job.state.is_terminal() {
            return refused("IJ004");
        }
        if let Some(i) = job.open_attempt() {
            let a = &job.attempts[i];
            return if a.state == AttemptState::Started && !a.lapsed {
                refused("IJ002")
            } else {
                refused("IJ003")
            };
        }
        if job.attempts.len() as i32 >= job.max_attempts {
            return refused("IJ006");
        }
        let provider = provider.unwrap_or(&job.provider).to_string();
        if provider != job.provider && self.failover_refused(job.contract.as_deref(), &provider) {
            return refused("IJ005");
        }
        let job = self.jobs.get_mut(&job_id).expect("job");
        let no = job.attempts.len() as i32 + 1;
        let id = attempt_id(job_id, i64::from(no));
        job.attempts.push(Attempt {
            id,
            no,
            provider,
            state: AttemptState::Started,
            version_read: job.version,
            lapsed: false,
            finished: false,
            result: None,
            error: None,
        });
        // Beginning never changes the version.
        job.state = JobState::Running;
        Answer::Begun {
            attempt_id: id,
            attempt_no: no,
            version: job.version,
        }
    }

    fn complete(&mut self, attempt_id: Uuid, version: i64, result: &Value) -> Answer {
        let contracts = self.contracts.clone();
        let Some((job, i)) = self.find_attempt(attempt_id) else {
            return refused("IJ007");
        };
        if job.attempts[i].version_read != version {
            return refused("22023");
        }
        // The deadline rule first, persisted (for the attempt being reported).
        if job.attempts[i].state == AttemptState::Started && job.attempts[i].lapsed {
            job.persist_lapse(i);
        }
        match job.attempts[i].state {
            // Asked again: the same answer, nothing changes, nothing is logged.
            AttemptState::Succeeded => Answer::Completion("won".into()),
            AttemptState::Discarded => Answer::Completion("lost".into()),
            AttemptState::Failed if job.attempts[i].rejected() => {
                Answer::Completion("rejected".into())
            }
            AttemptState::Failed => {
                // A result after a definite failure: the failure stands, the result is kept in
                // a late_result event.
                job.log_late("late_result", attempt_id);
                Answer::Completion("lost".into())
            }
            AttemptState::Started | AttemptState::Unknown | AttemptState::Abandoned => {
                let was_abandoned = job.attempts[i].state == AttemptState::Abandoned;
                let contract = job
                    .contract
                    .as_ref()
                    .map(|name| (name.clone(), contracts[name].clone()));
                if let Some((name, c)) = contract
                    && !c.def.accepts(result)
                {
                    let a = &mut job.attempts[i];
                    a.state = AttemptState::Failed;
                    a.finished = true;
                    a.result = Some(result.clone());
                    a.error = Some(violation(&name, c.version));
                    job.log("contract_violation", Some(attempt_id));
                    if !job.state.is_terminal() {
                        job.settle_failure(i, true, was_abandoned);
                    }
                    return Answer::Completion("rejected".into());
                }
                if job.cas(version, JobState::Succeeded, attempt_id, None) {
                    job.result = Some(result.clone());
                    let a = &mut job.attempts[i];
                    a.state = AttemptState::Succeeded;
                    a.finished = true;
                    a.result = Some(result.clone());
                    Answer::Completion("won".into())
                } else {
                    let a = &mut job.attempts[i];
                    a.state = AttemptState::Discarded;
                    a.finished = true;
                    a.result = Some(result.clone());
                    job.log("late_result", Some(attempt_id));
                    Answer::Completion("lost".into())
                }
            }
        }
    }

    fn fail(&mut self, attempt_id: Uuid, version: i64, error: &Value, retryable: bool) -> Answer {
        let Some((job, i)) = self.find_attempt(attempt_id) else {
            return refused("IJ007");
        };
        if job.attempts[i].version_read != version {
            return refused("22023");
        }
        match job.attempts[i].state {
            // Reported again: nothing changes.
            AttemptState::Failed => {}
            AttemptState::Succeeded | AttemptState::Discarded => {
                job.log_late("late_failure", attempt_id);
            }
            AttemptState::Started | AttemptState::Unknown | AttemptState::Abandoned => {
                let was_abandoned = job.attempts[i].state == AttemptState::Abandoned;
                // The attempt's own outcome is recorded directly (no timeout first).
                let a = &mut job.attempts[i];
                a.state = AttemptState::Failed;
                a.finished = true;
                a.error = Some(error.clone());
                if job.state.is_terminal() {
                    // Reading: the job had already finished, so the failure is late; the
                    // attempt still records what its provider said.
                    job.log_late("late_failure", attempt_id);
                } else {
                    job.settle_failure(i, retryable, was_abandoned);
                }
            }
        }
        Answer::JobState(job.effective_state().as_str().to_string())
    }

    /// Every row, in the form compared with the server's.
    pub fn snapshot(&self) -> Snapshot {
        let jobs = self
            .jobs
            .values()
            .map(|j| JobSnap {
                id: j.id,
                owner: j.owner.clone(),
                key: j.key.clone(),
                provider: j.provider.clone(),
                params: j.params.clone(),
                contract: j.contract.clone(),
                state: j.state.as_str().to_string(),
                version: j.version,
                completed_by: j.completed_by,
                result: j.result.clone(),
                error: j.error.as_ref().map(normalize_error),
                max_attempts: j.max_attempts,
                attempt_count: j.attempts.len() as i32,
                attempts: j
                    .attempts
                    .iter()
                    .map(|a| AttemptSnap {
                        id: a.id,
                        attempt_no: a.no,
                        provider: a.provider.clone(),
                        state: a.state.as_str().to_string(),
                        version_read: a.version_read,
                        finished: a.finished,
                        result: a.result.clone(),
                        error: a.error.as_ref().map(normalize_error),
                    })
                    .collect(),
                events: j.events.clone(),
            })
            .collect();
        Snapshot {
            jobs,
            contracts: self
                .contracts
                .iter()
                .map(|(n, c)| (n.clone(), c.version))
                .collect(),
            certifications: self
                .certifications
                .iter()
                .map(|c| {
                    (
                        c.provider.clone(),
                        c.contract.clone(),
                        c.contract_version,
                        c.revoked,
                    )
                })
                .collect(),
        }
    }
}

// --- what is compared --------------------------------------------------------------------------

/// One attempt row as compared.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptSnap {
    pub id: Uuid,
    pub attempt_no: i32,
    pub provider: String,
    pub state: String,
    pub version_read: i64,
    pub finished: bool,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

/// One job row, its attempts and its events, as compared.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSnap {
    pub id: Uuid,
    pub owner: String,
    pub key: String,
    pub provider: String,
    pub params: Value,
    pub contract: Option<String>,
    pub state: String,
    pub version: i64,
    pub completed_by: Option<Uuid>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub max_attempts: i32,
    pub attempt_count: i32,
    pub attempts: Vec<AttemptSnap>,
    /// (kind, attempt_id) in id order.
    pub events: Vec<(String, Option<Uuid>)>,
}

/// Every row the protocol writes, as compared between the model and the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// By job id.
    pub jobs: Vec<JobSnap>,
    /// (name, version) by name.
    pub contracts: Vec<(String, i32)>,
    /// (provider, contract, contract_version, revoked) in the order recorded.
    pub certifications: Vec<(String, String, i32, bool)>,
}

impl Snapshot {
    /// A readable account of the first differences between two snapshots.
    pub fn diff(&self, other: &Snapshot) -> String {
        let mut out = String::new();
        if self.jobs.len() != other.jobs.len() {
            out += &format!("jobs: {} vs {}\n", self.jobs.len(), other.jobs.len());
        }
        for (a, b) in self.jobs.iter().zip(&other.jobs) {
            if a != b {
                out += &format!("job {}:\n  model:  {a:?}\n  server: {b:?}\n", a.id);
            }
        }
        if self.contracts != other.contracts {
            out += &format!(
                "contracts:\n  model:  {:?}\n  server: {:?}\n",
                self.contracts, other.contracts
            );
        }
        if self.certifications != other.certifications {
            out += &format!(
                "certifications:\n  model:  {:?}\n  server: {:?}\n",
                self.certifications, other.certifications
            );
        }
        out
    }
}
