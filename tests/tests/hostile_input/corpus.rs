//! The generator of the corpus: what each call must answer, and which session makes it.

use super::*;

pub const SUBMIT: &str = "SELECT format('%s %s %s %s', job_id, created, state, version)
                        FROM intent.submit_job($1, $2, $3, $4, $5, $6)";
pub const BEGIN: &str = "SELECT format('%s %s', attempt_id, version)
                       FROM intent.begin_attempt($1, $2, $3, $4)";
pub const COMPLETE: &str = "SELECT intent.complete_attempt($1, $2, $3)::text";
pub const FAIL: &str = "SELECT intent.fail_attempt($1, $2, $3, $4, $5)::text";
pub const MARK: &str = "SELECT intent.mark_unknown($1, $2)::text";
pub const HEARTBEAT: &str = "SELECT intent.heartbeat($1, $2)::text";
pub const ABANDON: &str = "SELECT intent.abandon_attempt($1, $2)::text";
pub const CANCEL: &str = "SELECT intent.cancel_job($1, $2)::text";
pub const RECONCILE: &str = "SELECT intent.record_reconciliation($1, $2, $3)::text";

/// What a call must answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// This SQLSTATE.
    Code(&'static str),
    /// One row whose only column, as text, is this (None: NULL).
    Row(Option<String>),
    /// One row holding a `void` (a documented no-op): NULL or the empty text.
    Void,
}

pub fn row(s: &str) -> Expect {
    Expect::Row(Some(s.to_string()))
}

/// Which session makes the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// A superuser session, not bound to an owner.
    Main,
    /// A session bound to another owner (`SET intent.owner_id = 'intruder'`).
    Bound,
    /// A role with no privilege on the extension.
    Outsider,
    /// A superuser session with `statement_timeout = '300ms'`.
    Timeout,
}

pub struct Case {
    pub family: &'static str,
    pub what: String,
    pub sql: &'static str,
    pub params: Vec<Param>,
    pub expect: Expect,
    pub session: Session,
}

pub fn case(
    family: &'static str,
    what: impl Into<String>,
    sql: &'static str,
    params: Vec<Param>,
    expect: Expect,
) -> Case {
    Case {
        family,
        what: what.into(),
        sql,
        params,
        expect,
        session: Session::Main,
    }
}

// --- the generator -------------------------------------------------------------------------------

pub fn generate(rng: &mut Rng, fx: &Fixture) -> Case {
    let r = rng.below(108);
    match r {
        0..18 => bad_argument(rng, fx, &SUBMIT_JOB),
        18..24 => bad_encoding(rng, fx),
        24..29 => submit_conflict(rng, fx),
        29..33 => {
            let (owner, key, params, contract, answer) = rng.pick(&fx.replays).clone();
            let max_attempts = rng.between(1, 65535) as i32;
            case(
                "submit_replay",
                format!("replay of {key} with max_attempts {max_attempts}"),
                SUBMIT,
                vec![
                    text(owner),
                    text(key),
                    text(PROVIDER),
                    jsonb(params),
                    contract.map_or_else(null_text, text),
                    int(max_attempts),
                ],
                Expect::Row(Some(answer)),
            )
        }
        33..40 => bad_argument(rng, fx, &BEGIN_ATTEMPT),
        40..47 => begin_refused(rng, fx),
        47..54 => bad_argument(rng, fx, &COMPLETE_ATTEMPT),
        54..57 => unknown_id(rng, fx, &COMPLETE_ATTEMPT),
        57..62 => complete_replay(rng, fx),
        62..67 => fail_calls(rng, fx),
        67..71 => timer_calls(rng, fx),
        71..75 => heartbeat_calls(rng, fx),
        75..78 => abandon_calls(rng, fx),
        78..79 => reconcile_calls(rng, fx),
        79..82 => cancel_calls(rng, fx),
        82..85 => id_calls(rng, fx),
        85..89 => contract_calls(rng, fx),
        89..91 => purge_calls(rng, fx),
        91..94 => {
            let mut c = bound_calls(rng, fx);
            c.session = Session::Bound;
            c
        }
        94..95 => {
            let mut c = if rng.percent(50) {
                case(
                    "outsider",
                    "submit by a role without privileges",
                    SUBMIT,
                    vec![
                        text("o"),
                        text("k"),
                        text(PROVIDER),
                        jsonb(json!({})),
                        null_text(),
                        int(3),
                    ],
                    Expect::Code("42501"),
                )
            } else {
                case(
                    "outsider",
                    "cancel by a role without privileges",
                    CANCEL,
                    vec![id(Uuid::nil()), null_text()],
                    Expect::Code("42501"),
                )
            };
            c.session = Session::Outsider;
            c
        }
        95..100 => postgres_refuses(rng, fx),
        100..103 => large_replay(rng, fx),
        103..106 => checker_misbehaves(rng),
        _ => {
            let mut c = doubling_schema(rng);
            c.session = Session::Timeout;
            c
        }
    }
}

