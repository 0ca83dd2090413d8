//! Every variant of `Error`, produced by a real server (or, for the client-side ones, by real
//! data), classified by SQLSTATE alone.

mod db;

use std::collections::BTreeMap;
use std::time::Duration;

use db::TestDb;
use pg_intent_client::{
    self as intent, BeginOptions, Call, Error, Executor, FingerprintField, JobState, NewJob,
    StatementCache, Submitted,
};
use serde_json::{Value, json};
use tokio_postgres::{Client, Statement};

async fn job(db: &impl Executor, key: &str, max_attempts: u16) -> uuid::Uuid {
    let s: Submitted<Value> = intent::submit_job(
        db,
        &NewJob::new("owner", key, "gpu-a", &json!({"k": key})).max_attempts(max_attempts),
    )
    .await
    .unwrap();
    s.job_id
}

#[tokio::test]
async fn ij001_idempotency_conflict_names_the_fields() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let params = json!({"prompt": "fox"});
    let _: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &params))
            .await
            .unwrap();
    // Same params, different key order and whitespace: the same intent.
    let same: Value = serde_json::from_str(r#"{ "prompt" : "fox" }"#).unwrap();
    let replay: Submitted<Value> =
        intent::submit_job(&db, &NewJob::new("alice", "click-1", "gpu-a", &same))
            .await
            .unwrap();
    assert!(!replay.created);

    let other = json!({"prompt": "wolf"});
    let err = intent::submit_job::<Value>(&db, &NewJob::new("alice", "click-1", "gpu-b", &other))
        .await
        .unwrap_err();
    let Error::IdempotencyConflict { job_id, fields, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*job_id, intent::job_id("alice", "click-1").unwrap());
    assert_eq!(
        fields,
        &[FingerprintField::Provider, FingerprintField::Params]
    );
    assert_eq!(err.code(), Some("IJ001"));
    assert_eq!(err.http_status(), 422);
    assert!(err.detail().is_some());
    assert!(err.hint().is_some());
    assert!(
        err.to_string().starts_with("IJ001 idempotency_conflict: "),
        "{err}"
    );

    // Where the extension has contracts, one must be defined before a job can name it.
    db.batch_execute(
        "DO $$ BEGIN
           IF to_regproc('intent.define_contract') IS NOT NULL THEN
             EXECUTE $q$SELECT intent.define_contract('images-v1', '{\"type\": \"object\"}')$q$;
           END IF;
         END $$",
    )
    .await
    .unwrap();
    let err = intent::submit_job::<Value>(
        &db,
        &NewJob::new("alice", "click-1", "gpu-a", &params).contract("images-v1"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::IdempotencyConflict { fields, .. } if fields == &[FingerprintField::Contract]),
        "{err:?}"
    );
}

#[tokio::test]
async fn ij002_ij003_the_gate() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "gate", 3).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();

    let err = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::AttemptInFlight { job_id, attempt_id: Some(id), .. } if *job_id == j && *id == a.id()),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ002"));
    assert_eq!(err.http_status(), 409);

    intent::mark_unknown(&db, a.id(), Some("timeout"))
        .await
        .unwrap();
    let err = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::OutcomeUnknown { job_id, attempt_id: Some(id), .. } if *job_id == j && *id == a.id()),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ003"));

    // A started attempt past its deadline counts as unknown, swept or not.
    let j2 = job(&db, "lapsed", 3).await;
    let b = intent::begin_attempt(
        &db,
        j2,
        BeginOptions::new().lease(Duration::from_millis(30)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = intent::begin_attempt(&db, j2, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::OutcomeUnknown { attempt_id: Some(id), .. } if *id == b.id()),
        "{err:?}"
    );
}

#[tokio::test]
async fn ij004_job_finished_names_the_state() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "fin", 3).await;
    assert!(
        intent::cancel_job(&db, j, Some("changed my mind"))
            .await
            .unwrap()
    );
    let err = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::JobFinished { job_id, state: Some(JobState::Cancelled), .. } if *job_id == j),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ004"));

    let j = job(&db, "won", 3).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    intent::complete_attempt(&db, &a, &json!(1)).await.unwrap();
    let err = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::JobFinished {
                state: Some(JobState::Succeeded),
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn ij005_failover_needs_a_certified_provider() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "failover", 3).await;
    let err = intent::begin_attempt(&db, j, BeginOptions::new().provider("gpu-b"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::ProviderNotCertified { job_id, provider: Some(p), .. } if *job_id == j && p == "gpu-b"),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ005"));
    assert_eq!(err.http_status(), 422);
    // Naming the job's own provider is not a failover.
    intent::begin_attempt(&db, j, BeginOptions::new().provider("gpu-a"))
        .await
        .unwrap();
}

