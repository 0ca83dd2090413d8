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
//!
//! One test binary: [`values`] (parameters and values, good and bad), [`fixture`] (the jobs the
//! corpus aims at), [`calls`] (one description of each call's arguments, from which the
//! bad-argument families are generated), [`corpus`] (the generator), and [`edges`] (single tests at the edges of the
//! rules).

mod calls;
mod corpus;
mod edges;
mod fixture;
mod values;

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
use calls::*;
use corpus::*;
use fixture::*;
use values::*;

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
    let source = [
        include_str!("main.rs"),
        include_str!("calls.rs"),
        include_str!("corpus.rs"),
        include_str!("edges.rs"),
        include_str!("fixture.rs"),
        include_str!("values.rs"),
    ]
    .concat();
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
