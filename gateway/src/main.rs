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
//! `GATEWAY_WORKER` (`false`: no worker in this process).

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

    let pool = pool(
        &env("DATABASE_URL", "host=localhost user=gateway dbname=app"),
        16,
    )?;
    let gateway = Gateway::new(pool, config, fake_provider);
    if env("GATEWAY_WORKER", "true") == "true" {
        gateway.spawn_worker();
    }
    let listener = tokio::net::TcpListener::bind(env("GATEWAY_LISTEN", "127.0.0.1:8080")).await?;
    eprintln!("pg_intent_gateway: listening on {}", listener.local_addr()?);
    gateway
        .serve(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
