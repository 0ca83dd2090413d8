//! Runs the test provider on its own, for trying a client by hand:
//!
//! ```sh
//! cargo run -p pg_intent_test_provider -- --mode hallucinated-key --port 8089
//! curl -s localhost:8089/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Subject: a fox"}]}'
//! ```
//!
//! It listens on 127.0.0.1 only, until interrupted.

use std::net::SocketAddr;

use pg_intent_test_provider::{Mode, TestProvider};

const USAGE: &str = "usage: pg-intent-test-provider [--mode well-behaved|hallucinated-key|ignores-format|checker-rejects|server-error] [--port N]";

fn parse_args() -> Result<(Mode, u16), String> {
    let mut mode = Mode::WellBehaved;
    let mut port = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => mode = value()?.parse()?,
            "--port" => port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok((mode, port))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (mode, port) = match parse_args() {
        Ok(parsed) => parsed,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("{USAGE}");
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
    println!(
        "test provider ({mode}) at {}/v1/chat/completions",
        provider.base_url()
    );
    std::future::pending::<()>().await;
}
