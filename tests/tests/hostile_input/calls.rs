//! One description of each call's arguments (docs/protocol.md § Inputs), and the bad-argument
//! families generated from it.
//!
//! A [`Call`] names its SQL, and for each argument its name, its [`Kind`] (which says what
//! values it refuses) and what NULL does ([`Null`]), plus a valid set of arguments to start
//! from. From that alone the corpus makes:
//! - [`bad_argument`]: one argument NULL where NULL is refused, or given a value its kind
//!   refuses: `22023`, nothing written (for the strict id functions a bad value is `22023` too);
//! - [`null_arguments`]: NULL in, NULL out, for the strict id functions;
//! - [`unknown_id`]: the id a call looks up names nothing: `IJ007`;
//! - [`bad_encoding`]: a NUL byte, or bytes that are not UTF-8, in a text argument: PostgreSQL
//!   refuses them (`22021`) before any function of ours runs.
//!
//! (The families of the hand-written generator this replaces, for readers looking for them:
//! submit_bad_text and submit_bad_other are now submit_bad; nul_byte and not_utf8 keep their
//! names and cover every text argument of every call, not only submit_job's; begin_bad,
//! complete_bad, fail_bad, mark_unknown_bad, heartbeat_bad, abandon_bad, cancel_bad, ids_bad,
//! ids_null, define_bad, certify_bad, revoke_bad, validate_bad, purge_bad, reconcile_bad and the *_unknown
//! families keep their names.)

use super::*;

/// What an argument is, and so which values it refuses.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// owner_id, idempotency_key, provider, worker, a contract's own name: 1 to 255 characters.
    Name,
    /// The contract a call names: a name, and one that is defined.
    Contract,
    /// reason: 1 to 1000 characters.
    Reason,
    /// A jsonb document of at most this many bytes (params, error, evidence: 1 MiB; results:
    /// 16 MiB).
    Document(usize),
    /// A contract's output schema: a JSON Schema that compiles, of at most 1 MiB.
    Schema,
    /// A contract's checker (text cast to regprocedure): an existing `(jsonb) -> boolean`
    /// function, STABLE or IMMUTABLE, of nobody's schema but the caller's.
    Checker,
    /// lease, extend: positive, at most 24 hours.
    Lease,
    /// A certification's valid_for: positive, at most 366 days.
    Validity,
    /// A purge's retention: positive.
    Retention,
    /// version: the one begin_attempt handed to the attempt (1, for every attempt of the
    /// fixture).
    Version,
    /// An integer; these values are out of its range.
    Int(&'static [i32]),
    /// A job id: any uuid has its form (one that names no job is not found).
    JobId,
    /// An attempt id for the protocol calls: any uuid (one that names no attempt is not found).
    AttemptId,
    /// job_of's argument: an attempt id by its form; a job id (attempt number 0) is refused.
    AttemptIdForm,
    /// retryable.
    Flag,
    /// fail_attempt's retry_after: zero to 30 days, no month part, no negative part.
    RetryAfter,
    /// claim_attempts's providers: a text[] whose every element is a name.
    Providers,
}

/// What NULL does for an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Null {
    /// Refused (22023): "NULL only where docs/reference.md gives a NULL default", "any id argument".
    Refused,
    /// A default (the provider of the job, no contract, no reason, the setting's retention …).
    Default,
    /// The function is strict: NULL in, NULL out.
    Strict,
}

/// One argument of a call.
#[derive(Debug, Clone, Copy)]
pub struct Arg {
    pub name: &'static str,
    pub kind: Kind,
    pub null: Null,
}

const fn arg(name: &'static str, kind: Kind, null: Null) -> Arg {
    Arg { name, kind, null }
}

/// One SQL call of the API, as the corpus makes it.
pub struct Call {
    /// The SQL, `$1` … one parameter per argument, answering one text column.
    pub sql: &'static str,
    pub args: &'static [Arg],
    /// Valid arguments for the fixture, one of which the corpus makes bad.
    pub valid: fn(&mut Rng, &Fixture) -> Vec<Param>,
    /// The family of its bad-argument cases.
    pub bad: &'static str,
    /// The family of its unknown-id cases (calls that look an id up).
    pub unknown: &'static str,
}

use Kind::*;
use Null::*;

const MAX_ATTEMPTS_OUT: &[i32] = &[0, -1, 65536, i32::MAX, i32::MIN, -65535];
const ATTEMPT_NO_OUT: &[i32] = &[0, -1, 65536, i32::MAX, i32::MIN];
const BATCH_SIZE_OUT: &[i32] = &[0, -1, 100_001, i32::MAX, i32::MIN];
const MAX_JOBS_OUT: &[i32] = &[0, -1, 1001, i32::MAX, i32::MIN];

