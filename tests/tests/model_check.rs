//! The protocol, model-checked: random sequences of every call — submit, begin, complete, fail,
//! mark_unknown, heartbeat, abandon, cancel, sweep, contracts, certifications, and leases running
//! out — are run against a real server and against the reference model of `src/model.rs`
//! (written from docs/reference.md and docs/protocol.md, independently of the extension). Both must give
//! the same answer at every step, values and SQLSTATEs alike, and hold the same rows after every
//! step: job states, versions, completed_by, results and errors, every attempt's state, version,
//! result placement, and the kinds of events logged per job, in order.
//!
//! Time: attempts begin with an hour's lease, which never runs out by itself during a test.
//! Leases run out only in the explicit `LeaseRunsOut` step, which simulates time passing: as
//! superuser it moves the started attempt's deadline into the past (to a microsecond after its
//! start, `lapse_lease`), exactly what
//! the server would see an hour later. So every run is deterministic, and the deadline rule
//! (IJ003, heartbeat false, submit reporting unknown, the persisted timeout, sweep) is exercised
//! without waiting. Certifications expire the same way.
//!
//! Proptest shrinks a failing sequence to a minimal one and prints it with the step that
//! diverged. By default 128 cases of up to 40 steps; `PG_INTENT_FULL=1` runs 1024 cases of up to
//! 80 steps; `PG_INTENT_MODEL_CASES` and `PG_INTENT_MODEL_STEPS` set them exactly and
//! `PG_INTENT_MODEL_SEED` (a number) replays a run.

use pg_intent_tests::model::{Answer, Call, ContractDef, Model, Snapshot, normalize_error};
use pg_intent_tests::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use tokio::runtime::Runtime;

// --- the world the sequences play in -----------------------------------------------------------

/// Job slots: (owner, key). Two owners share a key, which must still be two jobs.
const SLOTS: [(&str, &str); 4] = [
    ("alice", "k0"),
    ("alice", "k1"),
    ("bob", "k1"),
    ("bob", "k2"),
];
/// The contract each slot's job names when submitted with its usual fingerprint.
const SLOT_CONTRACT: [Option<&str>; 4] = [None, Some("c_shape"), Some("c_even"), Some("c_shape")];
const PROVIDERS: [&str; 3] = ["p1", "p2", "p3"];
const CONTRACTS: [&str; 2] = ["c_shape", "c_even"];

fn results() -> [Value; 7] {
    [
        json!({"ok": true}),
        json!({"ok": "yes"}),
        json!({"nope": 1}),
        json!([1, 2]),
        json!({"ok": false, "n": 2}),
        json!({"ok": true, "n": 3}),
        json!({"n": "x"}),
    ]
}

fn errors() -> [Value; 2] {
    [
        json!({"status": 400}),
        json!({"status": 503, "retry": true}),
    ]
}

const LEASE: i64 = 3600;

// --- operations: what proptest generates ----------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Fingerprint {
    Usual,
    OtherProvider,
    OtherParams,
    OtherContract,
    UndefinedContract,
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Latest,
    Previous,
    Nth(i32),
}

/// A job: mostly one that exists (the k-th, modulo how many there are), sometimes a slot that
/// may never have been submitted.
#[derive(Debug, Clone, Copy)]
enum JobSel {
    Existing(usize),
    /// The k-th job that has an attempt (else as `Existing`).
    Tried(usize),
    /// The k-th job that has an open attempt (else as `Tried`).
    Busy(usize),
    Slot(usize),
    /// Exactly this job (never generated: used when one operation expands into several calls).
    Id(Uuid),
}

#[derive(Debug, Clone, Copy)]
struct AttemptRef {
    job: JobSel,
    which: Which,
}

#[derive(Debug, Clone, Copy)]
enum Reason {
    None,
    Some,
    Empty,
}

