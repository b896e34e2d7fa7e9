//! Renders the peers bench's prompt (a system prompt and one numbered user
//! message, `benches/peers.rs`) through the Qwen3 chat template N times, for
//! counting a render's instructions under callgrind, which is steadier than
//! timing it on a shared machine:
//!
//! ```sh
//! scripts/fetch-tokenizers.sh
//! cargo build --release --example render_count
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   --toggle-collect='minijinja::vm::Vm::eval_impl' \
//!   target/release/examples/render_count 5000 2>&1 | grep Collected
//! ```
//!
//! counts the instructions run inside minijinja's VM (the template's own
//! work, the context's serialization left out) over 5,000 renders; loading
//! the tokenizer is not counted. Differences of whole-process totals are
//! not used: the tokenizer's load runs through randomly seeded hash maps,
//! and its count moves by more than a small change to a render does. It
//! also prints the wall time a render took.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use tito::config::ModelConfig;
use tito::render::{RenderInput, Renderer};

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/tokenizers/qwen3");
    let model = ModelConfig {
        tokenizer: dir,
        ..ModelConfig::default()
    };
    let renderer = match Renderer::load(&model) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("render_count: {e} (run scripts/fetch-tokenizers.sh)");
            std::process::exit(1);
        }
    };
    let n: usize = match std::env::args().nth(1).map(|s| s.parse()) {
        None => 100_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("render_count: the argument is a count of renders (> 0)");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let mut bytes = 0;
    for i in 0..n {
        let messages = [
            json!({"role": "system", "content": "You are a helpful assistant."}),
            json!({"role": "user",
                "content": format!("Write one short sentence about the sea. (request {i})")}),
        ];
        let input = RenderInput {
            messages: &messages,
            add_generation_prompt: true,
            ..RenderInput::default()
        };
        match renderer.render(&input) {
            Ok(text) => bytes += text.len(),
            Err(e) => {
                eprintln!("render_count: {e}");
                std::process::exit(1);
            }
        }
    }
    let per = started.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("{n} renders, {per:.2} µs a render, {bytes} bytes in all");
}