pub static SUBMIT_JOB: Call = Call {
    sql: SUBMIT,
    args: &[
        arg("owner_id", Name, Refused),
        arg("idempotency_key", Name, Refused),
        arg("provider", Name, Refused),
        arg("params", Document(MIB), Refused),
        arg("contract", Contract, Default),
        arg("max_attempts", Int(MAX_ATTEMPTS_OUT), Refused),
    ],
    valid: |rng, _| {
        vec![
            text(good_name(rng)),
            text(good_name(rng)),
            text(good_name(rng)),
            jsonb(json!({"n": rng.below(10)})),
            null_text(),
            int(3),
        ]
    },
    bad: "submit_bad",
    unknown: "",
};

pub static BEGIN_ATTEMPT: Call = Call {
    sql: BEGIN,
    args: &[
        arg("job_id", JobId, Refused),
        arg("provider", Name, Default),
        arg("lease", Lease, Refused),
        arg("worker", Name, Default),
    ],
    valid: |rng, fx| {
        let job = *rng.pick(&[
            fx.pending,
            fx.running,
            fx.succeeded,
            fx.exhausted,
            job_id_of("nobody", "nothing"),
        ]);
        vec![
            id(job),
            null_text(),
            interval(30_000_000, 0, 0),
            null_text(),
        ]
    },
    bad: "begin_bad",
    unknown: "",
};

pub static COMPLETE_ATTEMPT: Call = Call {
    sql: COMPLETE,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        arg("version", Version, Refused),
        arg("result", Document(RESULT_LIMIT), Refused),
    ],
    valid: |rng, fx| {
        let a = rng.pick(&fx.attempts()).attempt_id;
        vec![id(a), bigint(1), jsonb(json!({"image": "x"}))]
    },
    bad: "complete_bad",
    unknown: "complete_unknown",
};

pub static FAIL_ATTEMPT: Call = Call {
    sql: FAIL,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        arg("version", Version, Refused),
        arg("error", Document(MIB), Refused),
        arg("retryable", Flag, Refused),
        arg("retry_after", RetryAfter, Default),
    ],
    valid: |rng, fx| {
        let a = rng.pick(&fx.attempts()).attempt_id;
        vec![
            id(a),
            bigint(1),
            jsonb(json!({"status": 500})),
            boolean(rng.percent(50)),
            null_interval(),
        ]
    },
    bad: "fail_bad",
    unknown: "fail_unknown",
};

pub static CLAIM_ATTEMPTS: Call = Call {
    sql: "SELECT count(*)::text FROM intent.claim_attempts($1, $2, $3, $4)",
    args: &[
        arg("providers", Providers, Default),
        arg("worker", Name, Default),
        arg("lease", Lease, Refused),
        arg("max_jobs", Int(MAX_JOBS_OUT), Refused),
    ],
    valid: |_, _| {
        vec![
            Box::new(None::<Vec<Option<String>>>),
            null_text(),
            interval(30_000_000, 0, 0),
            int(1),
        ]
    },
    bad: "claim_bad",
    unknown: "",
};

pub static MARK_UNKNOWN: Call = Call {
    sql: MARK,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        arg("reason", Reason, Default),
    ],
    valid: |rng, fx| vec![id(rng.pick(&fx.attempts()).attempt_id), null_text()],
    bad: "mark_unknown_bad",
    unknown: "mark_unknown_unknown",
};

pub static HEARTBEAT_CALL: Call = Call {
    sql: HEARTBEAT,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        arg("extend", Lease, Default),
    ],
    valid: |rng, fx| vec![id(rng.pick(&fx.attempts()).attempt_id), null_interval()],
    bad: "heartbeat_bad",
    unknown: "heartbeat_unknown",
};

pub static ABANDON_ATTEMPT: Call = Call {
    sql: ABANDON,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        arg("reason", Reason, Refused),
    ],
    valid: |rng, fx| vec![id(rng.pick(&fx.attempts()).attempt_id), text("why")],
    bad: "abandon_bad",
    unknown: "abandon_unknown",
};

