//! The example gateway, with the fake provider.
//!
//! ```sh
//! DATABASE_URL='host=localhost user=gateway dbname=app' \
//! GATEWAY_TOKENS='alice-token=alice,bob-token=bob' \
//!   cargo run -p pg_intent_gateway
//! curl -i localhost:8080/jobs -H 'Authorization: Bearer alice-token' \
//!      -H 'Idempotency-Key: "click-1"' -H 'Content-Type: application/json' -d '{"prompt": "a cat"}'
//! ```
//!
//! Environment: `DATABASE_URL` (a tokio-postgres connection string or URL), `GATEWAY_LISTEN`
//! (default `127.0.0.1:8080`), `GATEWAY_TOKENS` (`token=owner,…`), `GATEWAY_PROVIDERS`
//! (`gpu-a,gpu-b`; the first is the one of `POST /jobs`), `GATEWAY_BIND_OWNER` (`true`:
//! `SET LOCAL intent.owner_id` per request; needs `GRANT SET ON PARAMETER intent.owner_id`),
//! `GATEWAY_WORKER` (`false`: no worker in this process). The worker `LISTEN`s on
//! `DATABASE_URL` for `NOTIFY intent_claimable`; Ctrl-C lets its running attempts finish.

use pg_intent_gateway::{Config, Gateway, fake_provider, pool};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config {
        bind_owner: env("GATEWAY_BIND_OWNER", "true") == "true",
        ..Config::default()
    };
    for pair in env("GATEWAY_TOKENS", "alice-token=alice").split(',') {
        let (token, owner) = pair
            .split_once('=')
            .ok_or("GATEWAY_TOKENS is token=owner,…")?;
        config
            .tokens
            .insert(token.trim().into(), owner.trim().into());
    }
    config.providers = env("GATEWAY_PROVIDERS", "gpu-a,gpu-b")
        .split(',')
        .map(|p| p.trim().to_string())
        .collect();
    config.default_provider = config.providers[0].clone();
    config.worker.name = format!("gateway-{}", std::process::id());
    let database_url = env("DATABASE_URL", "host=localhost user=gateway dbname=app");
    config.worker.listen = Some(database_url.parse()?);

    // The pool serves the requests and the worker's attempts (one connection each).
    let pool = pool(&database_url, 16 + config.worker.concurrency)?;
    let gateway = Gateway::new(pool, config, fake_provider);

    // Ctrl-C stops the server and the worker; the worker lets running attempts finish.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop.send(true);
    });
    let worker = (env("GATEWAY_WORKER", "true") == "true")
        .then(|| gateway.spawn_worker_until(until_stopped(stopped.clone())));
    let listener = tokio::net::TcpListener::bind(env("GATEWAY_LISTEN", "127.0.0.1:8080")).await?;
    eprintln!("pg_intent_gateway: listening on {}", listener.local_addr()?);
    gateway.serve(listener, until_stopped(stopped)).await?;
    if let Some(worker) = worker {
        worker.await?;
    }
    Ok(())
}
