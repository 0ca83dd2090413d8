//! Every documented SQLSTATE reaches a client byte-exact, with its DETAIL and HINT, through
//! tokio-postgres (`DbError::code().code()`); a refusal writes nothing; the backend survives.
//! (Why that needs proving: extension/src/entry.rs.)

use pg_intent_tests::*;

/// Runs `call` (which must be refused with `code`) and checks everything a client relies on:
/// the code byte for byte, severity, a message, a DETAIL (and a HINT when `hint`), that nothing
/// was written, and that the same backend still answers on the same connection.
async fn assert_refusal<T, F, Fut>(
    c: &Client,
    code: &str,
    hint: bool,
    what: &str,
    call: F,
) -> SqlError
where
    T: std::fmt::Debug,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let err = assert_error(c, code, what, call).await;
    assert!(
        err.detail.as_deref().is_some_and(|d| !d.is_empty()),
        "{what}: every refusal has a DETAIL with the facts: {err:?}"
    );
    if hint {
        assert!(
            err.hint.as_deref().is_some_and(|h| !h.is_empty()),
            "{what}: a HINT says what to do next: {err:?}"
        );
    }
    err
}

/// Like [`assert_refusal`] without the DETAIL and HINT requirements: the code, a message,
/// nothing written, the backend alive.
async fn assert_error<T, F, Fut>(c: &Client, code: &str, what: &str, call: F) -> SqlError
where
    T: std::fmt::Debug,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let pid = backend_pid(c).await;
    let before = digest(c).await;
    let err = match call().await {
        Ok(v) => panic!("{what}: expected SQLSTATE {code}, got {v:?}"),
        Err(e) => {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("{what}: not a server error: {e:?}"));
            // Byte-exact, as a client matches on it.
            assert_eq!(
                db.code().code().as_bytes(),
                code.as_bytes(),
                "{what}: {db:?}"
            );
            SqlError::from_error(&e)
        }
    };
    assert_eq!(err.severity, "ERROR", "{what}");
    assert!(!err.message.is_empty(), "{what}: empty message");
    assert_eq!(digest(c).await, before, "{what}: a refusal writes nothing");
    assert_eq!(backend_pid(c).await, pid, "{what}: the backend survives");
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij001_idempotency_conflict() {
    let db = Cluster::shared().fresh_db("sqlstate_ij001").await;
    let c = db.connect().await;
    let s = submit(&c, "u", "k", "p", &json!({"n": 1})).await.unwrap();
    let err = assert_refusal(&c, "IJ001", true, "submit with other params", || async {
        submit(&c, "u", "k", "p", &json!({"n": 2})).await
    })
    .await;
    assert_eq!(
        err.detail(),
        format!("Job {} exists with a different params.", s.job_id)
    );
    let err = assert_refusal(
        &c,
        "IJ001",
        true,
        "submit with other provider and params",
        || async { submit(&c, "u", "k", "q", &json!({"n": 2})).await },
    )
    .await;
    assert_eq!(
        err.detail(),
        format!("Job {} exists with a different provider, params.", s.job_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij002_attempt_in_flight() {
    let db = Cluster::shared().fresh_db("sqlstate_ij002").await;
    let c = db.connect().await;
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    let err = assert_refusal(&c, "IJ002", true, "second begin", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(
        err.detail().contains(&a.attempt_id.to_string()),
        "names the blocking attempt: {err:?}"
    );
    assert!(err.detail().contains("started"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij003_outcome_unknown() {
    let db = Cluster::shared().fresh_db("sqlstate_ij003").await;
    let c = db.connect().await;
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    mark_unknown(&c, a.attempt_id, Some("client timeout"))
        .await
        .unwrap();
    let err = assert_refusal(&c, "IJ003", true, "begin after a timeout", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(err.detail().contains(&a.attempt_id.to_string()), "{err:?}");
    assert!(err.detail().contains("unknown"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij004_job_finished() {
    let db = Cluster::shared().fresh_db("sqlstate_ij004").await;
    let c = db.connect().await;
    // succeeded
    let s = submit(&c, "u", "won", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    complete(&c, a.attempt_id, a.version, &json!({"ok": true}))
        .await
        .unwrap();
    let err = assert_refusal(&c, "IJ004", true, "begin on a succeeded job", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(
        err.detail().contains("succeeded") && err.detail().contains(&a.attempt_id.to_string()),
        "{err:?}"
    );
    // failed
    let s = submit(&c, "u", "failed", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    assert_eq!(
        fail(&c, a.attempt_id, a.version, &json!({"code": 400}), false)
            .await
            .unwrap(),
        "failed"
    );
    let err = assert_refusal(&c, "IJ004", true, "begin on a failed job", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(err.detail().contains("failed"), "{err:?}");
    // cancelled
    let s = submit(&c, "u", "cancelled", "p", &json!({})).await.unwrap();
    assert!(
        cancel(&c, s.job_id, Some("user changed their mind"))
            .await
            .unwrap()
    );
    let err = assert_refusal(&c, "IJ004", true, "begin on a cancelled job", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(err.detail().contains("cancelled"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij005_failover_to_another_provider() {
    let db = Cluster::shared().fresh_db("sqlstate_ij005").await;
    let c = db.connect().await;
    // A job without a contract: no other provider can be trusted with it.
    let s = submit(&c, "u", "no-contract", "gpu-east", &json!({}))
        .await
        .unwrap();
    let err = assert_refusal(&c, "IJ005", true, "failover without a contract", || {
        begin(&c, s.job_id, Some("gpu-west"), "1 hour")
    })
    .await;
    assert!(
        err.detail().contains("gpu-east"),
        "names the job's provider: {err:?}"
    );
    // A job with a contract, to a provider holding no certification for it.
    ensure_contract(&c, "image-v1").await;
    let s = submit_full(
        &c,
        "u",
        "contract",
        "gpu-east",
        &json!({}),
        Some("image-v1"),
        3,
    )
    .await
    .unwrap();
    let err = assert_refusal(
        &c,
        "IJ005",
        true,
        "failover to an uncertified provider",
        || begin(&c, s.job_id, Some("gpu-west"), "1 hour"),
    )
    .await;
    assert!(
        err.message.contains("gpu-west") || err.detail().contains("gpu-west"),
        "{err:?}"
    );
    // The job's own provider, named explicitly, is not a failover.
    let a = begin(&c, s.job_id, Some("gpu-east"), "1 hour")
        .await
        .unwrap();
    assert_eq!(a.attempt_no, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij006_attempts_exhausted() {
    let db = Cluster::shared().fresh_db("sqlstate_ij006").await;
    let c = db.connect().await;
    let s = submit_full(&c, "u", "k", "p", &json!({}), None, 1)
        .await
        .unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    abandon(&c, a.attempt_id, "worker vanished").await.unwrap();
    let err = assert_refusal(&c, "IJ006", true, "begin beyond max_attempts", || {
        begin(&c, s.job_id, None, "1 hour")
    })
    .await;
    assert!(err.detail().contains('1'), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ij007_not_found() {
    let db = Cluster::shared().fresh_db("sqlstate_ij007").await;
    let c = db.connect().await;
    let job = job_id_of("nobody", "nothing");
    let attempt = attempt_id_of(job, 1);
    let err = assert_refusal(&c, "IJ007", true, "begin on no job", || {
        begin(&c, job, None, "1 hour")
    })
    .await;
    assert!(err.detail().contains(&job.to_string()), "{err:?}");
    let err = assert_refusal(&c, "IJ007", true, "complete no attempt", || async {
        complete(&c, attempt, 1, &json!({})).await
    })
    .await;
    assert!(err.detail().contains(&attempt.to_string()), "{err:?}");
    assert_refusal(&c, "IJ007", true, "fail no attempt", || async {
        fail(&c, attempt, 1, &json!({}), true).await
    })
    .await;
    assert_refusal(&c, "IJ007", true, "mark_unknown no attempt", || {
        mark_unknown(&c, attempt, None)
    })
    .await;
    assert_refusal(&c, "IJ007", true, "heartbeat no attempt", || {
        heartbeat(&c, attempt, None)
    })
    .await;
    assert_refusal(&c, "IJ007", true, "abandon no attempt", || {
        abandon(&c, attempt, "why")
    })
    .await;
    assert_refusal(&c, "IJ007", true, "cancel no job", || cancel(&c, job, None)).await;
    // An existing job, but an attempt it never had.
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    let ghost = attempt_id_of(s.job_id, 2);
    assert_refusal(
        &c,
        "IJ007",
        true,
        "complete an attempt the job never had",
        || async { complete(&c, ghost, 1, &json!({})).await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_parameter_value_22023() {
    let db = Cluster::shared().fresh_db("sqlstate_22023").await;
    let c = db.connect().await;
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    let a = begin(&c, s.job_id, None, "1 hour").await.unwrap();
    let long = "x".repeat(256);
    let huge = json!({"blob": "y".repeat(1024 * 1024 + 1)});

    // (what, SQL, whether a HINT is expected)
    let cases: Vec<(&str, String, bool)> = vec![
        (
            "empty owner",
            "SELECT * FROM intent.submit_job('', 'k2', 'p', '{}')".into(),
            false,
        ),
        (
            "over-long key",
            format!("SELECT * FROM intent.submit_job('u', '{long}', 'p', '{{}}')"),
            false,
        ),
        (
            "empty provider",
            "SELECT * FROM intent.submit_job('u', 'k2', '', '{}')".into(),
            false,
        ),
        (
            "over-long contract",
            format!("SELECT * FROM intent.submit_job('u', 'k2', 'p', '{{}}', '{long}')"),
            false,
        ),
        (
            "max_attempts 0",
            "SELECT * FROM intent.submit_job('u', 'k2', 'p', '{}', NULL, 0)".into(),
            false,
        ),
        (
            "max_attempts 65536",
            "SELECT * FROM intent.submit_job('u', 'k2', 'p', '{}', NULL, 65536)".into(),
            false,
        ),
        (
            "params over 1 MiB",
            format!("SELECT * FROM intent.submit_job('u', 'k2', 'p', '{huge}')"),
            true,
        ),
        (
            "zero lease",
            format!(
                "SELECT * FROM intent.begin_attempt('{}', NULL, '0 seconds')",
                s.job_id
            ),
            true,
        ),
        (
            "negative lease",
            format!(
                "SELECT * FROM intent.begin_attempt('{}', NULL, '-5 seconds')",
                s.job_id
            ),
            true,
        ),
        (
            "lease over 24 hours",
            format!(
                "SELECT * FROM intent.begin_attempt('{}', NULL, '25 hours')",
                s.job_id
            ),
            true,
        ),
        (
            "empty worker",
            format!(
                "SELECT * FROM intent.begin_attempt('{}', NULL, '1 minute', '')",
                s.job_id
            ),
            false,
        ),
        (
            "wrong version",
            format!(
                "SELECT intent.complete_attempt('{}', 99, '{{}}')",
                a.attempt_id
            ),
            true,
        ),
        (
            "zero heartbeat extension",
            format!("SELECT intent.heartbeat('{}', '0 seconds')", a.attempt_id),
            true,
        ),
        (
            "empty abandon reason",
            format!("SELECT intent.abandon_attempt('{}', '')", a.attempt_id),
            false,
        ),
        (
            "over-long reason",
            format!(
                "SELECT intent.mark_unknown('{}', '{}')",
                a.attempt_id,
                "r".repeat(1001)
            ),
            false,
        ),
    ];
    for (what, sql, hint) in &cases {
        assert_refusal(&c, "22023", *hint, what, || c.query(sql.as_str(), &[])).await;
    }
    // The id derivations are plain immutable functions: malformed input is 22023 too.
    for (what, sql) in [
        (
            "job_id of an empty owner",
            "SELECT intent.job_id('', 'k')".to_string(),
        ),
        (
            "attempt 0",
            format!("SELECT intent.attempt_id('{}', 0)", s.job_id),
        ),
        (
            "attempt 65536",
            format!("SELECT intent.attempt_id('{}', 65536)", s.job_id),
        ),
        (
            "job_of a job id",
            format!("SELECT intent.job_of('{}')", s.job_id),
        ),
    ] {
        assert_error(&c, "22023", what, || c.query(sql.as_str(), &[])).await;
    }
    // The attempt those refusals aimed at is untouched and still works.
    assert!(heartbeat(&c, a.attempt_id, None).await.unwrap());
}

/// NULL where docs/reference.md gives no NULL default is bad input (22023), writes nothing, and says
/// which argument it was.
async fn null_argument_cases(c: &Client) -> Vec<(&'static str, String)> {
    let s = submit(c, "u", "k", "p", &json!({})).await.unwrap();
    let a = begin(c, s.job_id, None, "1 hour").await.unwrap();
    vec![
        (
            "NULL owner",
            "SELECT * FROM intent.submit_job(NULL, 'k2', 'p', '{}')".to_string(),
        ),
        (
            "NULL params",
            "SELECT * FROM intent.submit_job('u', 'k2', 'p', NULL)".to_string(),
        ),
        (
            "NULL max_attempts",
            "SELECT * FROM intent.submit_job('u', 'k2', 'p', '{}', NULL, NULL)".to_string(),
        ),
        (
            "NULL job id",
            "SELECT * FROM intent.begin_attempt(NULL)".to_string(),
        ),
        (
            "NULL lease",
            format!(
                "SELECT * FROM intent.begin_attempt('{}', NULL, NULL)",
                s.job_id
            ),
        ),
        (
            "NULL version",
            format!(
                "SELECT intent.complete_attempt('{}', NULL, '{{}}')",
                a.attempt_id
            ),
        ),
        (
            "NULL result",
            format!(
                "SELECT intent.complete_attempt('{}', {}, NULL)",
                a.attempt_id, a.version
            ),
        ),
        (
            "NULL abandon reason",
            format!("SELECT intent.abandon_attempt('{}', NULL)", a.attempt_id),
        ),
        (
            "NULL attempt id",
            "SELECT intent.heartbeat(NULL)".to_string(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_arguments_are_22023() {
    let db = Cluster::shared().fresh_db("sqlstate_null").await;
    let c = db.connect().await;
    for (what, sql) in null_argument_cases(&c).await {
        let err = assert_error(&c, "22023", what, || c.query(sql.as_str(), &[])).await;
        assert!(err.message.contains("NULL"), "{what}: {err:?}");
        assert!(err.hint.is_some(), "{what}: {err:?}");
    }
}

/// docs/reference.md § 6 (the facts line): *every* refusal carries a DETAIL with the facts. The NULL-argument refusals
/// (extension/src/input.rs `required`) say which argument was NULL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_argument_refusals_carry_a_detail() {
    let db = Cluster::shared().fresh_db("sqlstate_null_detail").await;
    let c = db.connect().await;
    for (what, sql) in null_argument_cases(&c).await {
        assert_refusal(&c, "22023", true, what, || c.query(sql.as_str(), &[])).await;
    }
}

/// Inside an explicit transaction a refusal aborts the transaction (as any error does); after
/// ROLLBACK the connection carries on, and the server never restarted through all of this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_inside_a_transaction_and_the_server_survives() {
    let cluster = Cluster::shared();
    let started = cluster.postmaster_start_time().await;
    let db = cluster.fresh_db("sqlstate_tx").await;
    let c = db.connect().await;
    let before = digest(&c).await;
    c.batch_execute("BEGIN").await.unwrap();
    let s = submit(&c, "u", "k", "p", &json!({})).await.unwrap();
    let err = refusal(
        begin(&c, job_id_of("u", "missing"), None, "1 minute").await,
        "IJ007",
    );
    assert!(err.hint.is_some());
    let err = refusal(begin(&c, s.job_id, None, "1 minute").await, "25P02");
    assert!(err.message.contains("aborted"));
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        digest(&c).await,
        before,
        "the whole transaction rolled back"
    );
    assert!(submit(&c, "u", "k", "p", &json!({})).await.unwrap().created);
    assert_eq!(
        cluster.postmaster_start_time().await,
        started,
        "no backend crashed the server"
    );
}

/// A NUL byte in text is refused by PostgreSQL itself (22021) before any function runs: the
/// backend survives and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_is_refused_before_the_extension_sees_it() {
    let db = Cluster::shared().fresh_db("sqlstate_nul").await;
    let c = db.connect().await;
    assert_error(&c, "22021", "NUL in the key", || async {
        submit(&c, "u", "k\0ey", "p", &json!({})).await
    })
    .await;
    assert!(
        submit(&c, "u", "key", "p", &json!({}))
            .await
            .unwrap()
            .created
    );
}
