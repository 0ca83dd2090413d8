//! Hostile and bad input: a generated corpus of calls that are wrong in every way a client can
//! be wrong — NULLs, empty and over-long strings (of odd Unicode too), NUL bytes and bytes that
//! are not UTF-8, params and results over 1 MiB or nested thousands deep, negative, zero and
//! enormous leases, unknown and malformed ids, wrong versions, repeated completions and
//! failures, calls in the wrong order, sessions bound to another owner, roles without
//! privileges, values PostgreSQL itself refuses to parse.
//!
//! Every call must get exactly the answer docs/protocol.md documents — its SQLSTATE, or for the
//! calls the protocol answers rather than refuses (a replayed completion, mark_unknown on a
//! finished attempt, a heartbeat after the end…) its documented answer —, and none may write:
//! after every call the digest of every row of every table of the extension (with each row's
//! physical identity) is unchanged. No backend may crash: the connection, its backend and the
//! postmaster survive every call, and the server log shows no crash.
//!
//! Scale: `PG_INTENT_FULL=1` → 10,000 calls; the default (CI) is 1,200.
//! `PG_INTENT_HOSTILE_INPUTS` and `PG_INTENT_SEED` override.

use pg_intent_tests::reliability::{
    CrashWatch, Figures, RawInterval, RawJsonb, RawText, Rng, TableDigest, Violations, full,
    nested_json, scale, seed,
};
use pg_intent_tests::*;
use std::collections::BTreeMap;
use tokio_postgres::types::ToSql;

const PROVIDER: &str = "gpu-east";
const CONTRACT: &str = "shape-v1";
const MIB: usize = 1024 * 1024;
/// The result limit (docs/protocol.md): results may be larger than params.
const RESULT_LIMIT: usize = 16 * MIB;

type Param = Box<dyn ToSql + Sync + Send>;

fn text(s: impl Into<String>) -> Param {
    Box::new(Some(s.into()))
}
fn null_text() -> Param {
    Box::new(None::<String>)
}
fn raw(bytes: Vec<u8>) -> Param {
    Box::new(RawText(bytes))
}
fn jsonb(v: Value) -> Param {
    Box::new(v)
}
fn raw_jsonb(text: Vec<u8>) -> Param {
    Box::new(RawJsonb(text))
}
fn null_jsonb() -> Param {
    Box::new(None::<Value>)
}
fn int(i: i32) -> Param {
    Box::new(i)
}
fn null_int() -> Param {
    Box::new(None::<i32>)
}
fn bigint(i: i64) -> Param {
    Box::new(i)
}
fn null_bigint() -> Param {
    Box::new(None::<i64>)
}
fn id(u: Uuid) -> Param {
    Box::new(u)
}
fn null_id() -> Param {
    Box::new(None::<Uuid>)
}
fn interval(micros: i64, days: i32, months: i32) -> Param {
    Box::new(RawInterval {
        micros,
        days,
        months,
    })
}
fn null_interval() -> Param {
    Box::new(None::<RawInterval>)
}
fn boolean(b: bool) -> Param {
    Box::new(b)
}
fn null_bool() -> Param {
    Box::new(None::<bool>)
}

const SUBMIT: &str = "SELECT format('%s %s %s %s', job_id, created, state, version)
                        FROM intent.submit_job($1, $2, $3, $4, $5, $6)";
const BEGIN: &str = "SELECT format('%s %s', attempt_id, version)
                       FROM intent.begin_attempt($1, $2, $3, $4)";
const COMPLETE: &str = "SELECT intent.complete_attempt($1, $2, $3)::text";
const FAIL: &str = "SELECT intent.fail_attempt($1, $2, $3, $4)::text";
const MARK: &str = "SELECT intent.mark_unknown($1, $2)::text";
const HEARTBEAT: &str = "SELECT intent.heartbeat($1, $2)::text";
const ABANDON: &str = "SELECT intent.abandon_attempt($1, $2)::text";
const CANCEL: &str = "SELECT intent.cancel_job($1, $2)::text";

/// What a call must answer.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    /// This SQLSTATE.
    Code(&'static str),
    /// One row whose only column, as text, is this (None: NULL).
    Row(Option<String>),
    /// One row holding a `void` (a documented no-op): NULL or the empty text.
    Void,
}

fn row(s: &str) -> Expect {
    Expect::Row(Some(s.to_string()))
}

/// Which session makes the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session {
    /// A superuser session, not bound to an owner.
    Main,
    /// A session bound to another owner (`SET intent.owner_id = 'intruder'`).
    Bound,
    /// A role with no privilege on the extension.
    Outsider,
    /// A superuser session with `statement_timeout = '300ms'`.
    Timeout,
}

struct Case {
    family: &'static str,
    what: String,
    sql: &'static str,
    params: Vec<Param>,
    expect: Expect,
    session: Session,
}

fn case(
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

// --- strings ------------------------------------------------------------------------------------

/// Characters a careless client (or a hostile one) puts in names: controls, bidi overrides,
/// joiners, byte-order marks, noncharacters, private use, astral planes, combining marks, quotes,
/// format specifiers, and plain letters.
const ODD: &[char] = &[
    '\u{202E}',
    '\u{200D}',
    '\u{200B}',
    '\u{FEFF}',
    '\u{FFFF}',
    '\u{FFFE}',
    '\u{E000}',
    '\u{1F600}',
    '\u{1F469}',
    '\u{0301}',
    '\u{10FFFF}',
    '\u{1D11E}',
    '\u{2028}',
    '\u{85}',
    '\u{7F}',
    '\u{1}',
    '\t',
    '\n',
    '\r',
    '\\',
    '\'',
    '"',
    '%',
    '$',
    ';',
    'Ω',
    'ß',
    'ö',
    'к',
    '中',
    'a',
    'z',
    '0',
    ' ',
    '-',
];

/// `n` characters drawn from [`ODD`].
fn odd(rng: &mut Rng, n: usize) -> String {
    (0..n).map(|_| *rng.pick(ODD)).collect()
}

/// A valid name: 1 to 255 characters, often odd ones.
fn good_name(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("name-{}", rng.below(1000)),
        1 => odd(rng, 255),
        _ => {
            let n = rng.between(1, 40) as usize;
            odd(rng, n)
        }
    }
}

/// A name that breaks the 1–255 character rule.
fn bad_name(rng: &mut Rng) -> (String, &'static str) {
    match rng.below(5) {
        0 => (String::new(), "empty"),
        1 => {
            let n = rng.between(256, 300) as usize;
            (odd(rng, n), "256-300 odd characters")
        }
        2 => ("\u{1F600}".repeat(256), "256 four-byte characters"),
        3 => (
            "e\u{301}".repeat(128),
            "128 letters with combining accents (256 characters)",
        ),
        _ => {
            let n = rng.between(1000, 200_000) as usize;
            ("x".repeat(n), "thousands of characters")
        }
    }
}