/// A replay of the job whose result is 3 MiB, one by one or repeated in a batch: the whole
/// result comes back (its md5 checked), nothing is written.
pub fn large_replay(rng: &mut Rng, fx: &Fixture) -> Case {
    const ONE: &str = "SELECT md5(result::text) FROM intent.submit_job('fx', 'large', $1, $2)";
    const BATCH: &str = "SELECT CASE WHEN count(*) = count(*) FILTER (WHERE md5(result::text) = $3)
                                THEN $3 ELSE 'different' END
                           FROM intent.submit_jobs(array_fill('fx'::text, ARRAY[$4::int]),
                                                   array_fill('large'::text, ARRAY[$4::int]),
                                                   array_fill($1::text, ARRAY[$4::int]),
                                                   array_fill($2::jsonb, ARRAY[$4::int]))";
    let params = json!({"key": "large", "prompt": "a cat"});
    if rng.percent(50) {
        case(
            "large_replay",
            "submit_job replay of a 3 MiB result",
            ONE,
            vec![text(PROVIDER), jsonb(params)],
            row(&fx.large_md5),
        )
    } else {
        let n = rng.between(1, 6) as i32;
        case(
            "large_replay",
            format!("submit_jobs replay of a 3 MiB result, {n} times in one batch"),
            BATCH,
            vec![
                text(PROVIDER),
                jsonb(params),
                text(fx.large_md5.clone()),
                int(n),
            ],
            row(&fx.large_md5),
        )
    }
}

/// Validation against contracts whose checkers raise, return NULL, write, change settings, call
/// pg_intent, or were made VOLATILE after they were vetted: each answers as documented, and
/// nothing it did stays (its write is rolled back, the settings are the session's own).
pub fn checker_misbehaves(rng: &mut Rng) -> Case {
    const VALIDATE: &str = "SELECT CASE $1
                   WHEN 'checker-writes' THEN v.valid || ' ' || (SELECT count(*) FROM public.checker_scratch)
                   WHEN 'checker-settings' THEN v.valid || ' ' || current_setting('work_mem') || ' '
                                                || current_setting('search_path')
                   ELSE v.valid::text END
              FROM intent.validate_result($1, '{}') v";
    let (contract, answer) = *rng.pick(MISBEHAVING);
    case(
        "checker_misbehaves",
        format!("validate against {contract}"),
        VALIDATE,
        vec![text(contract)],
        row(answer),
    )
}

/// A schema whose validation doubles with each level, in a session with a 300 ms
/// statement_timeout: stopped (57014), nothing written, the job's lock released.
pub fn doubling_schema(rng: &mut Rng) -> Case {
    if rng.percent(50) {
        case(
            "doubling_schema",
            "validate_result against a schema of 2^34 steps",
            "SELECT valid::text FROM intent.validate_result('doubling', '1')",
            vec![],
            Expect::Code("57014"),
        )
    } else {
        case(
            "doubling_schema",
            "validate_result of a random integer against a schema of 2^34 steps",
            "SELECT valid::text FROM intent.validate_result('doubling', to_jsonb($1::int))",
            vec![int(rng.between(0, 1000) as i32)],
            Expect::Code("57014"),
        )
    }
}