pub static RECORD_RECONCILIATION: Call = Call {
    sql: RECONCILE,
    args: &[
        arg("attempt_id", AttemptId, Refused),
        // Any text that is not a decision is refused (22023); a Name's bad values are too.
        arg("decision", Name, Refused),
        arg("evidence", Document(1 << 20), Refused),
    ],
    valid: |rng, fx| {
        vec![
            id(rng.pick(&fx.settled()).attempt_id),
            text("completed"),
            jsonb(json!({"provider_says": "done"})),
        ]
    },
    bad: "reconcile_bad",
    unknown: "reconcile_unknown",
};

pub static CANCEL_JOB: Call = Call {
    sql: CANCEL,
    args: &[
        arg("job_id", JobId, Refused),
        arg("reason", Reason, Default),
    ],
    valid: |_, fx| vec![id(fx.pending), null_text()],
    bad: "cancel_bad",
    unknown: "cancel_unknown",
};

pub static JOB_ID: Call = Call {
    sql: "SELECT intent.job_id($1, $2)::text",
    args: &[
        arg("owner_id", Name, Strict),
        arg("idempotency_key", Name, Strict),
    ],
    valid: |_, _| vec![text("o"), text("k")],
    bad: "ids_bad",
    unknown: "",
};

pub static ATTEMPT_ID: Call = Call {
    sql: "SELECT intent.attempt_id($1, $2)::text",
    args: &[
        arg("job_id", JobId, Strict),
        arg("attempt_no", Int(ATTEMPT_NO_OUT), Strict),
    ],
    valid: |_, fx| vec![id(fx.pending), int(1)],
    bad: "ids_bad",
    unknown: "",
};

pub static JOB_OF: Call = Call {
    sql: "SELECT intent.job_of($1)::text",
    args: &[arg("attempt_id", AttemptIdForm, Strict)],
    valid: |_, fx| vec![id(fx.r1.attempt_id)],
    bad: "ids_bad",
    unknown: "",
};

pub static DEFINE_CONTRACT: Call = Call {
    sql: "SELECT intent.define_contract($1, $2, $3::text::regprocedure)::text",
    args: &[
        arg("name", Name, Refused),
        arg("output_schema", Schema, Refused),
        arg("checker", Checker, Default),
    ],
    valid: |_, _| vec![text("c-bad"), jsonb(json!({})), null_text()],
    bad: "define_bad",
    unknown: "",
};

pub static CERTIFY_PROVIDER: Call = Call {
    sql: "SELECT intent.certify_provider($1, $2, $3, $4)::text",
    args: &[
        arg("provider", Name, Refused),
        arg("contract", Contract, Refused),
        arg("evidence", Document(MIB), Refused),
        arg("valid_for", Validity, Refused),
    ],
    valid: |_, _| {
        vec![
            text("gpu-west"),
            text(CONTRACT),
            jsonb(json!({"passed": 10})),
            interval(86_400_000_000, 0, 0),
        ]
    },
    bad: "certify_bad",
    unknown: "",
};

pub static REVOKE_CERTIFICATION: Call = Call {
    sql: "SELECT intent.revoke_certification($1, $2, $3)::text",
    args: &[
        arg("provider", Name, Refused),
        arg("contract", Contract, Refused),
        arg("reason", Reason, Refused),
    ],
    valid: |_, _| vec![text("gpu-west"), text(CONTRACT), text("compromised")],
    bad: "revoke_bad",
    unknown: "",
};

pub static VALIDATE_RESULT: Call = Call {
    sql: "SELECT format('%s %s', valid, errors) FROM intent.validate_result($1, $2)",
    args: &[
        arg("contract", Contract, Refused),
        arg("result", Document(RESULT_LIMIT), Refused),
    ],
    valid: |_, _| vec![text(CONTRACT), jsonb(json!({}))],
    bad: "validate_bad",
    unknown: "",
};

pub static PURGE: Call = Call {
    sql: "SELECT intent.purge($1, $2)::text",
    args: &[
        arg("older_than", Retention, Default),
        arg("batch_size", Int(BATCH_SIZE_OUT), Refused),
    ],
    valid: |_, _| vec![interval(0, 30, 0), int(10)],
    bad: "purge_bad",
    unknown: "",
};

/// Every call of the table.
pub static CALLS: &[&Call] = &[
    &SUBMIT_JOB,
    &BEGIN_ATTEMPT,
    &COMPLETE_ATTEMPT,
    &FAIL_ATTEMPT,
    &CLAIM_ATTEMPTS,
    &MARK_UNKNOWN,
    &HEARTBEAT_CALL,
    &ABANDON_ATTEMPT,
    &RECORD_RECONCILIATION,
    &CANCEL_JOB,
    &JOB_ID,
    &ATTEMPT_ID,
    &JOB_OF,
    &DEFINE_CONTRACT,
    &CERTIFY_PROVIDER,
    &REVOKE_CERTIFICATION,
    &VALIDATE_RESULT,
    &PURGE,
];

