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
//! `GATEWAY_WORKER` (`false`: no worker in this process), `GATEWAY_PURGE` (`false`: the worker
//! does not purge) and `GATEWAY_PURGE_EVERY` (default 60s), the reconciler's settings
//! (`GATEWAY_RECONCILE=false`: off; `GATEWAY_RECONCILE_EVERY`, `GATEWAY_RECONCILE_ABANDON_AFTER`
//! (unset: never abandon), `GATEWAY_RECONCILE_BATCH`; gateway/README.md § The reconciler), and
//! the bounds of gateway/README.md § Timeouts (`GATEWAY_GRACE`, `GATEWAY_STATEMENT_TIMEOUT`, …
//! as `250ms`, `5s` or seconds). The worker `LISTEN`s on `DATABASE_URL` for
//! `NOTIFY intent_claimable`.
//!
//! SIGTERM or SIGINT (Ctrl-C): the gateway stops accepting connections, finishes the requests
//! in flight, lets running attempts finish within the grace period and marks the rest
//! `unknown`, then exits 0.

use std::time::Duration;

use pg_intent_gateway::{Config, FakeProvider, Gateway, pool_with};
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// `250ms`, `5s`, `1.5s` or a number of seconds.
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1e-3)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1.0)
    };
    let secs = number.trim().parse::<f64>().ok()? * scale;
    Duration::try_from_secs_f64(secs).ok()
}

/// Sets `target` from the environment variable `name`, if set.
fn duration_from_env(name: &str, target: &mut Duration) -> Result<(), BoxError> {
    if let Ok(text) = std::env::var(name) {
        *target = parse_duration(&text)
            .ok_or_else(|| format!("{name}={text:?}: expected e.g. 250ms, 5s or 5"))?;
    }
    Ok(())
}

fn number_from_env<T: std::str::FromStr>(name: &str, target: &mut T) -> Result<(), BoxError> {
    if let Ok(text) = std::env::var(name) {
        *target = text
            .trim()
            .parse()
            .map_err(|_| format!("{name}={text:?}: expected a number"))?;
    }
    Ok(())
}

/// The first SIGTERM or SIGINT, by name.
async fn stop_signal(
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> &'static str {
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // First of all, so that a signal during startup is not the default (death): it stops the
    // gateway as soon as it runs.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

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
    duration_from_env("GATEWAY_GRACE", &mut config.worker.grace)?;
    if env("GATEWAY_PURGE", "true") != "true" {
        config.worker.purge_every = None;
    } else if let Some(every) = config.worker.purge_every.as_mut() {
        duration_from_env("GATEWAY_PURGE_EVERY", every)?;
    }
    number_from_env("GATEWAY_RETRY_AFTER", &mut config.unavailable_retry_after)?;
    let db = &mut config.database;
    duration_from_env("GATEWAY_DB_WAIT_TIMEOUT", &mut db.wait_timeout)?;
    duration_from_env("GATEWAY_DB_CONNECT_TIMEOUT", &mut db.connect_timeout)?;
    duration_from_env("GATEWAY_DB_RECYCLE_TIMEOUT", &mut db.recycle_timeout)?;
    duration_from_env("GATEWAY_STATEMENT_TIMEOUT", &mut db.statement_timeout)?;
    duration_from_env("GATEWAY_TRANSACTION_TIMEOUT", &mut db.transaction_timeout)?;
    let http = &mut config.http;
    duration_from_env("GATEWAY_HEADER_TIMEOUT", &mut http.header_timeout)?;
    duration_from_env("GATEWAY_BODY_TIMEOUT", &mut http.body_timeout)?;
    number_from_env("GATEWAY_MAX_BODY_BYTES", &mut http.max_body_bytes)?;
    number_from_env("GATEWAY_MAX_HEAD_BYTES", &mut http.max_head_bytes)?;
    duration_from_env("GATEWAY_WRITE_TIMEOUT", &mut http.write_timeout)?;
    number_from_env("GATEWAY_MAX_CONNECTIONS", &mut http.max_connections)?;
    duration_from_env("GATEWAY_DRAIN_TIMEOUT", &mut http.drain_timeout)?;
    let rec = &mut config.reconciler;
    rec.enabled = env("GATEWAY_RECONCILE", "true") == "true";
    rec.name = format!("gateway-{}-reconciler", std::process::id());
    duration_from_env("GATEWAY_RECONCILE_EVERY", &mut rec.every)?;
    if std::env::var_os("GATEWAY_RECONCILE_ABANDON_AFTER").is_some() {
        let mut age = Duration::ZERO;
        duration_from_env("GATEWAY_RECONCILE_ABANDON_AFTER", &mut age)?;
        rec.abandon_after = Some(age);
    }
    number_from_env("GATEWAY_RECONCILE_BATCH", &mut rec.batch)?;

    let database_url = env("DATABASE_URL", "host=localhost user=gateway dbname=app");
    let mut listen: tokio_postgres::Config = database_url.parse()?;
    if listen.get_connect_timeout().is_none() {
        listen.connect_timeout(config.database.connect_timeout);
    }
    config.worker.listen = Some(listen);

    // The pool serves the requests and the worker's attempts (one connection each).
    let pool = pool_with(
        &database_url,
        16 + config.worker.concurrency,
        &config.database,
    )?;
    let grace = config.worker.grace;
    // The stand-in provider remembers its calls by attempt id: the reconciler asks it.
    let provider = FakeProvider::new();
    let gateway = Gateway::new(pool, config, provider.clone());

    // The signal stops the server and the worker together.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::spawn(async move {
        let name = stop_signal(&mut term, &mut int).await;
        eprintln!(
            "pg_intent_gateway: {name}: no new connections; finishing the requests in flight, \
             and the running attempts within {grace:?} (the rest become unknown)"
        );
        let _ = stop.send(true);
        // Keep the handlers installed: a second signal must not kill the drain half-way.
        loop {
            let name = stop_signal(&mut term, &mut int).await;
            eprintln!("pg_intent_gateway: {name}: already shutting down");
        }
    });
    // The port first: if it cannot be bound the process exits before the worker has claimed
    // an attempt (which exiting would leave `started`, to lapse to `unknown`).
    let listener = tokio::net::TcpListener::bind(env("GATEWAY_LISTEN", "127.0.0.1:8080")).await?;
    eprintln!("pg_intent_gateway: listening on {}", listener.local_addr()?);
    let worker = (env("GATEWAY_WORKER", "true") == "true")
        .then(|| gateway.spawn_worker_until(until_stopped(stopped.clone())));
    let reconciler = gateway.spawn_reconciler_until(provider, until_stopped(stopped.clone()));
    gateway.serve(listener, until_stopped(stopped)).await?;
    if let Some(reconciler) = reconciler {
        reconciler.await?;
    }
    if let Some(worker) = worker {
        // The worker's own shutdown: running attempts get the grace period, the rest are
        // marked unknown ("worker shut down"). The process exits only after that.
        worker.await?;
    }
    eprintln!("pg_intent_gateway: shut down");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 20 "), Some(Duration::from_secs(20)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5m"), None);
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration(""), None);
    }
}