pub fn submit_conflict(rng: &mut Rng, fx: &Fixture) -> Case {
    let (owner, key, params, contract, _) = rng.pick(&fx.replays).clone();
    let mut p: Vec<Param> = vec![
        text(owner),
        text(key.clone()),
        text(PROVIDER),
        jsonb(params.clone()),
        contract.map_or_else(null_text, text),
        int(3),
    ];
    let what = match rng.below(4) {
        0 => {
            p[3] = raw_jsonb(odd_document(rng));
            "other params (odd or nested thousands deep)"
        }
        1 => {
            p[2] = text(format!("other-{}", odd(rng, 20)));
            "another provider"
        }
        2 => {
            p[4] = if contract.is_some() {
                null_text()
            } else {
                text(CONTRACT)
            };
            "another contract"
        }
        _ => {
            let mut other = params;
            other["prompt"] = Value::String(odd(rng, 20));
            p[3] = jsonb(other);
            "params with odd Unicode"
        }
    };
    case(
        "submit_conflict",
        format!("{key} with {what}"),
        SUBMIT,
        p,
        Expect::Code("IJ001"),
    )
}

pub fn begin_refused(rng: &mut Rng, fx: &Fixture) -> Case {
    let lease = interval(rng.between(1, 86_400_000_000), 0, 0);
    let (job, provider, code, what): (Uuid, Option<String>, &'static str, String) =
        match rng.below(7) {
            0 => (
                fx.running,
                None,
                "IJ002",
                "a job with an attempt in flight".into(),
            ),
            1 => (
                fx.unknown,
                None,
                "IJ003",
                "a job whose attempt is unknown".into(),
            ),
            2 => (
                *rng.pick(&[fx.succeeded, fx.lost, fx.failed, fx.cancelled]),
                None,
                "IJ004",
                "a finished job".into(),
            ),
            3 => (fx.exhausted, None, "IJ006", "a job out of attempts".into()),
            4 => (
                *rng.pick(&[fx.pending, fx.rejected]),
                Some(format!("uncertified-{}", odd(rng, 30))),
                "IJ005",
                "a failover to an uncertified provider".into(),
            ),
            5 => (
                fx.succeeded,
                Some("gpu-west".into()),
                "IJ004",
                "a failover on a finished job".into(),
            ),
            _ => {
                let (job, what) = unknown_job(rng, fx);
                (job, None, "IJ007", what.to_string())
            }
        };
    case(
        "begin_refused",
        format!("begin on {what}"),
        BEGIN,
        vec![
            id(job),
            provider.map_or_else(null_text, text),
            lease,
            null_text(),
        ],
        Expect::Code(code),
    )
}

pub fn complete_replay(rng: &mut Rng, fx: &Fixture) -> Case {
    let (a, answer) = *rng.pick(&[
        (&fx.s1, "won"),
        (&fx.l2, "won"),
        (&fx.l1, "lost"),
        (&fx.f1, "lost"),
        (&fx.j1, "rejected"),
    ]);
    let result = match rng.below(3) {
        0 => raw_jsonb(odd_document(rng)),
        1 => jsonb(json!({"image": "another result"})),
        _ => jsonb(json!({"image": "x"})),
    };
    case(
        "complete_replay",
        format!("completion of {} asked again", a.attempt_id),
        COMPLETE,
        vec![id(a.attempt_id), bigint(1), result],
        row(answer),
    )
}

pub fn fail_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(6) {
        0..3 => bad_argument(rng, fx, &FAIL_ATTEMPT),
        3 => unknown_id(rng, fx, &FAIL_ATTEMPT),
        _ => {
            // Reported again, or after the outcome: logged once (by the fixture), then no-ops.
            let mut p = (FAIL_ATTEMPT.valid)(rng, fx);
            let (a, state) = *rng.pick(&[
                (&fx.f1, "failed"),
                (&fx.s1, "succeeded"),
                (&fx.l1, "succeeded"),
                (&fx.l2, "succeeded"),
                (&fx.j1, "pending"),
            ]);
            p[0] = id(a.attempt_id);
            case(
                "fail_replay",
                format!("failure of {} reported again", a.attempt_id),
                FAIL,
                p,
                row(state),
            )
        }
    }
}

