//! A standalone mock inference backend for tests and benchmarks that run
//! outside the Rust test harness (the OpenAI SDK test, the peer benchmark).
//! It speaks vLLM's token-in `/v1/completions`, plus a text
//! `/v1/chat/completions` for gateways that forward text. Requests are
//! answered from `--script FILE` (a JSON list of id lists, one per request,
//! in order) and then with the same reply ids (`--reply-ids 1,2,3`); a
//! request carrying `structured_outputs` gets `--structured-reply-ids` when
//! given, as a backend honouring the constraint would answer.
//!
//! It answers vLLM's `prompt_logprobs` too (the replay check, `POST
//! /v1/trajectories/{id}/verify`): a token it sampled gets back the logprob
//! it was sampled with, so a replay of its answers shows |Δ| = 0, except at
//! the sequence positions shifted with `--replay-shift POS=DELTA,...`.
//!
//! Prints `listening on ADDR` on stdout once it accepts connections.

#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::io::Write;

use mock_vllm::{MockVllm, Scripted};

struct Args {
    listen: String,
    ids: Vec<u32>,
    script: Vec<Vec<u32>>,
    structured: Option<Vec<u32>>,
    shifts: Vec<(usize, f32)>,
}

fn id_list(v: &str) -> Result<Vec<u32>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("bad id {s:?}: {e}"))
        })
        .collect()
}

/// `POS=DELTA,POS=DELTA`.
fn shift_list(v: &str) -> Result<Vec<(usize, f32)>, String> {
    v.split(',')
        .map(|kv| {
            let (pos, delta) = kv
                .split_once('=')
                .ok_or_else(|| format!("bad shift {kv:?}: expected POS=DELTA"))?;
            let pos = pos
                .trim()
                .parse()
                .map_err(|e| format!("bad position {pos:?}: {e}"))?;
            let delta = delta
                .trim()
                .parse()
                .map_err(|e| format!("bad delta {delta:?}: {e}"))?;
            Ok((pos, delta))
        })
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut listen = "127.0.0.1:0".to_string();
    let mut ids = vec![72, 105, 33];
    let mut script = Vec::new();
    let mut structured = None;
    let mut shifts = Vec::new();
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
            "--replay-shift" => {
                shifts = shift_list(&args.next().ok_or("--replay-shift needs POS=DELTA,...")?)?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        listen,
        ids,
        script,
        structured,
        shifts,
    })
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mock_backend: {e}\nusage: mock_backend [--listen ADDR] [--reply-ids 1,2,3] [--script FILE] [--structured-reply-ids 1,2,3] [--replay-shift POS=DELTA,...]");
            std::process::exit(2);
        }
    };
    let mock = MockVllm::start_on(&args.listen, Scripted::ids(args.ids)).await;
    *mock.state.structured_reply.lock().expect("lock") = args.structured;
    // As vLLM started with `--weight-transfer-config`: the two-step weight
    // update (start / finish) is accepted.
    mock.state
        .transfer_configured
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for reply in args.script {
        mock.push(Scripted::ids(reply));
    }
    for (pos, delta) in args.shifts {
        mock.shift_replay(pos, delta);
    }
    println!("listening on {}", mock.addr);
    let _ = std::io::stdout().flush();
    let _ = tokio::signal::ctrl_c().await;
}
