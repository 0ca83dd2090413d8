//! Edges of the input rules, one test each: odd but valid keys, deep results, calendar-length
//! leases, enormous validities and retentions.

use super::*;

/// Keys are compared byte for byte, without normalisation (docs/reference.md § 1.4): odd but valid keys —
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