impl Reason {
    fn get(self) -> Option<String> {
        match self {
            Reason::None => None,
            Reason::Some => Some("model check".into()),
            Reason::Empty => Some(String::new()),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Submit {
        slot: usize,
        fingerprint: Fingerprint,
        max_attempts: i32,
    },
    /// `submit_jobs`: (slot, fingerprint, max_attempts) per intent.
    SubmitBatch {
        items: Vec<(usize, Fingerprint, i32)>,
    },
    Begin {
        job: JobSel,
        provider: Option<usize>,
        lease: i64,
    },
    Complete {
        attempt: AttemptRef,
        honest: bool,
        result: usize,
    },
    Fail {
        attempt: AttemptRef,
        honest: bool,
        error: usize,
        retryable: bool,
    },
    MarkUnknown {
        attempt: AttemptRef,
        reason: Reason,
    },
    Heartbeat {
        attempt: AttemptRef,
        extend: Option<i64>,
    },
    Abandon {
        attempt: AttemptRef,
        reason: Reason,
    },
    Cancel {
        job: JobSel,
        reason: Reason,
    },
    Sweep,
    /// Time passes until the job's started attempt is past its deadline; `then` is the call
    /// that meets the lapsed lease first (so that every call's deadline rule gets exercised).
    LeaseRunsOut {
        job: JobSel,
        then: Option<Then>,
    },
    /// The job's own submit again (its usual fingerprint): a replay.
    Resubmit {
        job: JobSel,
    },
    RedefineShape {
        strict: bool,
    },
    Certify {
        provider: usize,
        contract: usize,
    },
    Revoke {
        provider: usize,
        contract: usize,
    },
    CertificationExpires {
        provider: usize,
        contract: usize,
    },
}

/// The call right after a lease runs out, on the same job.
#[derive(Debug, Clone, Copy)]
enum Then {
    Heartbeat,
    Complete(usize),
    Fail(bool),
    MarkUnknown,
    Abandon,
    Begin,
    Resubmit,
    Cancel,
    Sweep,
}

impl Then {
    fn op(self, job: JobSel) -> Op {
        let attempt = AttemptRef {
            job,
            which: Which::Latest,
        };
        match self {
            Then::Heartbeat => Op::Heartbeat {
                attempt,
                extend: None,
            },
            Then::Complete(result) => Op::Complete {
                attempt,
                honest: true,
                result,
            },
            Then::Fail(retryable) => Op::Fail {
                attempt,
                honest: true,
                error: 0,
                retryable,
            },
            Then::MarkUnknown => Op::MarkUnknown {
                attempt,
                reason: Reason::Some,
            },
            Then::Abandon => Op::Abandon {
                attempt,
                reason: Reason::Some,
            },
            Then::Begin => Op::Begin {
                job,
                provider: None,
                lease: LEASE,
            },
            Then::Resubmit => Op::Resubmit { job },
            Then::Cancel => Op::Cancel {
                job,
                reason: Reason::None,
            },
            Then::Sweep => Op::Sweep,
        }
    }
}

fn then() -> impl Strategy<Value = Then> {
    prop_oneof![
        Just(Then::Heartbeat),
        (0..7usize).prop_map(Then::Complete),
        any::<bool>().prop_map(Then::Fail),
        Just(Then::MarkUnknown),
        Just(Then::Abandon),
        Just(Then::Begin),
        Just(Then::Resubmit),
        Just(Then::Cancel),
        Just(Then::Sweep),
    ]
}

fn slot() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0), 3 => Just(1), 2 => Just(2), 1 => Just(3)]
}

fn job_sel() -> impl Strategy<Value = JobSel> {
    prop_oneof![
        9 => (0..SLOTS.len()).prop_map(JobSel::Existing),
        1 => slot().prop_map(JobSel::Slot),
    ]
}

fn attempt_ref() -> impl Strategy<Value = AttemptRef> {
    let which = prop_oneof![
        7 => Just(Which::Latest),
        2 => Just(Which::Previous),
        1 => (1..=4i32).prop_map(Which::Nth),
    ];
    let job = prop_oneof![
        5 => (0..SLOTS.len()).prop_map(JobSel::Busy),
        4 => (0..SLOTS.len()).prop_map(JobSel::Tried),
        1 => slot().prop_map(JobSel::Slot),
    ];
    (job, which).prop_map(|(job, which)| AttemptRef { job, which })
}

