//! A reconciler: resolves attempts whose outcome is unknown by asking the provider what really
//! happened, so the job's gate can open again.
//!
//! For each unknown attempt (after `sweep` persisted lapsed leases):
//! - the provider finished → `complete_attempt` with the result (it may win: its work happened);
//! - the provider says it never ran it → `fail_attempt` (a definite failure, retryable);
//! - the provider cannot tell, and it is old enough → `abandon_attempt` (the out-of-band decision);
//! - still running → leave it.
//!
//! Reading `intent.attempts` needs `SELECT` on it (an operator role).
//! `DATABASE_URL=... cargo run -p pg_intent_client --example reconciler`

use std::time::{Duration, SystemTime};

use pg_intent_client::{self as intent, AttemptRecord, Connection};
use serde_json::json;

/// What the provider's status API says about a request, keyed by our attempt id.
enum ProviderStatus {
    Done(serde_json::Value),
    NeverReceived,
    Running,
    NoIdea,
}

/// Stands in for the provider's status API.
async fn ask_provider(attempt: &AttemptRecord) -> ProviderStatus {
    match attempt.attempt_no % 4 {
        1 => ProviderStatus::Done(json!({"url": format!("s3://images/{}.png", attempt.id)})),
        2 => ProviderStatus::NeverReceived,
        3 => ProviderStatus::Running,
        _ => ProviderStatus::NoIdea,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "host=localhost user=postgres".into());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let db = Connection::new(client);
    let give_up_after = Duration::from_secs(15 * 60);

    let lapsed = intent::sweep(&db).await?;
    println!("sweep: {lapsed} lapsed lease(s) persisted as unknown");
    for attempt in intent::unknown_attempts(&db, 100).await? {
        // The handle carries the fencing token read from the database.
        let handle = attempt.handle();
        match ask_provider(&attempt).await {
            ProviderStatus::Done(result) => {
                let completion = intent::complete_attempt(&db, &handle, &result).await?;
                println!("{}: provider finished → {completion}", attempt.id);
            }
            ProviderStatus::NeverReceived => {
                let state = intent::fail_attempt(
                    &db,
                    &handle,
                    &json!({"reconciled": "provider has no record of the request"}),
                    true,
                )
                .await?;
                println!("{}: never ran → failed; job is {state}", attempt.id);
            }
            ProviderStatus::Running => println!("{}: still running, leave it", attempt.id),
            ProviderStatus::NoIdea => {
                let age = SystemTime::now()
                    .duration_since(attempt.started_at)
                    .unwrap_or_default();
                if age > give_up_after {
                    intent::abandon_attempt(&db, attempt.id, "reconciler: provider cannot tell")
                        .await?;
                    println!("{}: abandoned after {age:?}", attempt.id);
                } else {
                    println!("{}: unknown for {age:?}; asking again later", attempt.id);
                }
            }
        }
    }
    Ok(())
}
