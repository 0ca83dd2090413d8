//! A reconciler process: `pg_intent_client::Reconciler` resolving attempts whose outcome is
//! unknown by asking the provider what became of the request sent under the attempt id, every
//! 30 seconds (docs/runbook.md § 2 has the rules it applies).
//!
//! The provider here is a stand-in that answers by attempt number; a real one asks the
//! provider's status API (`pg_intent_harness::RequestLookup` for an OpenAI-compatible
//! provider that keeps requests by idempotency key, as pg_intent's test provider does).
//!
//! Connect as an operator (a member of `intent_operator`), unbound:
//! `DATABASE_URL=... cargo run -p pg_intent_client --example reconciler`

use std::time::Duration;

use pg_intent_client::reconciler::{Lookup, ProviderStatus, Reconciler};
use pg_intent_client::{AttemptRecord, Connection};
use serde_json::json;

/// Stands in for the provider's status API.
async fn ask_provider(
    attempt: AttemptRecord,
) -> Result<Lookup, pg_intent_client::runner::BoxError> {
    let status = match attempt.attempt_no % 4 {
        1 => ProviderStatus::Done(json!({"url": format!("s3://images/{}.png", attempt.id)})),
        2 => ProviderStatus::NeverReceived,
        3 => ProviderStatus::Running,
        _ => ProviderStatus::CannotTell,
    };
    Ok(Lookup::new(status).evidence(json!({"asked": "the stand-in provider"})))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "host=localhost user=postgres".into());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let mut db = Connection::new(client);
    let reconciler = Reconciler::new(ask_provider)
        .abandon_after(Duration::from_secs(15 * 60))
        .name(format!("reconciler-{}", std::process::id()));
    loop {
        let pass = reconciler.run_once(&mut db).await?;
        println!("sweep: {} lapsed lease(s) persisted as unknown", pass.swept);
        for r in &pass.reconciled {
            println!("{} ({}): {}", r.attempt_id, r.provider, r.decision);
        }
        for (attempt_id, error) in &pass.errors {
            println!("{attempt_id}: not reconciled: {error}");
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}
