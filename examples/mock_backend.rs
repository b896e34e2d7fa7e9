//! A standalone mock inference backend for tests and benchmarks that run
//! outside the Rust test harness (the OpenAI SDK test, the peer benchmark).
//! It speaks vLLM's token-in `/v1/completions`, plus a text
//! `/v1/chat/completions` for gateways that forward text. Every request is
//! answered with the same reply ids (`--reply-ids 1,2,3`).
//!
//! Prints `listening on ADDR` on stdout once it accepts connections.

#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::io::Write;

use mock_vllm::{MockVllm, Scripted};

fn parse_args() -> Result<(String, Vec<u32>), String> {
    let mut listen = "127.0.0.1:0".to_string();
    let mut ids = vec![72, 105, 33];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs ADDR")?,
            "--reply-ids" => {
                let v = args.next().ok_or("--reply-ids needs a list")?;
                ids = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<u32>()
                            .map_err(|e| format!("bad id {s:?}: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((listen, ids))
}

#[tokio::main]
async fn main() {
    let (listen, ids) = match parse_args() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mock_backend: {e}\nusage: mock_backend [--listen ADDR] [--reply-ids 1,2,3]");
            std::process::exit(2);
        }
    };
    let mock = MockVllm::start_on(&listen, Scripted::ids(ids)).await;
    println!("listening on {}", mock.addr);
    let _ = std::io::stdout().flush();
    let _ = tokio::signal::ctrl_c().await;
}