impl Kind {
    /// NULL, of this kind's type.
    fn null(self) -> Param {
        match self {
            Name | Contract | Reason | Checker => null_text(),
            Document(_) | Schema => null_jsonb(),
            Lease | Validity | Retention | RetryAfter => null_interval(),
            Providers => Box::new(None::<Vec<Option<String>>>),
            Version => null_bigint(),
            Int(_) => null_int(),
            JobId | AttemptId | AttemptIdForm => null_id(),
            Flag => null_bool(),
        }
    }

    /// Whether some value of this kind (other than NULL) is refused as bad input.
    fn has_bad_values(self) -> bool {
        !matches!(self, JobId | AttemptId | Flag)
    }

    /// A value this kind refuses (22023), and what it is.
    fn bad(self, rng: &mut Rng, fx: &Fixture) -> (Param, String) {
        match self {
            Name => {
                let (bad, what) = bad_name(rng);
                (text(bad), what.to_string())
            }
            Contract => {
                if rng.percent(50) {
                    let (bad, what) = bad_name(rng);
                    (text(bad), what.to_string())
                } else {
                    let name = if rng.percent(50) {
                        format!("undefined-{}", good_name(rng))
                    } else {
                        format!("undefined-{}", rng.below(1000))
                    };
                    (text(name), "an undefined contract".to_string())
                }
            }
            Reason => (text(bad_reason(rng)), "empty or over-long".to_string()),
            Document(limit) => {
                let (doc, what) = huge_document(rng, limit);
                (raw_jsonb(doc), what.to_string())
            }
            Schema => {
                if rng.percent(40) {
                    let (doc, what) = huge_document(rng, MIB);
                    (raw_jsonb(doc), what.to_string())
                } else {
                    let schema = *rng.pick(&[
                        "{\"type\": 5}",
                        "{\"pattern\": \"((\"}",
                        "{\"$ref\": \"http://127.0.0.1:1/schema.json\"}",
                        "{\"minLength\": -1}",
                        "{\"type\": \"nonsense\"}",
                    ]);
                    (
                        raw_jsonb(schema.as_bytes().to_vec()),
                        format!("invalid schema {schema}"),
                    )
                }
            }
            Checker => {
                // Functions of the wrong shape or volatility, and oids that name no function.
                let checker = *rng.pick(&[
                    "intent.job_of(uuid)",
                    "pg_catalog.now()",
                    "pg_catalog.jsonb_typeof(jsonb)",
                    "pg_catalog.random()",
                    "1",
                    "4294967295",
                    "999999",
                ]);
                (text(checker), format!("checker {checker}"))
            }
            Lease => bad_lease(rng),
            RetryAfter => {
                let day = 86_400_000_000i64;
                let ((micros, days, months), what) = *rng.pick(&[
                    ((-1, 0, 0), "negative"),
                    ((0, -1, 0), "minus a day"),
                    ((0, 0, 1), "a month"),
                    ((0, 31, 0), "31 days"),
                    ((30 * day + 1, 0, 0), "30 days and a microsecond"),
                    ((i64::MAX, i32::MAX, i32::MAX), "enormous"),
                ]);
                (
                    interval(micros, days, months),
                    format!("retry_after {what}"),
                )
            }
            Providers => {
                let (list, what): (Vec<Option<String>>, &str) = match rng.below(4) {
                    0 => (vec![None], "a NULL provider"),
                    1 => (vec![Some(String::new())], "an empty provider"),
                    2 => (vec![Some("x".repeat(256))], "a 256-character provider"),
                    _ => (vec![Some("gpu".into()), None], "a NULL among providers"),
                };
                (Box::new(Some(list)), what.to_string())
            }
            Validity => {
                // (Intervals so large that now() + valid_for overflows: see
                // enormous_validities_and_retentions_get_documented_codes.)
                let (micros, days, months) = *rng.pick(&[
                    (0, 0, 0),
                    (-1, 0, 0),
                    (0, 367, 0),
                    (0, 0, 13),
                    (0, 0, 12_000),
                ]);
                (
                    interval(micros, days, months),
                    format!("valid_for of {months} months {days} days {micros} µs"),
                )
            }
            Retention => {
                let ((micros, days, months), what) = *rng.pick(&[
                    ((0, 0, 0), "zero"),
                    ((-1, 0, 0), "negative"),
                    ((0, -30, 0), "minus 30 days"),
                ]);
                (interval(micros, days, months), format!("retention {what}"))
            }
            Version => {
                let v = wrong_version(rng);
                (
                    bigint(v),
                    format!("version {v} for an attempt given version 1"),
                )
            }
            Int(out_of_range) => {
                let n = *rng.pick(out_of_range);
                (int(n), format!("{n}"))
            }
            AttemptIdForm => (
                id(*rng.pick(&[fx.pending, fx.running, Uuid::nil()])),
                "a job id".to_string(),
            ),
            JobId | AttemptId | Flag => unreachable!("{self:?} has no bad values but NULL"),
        }
    }

