//! A standalone mock inference backend for tests and benchmarks that run
//! outside the Rust test harness (the OpenAI SDK test, the peer benchmark).
//! It speaks vLLM's token-in `/v1/completions`, plus a text
//! `/v1/chat/completions` for gateways that forward text. Requests are
//! answered from `--script FILE` (a JSON list of id lists, one per request,
//! in order) and then with the same reply ids (`--reply-ids 1,2,3`); a
//! request carrying `structured_outputs` gets `--structured-reply-ids` when
//! given, as a backend honouring the constraint would answer.
//!
//! Prints `listening on ADDR` on stdout once it accepts connections.

#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::io::Write;

use mock_vllm::{MockVllm, Scripted};

type Args = (String, Vec<u32>, Vec<Vec<u32>>, Option<Vec<u32>>);

fn id_list(v: &str) -> Result<Vec<u32>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("bad id {s:?}: {e}"))
        })
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut listen = "127.0.0.1:0".to_string();
    let mut ids = vec![72, 105, 33];
    let mut script = Vec::new();
    let mut structured = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs ADDR")?,
            "--reply-ids" => ids = id_list(&args.next().ok_or("--reply-ids needs a list")?)?,
            "--structured-reply-ids" => {
                let v = args.next().ok_or("--structured-reply-ids needs a list")?;
                structured = Some(id_list(&v)?);
            }
            "--script" => {
                let path = args.next().ok_or("--script needs a file")?;
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
                script = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((listen, ids, script, structured))
}

#[tokio::main]
async fn main() {
    let (listen, ids, script, structured) = match parse_args() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mock_backend: {e}\nusage: mock_backend [--listen ADDR] [--reply-ids 1,2,3] [--script FILE] [--structured-reply-ids 1,2,3]");
            std::process::exit(2);
        }
    };
    let mock = MockVllm::start_on(&listen, Scripted::ids(ids)).await;
    *mock.state.structured_reply.lock().expect("lock") = structured;
    for reply in script {
        mock.push(Scripted::ids(reply));
    }
    println!("listening on {}", mock.addr);
    let _ = std::io::stdout().flush();
    let _ = tokio::signal::ctrl_c().await;
}
