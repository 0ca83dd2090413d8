//! A server started from a shell with `RUST_BACKTRACE=1` (a developer's habit, a container
//! image's default) must still give clients PostgreSQL's own DETAIL for an error that crosses
//! the extension's Rust code — not Rust stack frames. pgrx appends a backtrace to such errors
//! when backtraces are enabled; the extension's `_PG_init` turns them off unless
//! `RUST_LIB_BACKTRACE` asks for them explicitly.
//!
//! This binary holds one test because it sets the variable in its own environment, which the
//! server it starts inherits.

use pg_intent_tests::*;

/// Markers of a Rust backtrace in an error field.
const RUST_FRAMES: &[&str] = &[
    "backtrace",
    ".rs:",
    "pgrx",
    "std::",
    "core::",
    "rust_begin_unwind",
];

fn assert_no_rust_frames(what: &str, err: &SqlError) {
    for field in [Some(&err.message), err.detail.as_ref(), err.hint.as_ref()]
        .into_iter()
        .flatten()
    {
        for mark in RUST_FRAMES {
            assert!(
                !field.contains(mark),
                "{what}: a client sees Rust internals ({mark:?}) in {err:#?}"
            );
        }
    }
}

/// The same error raised by PostgreSQL itself, without the extension: what clients must see.
fn same_as_postgres(what: &str, through_rust: &SqlError, plain: &SqlError) {
    assert_eq!(
        (&through_rust.code, &through_rust.detail, &through_rust.hint),
        (&plain.code, &plain.detail, &plain.hint),
        "{what}: the error that crossed Rust differs from PostgreSQL's own"
    );
}

#[test]
fn a_server_started_with_rust_backtrace_still_gives_postgresql_s_own_detail() {
    // SAFETY: this is the only test of this binary, and it sets the variables before it starts
    // any thread of its own; the test harness reads no environment meanwhile.
    unsafe {
        std::env::set_var("RUST_BACKTRACE", "1");
        std::env::remove_var("RUST_LIB_BACKTRACE");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let cluster = Cluster::start();
        let pid = cluster.postmaster_pid().expect("running");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("read its environment");
        assert!(
            environ
                .split(|b| *b == 0)
                .any(|var| var == b"RUST_BACKTRACE=1"),
            "the server was started with RUST_BACKTRACE=1 in its environment"
        );
        let db = cluster.fresh_db("rust_backtrace").await;
        let c = db.connect().await;

        // 1. A serialization failure from submit_job under REPEATABLE READ: PostgreSQL raises it
        //    inside the INSERT that the extension runs through SPI, and it crosses Rust.
        let other = db.connect().await;
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM intent.jobs")
            .await
            .unwrap();
        submit(&other, "u", "k", "p", &json!({})).await.unwrap();
        let through_rust = refusal(submit(&c, "u", "k", "p", &json!({})).await, "40001");
        c.batch_execute("ROLLBACK").await.unwrap();
        assert_no_rust_frames("40001 from submit_job", &through_rust);
        // PostgreSQL's own: the same conflict in a plain INSERT … ON CONFLICT.
        c.batch_execute("CREATE TABLE plain (k text PRIMARY KEY)")
            .await
            .unwrap();
        c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM plain")
            .await
            .unwrap();
        other
            .batch_execute("INSERT INTO plain VALUES ('k')")
            .await
            .unwrap();
        let plain = SqlError::from_error(
            &c.batch_execute("INSERT INTO plain VALUES ('k') ON CONFLICT DO NOTHING")
                .await
                .expect_err("a serialization failure"),
        );
        c.batch_execute("ROLLBACK").await.unwrap();
        same_as_postgres("40001", &through_rust, &plain);

        // 2. A bad intent.retention: PostgreSQL's interval input refuses it (22007) inside the
        //    extension's purge.
        c.batch_execute("SET intent.retention = 'bogus'")
            .await
            .unwrap();
        let through_rust = expect_error(&c, "SELECT intent.purge()", &[]).await;
        assert_eq!(through_rust.code, "22007", "{through_rust:?}");
        assert_no_rust_frames("22007 from purge", &through_rust);
        let plain = expect_error(&c, "SELECT 'bogus'::interval", &[]).await;
        same_as_postgres("22007", &through_rust, &plain);

        // 3. The extension's own refusals are untouched.
        let err = refusal(
            begin(&c, job_id_of("nobody", "none"), None, "1 minute").await,
            "IJ007",
        );
        assert_no_rust_frames("IJ007", &err);
        assert!(err.detail.is_some() && err.hint.is_some(), "{err:?}");
    });
}