    /// Whether the argument is text that PostgreSQL converts from the client's bytes.
    fn is_text(self) -> bool {
        matches!(self, Name | Contract | Reason)
    }
}

/// `call` with one argument made bad: NULL where NULL is refused, or a value its kind refuses.
/// Bad input is checked before anything is looked up, so the other arguments may name
/// anything: 22023.
pub fn bad_argument(rng: &mut Rng, fx: &Fixture, call: &Call) -> Case {
    let mut p = (call.valid)(rng, fx);
    let candidates: Vec<usize> = (0..call.args.len())
        .filter(|&i| call.args[i].null == Refused || call.args[i].kind.has_bad_values())
        .collect();
    let i = *rng.pick(&candidates);
    let arg = call.args[i];
    let what = if arg.null == Refused && (!arg.kind.has_bad_values() || rng.percent(30)) {
        p[i] = arg.kind.null();
        format!("NULL {}", arg.name)
    } else {
        let (value, what) = arg.kind.bad(rng, fx);
        p[i] = value;
        format!("{}: {what}", arg.name)
    };
    case(call.bad, what, call.sql, p, Expect::Code("22023"))
}

/// A strict function with some of its arguments NULL: NULL.
pub fn null_arguments(rng: &mut Rng, fx: &Fixture, call: &Call) -> Case {
    let mut p = (call.valid)(rng, fx);
    let n = call.args.len();
    // A non-empty subset of the arguments.
    let mask = rng.between(1, (1 << n) - 1) as usize;
    let mut nulls = Vec::new();
    for (i, arg) in call.args.iter().enumerate() {
        if mask & (1 << i) != 0 {
            p[i] = arg.kind.null();
            nulls.push(arg.name);
        }
    }
    case(
        "ids_null",
        format!("NULL {} is NULL", nulls.join(", ")),
        call.sql,
        p,
        Expect::Row(None),
    )
}

/// `call` on an id that names nothing (a random one, one of no job, an attempt its job never
/// had, a job id for an attempt id, an attempt id for a job id): IJ007.
pub fn unknown_id(rng: &mut Rng, fx: &Fixture, call: &Call) -> Case {
    let mut p = (call.valid)(rng, fx);
    let i = call
        .args
        .iter()
        .position(|a| matches!(a.kind, JobId | AttemptId))
        .expect("a call that looks an id up");
    let (u, what) = match call.args[i].kind {
        JobId => unknown_job(rng, fx),
        _ => unknown_attempt(rng, fx),
    };
    p[i] = id(u);
    case(
        call.unknown,
        format!("{} of {what}", call.args[i].name),
        call.sql,
        p,
        Expect::Code("IJ007"),
    )
}

/// A NUL byte, or bytes that are not UTF-8, in a text argument of any call: PostgreSQL refuses
/// them before any function runs (22021).
pub fn bad_encoding(rng: &mut Rng, fx: &Fixture) -> Case {
    let texts: Vec<(&Call, usize)> = CALLS
        .iter()
        .flat_map(|call| {
            (0..call.args.len())
                .filter(|&i| call.args[i].kind.is_text())
                .map(move |i| (*call, i))
        })
        .collect();
    let (call, i) = *rng.pick(&texts);
    let mut p = (call.valid)(rng, fx);
    let name = call.args[i].name;
    if rng.percent(50) {
        p[i] = raw(with_nul(rng));
        case(
            "nul_byte",
            format!("NUL byte in {name} ({})", call.bad),
            call.sql,
            p,
            Expect::Code("22021"),
        )
    } else {
        let (bytes, what) = not_utf8(rng);
        p[i] = raw(bytes);
        case(
            "not_utf8",
            format!("{what} in {name} ({})", call.bad),
            call.sql,
            p,
            Expect::Code("22021"),
        )
    }
}
