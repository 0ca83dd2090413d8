//! A submitting service: the API handler of "generate an image" that a user may click twice.
//!
//! The job is submitted in the same transaction as the order that needs it, so it exists exactly
//! when the order does. Errors become HTTP answers by their SQLSTATE, never by message text.
//!
//! Run against a database with `CREATE EXTENSION pg_intent`:
//! `DATABASE_URL="host=localhost user=postgres" cargo run -p pg_intent_client --example submit_service`

use pg_intent_client::{self as intent, Connection, Error, JobState, NewJob, Submitted};
use serde::{Deserialize, Serialize};

/// What the client sends.
#[derive(Debug, Serialize)]
struct ImageRequest {
    prompt: String,
    size: (u32, u32),
}

/// What a finished job holds.
#[derive(Debug, Serialize, Deserialize)]
struct Image {
    url: String,
}

/// An HTTP-ish answer.
#[derive(Debug)]
struct Response {
    status: u16,
    body: String,
}

/// POST /images with header Idempotency-Key: the click id.
async fn create_image(
    db: &mut Connection,
    user: &str,
    click_id: &str,
    req: &ImageRequest,
) -> Result<Response, Box<dyn std::error::Error>> {
    // Every layer can name the job before the database is asked (route, log, trace on it).
    let Ok(job_id) = intent::job_id(user, click_id) else {
        return Ok(Response {
            status: 400,
            body: "the Idempotency-Key must be 1 to 255 characters".into(),
        });
    };
    println!("[{job_id}] create_image for {user}/{click_id}");

    let tx = db
        .transaction()
        .await
        .map_err(|source| Error::Connection { source })?;
    tx.execute(
        "INSERT INTO orders (owner_id, click_id, job_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        &[&user, &click_id, &job_id],
    )
    .await?;
    let submitted: Result<Submitted<Image>, Error> =
        intent::submit_job(&tx, &NewJob::new(user, click_id, "gpu-a", req)).await;
    let job = match submitted {
        Ok(job) => job,
        Err(e) => {
            // The transaction rolls back when dropped: no order without its job.
            return Ok(Response {
                status: e.http_status(),
                body: match &e {
                    Error::IdempotencyConflict { fields, .. } => {
                        format!("this key was used for another request (different {fields:?})")
                    }
                    other => other.to_string(),
                },
            });
        }
    };
    tx.commit()
        .await
        .map_err(|source| Error::Connection { source })?;

    Ok(match (job.state, job.result) {
        (JobState::Succeeded, Some(image)) => Response {
            status: 200,
            body: image.url,
        },
        (state, _) => Response {
            status: if job.created { 201 } else { 202 },
            body: format!("job {} is {state}", job.job_id),
        },
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "host=localhost user=postgres".into());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let mut db = Connection::new(client);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS orders (
             owner_id text, click_id text, job_id uuid, PRIMARY KEY (owner_id, click_id))",
    )
    .await?;

    let req = ImageRequest {
        prompt: "a red fox in the snow".into(),
        size: (1024, 1024),
    };
    // The double click: the same key twice → one job (201, then 202).
    for _ in 0..2 {
        let r = create_image(&mut db, "alice", "click-1", &req).await?;
        println!("{} {}", r.status, r.body);
    }
    // The same key with another request → 422.
    let other = ImageRequest {
        prompt: "a grey wolf".into(),
        size: (512, 512),
    };
    let r = create_image(&mut db, "alice", "click-1", &other).await?;
    println!("{} {}", r.status, r.body);
    Ok(())
}