/// Bytes that are not UTF-8, for a text argument.
fn not_utf8(rng: &mut Rng) -> (Vec<u8>, &'static str) {
    let (bad, what): (&[u8], &str) = *rng.pick(&[
        (&[0xFF][..], "byte 0xFF"),
        (&[0xC0, 0x80], "overlong NUL"),
        (&[0xED, 0xA0, 0x80], "UTF-16 surrogate"),
        (&[0xF4, 0x90, 0x80, 0x80], "beyond U+10FFFF"),
        (&[0xE2, 0x82], "truncated sequence"),
        (&[0x80], "lone continuation byte"),
    ]);
    let mut bytes = b"key-".to_vec();
    bytes.extend_from_slice(bad);
    if rng.percent(50) {
        bytes.extend_from_slice(b"-tail");
    }
    (bytes, what)
}

/// A name with a NUL byte somewhere.
fn with_nul(rng: &mut Rng) -> Vec<u8> {
    let mut s = good_name(rng).into_bytes();
    let at = rng.below(s.len() + 1);
    // Keep the text valid UTF-8 around the NUL: insert at a char boundary.
    let at = (0..=at)
        .rev()
        .find(|&i| i == 0 || i == s.len() || (s[i] & 0xC0) != 0x80)
        .unwrap_or(0);
    s.insert(at, 0);
    s
}

/// A reason that breaks the 1–1000 character rule.
fn bad_reason(rng: &mut Rng) -> String {
    if rng.percent(30) {
        String::new()
    } else {
        let n = rng.between(1001, 5000) as usize;
        odd(rng, n)
    }
}

// --- documents -----------------------------------------------------------------------------------

/// A jsonb document over `limit` bytes (params, errors and schemas: 1 MiB; results: 16 MiB),
/// as text, in one of several shapes.
fn huge_document(rng: &mut Rng, limit: usize) -> (Vec<u8>, &'static str) {
    let extra = rng.below(4096);
    match rng.below(4) {
        0 => (
            format!("{{\"blob\": \"{}\"}}", "y".repeat(limit + extra)).into_bytes(),
            "a string over the limit",
        ),
        1 => {
            let items: Vec<String> = (0..(limit / 7 + extra))
                .map(|i| (i % 1_000_000).to_string())
                .collect();
            (
                format!("[{}]", items.join(",")).into_bytes(),
                "an array of numbers over the limit",
            )
        }
        2 => {
            let fields: Vec<String> = (0..(limit / 14 + extra))
                .map(|i| format!("\"k{i:08}\":1"))
                .collect();
            (
                format!("{{{}}}", fields.join(",")).into_bytes(),
                "an object of keys over the limit",
            )
        }
        _ => {
            // Deeply nested AND over the limit.
            let doc = nested_json(3000, &format!("\"{}\"", "z".repeat(limit)));
            (doc, "over the limit under 3,000 levels of nesting")
        }
    }
}

/// A valid, odd document: deep nesting, odd Unicode, big numbers, empty containers.
fn odd_document(rng: &mut Rng) -> Vec<u8> {
    match rng.below(5) {
        0 => nested_json(rng.between(500, 10_000) as usize, "1"),
        1 => format!("{{\"s\": {}}}", Value::String(odd(rng, 300))).into_bytes(),
        2 => b"[1e308, -1e-308, 123456789012345678901234567890, 0.0, -0]".to_vec(),
        3 => b"[{}, [], null, \"\", true]".to_vec(),
        _ => b"null".to_vec(),
    }
}

// --- the fixture ---------------------------------------------------------------------------------