pub fn timer_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0 | 1 => bad_argument(rng, fx, &MARK_UNKNOWN),
        2 => unknown_id(rng, fx, &MARK_UNKNOWN),
        _ => {
            let mut settled = fx.settled();
            settled.push(&fx.u1);
            let a = rng.pick(&settled).attempt_id;
            case(
                "mark_unknown_noop",
                format!("mark_unknown on settled {a}"),
                MARK,
                vec![id(a), text(good_name(rng))],
                Expect::Void,
            )
        }
    }
}

pub fn heartbeat_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0 | 1 => bad_argument(rng, fx, &HEARTBEAT_CALL),
        2 => unknown_id(rng, fx, &HEARTBEAT_CALL),
        _ => {
            let mut stopped = fx.settled();
            stopped.push(&fx.u1);
            stopped.push(&fx.c1);
            let a = rng.pick(&stopped).attempt_id;
            case(
                "heartbeat_stop",
                format!("heartbeat on {a}, which must stop"),
                HEARTBEAT,
                vec![id(a), interval(60_000_000, 0, 0)],
                row("false"),
            )
        }
    }
}

pub fn abandon_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0 | 1 => bad_argument(rng, fx, &ABANDON_ATTEMPT),
        2 => unknown_id(rng, fx, &ABANDON_ATTEMPT),
        _ => {
            let a = rng.pick(&fx.settled()).attempt_id;
            case(
                "abandon_noop",
                format!("abandon settled {a}"),
                ABANDON,
                vec![id(a), text(good_name(rng))],
                Expect::Void,
            )
        }
    }
}

/// record_reconciliation: bad arguments (22023) and attempts that do not exist (IJ007). (A
/// valid call writes a `reconciled` event; the corpus's refusals write nothing.)
pub fn reconcile_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    if rng.below(3) < 2 {
        bad_argument(rng, fx, &RECORD_RECONCILIATION)
    } else {
        unknown_id(rng, fx, &RECORD_RECONCILIATION)
    }
}

pub fn cancel_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0 | 1 => bad_argument(rng, fx, &CANCEL_JOB),
        2 => unknown_id(rng, fx, &CANCEL_JOB),
        _ => {
            let j = *rng.pick(&[fx.succeeded, fx.lost, fx.failed, fx.cancelled]);
            case(
                "cancel_finished",
                format!("cancel finished {j}"),
                CANCEL,
                vec![id(j), text(good_name(rng))],
                row("false"),
            )
        }
    }
}

pub fn id_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    let call = *rng.pick(&[&JOB_ID, &ATTEMPT_ID, &JOB_OF]);
    if rng.below(5) < 3 {
        bad_argument(rng, fx, call)
    } else {
        null_arguments(rng, fx, call)
    }
}

pub fn contract_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(9) {
        0..5 => bad_argument(rng, fx, &DEFINE_CONTRACT),
        5 => bad_argument(rng, fx, &CERTIFY_PROVIDER),
        6 => bad_argument(rng, fx, &REVOKE_CERTIFICATION),
        7 => case(
            "revoke_noop",
            "revoke a certification that was never granted",
            REVOKE_CERTIFICATION.sql,
            vec![text(good_name(rng)), text(CONTRACT), text("just in case")],
            row("false"),
        ),
        _ => bad_argument(rng, fx, &VALIDATE_RESULT),
    }
}

pub fn purge_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0..3 => bad_argument(rng, fx, &PURGE),
        _ => case(
            "purge_noop",
            "purge with a retention longer than anything's age",
            PURGE.sql,
            vec![interval(0, 0, 12_000), int(1000)],
            row("0"),
        ),
    }
}

