//! Stored values of every size class come back byte for byte through every path that returns
//! them: `submit_job` and `submit_jobs` replays, the tables, the views. Classes: inline, inline
//! compressed, TOASTed (compressed and not), params just under their 1 MiB limit, and results of
//! several megabytes (results may be up to 16 MiB). The replay path once read a freed copy of a
//! large result (wrong bytes, or a crashed backend); the valgrind pass (scripts/valgrind.sh)
//! runs the SQL twin of this corpus, tests/valgrind/large_values.sql, under memcheck.

use pg_intent_tests::reliability::Rng;
use pg_intent_tests::*;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// A string of `n` bytes that does not compress: printable ASCII with escapes and multi-byte
/// characters mixed in, so that JSON's escaping and UTF-8 are exercised too.
fn incompressible(rng: &mut Rng, n: usize) -> String {
    const ODD: [&str; 6] = ["\"", "\\", "\n", "\u{1}", "é", "🦀"];
    let mut s = String::with_capacity(n + 4);
    while s.len() < n {
        if rng.below(50) == 0 {
            s.push_str(ODD[rng.below(ODD.len())]);
        } else {
            s.push((b' ' + rng.below(95) as u8) as char);
        }
    }
    while s.len() > n {
        s.pop();
    }
    s
}

/// The size classes: (name, document).
fn documents(rng: &mut Rng) -> Vec<(String, Value)> {
    let mut docs = vec![
        ("tiny".to_string(), json!({"v": "x"})),
        (
            "inline 1.5 kB".to_string(),
            json!({"v": incompressible(rng, 1500)}),
        ),
        (
            "compressible 200 kB".to_string(),
            json!({"v": "abc".repeat(200 * KIB / 3)}),
        ),
        (
            "toasted 300 kB".to_string(),
            json!({"v": incompressible(rng, 300 * KIB)}),
        ),
        (
            "many keys 100 kB".to_string(),
            Value::Object(
                (0..4000)
                    .map(|i| (format!("k{i:05}"), json!(incompressible(rng, 20))))
                    .collect(),
            ),
        ),
    ];
    for mib in [3, 9] {
        docs.push((
            format!("result {mib} MiB"),
            json!({"v": incompressible(rng, mib * MIB)}),
        ));
    }
    // Just under the result limit (jsonb adds a few bytes of header to the string).
    docs.push((
        "result just under 16 MiB".to_string(),
        json!({"v": "r".repeat(16 * MIB - 64)}),
    ));
    docs
}

/// The canonical text of a jsonb value, as the server prints it.
async fn canonical(c: &Client, v: &Value) -> String {
    c.query_one("SELECT $1::jsonb::text", &[v])
        .await
        .unwrap()
        .get(0)
}