/// Jobs in every state, made before the corpus runs. Every call of the corpus aimed at them is
/// refused, or is a documented no-op: none may change them.
struct Fixture {
    pending: Uuid,
    running: Uuid,
    r1: Begun,
    unknown: Uuid,
    u1: Begun,
    succeeded: Uuid,
    s1: Begun,
    /// l1 abandoned, l2 won, then l1's result lost.
    lost: Uuid,
    l1: Begun,
    l2: Begun,
    failed: Uuid,
    f1: Begun,
    cancelled: Uuid,
    /// Still started, under a cancelled job.
    c1: Begun,
    /// max_attempts 1, its one attempt abandoned.
    exhausted: Uuid,
    x1: Begun,
    /// With a contract; j1's result was rejected.
    rejected: Uuid,
    j1: Begun,
    /// Submits of the fixture's jobs, and what a replay of each answers.
    replays: Vec<(String, String, Value, Option<&'static str>, String)>,
    /// md5 of the text of the 3 MiB result of job "large".
    large_md5: String,
}

/// The fixture's contracts whose checkers misbehave, and what validating `{}` against each
/// answers ('valid' and what the checker tried to leave behind, which must not stay).
const MISBEHAVING: &[(&str, &str)] = &[
    ("checker-raises", "false"),
    ("checker-null", "false"),
    ("checker-writes", "true 0"),
    ("checker-settings", "true 4MB \"$user\", public"),
    ("checker-calls-pg-intent", "false"),
    ("checker-made-volatile", "false"),
];

/// The misbehaving checkers (see [`MISBEHAVING`]) and a schema whose validation doubles with
/// each of its 34 levels.
const HOSTILE_CONTRACTS: &str = "
    CREATE TABLE public.checker_scratch (x int);
    CREATE FUNCTION public.c_raises(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN RAISE EXCEPTION 'no'; END $$;
    CREATE FUNCTION public.c_null(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT NULL::boolean';
    CREATE FUNCTION public.scribble() RETURNS void LANGUAGE sql VOLATILE AS
        'INSERT INTO public.checker_scratch VALUES (1)';
    CREATE FUNCTION public.c_writes(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM public.scribble(); RETURN true; END $$;
    CREATE FUNCTION public.c_settings(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM set_config('work_mem', '64kB', false); PERFORM set_config('search_path', 'pg_temp', false);
                 RETURN true; END $$;
    CREATE FUNCTION public.c_calls(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS
        $$ BEGIN PERFORM intent.sweep(); RETURN true; END $$;
    CREATE FUNCTION public.c_volatile(r jsonb) RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';
    SELECT intent.define_contract('checker-raises', '{}', 'public.c_raises(jsonb)'),
           intent.define_contract('checker-null', '{}', 'public.c_null(jsonb)'),
           intent.define_contract('checker-writes', '{}', 'public.c_writes(jsonb)'),
           intent.define_contract('checker-settings', '{}', 'public.c_settings(jsonb)'),
           intent.define_contract('checker-calls-pg-intent', '{}', 'public.c_calls(jsonb)'),
           intent.define_contract('checker-made-volatile', '{}', 'public.c_volatile(jsonb)');
    ALTER FUNCTION public.c_volatile(jsonb) VOLATILE;";

impl Fixture {
    async fn build(c: &Client) -> Fixture {
        assert!(
            ensure_contract(c, "unused").await,
            "contracts are supported"
        );
        c.query(
            "SELECT intent.define_contract($1, '{\"type\": \"object\", \"required\": [\"image\"]}')",
            &[&CONTRACT],
        )
        .await
        .expect("define the contract");
        let mut replays = Vec::new();
        let job = async |key: &str, max_attempts: i32, contract: Option<&'static str>| {
            let params = json!({"key": key, "prompt": "a cat"});
            let s = submit_full(c, "fx", key, PROVIDER, &params, contract, max_attempts)
                .await
                .unwrap();
            (s.job_id, params)
        };
        let (pending, p_params) = job("pending", 3, None).await;
        let (running, r_params) = job("running", 3, None).await;
        let r1 = begin(c, running, None, "2 hours").await.unwrap();
        let (unknown, u_params) = job("unknown", 3, None).await;
        let u1 = begin(c, unknown, None, "2 hours").await.unwrap();
        mark_unknown(c, u1.attempt_id, Some("timer")).await.unwrap();
        let (succeeded, s_params) = job("succeeded", 3, None).await;
        let s1 = begin(c, succeeded, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, s1.attempt_id, 1, &json!({"image": "s1"}))
                .await
                .unwrap(),
            "won"
        );
        // The first late failure is logged; the corpus only repeats it.
        fail(c, s1.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        let (lost, l_params) = job("lost", 3, None).await;
        let l1 = begin(c, lost, None, "2 hours").await.unwrap();
        abandon(c, l1.attempt_id, "stuck").await.unwrap();
        let l2 = begin(c, lost, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, l2.attempt_id, 1, &json!({"image": "l2"}))
                .await
                .unwrap(),
            "won"
        );
        assert_eq!(
            complete(c, l1.attempt_id, 1, &json!({"image": "l1"}))
                .await
                .unwrap(),
            "lost"
        );
        fail(c, l1.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        fail(c, l2.attempt_id, 1, &json!({"late": true}), true)
            .await
            .unwrap();
        let (failed, f_params) = job("failed", 3, None).await;
        let f1 = begin(c, failed, None, "2 hours").await.unwrap();
        assert_eq!(
            fail(c, f1.attempt_id, 1, &json!({"status": 400}), false)
                .await
                .unwrap(),
            "failed"
        );
        assert_eq!(
            complete(c, f1.attempt_id, 1, &json!({"image": "f1"}))
                .await
                .unwrap(),
            "lost"
        );
        let (cancelled, c_params) = job("cancelled", 3, None).await;
        let c1 = begin(c, cancelled, None, "2 hours").await.unwrap();
        assert!(cancel(c, cancelled, Some("changed my mind")).await.unwrap());
        let (exhausted, x_params) = job("exhausted", 1, None).await;
        let x1 = begin(c, exhausted, None, "2 hours").await.unwrap();
        abandon(c, x1.attempt_id, "gone").await.unwrap();
        let (rejected, j_params) = job("rejected", 3, Some(CONTRACT)).await;
        let j1 = begin(c, rejected, None, "2 hours").await.unwrap();
        assert_eq!(
            complete(c, j1.attempt_id, 1, &json!({"nope": 1}))
                .await
                .unwrap(),
            "rejected"
        );

        // A job whose result is 3 MiB: replays must return it whole, and write nothing.
        let (large, _) = job("large", 3, None).await;
        let g1 = begin(c, large, None, "2 hours").await.unwrap();
        let big = json!({"blob": "b".repeat(3 * MIB), "tail": "\u{1F980}"});
        assert_eq!(complete(c, g1.attempt_id, 1, &big).await.unwrap(), "won");
        let large_md5: String = c
            .query_one(
                "SELECT md5(result::text) FROM intent.jobs WHERE id = $1",
                &[&large],
            )
            .await
            .unwrap()
            .get(0);
        c.batch_execute(HOSTILE_CONTRACTS)
            .await
            .expect("the misbehaving checkers");
        let doubling = {
            let mut defs = serde_json::Map::new();
            for i in 0..34 {
                let next = format!("#/$defs/d{}", i + 1);
                defs.insert(
                    format!("d{i}"),
                    json!({"anyOf": [{"allOf": [{"$ref": next}, {"type": "string"}]}, {"$ref": next}]}),
                );
            }
            defs.insert("d34".into(), json!({"type": "integer"}));
            json!({"$defs": defs, "$ref": "#/$defs/d0"})
        };
        c.query(
            "SELECT intent.define_contract('doubling', $1)",
            &[&doubling],
        )
        .await
        .unwrap();

        for (key, id, params, contract) in [
            ("pending", pending, p_params, None),
            ("running", running, r_params, None),
            ("unknown", unknown, u_params, None),
            ("succeeded", succeeded, s_params, None),
            ("lost", lost, l_params, None),
            ("failed", failed, f_params, None),
            ("cancelled", cancelled, c_params, None),
            ("exhausted", exhausted, x_params, None),
            ("rejected", rejected, j_params, Some(CONTRACT)),
        ] {
            let answer: String = c
                .query_one(
                    "SELECT format('%s %s %s %s', id, false, state, version) FROM intent.jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            replays.push(("fx".to_string(), key.to_string(), params, contract, answer));
        }
        Fixture {
            pending,
            running,
            r1,
            unknown,
            u1,
            succeeded,
            s1,
            lost,
            l1,
            l2,
            failed,
            f1,
            cancelled,
            c1,
            exhausted,
            x1,
            rejected,
            j1,
            replays,
            large_md5,
        }
    }

    /// Attempts that exist (for wrong-version calls).
    fn attempts(&self) -> Vec<&Begun> {
        vec![
            &self.r1, &self.u1, &self.s1, &self.l1, &self.l2, &self.f1, &self.c1, &self.x1,
            &self.j1,
        ]
    }

    /// Attempts that already have an outcome (or are abandoned, or unknown): timers, heartbeats
    /// and abandons on them are documented no-ops.
    fn settled(&self) -> Vec<&Begun> {
        vec![&self.s1, &self.l1, &self.l2, &self.f1, &self.x1, &self.j1]
    }
}

/// An id that names nothing: a random UUID, a derived job that was never submitted, an attempt
/// a real job never had, a job id where an attempt id belongs.
fn unknown_attempt(rng: &mut Rng, fx: &Fixture) -> (Uuid, &'static str) {
    match rng.below(4) {
        0 => (
            Uuid::from_u64_pair(rng.next_u64(), rng.next_u64() | 1),
            "a random uuid",
        ),
        1 => (
            attempt_id_of(job_id_of("nobody", &format!("k{}", rng.below(1000))), 1),
            "an attempt of no job",
        ),
        2 => (
            attempt_id_of(fx.lost, rng.between(3, 65535)),
            "an attempt its job never had",
        ),
        _ => (
            *rng.pick(&[fx.pending, fx.running, fx.succeeded]),
            "a job id",
        ),
    }
}

fn unknown_job(rng: &mut Rng, fx: &Fixture) -> (Uuid, &'static str) {
    match rng.below(3) {
        0 => (
            Uuid::from_u64_pair(rng.next_u64(), rng.next_u64()),
            "a random uuid",
        ),
        1 => (
            job_id_of(&good_name(rng), &good_name(rng)),
            "a derived id never submitted",
        ),
        _ => (fx.r1.attempt_id, "an attempt id"),
    }
}

/// A lease or heartbeat extension that is not in (0, 24 hours]: every field of the same sign,
/// so that the calendar and a fixed 30-day month agree it is out of range.
fn bad_lease(rng: &mut Rng) -> (Param, String) {
    let day = 86_400_000_000i64;
    let (micros, days, months) = match rng.below(9) {
        0 => (0, 0, 0),
        1 => (-rng.between(1, i64::MAX / 2), 0, 0),
        2 => (-rng.between(0, day), -(rng.between(1, 1000) as i32), 0),
        3 => (0, 0, -(rng.between(1, 1_000_000) as i32)),
        4 => (day + rng.between(1, day * 365), 0, 0),
        5 => (rng.between(0, day), rng.between(2, 100_000) as i32, 0),
        6 => (rng.between(1, day), 1, 0),
        7 => (
            rng.between(0, day),
            rng.between(0, 30) as i32,
            rng.between(1, 1_000_000) as i32,
        ),
        _ => *rng.pick(&[
            (i64::MAX, i32::MAX, i32::MAX),
            (i64::MIN, i32::MIN, i32::MIN),
            (i64::MAX, 0, 0),
            (0, i32::MAX, 0),
            (0, 0, i32::MAX),
            (day + 1, 0, 0),
            (-1, 0, 0),
        ]),
    };
    (
        interval(micros, days, months),
        format!("interval of {months} months {days} days {micros} µs"),
    )
}

/// A version other than 1 (every attempt of the fixture was handed version 1).
fn wrong_version(rng: &mut Rng) -> i64 {
    let random = rng.between(4, i64::MAX / 2);
    *rng.pick(&[0, -1, 2, 3, i64::MAX, i64::MIN, random])
}

// --- the generator -------------------------------------------------------------------------------

fn generate(rng: &mut Rng, fx: &Fixture) -> Case {
    let r = rng.below(108);
    match r {
        0..12 => submit_bad_text(rng),
        12..18 => submit_bad_other(rng),
        18..21 => {
            // A NUL byte in a text argument: PostgreSQL refuses it before any function runs.
            let field = rng.below(4);
            let mut p: Vec<Param> = vec![
                text("o"),
                text("k"),
                text(PROVIDER),
                jsonb(json!({})),
                null_text(),
                int(3),
            ];
            p[[0, 1, 2, 4][field]] = raw(with_nul(rng));
            case(
                "nul_byte",
                format!("NUL byte in argument {}", field + 1),
                SUBMIT,
                p,
                Expect::Code("22021"),
            )
        }
        21..24 => {
            let field = rng.below(4);
            let (bytes, what) = not_utf8(rng);
            let mut p: Vec<Param> = vec![
                text("o"),
                text("k"),
                text(PROVIDER),
                jsonb(json!({})),
                null_text(),
                int(3),
            ];
            p[[0, 1, 2, 4][field]] = raw(bytes);
            case(
                "not_utf8",
                format!("{what} in argument {}", field + 1),
                SUBMIT,
                p,
                Expect::Code("22021"),
            )
        }
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
        33..40 => begin_bad(rng, fx),
        40..47 => begin_refused(rng, fx),
        47..54 => complete_bad(rng, fx),
        54..57 => {
            let (a, what) = unknown_attempt(rng, fx);
            case(
                "complete_unknown",
                format!("complete {what}"),
                COMPLETE,
                vec![id(a), bigint(1), jsonb(json!({"image": "x"}))],
                Expect::Code("IJ007"),
            )
        }
        57..62 => complete_replay(rng, fx),
        62..67 => fail_calls(rng, fx),
        67..71 => timer_calls(rng, fx),
        71..75 => heartbeat_calls(rng, fx),
        75..79 => abandon_calls(rng, fx),
        79..82 => cancel_calls(rng, fx),
        82..85 => id_calls(rng, fx),
        85..89 => contract_calls(rng),
        89..91 => purge_calls(rng),
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
fn large_replay(rng: &mut Rng, fx: &Fixture) -> Case {
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
fn checker_misbehaves(rng: &mut Rng) -> Case {
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
fn doubling_schema(rng: &mut Rng) -> Case {
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

fn submit_bad_text(rng: &mut Rng) -> Case {
    let field = rng.below(4); // owner, key, provider, contract
    let mut p: Vec<Param> = vec![
        text(good_name(rng)),
        text(good_name(rng)),
        text(good_name(rng)),
        jsonb(json!({"n": rng.below(10)})),
        null_text(),
        int(3),
    ];
    let names = ["owner_id", "idempotency_key", "provider", "contract"];
    if field < 3 && rng.percent(20) {
        p[field] = null_text();
        return case(
            "submit_bad_text",
            format!("NULL {}", names[field]),
            SUBMIT,
            p,
            Expect::Code("22023"),
        );
    }
    let (bad, what) = bad_name(rng);
    p[if field == 3 { 4 } else { field }] = text(bad);
    case(
        "submit_bad_text",
        format!("{} {what}", names[field]),
        SUBMIT,
        p,
        Expect::Code("22023"),
    )
}

fn submit_bad_other(rng: &mut Rng) -> Case {
    let mut p: Vec<Param> = vec![
        text(good_name(rng)),
        text(good_name(rng)),
        text(PROVIDER),
        jsonb(json!({})),
        null_text(),
        int(3),
    ];
    let what = match rng.below(4) {
        0 => {
            p[3] = null_jsonb();
            "NULL params".to_string()
        }
        1 => {
            let (doc, what) = huge_document(rng, MIB);
            p[3] = raw_jsonb(doc);
            format!("params: {what}")
        }
        2 => {
            let n = *rng.pick(&[0, -1, 65536, i32::MAX, i32::MIN, -65535]);
            p[5] = if rng.percent(15) { null_int() } else { int(n) };
            format!("max_attempts {n} (or NULL)")
        }
        _ => {
            p[4] = text(format!("undefined-{}", good_name(rng)));
            "an undefined contract".to_string()
        }
    };
    case("submit_bad_other", what, SUBMIT, p, Expect::Code("22023"))
}

fn submit_conflict(rng: &mut Rng, fx: &Fixture) -> Case {
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

fn begin_bad(rng: &mut Rng, fx: &Fixture) -> Case {
    let job = *rng.pick(&[
        fx.pending,
        fx.running,
        fx.succeeded,
        fx.exhausted,
        job_id_of("nobody", "nothing"),
    ]);
    let mut p: Vec<Param> = vec![
        id(job),
        null_text(),
        interval(30_000_000, 0, 0),
        null_text(),
    ];
    let what = match rng.below(6) {
        0 => {
            p[0] = null_id();
            "NULL job_id".to_string()
        }
        1 => {
            p[2] = null_interval();
            "NULL lease".to_string()
        }
        2 | 3 => {
            let (lease, what) = bad_lease(rng);
            p[2] = lease;
            what
        }
        4 => {
            let (bad, what) = bad_name(rng);
            p[1] = text(bad);
            format!("provider {what}")
        }
        _ => {
            let (bad, what) = bad_name(rng);
            p[3] = text(bad);
            format!("worker {what}")
        }
    };
    case("begin_bad", what, BEGIN, p, Expect::Code("22023"))
}

fn begin_refused(rng: &mut Rng, fx: &Fixture) -> Case {
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

fn complete_bad(rng: &mut Rng, fx: &Fixture) -> Case {
    let a = (*rng.pick(&fx.attempts())).clone();
    let mut p: Vec<Param> = vec![id(a.attempt_id), bigint(1), jsonb(json!({"image": "x"}))];
    let what = match rng.below(5) {
        0 => {
            p[0] = null_id();
            "NULL attempt_id".to_string()
        }
        1 => {
            p[1] = null_bigint();
            "NULL version".to_string()
        }
        2 => {
            p[2] = null_jsonb();
            "NULL result".to_string()
        }
        3 => {
            let (doc, what) = huge_document(rng, RESULT_LIMIT);
            p[2] = raw_jsonb(doc);
            format!("result: {what}")
        }
        _ => {
            let v = wrong_version(rng);
            p[1] = bigint(v);
            format!("version {v} for an attempt given version 1")
        }
    };
    case("complete_bad", what, COMPLETE, p, Expect::Code("22023"))
}

fn complete_replay(rng: &mut Rng, fx: &Fixture) -> Case {
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

fn fail_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    let a = (*rng.pick(&fx.attempts())).clone();
    let retryable = rng.percent(50);
    let mut p: Vec<Param> = vec![
        id(a.attempt_id),
        bigint(1),
        jsonb(json!({"status": 500})),
        boolean(retryable),
    ];
    match rng.below(6) {
        0 => {
            let which = rng.below(4);
            p[which] = match which {
                0 => null_id(),
                1 => null_bigint(),
                2 => null_jsonb(),
                _ => null_bool(),
            };
            case(
                "fail_bad",
                format!("NULL argument {}", which + 1),
                FAIL,
                p,
                Expect::Code("22023"),
            )
        }
        1 => {
            let (doc, what) = huge_document(rng, MIB);
            p[2] = raw_jsonb(doc);
            case(
                "fail_bad",
                format!("error: {what}"),
                FAIL,
                p,
                Expect::Code("22023"),
            )
        }
        2 => {
            p[1] = bigint(wrong_version(rng));
            case("fail_bad", "wrong version", FAIL, p, Expect::Code("22023"))
        }
        3 => {
            let (u, what) = unknown_attempt(rng, fx);
            p[0] = id(u);
            case(
                "fail_unknown",
                format!("fail {what}"),
                FAIL,
                p,
                Expect::Code("IJ007"),
            )
        }
        _ => {
            // Reported again, or after the outcome: logged once (by the fixture), then no-ops.
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

fn timer_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    let a = rng.pick(&fx.attempts()).attempt_id;
    match rng.below(4) {
        0 => case(
            "mark_unknown_bad",
            "NULL attempt_id",
            MARK,
            vec![null_id(), null_text()],
            Expect::Code("22023"),
        ),
        1 => case(
            "mark_unknown_bad",
            "bad reason",
            MARK,
            vec![id(a), text(bad_reason(rng))],
            Expect::Code("22023"),
        ),
        2 => {
            let (u, what) = unknown_attempt(rng, fx);
            case(
                "mark_unknown_unknown",
                format!("mark_unknown {what}"),
                MARK,
                vec![id(u), null_text()],
                Expect::Code("IJ007"),
            )
        }
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

fn heartbeat_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    let a = rng.pick(&fx.attempts()).attempt_id;
    match rng.below(4) {
        0 => case(
            "heartbeat_bad",
            "NULL attempt_id",
            HEARTBEAT,
            vec![null_id(), null_interval()],
            Expect::Code("22023"),
        ),
        1 => {
            let (extend, what) = bad_lease(rng);
            case(
                "heartbeat_bad",
                format!("extend by {what}"),
                HEARTBEAT,
                vec![id(a), extend],
                Expect::Code("22023"),
            )
        }
        2 => {
            let (u, what) = unknown_attempt(rng, fx);
            case(
                "heartbeat_unknown",
                format!("heartbeat {what}"),
                HEARTBEAT,
                vec![id(u), null_interval()],
                Expect::Code("IJ007"),
            )
        }
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

fn abandon_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    let a = rng.pick(&fx.attempts()).attempt_id;
    match rng.below(4) {
        0 => case(
            "abandon_bad",
            "NULL attempt_id",
            ABANDON,
            vec![null_id(), text("why")],
            Expect::Code("22023"),
        ),
        1 => {
            let reason = if rng.percent(30) {
                null_text()
            } else {
                text(bad_reason(rng))
            };
            case(
                "abandon_bad",
                "NULL, empty or over-long reason",
                ABANDON,
                vec![id(a), reason],
                Expect::Code("22023"),
            )
        }
        2 => {
            let (u, what) = unknown_attempt(rng, fx);
            case(
                "abandon_unknown",
                format!("abandon {what}"),
                ABANDON,
                vec![id(u), text("why")],
                Expect::Code("IJ007"),
            )
        }
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

fn cancel_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    match rng.below(4) {
        0 => case(
            "cancel_bad",
            "NULL job_id",
            CANCEL,
            vec![null_id(), null_text()],
            Expect::Code("22023"),
        ),
        1 => case(
            "cancel_bad",
            "bad reason",
            CANCEL,
            vec![id(fx.pending), text(bad_reason(rng))],
            Expect::Code("22023"),
        ),
        2 => {
            let (j, what) = unknown_job(rng, fx);
            case(
                "cancel_unknown",
                format!("cancel {what}"),
                CANCEL,
                vec![id(j), null_text()],
                Expect::Code("IJ007"),
            )
        }
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

fn id_calls(rng: &mut Rng, fx: &Fixture) -> Case {
    const JOB_ID: &str = "SELECT intent.job_id($1, $2)::text";
    const ATTEMPT_ID: &str = "SELECT intent.attempt_id($1, $2)::text";
    const JOB_OF: &str = "SELECT intent.job_of($1)::text";
    match rng.below(5) {
        0 => {
            let (bad, what) = bad_name(rng);
            let p = if rng.percent(50) {
                vec![text(bad), text("k")]
            } else {
                vec![text("o"), text(bad)]
            };
            case(
                "ids_bad",
                format!("job_id of {what}"),
                JOB_ID,
                p,
                Expect::Code("22023"),
            )
        }
        1 => {
            let n = *rng.pick(&[0, -1, 65536, i32::MAX, i32::MIN]);
            case(
                "ids_bad",
                format!("attempt_id number {n}"),
                ATTEMPT_ID,
                vec![id(fx.pending), int(n)],
                Expect::Code("22023"),
            )
        }
        2 => case(
            "ids_bad",
            "job_of a job id",
            JOB_OF,
            vec![id(*rng.pick(&[fx.pending, fx.running, Uuid::nil()]))],
            Expect::Code("22023"),
        ),
        3 => {
            let p = match rng.below(3) {
                0 => vec![null_text(), text("k")],
                1 => vec![text("o"), null_text()],
                _ => vec![null_text(), null_text()],
            };
            case(
                "ids_null",
                "job_id of NULL is NULL",
                JOB_ID,
                p,
                Expect::Row(None),
            )
        }
        _ => {
            if rng.percent(50) {
                case(
                    "ids_null",
                    "attempt_id of NULL is NULL",
                    ATTEMPT_ID,
                    vec![null_id(), int(1)],
                    Expect::Row(None),
                )
            } else {
                case(
                    "ids_null",
                    "job_of NULL is NULL",
                    JOB_OF,
                    vec![null_id()],
                    Expect::Row(None),
                )
            }
        }
    }
}

fn contract_calls(rng: &mut Rng) -> Case {
    const DEFINE: &str = "SELECT intent.define_contract($1, $2, $3::oid::regprocedure)::text";
    const DEFINE_WITH: &str = "SELECT intent.define_contract($1, $2, $3::text::regprocedure)::text";
    const CERTIFY: &str = "SELECT intent.certify_provider($1, $2, $3, $4)::text";
    const REVOKE: &str = "SELECT intent.revoke_certification($1, $2, $3)::text";
    const VALIDATE: &str =
        "SELECT format('%s %s', valid, errors) FROM intent.validate_result($1, $2)";
    let none_oid: Param = Box::new(None::<u32>);
    match rng.below(9) {
        0 => {
            let (bad, what) = bad_name(rng);
            let name = if rng.percent(20) {
                null_text()
            } else {
                text(bad)
            };
            case(
                "define_bad",
                format!("contract name {what} (or NULL)"),
                DEFINE,
                vec![name, jsonb(json!({})), none_oid],
                Expect::Code("22023"),
            )
        }
        1 => {
            let schema = *rng.pick(&[
                "{\"type\": 5}",
                "{\"pattern\": \"((\"}",
                "{\"$ref\": \"http://127.0.0.1:1/schema.json\"}",
                "{\"minLength\": -1}",
                "{\"type\": \"nonsense\"}",
            ]);
            case(
                "define_bad",
                format!("invalid schema {schema}"),
                DEFINE,
                vec![
                    text("c-bad"),
                    raw_jsonb(schema.as_bytes().to_vec()),
                    none_oid,
                ],
                Expect::Code("22023"),
            )
        }
        2 => {
            let schema = if rng.percent(40) {
                null_jsonb()
            } else {
                raw_jsonb(huge_document(rng, MIB).0)
            };
            case(
                "define_bad",
                "NULL or over-1-MiB schema",
                DEFINE,
                vec![text("c-bad"), schema, none_oid],
                Expect::Code("22023"),
            )
        }
        3 => {
            let checker = *rng.pick(&[
                "intent.job_of(uuid)",
                "pg_catalog.now()",
                "pg_catalog.jsonb_typeof(jsonb)",
                "pg_catalog.random()",
            ]);
            case(
                "define_bad",
                format!("checker {checker}"),
                DEFINE_WITH,
                vec![text("c-bad"), jsonb(json!({})), text(checker)],
                Expect::Code("22023"),
            )
        }
        4 => {
            let oid: Param = Box::new(Some(*rng.pick(&[1u32, 4_294_967_295, 999_999])));
            case(
                "define_bad",
                "a checker oid that names no function",
                DEFINE,
                vec![text("c-bad"), jsonb(json!({})), oid],
                Expect::Code("22023"),
            )
        }
        5 => {
            let mut p: Vec<Param> = vec![
                text("gpu-west"),
                text(CONTRACT),
                jsonb(json!({"passed": 10})),
                interval(86_400_000_000, 0, 0),
            ];
            let what = match rng.below(5) {
                0 => {
                    p[0] = text(bad_name(rng).0);
                    "bad provider"
                }
                1 => {
                    p[1] = text(format!("undefined-{}", rng.below(1000)));
                    "an undefined contract"
                }
                2 => {
                    p[2] = if rng.percent(50) {
                        null_jsonb()
                    } else {
                        raw_jsonb(huge_document(rng, MIB).0)
                    };
                    "NULL or over-1-MiB evidence"
                }
                3 => {
                    // (Intervals so large that now() + valid_for overflows are a known bug:
                    // see enormous_validities_and_retentions_get_documented_codes.)
                    p[3] = match rng.below(6) {
                        0 => interval(0, 0, 0),
                        1 => interval(-1, 0, 0),
                        2 => interval(0, 367, 0),
                        3 => interval(0, 0, 13),
                        4 => interval(0, 0, 12 * 1000),
                        _ => null_interval(),
                    };
                    "valid_for zero, negative, over 366 days or NULL"
                }
                _ => {
                    p[1] = null_text();
                    "NULL contract"
                }
            };
            case("certify_bad", what, CERTIFY, p, Expect::Code("22023"))
        }
        6 => {
            let mut p: Vec<Param> = vec![text("gpu-west"), text(CONTRACT), text("compromised")];
            let which = rng.below(3);
            p[which] = match which {
                0 => text(bad_name(rng).0),
                1 => text(format!("undefined-{}", rng.below(1000))),
                _ => {
                    if rng.percent(40) {
                        null_text()
                    } else {
                        text(bad_reason(rng))
                    }
                }
            };
            case(
                "revoke_bad",
                format!("revoke with bad argument {}", which + 1),
                REVOKE,
                p,
                Expect::Code("22023"),
            )
        }
        7 => case(
            "revoke_noop",
            "revoke a certification that was never granted",
            REVOKE,
            vec![text(good_name(rng)), text(CONTRACT), text("just in case")],
            row("false"),
        ),
        _ => {
            let p: Vec<Param> = match rng.below(3) {
                0 => vec![
                    text(format!("undefined-{}", rng.below(1000))),
                    jsonb(json!({})),
                ],
                1 => vec![text(CONTRACT), null_jsonb()],
                _ => vec![
                    text(CONTRACT),
                    raw_jsonb(huge_document(rng, RESULT_LIMIT).0),
                ],
            };
            case(
                "validate_bad",
                "validate against no contract, or a NULL or huge result",
                VALIDATE,
                p,
                Expect::Code("22023"),
            )
        }
    }
}

fn purge_calls(rng: &mut Rng) -> Case {
    const PURGE: &str = "SELECT intent.purge($1, $2)::text";
    match rng.below(4) {
        0 => {
            let n = *rng.pick(&[0, -1, 100_001, i32::MAX, i32::MIN]);
            case(
                "purge_bad",
                format!("batch_size {n}"),
                PURGE,
                vec![interval(0, 30, 0), int(n)],
                Expect::Code("22023"),
            )
        }
        1 => case(
            "purge_bad",
            "NULL batch_size",
            PURGE,
            vec![interval(0, 30, 0), null_int()],
            Expect::Code("22023"),
        ),
        2 => {
            let (older_than, what) = *rng.pick(&[
                ((0, 0, 0), "zero"),
                ((-1, 0, 0), "negative"),
                ((0, -30, 0), "minus 30 days"),
            ]);
            case(
                "purge_bad",
                format!("retention {what}"),
                PURGE,
                vec![interval(older_than.0, older_than.1, older_than.2), int(10)],
                Expect::Code("22023"),
            )
        }
        _ => case(
            "purge_noop",
            "purge with a retention longer than anything's age",
            PURGE,
            vec![interval(0, 0, 12_000), int(1000)],
            row("0"),
        ),
    }
}

/// A session bound to owner 'intruder' reaching for the fixture's jobs (owner 'fx').
fn bound_calls(rng: &mut Rng, fx: &Fixture) -> Case {
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
fn postgres_refuses(rng: &mut Rng, fx: &Fixture) -> Case {
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

// --- running the corpus -------------------------------------------------------------------------

fn short(s: &str) -> String {
    if s.chars().count() > 160 {
        format!("{}…", s.chars().take(160).collect::<String>())
    } else {
        s.to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_bad_calls_get_their_documented_answer_and_change_nothing() {
    let inputs = scale("PG_INTENT_HOSTILE_INPUTS", 1200, 10_000);
    let mut rng = Rng::new(seed("hostile"));
    let mut figures = Figures::new("hostile");
    let cluster = Cluster::shared();
    let db = cluster.fresh_db("hostile").await;
    let main = db.connect().await;
    let fx = Fixture::build(&main).await;
    let bound = db.connect().await;
    bound
        .batch_execute("SET intent.owner_id = 'intruder'")
        .await
        .expect("bind a session to another owner");
    main.batch_execute(
        "DO $$ BEGIN CREATE ROLE hostile_outsider LOGIN; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    )
    .await
    .unwrap();
    let outsider = {
        let mut config = cluster.config(&db.name);
        config.user("hostile_outsider");
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect as the outsider");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    };
    let timeout = db.connect().await;
    timeout
        .batch_execute("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let watch = CrashWatch::start(cluster, &db.name).await;
    let tables = TableDigest::new(&main).await;
    let before = tables.take(&main).await;
    let pids = [
        backend_pid(&main).await,
        backend_pid(&bound).await,
        backend_pid(&outsider).await,
        backend_pid(&timeout).await,
    ];

    let v = Violations::new();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    let mut families: BTreeMap<&str, usize> = BTreeMap::new();
    for n in 0..inputs {
        let c = generate(&mut rng, &fx);
        *families.entry(c.family).or_default() += 1;
        let client = match c.session {
            Session::Main => &main,
            Session::Bound => &bound,
            Session::Outsider => &outsider,
            Session::Timeout => &timeout,
        };
        let params: Vec<&(dyn ToSql + Sync)> = c
            .params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let got: Result<Option<String>, String> = match client.query(c.sql, &params).await {
            Ok(rows) if rows.len() == 1 => Ok(rows[0].get(0)),
            Ok(rows) => Ok(Some(format!("{} rows", rows.len()))),
            Err(e) => match e.as_db_error() {
                Some(db) => Err(format!("{} {}", db.code().code(), db.message())),
                None => {
                    v.push(format!(
                        "#{n} {} ({}): the connection broke: {e:?}",
                        c.family,
                        short(&c.what)
                    ));
                    break;
                }
            },
        };
        let as_expected = match (&c.expect, &got) {
            (Expect::Code(code), Err(e)) => e.split(' ').next() == Some(*code),
            (Expect::Row(want), Ok(answer)) => want == answer,
            (Expect::Void, Ok(answer)) => answer.as_deref().is_none_or(str::is_empty),
            _ => false,
        };
        let key = match &got {
            Err(e) => e.split(' ').next().unwrap_or_default().to_string(),
            Ok(_) => "answer".to_string(),
        };
        *codes.entry(key).or_default() += 1;
        v.check(as_expected, || {
            format!(
                "#{n} {} ({}): expected {:?}, got {:?}",
                c.family,
                short(&c.what),
                c.expect,
                got.as_ref().map_err(|e| short(e))
            )
        });
        // Nothing written, anywhere; the same backends still answer.
        let after = tables.take(&main).await;
        if after != before {
            v.push(format!(
                "#{n} {} ({}) wrote to the tables",
                c.family,
                short(&c.what)
            ));
            break;
        }
        // The backend that took the call is the one that took the previous one, and the
        // postmaster is the one that started (a backend crash would have taken this session).
        let (pid, started): (i32, f64) = match client
            .query_one(
                "SELECT pg_backend_pid(), extract(epoch FROM pg_postmaster_start_time())::float8",
                &[],
            )
            .await
        {
            Ok(row) => (row.get(0), row.get(1)),
            Err(e) => {
                v.push(format!(
                    "#{n} {} ({}): the session died: {e}",
                    c.family,
                    short(&c.what)
                ));
                break;
            }
        };
        let expected_pid = match c.session {
            Session::Main => pids[0],
            Session::Bound => pids[1],
            Session::Outsider => pids[2],
            Session::Timeout => pids[3],
        };
        v.check(pid == expected_pid && started == watch.start_time(), || {
            format!(
                "#{n} {} ({}): backend {pid} (was {expected_pid}), postmaster started at {started}",
                c.family,
                short(&c.what)
            )
        });
        if n % 200 == 199 {
            for (client, pid) in [
                (&main, pids[0]),
                (&bound, pids[1]),
                (&outsider, pids[2]),
                (&timeout, pids[3]),
            ] {
                v.check(backend_pid(client).await == pid, || {
                    format!("#{n}: a backend was replaced")
                });
            }
            v.extend(watch.crashes(cluster).await);
        }
        if v.count() >= 20 {
            break;
        }
    }
    v.extend(watch.crashes(cluster).await);
    // The fixture still works: the attempt in flight is alive.
    v.check(
        heartbeat(&main, fx.r1.attempt_id, None)
            .await
            .unwrap_or(false),
        || "the fixture's live attempt was disturbed".into(),
    );

    let codes_seen: Vec<String> = codes.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    figures
        .set("inputs", inputs)
        .set("families", families.len())
        .set("codes", codes_seen.join(","))
        .set("violations", v.count())
        .set("full", full());
    figures.print();
    v.assert_none("hostile input");
}

/// Keys are compared byte for byte, without normalisation (SPEC § Names): odd but valid keys —
/// bidi overrides, joiners, byte-order marks, noncharacters, astral planes, a composed and a
/// decomposed "é", 255 four-byte characters — are each a job of their own, with the id every
/// other layer derives, and a replay of each finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_but_valid_unicode_keys_are_jobs_of_their_own() {
    let db = Cluster::shared().fresh_db("hostile_unicode").await;
    let c = db.connect().await;
    let keys: Vec<String> = vec![
        "caf\u{E9}".into(),
        "cafe\u{301}".into(),
        "CAF\u{C9}".into(),
        "\u{202E}gnp.exe".into(),
        "\u{200D}".into(),
        "\u{FEFF}key".into(),
        "key\u{FEFF}".into(),
        "\u{FFFF}\u{FFFE}".into(),
        "\u{E000}".into(),
        "\u{1F469}\u{200D}\u{1F4BB}".into(),
        "\u{10FFFF}".into(),
        " ".into(),
        "\t\n\r".into(),
        "\u{1}".into(),
        "'; DROP TABLE intent.jobs; --".into(),
        "%s%n%x".into(),
        "\u{1F600}".repeat(255),
        "e\u{301}".repeat(127) + "e",
    ];
    for owner in ["ö", "\u{1F600}".repeat(255).as_str()] {
        for key in &keys {
            let s = submit(&c, owner, key, PROVIDER, &json!({})).await.unwrap();
            assert!(s.created, "{key:?} is a key of its own");
            assert_eq!(s.job_id, job_id_of(owner, key), "{key:?}");
            let sql_id: Uuid = c
                .query_one("SELECT intent.job_id($1, $2)", &[&owner, key])
                .await
                .unwrap()
                .get(0);
            assert_eq!(sql_id, s.job_id, "the SQL derivation agrees for {key:?}");
            let again = submit(&c, owner, key, PROVIDER, &json!({})).await.unwrap();
            assert_eq!((again.job_id, again.created), (s.job_id, false), "{key:?}");
        }
    }
    let stored: i64 = c
        .query_one(
            "SELECT count(DISTINCT (owner_id, idempotency_key)) FROM intent.jobs",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 2 * keys.len() as i64);
}

/// A result (or schema) nested more than 128 levels deep is valid JSON that PostgreSQL stores
/// happily (the corpus sends params 10,000 deep), so a job with a contract must answer its
/// completion — won, rejected, or a documented 22023 refusal — never XX000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_results_of_jobs_with_a_contract_get_a_documented_answer() {
    let db = Cluster::shared().fresh_db("hostile_deep_result").await;
    let c = db.connect().await;
    c.query(
        "SELECT intent.define_contract('any-array', '{\"type\": \"array\"}')",
        &[],
    )
    .await
    .unwrap();
    let mut problems = Vec::new();
    for depth in [127, 128, 200, 1000, 10_000] {
        let doc = RawJsonb(nested_json(depth, "1"));
        let key = format!("deep-{depth}");
        let s = submit_full(&c, "u", &key, PROVIDER, &json!({}), Some("any-array"), 3)
            .await
            .unwrap();
        let b = begin(&c, s.job_id, None, "1 minute").await.unwrap();
        let documented = |r: Result<Option<String>, tokio_postgres::Error>, ok: &[&str]| match r {
            Ok(answer) => answer.as_deref().is_some_and(|a| ok.contains(&a)),
            Err(e) => SqlError::code_of(&e).as_deref() == Some("22023"),
        };
        let completed = c
            .query_one(
                "SELECT intent.complete_attempt($1, $2, $3)::text",
                &[&b.attempt_id, &b.version, &doc],
            )
            .await
            .map(|r| r.get::<_, Option<String>>(0));
        if !documented(completed, &["won", "rejected"]) {
            problems.push(format!("complete_attempt, depth {depth}"));
        }
        let validated = c
            .query_one(
                "SELECT valid::text FROM intent.validate_result('any-array', $1)",
                &[&doc],
            )
            .await
            .map(|r| r.get::<_, Option<String>>(0));
        if !documented(validated, &["true", "false"]) {
            problems.push(format!("validate_result, depth {depth}"));
        }
        let defined = c
            .query_one(
                "SELECT intent.define_contract($1, $2)::text",
                &[&format!("deep-schema-{depth}"), &doc],
            )
            .await
            .map(|r| r.get::<_, Option<String>>(0));
        if !documented(defined, &["1"]) {
            problems.push(format!("define_contract, depth {depth}"));
        }
    }
    assert!(
        problems.is_empty(),
        "undocumented answers (XX000) for: {problems:?}"
    );
}

/// protocol.md § Time: a lease must be positive and at most 24 hours, and the deadline is
/// `started_at + lease`. PostgreSQL adds months and days on the calendar (and across daylight
/// saving time in the session's time zone), so an interval that looks short by 30-day months
/// can be negative or days long once added: it must be refused with 22023, never reach the
/// table's CHECK (23514), never buy a lease of days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_measured_the_way_the_deadline_is_computed() {
    let db = Cluster::shared().fresh_db("hostile_lease_calendar").await;
    let c = db.connect().await;
    let s = submit(&c, "u", "k", PROVIDER, &json!({})).await.unwrap();
    let mut problems = Vec::new();
    for lease in ["-12 mons 360 days 1 second", "12 mons -359 days"] {
        match begin(&c, s.job_id, None, lease).await {
            Err(e) if SqlError::code_of(&e).as_deref() == Some("22023") => {}
            Err(e) => problems.push(format!("lease {lease}: {:?}", SqlError::code_of(&e))),
            Ok(b) => {
                let length: String = c
                    .query_one(
                        "SELECT (deadline - started_at)::text FROM intent.attempts WHERE id = $1",
                        &[&b.attempt_id],
                    )
                    .await
                    .unwrap()
                    .get(0);
                problems.push(format!("lease {lease} was accepted: a lease of {length}"));
                abandon(&c, b.attempt_id, "test").await.unwrap();
            }
        }
    }
    // Daylight saving time, in a zone whose clocks spring forward at the next midnight (UTC):
    // tomorrow is 23 hours long, so '1 day -86399 seconds' (one second by 24-hour days) ends
    // before it starts.
    let c2 = db.connect().await;
    let tomorrow: i32 = c2
        .query_one(
            "SELECT (extract(doy FROM (now() AT TIME ZONE 'UTC')::date + 1) - 1)::int",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let zone = format!("AAA0BBB,{},{}", tomorrow, (tomorrow + 180) % 365);
    c2.batch_execute(&format!("SET TIME ZONE '{zone}'"))
        .await
        .unwrap();
    let s2 = submit(&c2, "u", "dst", PROVIDER, &json!({})).await.unwrap();
    match begin(&c2, s2.job_id, None, "1 day -86399 seconds").await {
        Err(e) if SqlError::code_of(&e).as_deref() == Some("22023") => {}
        Err(e) => problems.push(format!("across a DST change: {:?}", SqlError::code_of(&e))),
        Ok(_) => {}
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Every SQLSTATE the corpus meets must be documented (protocol.md § Inputs, the README's
/// error table or docs/reference.md): PostgreSQL's own refusals included, as 22021 already is.
#[test]
fn every_sqlstate_the_corpus_expects_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let docs = [
        root.join("docs/protocol.md"),
        root.join("README.md"),
        root.join("docs/reference.md"),
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .collect::<Vec<_>>()
    .join("\n");
    let source = include_str!("hostile_input.rs");
    let mut expected: Vec<&str> = source
        .match_indices("Expect::Code(\"")
        .map(|(i, m)| &source[i + m.len()..i + m.len() + 5])
        .filter(|c| c.chars().all(|ch| ch.is_ascii_alphanumeric()))
        .collect();
    expected.sort();
    expected.dedup();
    let missing: Vec<&&str> = expected.iter().filter(|c| !docs.contains(**c)).collect();
    assert!(missing.is_empty(), "undocumented SQLSTATEs: {missing:?}");
}

/// A certification's validity and a purge's retention are intervals like a lease: one so large
/// that `now() + valid_for` (or `now() - retention`) leaves the timestamp range must be refused
/// as bad input (22023) or, for a retention, simply purge nothing — never surface PostgreSQL's
/// internal 22008 from the extension's own arithmetic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enormous_validities_and_retentions_get_documented_codes() {
    let db = Cluster::shared().fresh_db("hostile_enormous").await;
    let c = db.connect().await;
    c.query("SELECT intent.define_contract($1, '{}')", &[&CONTRACT])
        .await
        .unwrap();
    let mut problems = Vec::new();
    for (micros, days, months) in [(0, 0, i32::MAX), (0, i32::MAX, 0), (i64::MAX, 0, 0)] {
        let valid_for = RawInterval {
            micros,
            days,
            months,
        };
        let certified = c
            .query_one(
                "SELECT intent.certify_provider('gpu-west', $1, '{}', $2)::text",
                &[&CONTRACT, &valid_for],
            )
            .await;
        match certified.map_err(|e| SqlError::code_of(&e)) {
            Err(Some(code)) if code == "22023" => {}
            other => problems.push(format!(
                "certify_provider valid_for {valid_for:?}: {other:?}"
            )),
        }
        let purged = c
            .query_one("SELECT intent.purge($1)::text", &[&valid_for])
            .await;
        match purged
            .map(|r| r.get::<_, Option<String>>(0))
            .map_err(|e| SqlError::code_of(&e))
        {
            Ok(Some(n)) if n == "0" => {}
            Err(Some(code)) if code == "22023" => {}
            other => problems.push(format!("purge {valid_for:?}: {other:?}")),
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