fn reason() -> impl Strategy<Value = Reason> {
    prop_oneof![
        6 => Just(Reason::Some),
        3 => Just(Reason::None),
        1 => Just(Reason::Empty),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let fingerprint = prop_oneof![
        30 => Just(Fingerprint::Usual),
        1 => Just(Fingerprint::OtherProvider),
        1 => Just(Fingerprint::OtherParams),
        1 => Just(Fingerprint::OtherContract),
        1 => Just(Fingerprint::UndefinedContract),
    ];
    let max_attempts = prop_oneof![
        20 => 1..=3i32,
        1 => Just(0),
        1 => Just(65536),
    ];
    let lease = prop_oneof![20 => Just(LEASE), 1 => Just(0i64), 1 => Just(25 * 3600i64)];
    let extend = prop_oneof![
        4 => Just(None),
        4 => Just(Some(LEASE)),
        1 => Just(Some(0i64)),
    ];
    let honest = prop_oneof![12 => Just(true), 1 => Just(false)];
    prop_oneof![
        12 => (slot(), fingerprint.clone(), max_attempts.clone()).prop_map(
            |(slot, fingerprint, max_attempts)| Op::Submit { slot, fingerprint, max_attempts }
        ),
        3 => proptest::collection::vec((slot(), fingerprint, max_attempts), 1..=4)
            .prop_map(|items| Op::SubmitBatch { items }),
        14 => (job_sel(), prop_oneof![6 => Just(None), 1 => (0..PROVIDERS.len()).prop_map(Some)], lease)
            .prop_map(|(job, provider, lease)| Op::Begin { job, provider, lease }),
        14 => (attempt_ref(), honest.clone(), 0..7usize).prop_map(|(attempt, honest, result)| {
            Op::Complete { attempt, honest, result }
        }),
        8 => (attempt_ref(), honest, 0..2usize, prop_oneof![3 => Just(true), 1 => Just(false)])
            .prop_map(|(attempt, honest, error, retryable)| Op::Fail {
                attempt,
                honest,
                error,
                retryable
            }),
        5 => (attempt_ref(), reason()).prop_map(|(attempt, reason)| Op::MarkUnknown { attempt, reason }),
        6 => (attempt_ref(), extend).prop_map(|(attempt, extend)| Op::Heartbeat { attempt, extend }),
        5 => (attempt_ref(), reason()).prop_map(|(attempt, reason)| Op::Abandon { attempt, reason }),
        3 => (job_sel(), reason()).prop_map(|(job, reason)| Op::Cancel { job, reason }),
        3 => Just(Op::Sweep),
        8 => (
            prop_oneof![4 => (0..SLOTS.len()).prop_map(JobSel::Busy), 1 => job_sel()],
            prop_oneof![1 => Just(None), 4 => then().prop_map(Some)],
        )
            .prop_map(|(job, then)| Op::LeaseRunsOut { job, then }),
        2 => job_sel().prop_map(|job| Op::Resubmit { job }),
        3 => any::<bool>().prop_map(|strict| Op::RedefineShape { strict }),
        4 => (1..PROVIDERS.len(), 0..CONTRACTS.len())
            .prop_map(|(provider, contract)| Op::Certify { provider, contract }),
        4 => (1..PROVIDERS.len(), 0..CONTRACTS.len())
            .prop_map(|(provider, contract)| Op::Revoke { provider, contract }),
        2 => (1..PROVIDERS.len(), 0..CONTRACTS.len())
            .prop_map(|(provider, contract)| Op::CertificationExpires { provider, contract }),
    ]
}

/// Turns an operation into a concrete call. Attempt references ("the latest attempt of slot
/// 2") and honest versions are resolved against the model, which is deterministic given the
/// sequence; the call itself is then sent to both sides unchanged.
fn resolve(model: &Model, op: &Op) -> Call {
    let job_of_slot = |slot: usize| model::job_id(SLOTS[slot].0, SLOTS[slot].1);
    let kth = |k: usize, keep: &dyn Fn(&model::Job) -> bool| -> Option<Uuid> {
        let ids: Vec<Uuid> = model
            .jobs
            .values()
            .filter(|j| keep(j))
            .map(|j| j.id)
            .collect();
        (!ids.is_empty()).then(|| ids[k % ids.len()])
    };
    let job = |sel: JobSel| -> Uuid {
        let (k, found) = match sel {
            JobSel::Slot(slot) => return job_of_slot(slot),
            JobSel::Id(id) => return id,
            JobSel::Existing(k) => (k, None),
            JobSel::Tried(k) => (k, kth(k, &|j| !j.attempts.is_empty())),
            JobSel::Busy(k) => (
                k,
                kth(k, &|j| j.attempts.iter().any(|a| a.state.is_open()))
                    .or_else(|| kth(k, &|j| !j.attempts.is_empty())),
            ),
        };
        found
            .or_else(|| kth(k, &|_| true))
            .unwrap_or_else(|| job_of_slot(k % SLOTS.len()))
    };
    let attempt = |r: AttemptRef, honest: bool| -> (Uuid, i64) {
        let job_id = job(r.job);
        let count = model
            .jobs
            .get(&job_id)
            .map_or(0, |j| j.attempts.len() as i32);
        let no = match r.which {
            Which::Latest => count.max(1),
            Which::Previous => (count - 1).max(1),
            Which::Nth(n) => n,
        };
        let own = model
            .jobs
            .get(&job_id)
            .and_then(|j| j.attempts.get(no as usize - 1))
            .map_or(1, |a| a.version_read);
        (
            model::attempt_id(job_id, i64::from(no)),
            if honest { own } else { own + 1 },
        )
    };
    match *op {
        Op::Submit {
            slot,
            fingerprint,
            max_attempts,
        } => {
            let (owner, key) = SLOTS[slot];
            let mut provider = "p1";
            let mut params = json!({"prompt": format!("{owner}/{key}")});
            let mut contract = SLOT_CONTRACT[slot];
            match fingerprint {
                Fingerprint::Usual => {}
                Fingerprint::OtherProvider => provider = "p2",
                Fingerprint::OtherParams => params = json!({"prompt": "something else"}),
                Fingerprint::OtherContract => {
                    contract = match contract {
                        None => Some("c_shape"),
                        Some("c_shape") => Some("c_even"),
                        Some(_) => None,
                    }
                }
                Fingerprint::UndefinedContract => contract = Some("c_typo"),
            }
            Call::Submit {
                owner: owner.into(),
                key: key.into(),
                provider: provider.into(),
                params,
                contract: contract.map(str::to_string),
                max_attempts,
            }
        }
        Op::SubmitBatch { ref items } => Call::SubmitBatch(
            items
                .iter()
                .map(|&(slot, fingerprint, max_attempts)| {
                    resolve(
                        model,
                        &Op::Submit {
                            slot,
                            fingerprint,
                            max_attempts,
                        },
                    )
                })
                .collect(),
        ),
        Op::Begin {
            job: sel,
            provider,
            lease,
        } => Call::Begin {
            job_id: job(sel),
            provider: provider.map(|p| PROVIDERS[p].to_string()),
            lease_secs: lease,
        },
        Op::Complete {
            attempt: r,
            honest,
            result,
        } => {
            let (attempt_id, version) = attempt(r, honest);
            Call::Complete {
                attempt_id,
                version,
                result: results()[result].clone(),
            }
        }
        Op::Fail {
            attempt: r,
            honest,
            error,
            retryable,
        } => {
            let (attempt_id, version) = attempt(r, honest);
            Call::Fail {
                attempt_id,
                version,
                error: errors()[error].clone(),
                retryable,
            }
        }
        Op::MarkUnknown { attempt: r, reason } => Call::MarkUnknown {
            attempt_id: attempt(r, true).0,
            reason: reason.get(),
        },
        Op::Heartbeat { attempt: r, extend } => Call::Heartbeat {
            attempt_id: attempt(r, true).0,
            extend_secs: extend,
        },
        Op::Abandon { attempt: r, reason } => Call::Abandon {
            attempt_id: attempt(r, true).0,
            reason: reason.get(),
        },
        Op::Cancel { job: sel, reason } => Call::Cancel {
            job_id: job(sel),
            reason: reason.get(),
        },
        Op::Sweep => Call::Sweep,
        Op::LeaseRunsOut { job: sel, .. } => Call::LeaseRunsOut { job_id: job(sel) },
        Op::Resubmit { job: sel } => {
            let job_id = job(sel);
            let slot = (0..SLOTS.len())
                .find(|&s| job_of_slot(s) == job_id)
                .expect("every job is a slot's");
            resolve(
                model,
                &Op::Submit {
                    slot,
                    fingerprint: Fingerprint::Usual,
                    max_attempts: 3,
                },
            )
        }
        Op::RedefineShape { strict } => Call::DefineContract {
            name: "c_shape".into(),
            def: if strict {
                ContractDef::ShapeStrict
            } else {
                ContractDef::ShapeLoose
            },
        },
        Op::Certify { provider, contract } => Call::Certify {
            provider: PROVIDERS[provider].into(),
            contract: CONTRACTS[contract].into(),
        },
        Op::Revoke { provider, contract } => Call::Revoke {
            provider: PROVIDERS[provider].into(),
            contract: CONTRACTS[contract].into(),
            reason: "model check".into(),
        },
        Op::CertificationExpires { provider, contract } => Call::CertificationExpires {
            provider: PROVIDERS[provider].into(),
            contract: CONTRACTS[contract].into(),
        },
    }
}

use pg_intent_tests::model;

// --- the real side ---------------------------------------------------------------------------

/// Sends a call to the server and returns its answer in the model's terms.
async fn run_real(c: &Client, call: &Call) -> Answer {
    let answer = match call {
        Call::Submit {
            owner,
            key,
            provider,
            params,
            contract,
            max_attempts,
        } => c
            .query_one(
                "SELECT job_id, created, state::text, version, result
                   FROM intent.submit_job($1, $2, $3, $4, $5, $6)",
                &[owner, key, provider, params, contract, max_attempts],
            )
            .await
            .map(|r| Answer::Submitted {
                job_id: r.get(0),
                created: r.get(1),
                state: r.get(2),
                version: r.get(3),
                result: r.get(4),
            }),
        Call::SubmitBatch(submits) => {
            let (mut owners, mut keys, mut providers) = (Vec::new(), Vec::new(), Vec::new());
            let (mut params, mut contracts, mut max_attempts) =
                (Vec::new(), Vec::new(), Vec::new());
            for s in submits {
                let Call::Submit {
                    owner,
                    key,
                    provider,
                    params: p,
                    contract,
                    max_attempts: m,
                } = s
                else {
                    unreachable!("{s:?}")
                };
                owners.push(owner.clone());
                keys.push(key.clone());
                providers.push(provider.clone());
                params.push(p.clone());
                contracts.push(contract.clone());
                max_attempts.push(*m);
            }
            c.query(
                "SELECT job_id, created, state::text, version, result, sqlstate
                   FROM intent.submit_jobs($1, $2, $3, $4, $5, $6) ORDER BY ordinality",
                &[
                    &owners,
                    &keys,
                    &providers,
                    &params,
                    &contracts,
                    &max_attempts,
                ],
            )
            .await
            .map(|rows| {
                Answer::Batch(
                    rows.iter()
                        .map(|r| match r.get::<_, Option<String>>(5) {
                            Some(code) => Answer::Refused(code),
                            None => Answer::Submitted {
                                job_id: r.get(0),
                                created: r.get(1),
                                state: r.get(2),
                                version: r.get(3),
                                result: r.get(4),
                            },
                        })
                        .collect(),
                )
            })
        }
        Call::Begin {
            job_id,
            provider,
            lease_secs,
        } => c
            .query_one(
                "SELECT attempt_id, attempt_no, version
                   FROM intent.begin_attempt($1, $2, $3::bigint * interval '1 second')",
                &[job_id, provider, lease_secs],
            )
            .await
            .map(|r| Answer::Begun {
                attempt_id: r.get(0),
                attempt_no: r.get(1),
                version: r.get(2),
            }),
        Call::Complete {
            attempt_id,
            version,
            result,
        } => c
            .query_one(
                "SELECT intent.complete_attempt($1, $2, $3)::text",
                &[attempt_id, version, result],
            )
            .await
            .map(|r| Answer::Completion(r.get(0))),
        Call::Fail {
            attempt_id,
            version,
            error,
            retryable,
        } => c
            .query_one(
                "SELECT intent.fail_attempt($1, $2, $3, $4)::text",
                &[attempt_id, version, error, retryable],
            )
            .await
            .map(|r| Answer::JobState(r.get(0))),
        Call::MarkUnknown { attempt_id, reason } => c
            .query_one(
                "SELECT intent.mark_unknown($1, $2)::text",
                &[attempt_id, reason],
            )
            .await
            .map(|_| Answer::Done),
        Call::Heartbeat {
            attempt_id,
            extend_secs,
        } => c
            .query_one(
                "SELECT intent.heartbeat($1, $2::bigint * interval '1 second')",
                &[attempt_id, extend_secs],
            )
            .await
            .map(|r| Answer::Bool(r.get(0))),
        Call::Abandon { attempt_id, reason } => c
            .query_one(
                "SELECT intent.abandon_attempt($1, $2)::text",
                &[attempt_id, reason],
            )
            .await
            .map(|_| Answer::Done),
        Call::Cancel { job_id, reason } => c
            .query_one("SELECT intent.cancel_job($1, $2)", &[job_id, reason])
            .await
            .map(|r| Answer::Bool(r.get(0))),
        Call::Sweep => c
            .query_one("SELECT intent.sweep()", &[])
            .await
            .map(|r| Answer::Count(r.get(0))),
        // Simulated time: the started attempt's lease has run out.
        Call::LeaseRunsOut { job_id } => {
            // (lapse_lease: the target-neutral way, Citus included.)
            let started = c
                .query_opt(
                    "SELECT id FROM intent.attempts WHERE job_id = $1 AND state = 'started'",
                    &[job_id],
                )
                .await;
            match started {
                Ok(Some(row)) => lapse_lease(c, row.get(0))
                    .await
                    .map(|n| Answer::Count(n as i64)),
                Ok(None) => Ok(Answer::Count(0)),
                Err(e) => Err(e),
            }
        }
        Call::DefineContract { name, def } => c
            .query_one(
                "SELECT intent.define_contract($1, $2, $3::text::regprocedure)",
                &[name, &def.schema(), &def.checker()],
            )
            .await
            .map(|r| Answer::Version(r.get(0))),
        Call::Certify { provider, contract } => c
            .query_one(
                "SELECT intent.certify_provider($1, $2, '{\"suite\": \"passed\"}')",
                &[provider, contract],
            )
            .await
            .map(|_| Answer::Done),
        Call::Revoke {
            provider,
            contract,
            reason,
        } => c
            .query_one(
                "SELECT intent.revoke_certification($1, $2, $3)",
                &[provider, contract, reason],
            )
            .await
            .map(|r| Answer::Bool(r.get(0))),
        // Simulated time: the newest certification has expired.
        Call::CertificationExpires { provider, contract } => c
            .execute(
                "UPDATE intent.certifications
                    SET certified_at = statement_timestamp() - interval '2 days',
                        expires_at = statement_timestamp() - interval '1 day'
                  WHERE id = (SELECT max(id) FROM intent.certifications
                               WHERE provider = $1 AND contract = $2)",
                &[provider, contract],
            )
            .await
            .map(|n| Answer::Count(n as i64)),
    };
    match answer {
        Ok(a) => a,
        Err(e) => match SqlError::code_of(&e) {
            Some(code) => Answer::Refused(code),
            None => panic!("{call:?}: not a server error: {e:?}"),
        },
    }
}

/// Every row the protocol writes, read from the server (as superuser, unbound: all owners).
async fn real_snapshot(c: &Client) -> Snapshot {
    let rows = c
        .query(
            "SELECT id, owner_id, idempotency_key, provider, params, contract, state::text,
                    version, completed_by, result, error, max_attempts, attempt_count
               FROM intent.jobs ORDER BY id",
            &[],
        )
        .await
        .expect("read jobs");
    // All attempts and events at once (one round trip each), then grouped by job.
    let mut attempts: BTreeMap<Uuid, Vec<model::AttemptSnap>> = BTreeMap::new();
    for a in c
        .query(
            "SELECT job_id, id, attempt_no, provider, state::text, version_read,
                    finished_at IS NOT NULL, result, error
               FROM intent.attempts ORDER BY job_id, attempt_no",
            &[],
        )
        .await
        .expect("read attempts")
    {
        let error: Option<Value> = a.get(8);
        attempts
            .entry(a.get(0))
            .or_default()
            .push(model::AttemptSnap {
                id: a.get(1),
                attempt_no: a.get(2),
                provider: a.get(3),
                state: a.get(4),
                version_read: a.get(5),
                finished: a.get(6),
                result: a.get(7),
                error: error.as_ref().map(normalize_error),
            });
    }
    let mut events: BTreeMap<Uuid, Vec<(String, Option<Uuid>)>> = BTreeMap::new();
    for e in c
        .query(
            "SELECT job_id, kind, attempt_id FROM intent.events ORDER BY id",
            &[],
        )
        .await
        .expect("read events")
    {
        events
            .entry(e.get(0))
            .or_default()
            .push((e.get(1), e.get(2)));
    }
    let mut jobs = Vec::new();
    for r in rows {
        let id: Uuid = r.get(0);
        let error: Option<Value> = r.get(10);
        jobs.push(model::JobSnap {
            id,
            owner: r.get(1),
            key: r.get(2),
            provider: r.get(3),
            params: r.get(4),
            contract: r.get(5),
            state: r.get(6),
            version: r.get(7),
            completed_by: r.get(8),
            result: r.get(9),
            error: error.as_ref().map(normalize_error),
            max_attempts: r.get(11),
            attempt_count: r.get(12),
            attempts: attempts.remove(&id).unwrap_or_default(),
            events: events.remove(&id).unwrap_or_default(),
        });
    }
    assert!(
        attempts.is_empty() && events.is_empty(),
        "attempts or events without a job: {attempts:?} {events:?}"
    );
    let contracts = c
        .query(
            "SELECT name, version FROM intent.contracts ORDER BY name",
            &[],
        )
        .await
        .expect("read contracts")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let certifications = c
        .query(
            "SELECT provider, contract, contract_version, revoked_at IS NOT NULL
               FROM intent.certifications ORDER BY id",
            &[],
        )
        .await
        .expect("read certifications")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    Snapshot {
        jobs,
        contracts,
        certifications,
    }
}

const SETUP: &str = "
    CREATE FUNCTION public.n_is_even(r jsonb) RETURNS boolean
        LANGUAGE sql IMMUTABLE AS $$ SELECT (r->>'n')::int % 2 = 0 $$;
    GRANT EXECUTE ON FUNCTION public.n_is_even(jsonb) TO intent_owner;";

/// Empties the database and defines the contracts every case starts with.
async fn reset(c: &Client) -> Model {
    // Two transactions: Citus (the citus target) refuses DML on a reference table after the
    // TRUNCATE of distributed tables in the same one.
    c.batch_execute("TRUNCATE intent.events, intent.attempts, intent.certifications, intent.jobs")
        .await
        .expect("reset");
    c.batch_execute("DELETE FROM intent.contracts")
        .await
        .expect("reset");
    let contracts = [
        ("c_shape", ContractDef::ShapeLoose),
        ("c_even", ContractDef::EvenChecker),
    ];
    let mut model = Model::default();
    for (name, def) in contracts {
        let call = Call::DefineContract {
            name: name.into(),
            def,
        };
        assert_eq!(run_real(c, &call).await, Answer::Version(1));
        assert_eq!(model.apply(&call), Answer::Version(1));
    }
    model
}

/// A case: how many attempts the first two jobs allow (they are submitted before anything
/// else, so that most calls find a job), then the random calls.
type Case = ([i32; 2], Vec<Op>);

/// Runs one case on both sides; the first difference fails it with the trace so far.
async fn run_case(c: &Client, case: &Case, seen: &Seen) -> Result<(), String> {
    let mut model = reset(c).await;
    let mut trace = String::new();
    let (prelude, ops) = case;
    let prelude = prelude
        .iter()
        .enumerate()
        .map(|(slot, &max_attempts)| Op::Submit {
            slot,
            fingerprint: Fingerprint::Usual,
            max_attempts,
        });
    let mut queue: std::collections::VecDeque<Op> = prelude.chain(ops.iter().cloned()).collect();
    let mut step = 0;
    let mut before = real_snapshot(c).await;
    while let Some(op) = queue.pop_front() {
        // A lease running out is about the job's started attempt: on a job that is open but
        // has none, one begins first; then the lease runs out, then the follow-up call meets it.
        if let Op::LeaseRunsOut { job, then } = &op
            && !matches!(job, JobSel::Id(_))
        {
            let id = match resolve(&model, &op) {
                Call::LeaseRunsOut { job_id } => job_id,
                other => unreachable!("{other:?}"),
            };
            let job = JobSel::Id(id);
            let mut expanded = Vec::new();
            if model.jobs.get(&id).is_some_and(|j| {
                !j.state.is_terminal() && !j.attempts.iter().any(|a| a.state.is_open())
            }) {
                expanded.push(Op::Begin {
                    job,
                    provider: None,
                    lease: LEASE,
                });
            }
            expanded.push(Op::LeaseRunsOut { job, then: None });
            expanded.extend(then.map(|t| t.op(job)));
            for op in expanded.into_iter().rev() {
                queue.push_front(op);
            }
            continue;
        }
        let call = resolve(&model, &op);
        let model_before = model.clone();
        let expected = model.apply(&call);
        let got = run_real(c, &call).await;
        trace += &format!("  {step:>2}. {call:?}\n      -> {got:?}\n");
        seen.note(&call, &got);
        if got != expected {
            return Err(format!(
                "step {step}: the answers differ\n  call:   {call:?}\n  model:  {expected:?}\n  server: {got:?}\ntrace:\n{trace}"
            ));
        }
        let want = model.snapshot();
        let have = real_snapshot(c).await;
        if want != have {
            return Err(format!(
                "step {step}: the rows differ after {call:?}\n{}trace:\n{trace}",
                want.diff(&have)
            ));
        }
        // Every change the server made is a row of the transition table.
        for (observed, row) in transitions::observe(&call, &before, &have, &model_before, &model) {
            match row {
                Some(row) => seen.note_transition(row),
                None => {
                    return Err(format!(
                        "step {step}: a transition that is not in pg_intent_protocol::state::TRANSITIONS\n  call: {call:?}\n  observed: {observed:?}\ntrace:\n{trace}"
                    ));
                }
            }
        }
        before = have;
        step += 1;
    }
    Ok(())
}

/// What the runs covered: every (call, answer) pair seen, counted, so that a reader can check
/// that the sequences reach the interesting corners (printed at the end), and how often each
/// row of the transition table was observed.
#[derive(Default)]
struct Seen(
    Mutex<BTreeMap<String, usize>>,
    Mutex<BTreeMap<usize, usize>>,
);

impl Seen {
    fn note_transition(&self, row: usize) {
        *self.1.lock().unwrap().entry(row).or_default() += 1;
    }

    fn transitions_report(&self) -> String {
        let seen = self.1.lock().unwrap();
        pg_intent_protocol::state::TRANSITIONS
            .iter()
            .enumerate()
            .map(|(i, t)| {
                format!(
                    "  {:>5}  {} ({}) [{}]",
                    seen.get(&i).copied().unwrap_or(0),
                    t.call,
                    t.when,
                    i + 1
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn note(&self, call: &Call, answer: &Answer) {
        let call = format!("{call:?}");
        let call = call
            .split([' ', '{', '('])
            .next()
            .unwrap_or_default()
            .to_string();
        let answer = match answer {
            Answer::Submitted { created, state, .. } => {
                format!("{} {state}", if *created { "created" } else { "replay" })
            }
            Answer::Begun { .. } => "begun".into(),
            Answer::Completion(s) | Answer::JobState(s) | Answer::Refused(s) => s.clone(),
            Answer::Bool(b) => b.to_string(),
            Answer::Count(n) => format!("{}", n.min(&2)),
            Answer::Version(v) => format!("v{v}"),
            Answer::Done => "done".into(),
            Answer::Batch(answers) => {
                let refused = answers
                    .iter()
                    .filter(|a| matches!(a, Answer::Refused(_)))
                    .count();
                format!("{} intents, {refused} refused", answers.len())
            }
        };
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{call} -> {answer}"))
            .or_default() += 1;
    }

    fn report(&self) -> String {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, n)| format!("  {k}: {n}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn the_server_answers_like_the_model_at_every_step() {
    let full = std::env::var_os("PG_INTENT_FULL").is_some_and(|v| v != "0" && !v.is_empty());
    let cases = env_number("PG_INTENT_MODEL_CASES").unwrap_or(if full { 1024 } else { 128 }) as u32;
    let steps = env_number("PG_INTENT_MODEL_STEPS").unwrap_or(if full { 80 } else { 40 }) as usize;
    let seed = env_number("PG_INTENT_MODEL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!(
        "model check: {cases} cases of up to {steps} steps, seed {seed} (PG_INTENT_MODEL_SEED={seed} replays it)"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let c = connect(&rt);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        max_shrink_time: 180_000,
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let started = Instant::now();
    let strategy = (
        [1..=3i32, 1..=3i32],
        proptest::collection::vec(op(), 1..=steps),
    );
    let seen = Seen::default();
    let outcome = runner.run(&strategy, |case| {
        rt.block_on(run_case(&c, &case, &seen))
            .map_err(TestCaseError::fail)
    });
    eprintln!(
        "model check: done in {:.1?}; calls and answers seen:\n{}\ntransitions observed, per row of the table:\n{}",
        started.elapsed(),
        seen.report(),
        seen.transitions_report()
    );
    if let Err(e) = outcome {
        panic!("the server and the model disagree (seed {seed}):\n{e}");
    }
}

/// A divergence found and fixed (revoke_certification withdrew any standing certification), as
/// a fixed sequence checked against the documents: provider p2 is certified for c_shape, the contract is redefined (the
/// certification no longer counts: failover is refused with IJ005), and revoking then must
/// answer `false` ("false when there was no current certification"). Likewise when the newest certification has expired but an older one has not.
#[test]
fn revoke_answers_false_without_a_current_certification() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let c = connect(&rt);
    let seen = Seen::default();
    let redefined = vec![
        Op::Certify {
            provider: 1,
            contract: 0,
        },
        Op::RedefineShape { strict: true },
        Op::Begin {
            job: JobSel::Slot(1),
            provider: Some(1),
            lease: LEASE,
        },
        Op::Revoke {
            provider: 1,
            contract: 0,
        },
    ];
    let expired = vec![
        Op::Certify {
            provider: 1,
            contract: 0,
        },
        Op::Certify {
            provider: 1,
            contract: 0,
        },
        Op::CertificationExpires {
            provider: 1,
            contract: 0,
        },
        Op::Revoke {
            provider: 1,
            contract: 0,
        },
    ];
    let failures: Vec<String> = [redefined, expired]
        .into_iter()
        .filter_map(|ops| rt.block_on(run_case(&c, &([3, 3], ops), &seen)).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn connect(rt: &Runtime) -> Client {
    rt.block_on(async {
        let db = Cluster::shared().fresh_db("model_check").await;
        let c = db.connect().await;
        c.batch_execute(SETUP).await.expect("setup");
        c
    })
}

/// The transitions a step made, read from the server's rows before and after it.
mod transitions {
    use super::*;
    use pg_intent_protocol::state::{self, Observed, TRANSITIONS, Version};
    use pg_intent_protocol::{AttemptState, EventKind, JobState};
    use pg_intent_tests::model::JobSnap;

    /// The table's call for a model call, and the attempt it names; None for the steps that
    /// are not calls of the state machine (time passing, contracts and certifications).
    fn call_of(call: &Call) -> Option<(state::Call, Option<Uuid>)> {
        Some(match call {
            Call::Submit { .. } | Call::SubmitBatch(_) => (state::Call::SubmitJob, None),
            Call::Begin { .. } => (state::Call::BeginAttempt, None),
            Call::Complete { attempt_id, .. } => (state::Call::CompleteAttempt, Some(*attempt_id)),
            Call::Fail { attempt_id, .. } => (state::Call::FailAttempt, Some(*attempt_id)),
            Call::MarkUnknown { attempt_id, .. } => (state::Call::MarkUnknown, Some(*attempt_id)),
            Call::Heartbeat { attempt_id, .. } => (state::Call::Heartbeat, Some(*attempt_id)),
            Call::Abandon { attempt_id, .. } => (state::Call::AbandonAttempt, Some(*attempt_id)),
            Call::Cancel { .. } => (state::Call::CancelJob, None),
            Call::Sweep => (state::Call::Sweep, None),
            Call::LeaseRunsOut { .. }
            | Call::DefineContract { .. }
            | Call::Certify { .. }
            | Call::Revoke { .. }
            | Call::CertificationExpires { .. } => return None,
        })
    }

    /// Whether the model holds this attempt as started and past its deadline.
    fn lapsed(model: &Model, job: Uuid, attempt: Uuid) -> bool {
        model.jobs.get(&job).is_some_and(|j| {
            j.attempts
                .iter()
                .any(|a| a.id == attempt && a.state == AttemptState::Started && a.lapsed)
        })
    }

    /// Each attempt's effective state, and the job's.
    fn effective(snap: &JobSnap, model: &Model) -> (JobState, BTreeMap<Uuid, AttemptState>) {
        let mut open_lapsed = false;
        let attempts = snap
            .attempts
            .iter()
            .map(|a| {
                let stored: AttemptState = a.state.parse().expect("an attempt_state");
                let past = lapsed(model, snap.id, a.id);
                open_lapsed |= stored.is_open() && past;
                (a.id, state::effective_attempt(stored, past))
            })
            .collect();
        let job = state::effective_job(snap.state.parse().expect("a job_state"), open_lapsed);
        (job, attempts)
    }

    /// Every job the step changed, as an observation and the row of TRANSITIONS that allows
    /// it (None: no row does).
    pub fn observe(
        call: &Call,
        before: &Snapshot,
        after: &Snapshot,
        model_before: &Model,
        model_after: &Model,
    ) -> Vec<(Observed, Option<usize>)> {
        let Some((kind, named)) = call_of(call) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for job in &after.jobs {
            let (to_job, attempts_after) = effective(job, model_after);
            let Some(prev) = before.jobs.iter().find(|j| j.id == job.id) else {
                let observed = Observed {
                    call: kind,
                    attempt: None,
                    job: None,
                    to_attempt: None,
                    to_job,
                    version: Version::First,
                    event: None,
                };
                out.push((
                    observed,
                    TRANSITIONS.iter().position(|t| t.allows(&observed)),
                ));
                continue;
            };
            let (from_job, attempts_before) = effective(prev, model_before);
            // Events logged by this step, less the timeouts that persisted the deadline rule
            // for an attempt that had already lapsed (not a transition: its state was unknown).
            let mut events: Vec<&(String, Option<Uuid>)> = job.events
                [prev.events.len().min(job.events.len())..]
                .iter()
                .collect();
            events.retain(|(kind, attempt)| {
                !(kind == "timeout" && attempt.is_some_and(|a| lapsed(model_before, job.id, a)))
            });
            let changed: Vec<Uuid> = attempts_after
                .iter()
                .filter(|(id, s)| attempts_before.get(id) != Some(s))
                .map(|(id, _)| *id)
                .collect();
            let version = if job.version == prev.version {
                Version::Kept
            } else {
                Version::Bumped
            };
            if changed.is_empty()
                && events.is_empty()
                && from_job == to_job
                && version == Version::Kept
            {
                continue;
            }
            // The attempt the call concerns: the one it names, or the one it began.
            let concerned = named
                .filter(|a| attempts_after.contains_key(a))
                .or_else(|| {
                    changed
                        .iter()
                        .copied()
                        .find(|a| !attempts_before.contains_key(a))
                });
            let stray = changed.iter().any(|a| Some(*a) != concerned);
            let event = match events.as_slice() {
                [] => None,
                [(kind, _)] => kind.parse::<EventKind>().ok(),
                _ => None,
            };
            let observed = Observed {
                call: kind,
                attempt: concerned.and_then(|a| attempts_before.get(&a).copied()),
                job: Some(from_job),
                to_attempt: concerned.and_then(|a| attempts_after.get(&a).copied()),
                to_job,
                version,
                event,
            };
            let row = if stray || events.len() > 1 {
                None
            } else {
                TRANSITIONS.iter().position(|t| t.allows(&observed))
            };
            out.push((observed, row));
        }
        out
    }
}