/// A text the server returns, compared byte for byte (reported by size and first difference).
fn same_bytes(what: &str, expected: &str, got: &str) {
    if expected != got {
        let at = expected
            .bytes()
            .zip(got.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(got.len()));
        panic!(
            "{what}: {} bytes expected, {} returned, first difference at byte {at}",
            expected.len(),
            got.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_every_size_come_back_byte_for_byte() {
    let db = Cluster::shared().fresh_db("large_results").await;
    let c = db.connect().await;
    let mut rng = Rng::new(20261201);
    for (i, (class, doc)) in documents(&mut rng).into_iter().enumerate() {
        let key = format!("k{i}");
        let text = canonical(&c, &doc).await;
        let job = submit(&c, "alice", &key, "gpu", &json!({"i": i}))
            .await
            .unwrap();
        // Two attempts: the first is abandoned and reports late, so its result is discarded
        // and shows in intent.lost_races beside the winner's.
        let first = begin(&c, job.job_id, None, "1 hour").await.unwrap();
        abandon(&c, first.attempt_id, "stalled").await.unwrap();
        let second = begin(&c, job.job_id, None, "1 hour").await.unwrap();
        assert_eq!(
            complete(&c, second.attempt_id, 1, &doc).await.unwrap(),
            "won",
            "{class}"
        );
        assert_eq!(
            complete(&c, first.attempt_id, 1, &doc).await.unwrap(),
            "lost",
            "{class}"
        );

        // Several replays in one session: each must read its own, live copy.
        for round in 0..3 {
            let row = c
                .query_one(
                    "SELECT result::text, result FROM intent.submit_job('alice', $1, 'gpu', $2)",
                    &[&key, &json!({"i": i})],
                )
                .await
                .unwrap_or_else(|e| panic!("{class}: replay {round}: {e:?}"));
            same_bytes(
                &format!("{class}: submit_job replay {round}"),
                &text,
                row.get(0),
            );
            assert_eq!(
                row.get::<_, Value>(1),
                doc,
                "{class}: submit_job replay (binary)"
            );
        }
        let rows = c
            .query(
                "SELECT result::text FROM intent.submit_jobs(ARRAY['alice', 'alice'], ARRAY[$1, $1],
                                                             ARRAY['gpu', 'gpu'], ARRAY[$2, $2]::jsonb[])",
                &[&key, &json!({"i": i})],
            )
            .await
            .unwrap_or_else(|e| panic!("{class}: submit_jobs replay: {e:?}"));
        assert_eq!(rows.len(), 2);
        for r in &rows {
            same_bytes(&format!("{class}: submit_jobs replay"), &text, r.get(0));
        }
        let r = c
            .query_one(
                "SELECT late_result::text, winning_result::text FROM intent.lost_races WHERE job_id = $1",
                &[&job.job_id],
            )
            .await
            .unwrap();
        same_bytes(&format!("{class}: lost_races.late_result"), &text, r.get(0));
        same_bytes(
            &format!("{class}: lost_races.winning_result"),
            &text,
            r.get(1),
        );
        let r = c
            .query_one(
                "SELECT result::text FROM intent.jobs WHERE id = $1",
                &[&job.job_id],
            )
            .await
            .unwrap();
        same_bytes(&format!("{class}: intent.jobs.result"), &text, r.get(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_of_every_size_come_back_byte_for_byte() {
    let db = Cluster::shared().fresh_db("large_params").await;
    let c = db.connect().await;
    let mut rng = Rng::new(7);
    let mut docs: Vec<(String, Value)> = documents(&mut rng)
        .into_iter()
        .filter(|(class, _)| !class.starts_with("result"))
        .collect();
    docs.push((
        "params just under 1 MiB".to_string(),
        json!({"v": "p".repeat(MIB - 64)}),
    ));
    let over = json!({"v": "p".repeat(MIB + 1)});
    refusal(submit(&c, "alice", "over", "gpu", &over).await, "22023");
    for (i, (class, doc)) in docs.into_iter().enumerate() {
        let key = format!("p{i}");
        let text = canonical(&c, &doc).await;
        assert!(
            submit(&c, "alice", &key, "gpu", &doc)
                .await
                .unwrap()
                .created,
            "{class}"
        );
        // The replay compares params with jsonb equality: the same bytes replay, others conflict.
        for _ in 0..2 {
            assert!(
                !submit(&c, "alice", &key, "gpu", &doc)
                    .await
                    .unwrap()
                    .created,
                "{class}"
            );
        }
        refusal(
            submit(&c, "alice", &key, "gpu", &json!({"other": i})).await,
            "IJ001",
        );
        let r = c
            .query_one(
                "SELECT params::text FROM intent.jobs WHERE id = intent.job_id('alice', $1)",
                &[&key],
            )
            .await
            .unwrap();
        same_bytes(&format!("{class}: intent.jobs.params"), &text, r.get(0));
    }
}

/// A batch holds the results it returns in memory until its rows go out, and in the rows
/// themselves: each job's result is copied once, however often the batch repeats its key, and
/// past 64 MiB of results returned the remaining intents, in batch order, are refused (54000)
/// instead of exhausting the server's memory or disk. Params are bounded too (64 MiB a call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_large_replays_is_bounded() {
    let db = Cluster::shared().fresh_db("large_batch").await;
    let c = db.connect().await;
    // Compressible, so that storing them is quick; 15 MiB each once detoasted.
    let big = |i: usize| json!({"v": format!("{i}").repeat(15 * MIB)});
    for i in 0..6 {
        let job = submit(&c, "alice", &format!("b{i}"), "gpu", &json!({}))
            .await
            .unwrap();
        let a = begin(&c, job.job_id, None, "1 hour").await.unwrap();
        assert_eq!(complete(&c, a.attempt_id, 1, &big(i)).await.unwrap(), "won");
    }
    let batch = |keys: Vec<String>| {
        let n = keys.len();
        (
            vec!["alice".to_string(); n],
            keys,
            vec!["gpu".to_string(); n],
            vec![json!({}); n],
        )
    };
    let expected: String = c
        .query_one("SELECT md5($1::jsonb::text)", &[&big(0)])
        .await
        .unwrap()
        .get(0);
    // One key twenty times, and six keys: the first four rows fit in 64 MiB, in batch order.
    for keys in [
        vec!["b0".to_string(); 20],
        (0..6).map(|i| format!("b{i}")).collect::<Vec<_>>(),
    ] {
        let n = keys.len();
        let (o, k, p, pa) = batch(keys);
        let rows = c
            .query(
                "SELECT sqlstate, md5(result::text) FROM intent.submit_jobs($1, $2, $3, $4) ORDER BY ordinality",
                &[&o, &k, &p, &pa],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), n);
        for (i, r) in rows.iter().enumerate() {
            let (code, md5): (Option<String>, Option<String>) = (r.get(0), r.get(1));
            if i < 4 {
                assert_eq!(code, None, "row {i}");
                if n == 20 {
                    assert_eq!(md5.as_deref(), Some(expected.as_str()), "row {i}");
                }
            } else {
                assert_eq!((code.as_deref(), md5), (Some("54000"), None), "row {i}");
            }
        }
    }
    // 80 intents of 1 MiB params each: over the 64 MiB a call takes, refused whole.
    let n = 80;
    let params = vec![json!({"p": "x".repeat(MIB - 100)}); n];
    let keys: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    let e = expect_error(
        &c,
        "SELECT * FROM intent.submit_jobs($1, $2, $3, $4)",
        &[
            &vec!["alice".to_string(); n],
            &keys,
            &vec!["gpu".to_string(); n],
            &params,
        ],
    )
    .await;
    assert_eq!(e.code, "54000", "{e:?}");
}
