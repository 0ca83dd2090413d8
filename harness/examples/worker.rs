//! A worker: runs one job by the protocol, failing over to a second provider only when the gate
//! allows.
//!
//! The helper begins the attempt, heartbeats while the (simulated) provider works, marks the
//! attempt unknown — never failed — when our own timeout fires, and reports with the attempt's
//! own version. An unknown outcome is an answer ("reconcile first"), not a reason to start a
//! second attempt.
//!
//! The provider's failures are the harness's (`harness::Failure`, `harness::ProviderError`),
//! reported with `Failure::into_work_error`: only a failure that says nothing was processed
//! (gpu-a's 429) fails the attempt; a call that times out after sending is marked unknown.
//!
//! `DATABASE_URL=... cargo run -p pg_intent_harness --example worker -- alice click-1 [slow]`
//! (run the submit_service example first; `slow` makes the provider outlast the timeout).

use std::time::Duration;

use pg_intent_client::{self as intent, Attempt, Completion, Connection, Failover, Worker};
use pg_intent_harness::{Failure, ProviderError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    url: String,
}

/// How long one provider call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The worker's timeout: strictly longer than [`CALL_TIMEOUT`], so that the call's own timeout
/// decides and records what it knows ("sent, no answer within 1s"). The worker's is the
/// backstop for the whole work; with the two equal, which fires first would be a race. Either
/// one marks the attempt unknown, never failed.
const WORKER_TIMEOUT: Duration = Duration::from_secs(2);

/// Stands in for the HTTP call to a GPU provider. The attempt id is the provider-side
/// idempotency key, so a reconciler can later ask the provider what became of it.
async fn call_provider(attempt: &Attempt, slow: bool) -> Result<Image, Failure> {
    let provider = attempt.provider().unwrap_or("gpu-a");
    println!("calling {provider} for attempt {} ...", attempt.id());
    if slow {
        tokio::time::sleep(Duration::from_secs(3600)).await; // still generating
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    match provider {
        // Rate-limited before any work started: the provider says it processed nothing.
        "gpu-a" if attempt.attempt_no() == 1 => Err(Failure::Provider(
            ProviderError::http(429, "rate limit reached").retry_after(Duration::ZERO),
        )),
        _ => Ok(Image {
            url: format!("s3://images/{}.png", attempt.id()),
        }),
    }
}

/// The worker's work: the call within its timeout, its failure mapped by
/// `Failure::into_work_error` (429: failed, retryable; timed out after sending: unknown).
async fn work(attempt: Attempt, slow: bool) -> Result<Image, intent::WorkError<serde_json::Value>> {
    let provider = attempt.provider().unwrap_or("gpu-a").to_string();
    match tokio::time::timeout(CALL_TIMEOUT, call_provider(&attempt, slow)).await {
        Ok(answer) => answer,
        Err(_) => Err(Failure::Timeout(CALL_TIMEOUT)),
    }
    .map_err(|failure| failure.into_work_error(&provider))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let owner = args.get(1).map_or("alice", String::as_str);
    let key = args.get(2).map_or("click-1", String::as_str);
    let slow = args.get(3).is_some_and(|a| a == "slow");
    let job_id = intent::job_id(owner, key)?;

    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "host=localhost user=postgres".into());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let db = Connection::new(client);

    let worker = Worker::new(&db, WORKER_TIMEOUT)
        .lease(Duration::from_secs(1))
        .name("example-worker");
    // gpu-a twice (a retry), then gpu-b: a failover that needs the job's contract and a
    // certification, else the gate refuses it and it is skipped.
    let answer = worker
        .run_failover(job_id, &["gpu-a", "gpu-a", "gpu-b"], |attempt| {
            work(attempt, slow)
        })
        .await?;
    match answer {
        Failover::Completed {
            attempt,
            completion: Completion::Won,
            result,
        } => {
            println!("attempt {} won: {}", attempt.attempt_no(), result.url)
        }
        Failover::Completed { completion, .. } => {
            println!("our result was {completion}; the job's result stands")
        }
        Failover::ReconcileFirst { attempt_id, reason } => println!(
            "outcome of {attempt_id:?} unknown ({}): run the reconciler, not another attempt",
            reason.unwrap_or_else(|| "an earlier attempt".into())
        ),
        Failover::InFlight { attempt_id } => println!("{attempt_id:?} is running elsewhere"),
        Failover::JobFinished { state } => println!("nothing to do: the job is {state:?}"),
        Failover::Failed { error, .. } => println!("the job failed: {error:?}"),
        Failover::Stopped { attempt } => println!("told to stop {}", attempt.id()),
        Failover::Exhausted {
            failures,
            rejected,
            not_certified,
            attempts_exhausted,
        } => println!(
            "no provider left: failures {failures:?}, rejected {rejected:?}, \
             not certified {not_certified:?}, attempts exhausted {attempts_exhausted}"
        ),
    }
    Ok(())
}