/// A session bound to owner 'intruder' reaching for the fixture's jobs (owner 'fx').
pub fn bound_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(5) {
        0 => case(
            "bound",
            "submit for another owner",
            SUBMIT,
            vec![
                text("fx"),
                text("pending"),
                text(PROVIDER),
                jsonb(json!({})),
                null_text(),
                int(3),
            ],
            Expect::Code("42501"),
        ),
        1 => case(
            "bound",
            "begin another owner's job",
            BEGIN,
            vec![
                id(fx.pending),
                null_text(),
                interval(1_000_000, 0, 0),
                null_text(),
            ],
            Expect::Code("IJ007"),
        ),
        2 => case(
            "bound",
            "complete another owner's attempt",
            COMPLETE,
            vec![id(fx.r1.attempt_id), bigint(1), jsonb(json!({}))],
            Expect::Code("IJ007"),
        ),
        3 => case(
            "bound",
            "cancel another owner's job",
            CANCEL,
            vec![id(fx.running), null_text()],
            Expect::Code("IJ007"),
        ),
        _ => case(
            "bound",
            "heartbeat another owner's attempt",
            HEARTBEAT,
            vec![id(fx.r1.attempt_id), null_interval()],
            Expect::Code("IJ007"),
        ),
    }
}

/// Values PostgreSQL itself refuses before any function of ours runs.
pub fn postgres_refuses(rng: &mut Rng, fx: &Fixture) -> Case {
    const CANCEL_TEXT: &str = "SELECT intent.cancel_job($1::text::uuid, NULL)::text";
    const SUBMIT_TEXT: &str = "SELECT intent.submit_job('o', 'k', 'p', $1::text::jsonb)::text";
    const BEGIN_TEXT: &str = "SELECT intent.begin_attempt($1, NULL, $2::text::interval)::text";
    const SUBMIT_MAX: &str =
        "SELECT intent.submit_job('o', 'k', 'p', '{}', NULL, $1::text::int)::text";
    match rng.below(7) {
        0 => {
            let s = rng
                .pick(&[
                    "",
                    "zz",
                    "62ccd04c-f6e5-82dd-aeee",
                    "62ccd04c-f6e5-82dd-aeee-a9dac80900000",
                    "' OR 1=1 --",
                ])
                .to_string();
            case(
                "postgres_refuses",
                format!("malformed uuid {s:?}"),
                CANCEL_TEXT,
                vec![text(s)],
                Expect::Code("22P02"),
            )
        }
        1 => case(
            "postgres_refuses",
            "\\u0000 in a jsonb string",
            SUBMIT_TEXT,
            vec![text("{\"prompt\": \"a\\u0000b\"}")],
            Expect::Code("22P05"),
        ),
        2 => {
            let s = rng
                .pick(&["{", "{\"a\": }", "[1,]", "{\"a\": \"\\ud800\"}", "NaN"])
                .to_string();
            case(
                "postgres_refuses",
                format!("malformed json {s:?}"),
                SUBMIT_TEXT,
                vec![text(s)],
                Expect::Code("22P02"),
            )
        }
        3 => {
            let depth = rng.between(60_000, 200_000) as usize;
            case(
                "postgres_refuses",
                format!("params nested {depth} deep"),
                SUBMIT,
                vec![
                    text("o"),
                    text("k"),
                    text(PROVIDER),
                    raw_jsonb(nested_json(depth, "1")),
                    null_text(),
                    int(3),
                ],
                Expect::Code("54001"),
            )
        }
        4 => {
            let s = rng.pick(&["bogus", "1 fortnight", "", "P1Y2Z"]).to_string();
            case(
                "postgres_refuses",
                format!("malformed interval {s:?}"),
                BEGIN_TEXT,
                vec![id(fx.pending), text(s)],
                Expect::Code("22007"),
            )
        }
        5 => case(
            "postgres_refuses",
            "interval out of range",
            BEGIN_TEXT,
            vec![id(fx.pending), text("999999999 years")],
            Expect::Code("22008"),
        ),
        _ => case(
            "postgres_refuses",
            "max_attempts beyond int",
            SUBMIT_MAX,
            vec![text("99999999999")],
            Expect::Code("22003"),
        ),
    }
}
