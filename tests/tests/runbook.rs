//! docs/runbook.md is only worth something at 3 a.m. if its SQL works. This test runs every
//! ```sql block of it, through psql (its variables and all), as the roles the runbook names,
//! against a situation made for that block, and checks the effect the runbook promises.
//!
//! Each block is preceded by `<!-- runbook-test: NAME -->`; a block without one fails the test,
//! so no SQL reaches the runbook untested.

use pg_intent_tests::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// The labelled ```sql blocks of the runbook, in order.
fn blocks() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/runbook.md");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut out = Vec::new();
    let mut label: Option<String> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("<!-- runbook-test:") {
            label = Some(rest.trim_end_matches("-->").trim().to_string());
        } else if t == "```sql" {
            let name = label.take().unwrap_or_else(|| {
                panic!("a ```sql block of the runbook has no runbook-test label")
            });
            let mut body = String::new();
            for l in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                body.push_str(l.trim_start());
                body.push('\n');
            }
            out.push((name, body));
        } else if !t.is_empty() && t.starts_with("```") {
            label = None;
        }
    }
    out
}

struct Runbook<'c> {
    db: Db<'c>,
    blocks: BTreeMap<String, String>,
}

impl Runbook<'_> {
    /// Runs block `name` through psql as `role`, with the psql variables `vars`; returns what
    /// psql printed (unaligned, tuples only). Panics on any error.
    fn run(&self, name: &str, role: &str, vars: &[(&str, &str)]) -> String {
        let sql = self
            .blocks
            .get(name)
            .unwrap_or_else(|| panic!("the runbook has no block {name}"));
        let mut cmd = Command::new(pg_bin().join("psql"));
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p"])
            .arg(self.db.cluster.port().to_string())
            .args(["-U", role, "-d", &self.db.name]);
        for (k, v) in vars {
            cmd.arg("-v").arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run psql");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(sql.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "runbook block {name} failed as {role} with {vars:?}:\n{sql}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

/// A job whose attempt 1 is `unknown` (its worker's timeout fired).
async fn unknown_attempt(c: &Client, key: &str, provider: &str) -> Uuid {
    let s = submit(c, "alice", key, provider, &json!({"prompt": key}))
        .await
        .unwrap();
    let row = c
        .query_one(
            "SELECT attempt_id FROM intent.begin_attempt($1, lease => '1 hour', worker => 'w-7')",
            &[&s.job_id],
        )
        .await
        .unwrap();
    let a: Uuid = row.get(0);
    mark_unknown(c, a, Some("the worker's timeout of 60s fired"))
        .await
        .unwrap();
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sql_block_of_the_runbook_works() {
    let db = Cluster::shared().fresh_db("runbook").await;
    let c = db.connect().await;
    // Roles are cluster-wide; this binary has its cluster to itself.
    c.batch_execute(
        "CREATE ROLE oncall LOGIN IN ROLE intent_operator;
         CREATE ROLE oncall_admin LOGIN IN ROLE intent_admin;",
    )
    .await
    .unwrap();
    let rb = Runbook {
        blocks: blocks().into_iter().collect(),
        db,
    };
    let s = |u: Uuid| u.to_string();
    let reason = (
        "reason",
        "INC-1234: the provider has no record of the request",
    );

    // Not bound to an owner.
    assert_eq!(rb.run("bound", "oncall", &[]).trim(), "");

    // 1. The overview lists what needs a person.
    let unknown = unknown_attempt(&c, "k-overview", "gpu-a").await;
    let out = rb.run("overview", "oncall", &[]);
    assert!(
        out.contains(&s(unknown)) && out.contains("gpu-a|unknown|1"),
        "{out}"
    );

    // 2.1 The story of one attempt's job.
    let out = rb.run("story", "oncall", &[("attempt_id", &s(unknown))]);
    assert!(out.contains("|timeout|") && out.contains("w-7"), "{out}");

    // 2.2 Complete by hand.
    let a = unknown_attempt(&c, "k-complete", "gpu-a").await;
    let out = rb.run("complete", "oncall", &[("attempt_id", &s(a))]);
    assert_eq!(out.trim(), "won");
    let job = job_row(&c, job_id_of("alice", "k-complete")).await;
    assert_eq!(job.state, "succeeded");
    assert_eq!(
        job.result,
        Some(json!({"image": "blob://images/62ccd04c.png"}))
    );

    // 2.3 Fail by hand: the job goes back to pending, the failure says who and why.
    let a = unknown_attempt(&c, "k-fail", "gpu-a").await;
    let out = rb.run("fail", "oncall", &[("attempt_id", &s(a)), reason]);
    assert_eq!(out.trim(), "pending");
    let row = attempt_row(&c, a).await;
    assert_eq!(row.state, "failed");
    let err = row.error.unwrap();
    assert_eq!(err["reconciled_by"], "oncall");
    assert_eq!(err["provider_says"], "no such request id");

    // 2.4 Abandon one; abandon many of one provider (older than ten minutes only).
    let a = unknown_attempt(&c, "k-abandon", "gpu-a").await;
    rb.run("abandon", "oncall", &[("attempt_id", &s(a)), reason]);
    assert_eq!(attempt_row(&c, a).await.state, "abandoned");
    assert_eq!(
        job_row(&c, job_id_of("alice", "k-abandon")).await.state,
        "pending"
    );
    let old1 = unknown_attempt(&c, "k-outage-1", "gpu-z").await;
    let old2 = unknown_attempt(&c, "k-outage-2", "gpu-z").await;
    let recent = unknown_attempt(&c, "k-outage-3", "gpu-z").await;
    c.execute(
        "UPDATE intent.attempts SET started_at = started_at - interval '15 minutes' WHERE id IN ($1, $2)",
        &[&old1, &old2],
    )
    .await
    .unwrap();
    let out = rb.run("abandon-many", "oncall", &[("provider", "gpu-z"), reason]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert_eq!(attempt_row(&c, old1).await.state, "abandoned");
    assert_eq!(attempt_row(&c, old2).await.state, "abandoned");
    assert_eq!(attempt_row(&c, recent).await.state, "unknown");

    // 2.5 Cancel.
    let a = unknown_attempt(&c, "k-cancel", "gpu-a").await;
    assert_eq!(
        rb.run("cancel", "oncall", &[("attempt_id", &s(a)), reason])
            .trim(),
        "t"
    );
    assert_eq!(
        job_row(&c, job_id_of("alice", "k-cancel")).await.state,
        "cancelled"
    );

    // 2.6 Sweep a job stuck in running.
    let stuck = submit(&c, "alice", "k-stuck", "gpu-a", &json!({}))
        .await
        .unwrap();
    let sa = begin(&c, stuck.job_id, None, "100 milliseconds")
        .await
        .unwrap();
    wait_past_deadline(&c, sa.attempt_id).await;
    assert_eq!(rb.run("sweep", "oncall", &[]).trim(), "1");
    assert_eq!(attempt_row(&c, sa.attempt_id).await.state, "unknown");

    // 2.7 What the reconciler decided: its reconciled events (here one recorded by hand, as
    // the Reconciler records it after its decision).
    let a = unknown_attempt(&c, "k-reconciled", "gpu-a").await;
    rb.run("fail", "oncall", &[("attempt_id", &s(a)), reason]);
    c.execute(
        "SELECT intent.record_reconciliation($1, 'failed', '{\"provider_says\": \"never_received\"}')",
        &[&a],
    )
    .await
    .unwrap();
    let out = rb.run("reconciled", "oncall", &[]);
    assert!(
        out.contains(&s(a)) && out.contains("|failed|failed|never_received|"),
        "{out}"
    );

    // 3. A lost race: the abandoned attempt reports after a retry won.
    let race = submit(&c, "bob", "k-race", "gpu-a", &json!({}))
        .await
        .unwrap();
    let r1 = begin(&c, race.job_id, None, "1 hour").await.unwrap();
    abandon(&c, r1.attempt_id, "stalled").await.unwrap();
    let r2 = begin(&c, race.job_id, None, "1 hour").await.unwrap();
    complete(&c, r2.attempt_id, r2.version, &json!({"image": "b.png"}))
        .await
        .unwrap();
    complete(&c, r1.attempt_id, r1.version, &json!({"image": "a.png"}))
        .await
        .unwrap();
    let out = rb.run("lost-races", "oncall", &[]);
    assert!(
        out.contains(&s(r1.attempt_id)) && out.contains("a.png") && out.contains("b.png"),
        "{out}"
    );
    let out = rb.run("late-events", "oncall", &[("job_id", &s(race.job_id))]);
    assert!(out.contains("presented_version"), "{out}");

    // 4. Certifications: what needs attention, certify, revoke, attempts on a provider.
    assert!(ensure_contract(&c, "image").await);
    c.execute(
        "SELECT intent.certify_provider('gpu-b', 'image', '{\"suite\": \"ok\"}', '2 days')",
        &[],
    )
    .await
    .unwrap();
    let out = rb.run("certifications", "oncall", &[]);
    assert!(out.starts_with("gpu-b|image|t|"), "{out}");
    rb.run("certify", "oncall_admin", &[("provider", "gpu-c")]);
    let current = |provider: &'static str| {
        let c = &c;
        async move {
            c.query_one(
                "SELECT current FROM intent.certifications_expiring WHERE provider = $1",
                &[&provider],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
        }
    };
    assert!(current("gpu-c").await);
    let failover = submit_full(
        &c,
        "carol",
        "k-failover",
        "gpu-a",
        &json!({}),
        Some("image"),
        3,
    )
    .await
    .unwrap();
    let fa = begin(&c, failover.job_id, Some("gpu-c"), "1 hour")
        .await
        .unwrap();
    let vars = [("provider", "gpu-c"), ("contract", "image"), reason];
    assert_eq!(rb.run("revoke", "oncall_admin", &vars).trim(), "t");
    assert!(!current("gpu-c").await);
    let out = rb.run("on-provider", "oncall", &vars);
    assert!(out.contains(&s(fa.attempt_id)), "{out}");

    // 5. Retention: how far behind, and a purge by hand.
    let out = rb.run("retention", "oncall", &[]);
    assert!(
        out.trim().ends_with("|0"),
        "nothing is older than the retention: {out}"
    );
    c.execute(
        "UPDATE intent.jobs SET created_at = created_at - interval '40 days',
                                updated_at = updated_at - interval '40 days'
          WHERE id = $1",
        &[&race.job_id],
    )
    .await
    .unwrap();
    assert_eq!(rb.run("purge", "oncall", &[]).trim(), "1");
    assert_eq!(
        c.query_one(
            "SELECT count(*) FROM intent.jobs WHERE id = $1",
            &[&race.job_id]
        )
        .await
        .unwrap()
        .get::<_, i64>(0),
        0
    );

    // Every block was run above.
    let tested = [
        "bound",
        "overview",
        "story",
        "complete",
        "fail",
        "abandon",
        "abandon-many",
        "cancel",
        "sweep",
        "reconciled",
        "lost-races",
        "late-events",
        "certifications",
        "certify",
        "revoke",
        "on-provider",
        "retention",
        "purge",
    ];
    let all: Vec<&str> = rb.blocks.keys().map(String::as_str).collect();
    let mut want = tested.to_vec();
    want.sort();
    assert_eq!(all, want, "a runbook block is not tested here");
}
