//! Runs the test provider on its own, for trying a client by hand:
//!
//! ```sh
//! cargo run -p pg_intent_test_provider -- --mode hallucinated-key --port 8089
//! curl -s localhost:8089/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Subject: a fox"}]}'
//! ```
//!
//! It listens on 127.0.0.1 only, until interrupted.

use std::net::SocketAddr;
use std::time::Duration;

use pg_intent_test_provider::{Mode, TestProvider};

fn usage() -> String {
    let modes: Vec<&str> = Mode::ALL.iter().map(|m| m.as_str()).collect();
    format!(
        "usage: pg-intent-test-provider [--mode {}] [--port N] [--delay-ms N]",
        modes.join("|")
    )
}

fn parse_args() -> Result<(Mode, u16, Duration), String> {
    let mut mode = Mode::WellBehaved;
    let mut port = 0;
    let mut delay = Duration::ZERO;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => mode = value()?.parse()?,
            "--port" => port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--delay-ms" => {
                delay =
                    Duration::from_millis(value()?.parse().map_err(|e| format!("--delay-ms: {e}"))?)
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok((mode, port, delay))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (mode, port, delay) = match parse_args() {
        Ok(parsed) => parsed,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("{}", usage());
            std::process::exit(2);
        }
    };
    let provider = match TestProvider::bind(SocketAddr::from(([127, 0, 0, 1], port)), mode).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        }
    };
    provider.set_delay(delay);
    println!(
        "test provider ({mode}, answering after {delay:?}) at {}/v1/chat/completions",
        provider.base_url()
    );
    std::future::pending::<()>().await;
}