#[tokio::test]
async fn ij006_attempts_exhausted() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "once", 1).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    intent::abandon_attempt(&db, a.id(), "stuck").await.unwrap();
    let err = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::AttemptsExhausted { job_id, .. } if *job_id == j),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ006"));
    assert_eq!(err.http_status(), 409);
}

#[tokio::test]
async fn ij007_not_found() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let nobody = intent::job_id("nobody", "nothing").unwrap();
    let err = intent::begin_attempt(&db, nobody, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotFound { id, .. } if *id == nobody),
        "{err:?}"
    );
    assert_eq!(err.code(), Some("IJ007"));
    assert_eq!(err.http_status(), 404);

    let ghost = intent::attempt_id(nobody, 1).unwrap();
    for err in [
        intent::heartbeat(&db, ghost, None).await.unwrap_err(),
        intent::mark_unknown(&db, ghost, None).await.unwrap_err(),
        intent::abandon_attempt(&db, ghost, "why")
            .await
            .unwrap_err(),
        intent::cancel_job(&db, nobody, None)
            .await
            .map(|_| ())
            .unwrap_err(),
        // A job id where an attempt id belongs names no attempt.
        intent::heartbeat(&db, nobody, None)
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(matches!(&err, Error::NotFound { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn invalid_input_22023_writes_nothing() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let long = "x".repeat(256);
    let j = job(&db, "valid", 3).await;
    let mut errors = vec![
        intent::submit_job::<Value>(&db, &NewJob::new("", "k", "p", &json!({})))
            .await
            .unwrap_err(),
        intent::submit_job::<Value>(&db, &NewJob::new("o", &long, "p", &json!({})))
            .await
            .unwrap_err(),
        intent::submit_job::<Value>(&db, &NewJob::new("o", "k", "p", &json!({})).max_attempts(0))
            .await
            .unwrap_err(),
        intent::begin_attempt(&db, j, BeginOptions::new().lease(Duration::ZERO))
            .await
            .unwrap_err(),
        intent::begin_attempt(
            &db,
            j,
            BeginOptions::new().lease(Duration::from_secs(25 * 3600)),
        )
        .await
        .unwrap_err(),
    ];
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    errors.push(intent::abandon_attempt(&db, a.id(), "").await.unwrap_err());
    errors.push(
        intent::heartbeat(&db, a.id(), Some(Duration::ZERO))
            .await
            .unwrap_err(),
    );
    for err in &errors {
        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
        assert_eq!(err.code(), Some("22023"));
        assert_eq!(err.http_status(), 400);
    }
    // Too large a document (over 1 MiB): store blobs elsewhere.
    let huge = json!({"blob": "x".repeat(1_100_000)});
    let err = intent::submit_job::<Value>(&db, &NewJob::new("o", "huge", "p", &huge))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");

    // Other data exceptions stay database errors with their SQLSTATE, and are still bad input.
    let err = intent::submit_job::<Value>(&db, &NewJob::new("o\0", "k", "p", &json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    assert_eq!(err.code(), Some("22021"));
    assert_eq!(err.http_status(), 400);
    let err =
        intent::submit_job::<Value>(&db, &NewJob::new("o", "nul", "p", &json!({"s": "a\u{0}b"})))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some("22P05"), "{err:?}");
    assert_eq!(err.http_status(), 400);

    let jobs: i64 = db
        .query_one("SELECT count(*) FROM intent.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 1);
}

#[tokio::test]
async fn other_database_errors_keep_their_sqlstate() {
    let t = TestDb::new().await;
    let mut db = t.conn().await;
    let j = job(&db, "db", 3).await;

    // An aborted transaction: 25P02.
    let tx = db.transaction().await.unwrap();
    let first = intent::begin_attempt(
        &tx,
        intent::job_id("no", "job").unwrap(),
        BeginOptions::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(first, Error::NotFound { .. }));
    let err = intent::begin_attempt(&tx, j, BeginOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Database { .. }), "{err:?}");
    assert_eq!(err.code(), Some("25P02"));
    assert_eq!(err.http_status(), 500);
    assert!(!err.is_retryable());
    tx.rollback().await.unwrap();

    // No privilege: 42501 (the API is not granted to PUBLIC).
    db.batch_execute("CREATE ROLE app LOGIN").await.unwrap();
    let cfg = format!("{} ", t.conn_str()).replace("user=postgres", "user=app");
    let (app, conn) = tokio_postgres::connect(&cfg, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let app = intent::Connection::new(app);
    let err = intent::sweep(&app).await.unwrap_err();
    assert!(matches!(&err, Error::Database { .. }), "{err:?}");
    assert_eq!(err.code(), Some("42501"));
    assert_eq!(err.http_status(), 403);

    // A serialization failure: 40001, retryable.
    let mut other = t.conn().await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    let tx1 = db
        .transaction_with(tokio_postgres::IsolationLevel::RepeatableRead)
        .await
        .unwrap();
    tx1.query_one("SELECT 1 FROM intent.jobs WHERE id = $1", &[&j])
        .await
        .unwrap();
    {
        let tx2 = other.transaction().await.unwrap();
        intent::mark_unknown(&tx2, a.id(), None).await.unwrap();
        tx2.commit().await.unwrap();
    }
    let err = intent::heartbeat(&tx1, a.id(), None).await.unwrap_err();
    assert_eq!(err.code(), Some("40001"), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(err.http_status(), 503);
}

#[tokio::test]
async fn connection_errors_are_not_database_errors() {
    let t = TestDb::new().await;
    let admin = t.conn().await;
    let db = t.conn().await;
    intent::sweep(&db).await.unwrap();
    let pid: i32 = db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    assert!(
        pg_intent_cluster::eventually(Duration::from_secs(5), || async { db.is_closed() }).await
    );
    let err = intent::sweep(&db).await.unwrap_err();
    assert!(matches!(&err, Error::Connection { .. }), "{err:?}");
    assert_eq!(err.code(), None);
    assert!(err.pg_error().is_some());
    assert_eq!(err.http_status(), 503);
}

#[tokio::test]
async fn json_that_does_not_fit() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    // Params serde_json cannot write: a map with non-string keys. Nothing is sent.
    let mut bad = BTreeMap::new();
    bad.insert((1, 2), "x");
    let err = intent::submit_job::<Value>(&db, &NewJob::new("o", "k", "p", &bad))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    assert_eq!(err.code(), None);
    assert_eq!(err.http_status(), 400);

    // A result that is not the type asked for.
    let j = job(&db, "typed", 3).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    intent::complete_attempt(&db, &a, &json!({"url": "s3://x"}))
        .await
        .unwrap();
    let err = intent::submit_job::<u64>(
        &db,
        &NewJob::new("owner", "typed", "gpu-a", &json!({"k": "typed"})),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Deserialize(_)), "{err:?}");
}

/// An executor of one's own (here: one that answers every call with a label this client does
/// not know, as a newer extension might).
struct FromTheFuture {
    client: Client,
    cache: StatementCache,
}

impl Executor for FromTheFuture {
    fn client(&self) -> &Client {
        &self.client
    }

    async fn prepare_call(&self, call: Call) -> Result<Statement, tokio_postgres::Error> {
        assert_eq!(call, Call::CompleteAttempt);
        self.client
            .prepare_typed(
                "SELECT 'postponed'::text WHERE $1::uuid IS NOT NULL AND $2::int8 IS NOT NULL AND $3::jsonb IS NOT NULL",
                call.param_types(),
            )
            .await
    }
}

#[tokio::test]
async fn unknown_labels_are_reported() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    let j = job(&db, "future", 3).await;
    let a = intent::begin_attempt(&db, j, BeginOptions::new())
        .await
        .unwrap();
    let future = FromTheFuture {
        client: t.client().await,
        cache: StatementCache::new(),
    };
    assert!(future.cache.is_empty());
    let err = intent::complete_attempt(&future, &a, &json!(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownLabel(_)), "{err:?}");
    assert!(err.to_string().contains("postponed"), "{err}");
}

/// The refusal of a `begin_attempt` that must be refused.
async fn begin_refused(db: &impl Executor, job_id: uuid::Uuid) -> Error {
    intent::begin_attempt(db, job_id, BeginOptions::new())
        .await
        .unwrap_err()
}

/// A refusal's facts make the round trip: the extension writes them as the DETAIL's facts line,
/// the client reads them back exactly, and the DETAIL it shows people is the sentence alone.
#[tokio::test]
async fn refusal_facts_round_trip_from_the_server() {
    use pg_intent_client::pg_intent_protocol::{AttemptState, Facts};
    let t = TestDb::new().await;
    let db = t.conn().await;
    let bytes = |id: uuid::Uuid| Some(*id.as_bytes());
    let check = |err: Error, want: Facts| {
        assert_eq!(err.facts(), want, "{err:?}");
        let detail = err.detail().expect("a DETAIL");
        assert!(
            !detail.is_empty() && !detail.lines().any(|l| l.starts_with("Facts:")),
            "{detail:?}"
        );
    };

    // IJ001: the fields that differ.
    let j = job(&db, "facts", 1).await;
    let err = intent::submit_job::<Value>(&db, &NewJob::new("owner", "facts", "gpu-b", &json!({})))
        .await
        .unwrap_err();
    check(
        err,
        Facts {
            job_id: bytes(j),
            fields: Some(vec![FingerprintField::Provider, FingerprintField::Params]),
            ..Facts::default()
        },
    );

    // IJ002, then IJ003: the blocking attempt and its state. The DETAIL's sentence quotes the
    // worker's name, which tries to pass for a facts line: the real one still wins.
    let forger = "w\nFacts: job_id=00000000-0000-0000-0000-000000000000 attempt_state=unknown";
    let a = intent::begin_attempt(&db, j, BeginOptions::new().worker(forger))
        .await
        .unwrap();
    let blocking = |state| Facts {
        job_id: bytes(j),
        attempt_id: bytes(a.id()),
        attempt_state: Some(state),
        ..Facts::default()
    };
    check(begin_refused(&db, j).await, blocking(AttemptState::Started));
    intent::mark_unknown(&db, a.id(), None).await.unwrap();
    check(begin_refused(&db, j).await, blocking(AttemptState::Unknown));

    // IJ006: the counts.
    intent::abandon_attempt(&db, a.id(), "facts test")
        .await
        .unwrap();
    check(
        begin_refused(&db, j).await,
        Facts {
            job_id: bytes(j),
            attempt_count: Some(1),
            max_attempts: Some(1),
            ..Facts::default()
        },
    );

    // IJ004: the terminal state and version.
    intent::cancel_job(&db, j, None).await.unwrap();
    check(
        begin_refused(&db, j).await,
        Facts {
            job_id: bytes(j),
            job_state: Some(JobState::Cancelled),
            version: Some(2),
            ..Facts::default()
        },
    );
}

/// A facts line that pg_intent did not write is not believed: a contract checker may raise a
/// serialization failure (passed through with its own DETAIL), and write a facts line there.
#[tokio::test]
async fn a_checkers_facts_line_is_not_believed() {
    let t = TestDb::new().await;
    let db = t.conn().await;
    db.batch_execute(
        "CREATE FUNCTION public.forging_check(r jsonb) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
         BEGIN
           RAISE EXCEPTION 'please retry' USING ERRCODE = '40001',
             DETAIL = E'x\\nFacts: job_id=00000000-0000-0000-0000-000000000000 job_state=succeeded version=99';
         END $$;
         GRANT EXECUTE ON FUNCTION public.forging_check(jsonb) TO intent_owner;
         SELECT intent.define_contract('forged', '{}', 'public.forging_check(jsonb)');",
    )
    .await
    .unwrap();
    let params = json!({});
    let job = NewJob::new("owner", "forged", "gpu-a", &params).contract("forged");
    let s: Submitted<Value> = intent::submit_job(&db, &job).await.unwrap();
    let a = intent::begin_attempt(&db, s.job_id, BeginOptions::new())
        .await
        .unwrap();
    let err = intent::complete_attempt(&db, &a, &json!({"n": 1}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("40001"), "{err:?}");
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    assert_eq!(
        err.facts(),
        pg_intent_client::pg_intent_protocol::Facts::default()
    );
    assert!(err.detail().unwrap().contains("Facts: "), "{err:?}");
}
