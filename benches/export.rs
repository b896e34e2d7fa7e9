//! Export throughput for a trainer's batch: 10,000 stored samples of 2,048
//! tokens (a 512-id prompt, then 4 turns of 300 sampled ids with 112
//! observation ids between them) in a SQLite store, exported to `io::sink()`
//! as verl Parquet (prompt_length 512, response_length 1536: no padding, so
//! tokens written = tokens stored), trajectory Parquet and JSONL.
//!
//! Each export runs 3 times; the best round is reported. The stages are
//! timed the same way, so the report says where the time goes: the store
//! scan alone (read + decode), scan + row building (sample reconstruction,
//! padding, verl columns), and the full export (+ encoding).
//!
//! Each call's request body is what an agent sends: the whole conversation
//! so far (a system and a user message, then each earlier turn's assistant
//! message and tool result, about 4 characters a token), the served
//! message as its response. `TITO_BENCH_BODIES=small` gives every call a
//! one-message body instead (the bench as it was before 2026-11-28).
//!
//! `cargo bench --bench export` (release profile). `TITO_BENCH_SAMPLES=N`
//! changes the sample count.

use std::time::{Duration, Instant};

use serde_json::json;
use tito::export::{export, rows::rows_of, ExportOptions, ExportStats, Format, Layout};
use tito::store::{CallRecord, DynStore, TrajectoryFilter};

const PROMPT: u32 = 512;
const TURNS: u32 = 4;
const SAMPLED: u32 = 300;
const OBSERVATION: u32 = 112;
const RESPONSE: u32 = TURNS * SAMPLED + (TURNS - 1) * OBSERVATION;

/// About `tokens` tokens of text (4 characters each), different per `seed`.
fn text(tokens: u32, seed: u32) -> String {
    const WORDS: [&str; 8] = [
        "the", "tool", "returned", "rows", "while", "agent", "plans", "next",
    ];
    let mut s = String::with_capacity(tokens as usize * 4 + 8);
    let mut k = seed;
    while s.len() < tokens as usize * 4 {
        k = k.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        s.push_str(WORDS[(k >> 16) as usize % WORDS.len()]);
        s.push(' ');
    }
    s
}

/// The request and served message of turn `i` as an agent sends them: the
/// whole history each time (`small`: one tool message).
fn bodies(i: u32, small: bool) -> (serde_json::Value, serde_json::Value) {
    let reply = json!({"role": "assistant", "content": text(SAMPLED, 2 * i + 1)});
    if small {
        let request = json!({"messages": [{"role": "tool", "content": "result"}]});
        return (request, json!({"role": "assistant", "content": "text"}));
    }
    let mut messages = vec![
        json!({"role": "system", "content": "You are an agent with a shell tool."}),
        json!({"role": "user", "content": text(PROMPT - 16, 0)}),
    ];
    for j in 0..i {
        messages.push(json!({"role": "assistant", "content": text(SAMPLED, 2 * j + 1)}));
        messages.push(json!({"role": "tool", "content": text(OBSERVATION, 2 * j + 2)}));
    }
    let request = json!({"model": "agent", "temperature": 1.0, "messages": messages});
    (request, reply)
}

fn call(traj: &str, i: u32, small: bool) -> CallRecord {
    let delta = if i == 0 { PROMPT } else { OBSERVATION };
    let (request, response) = bodies(i, small);
    CallRecord {
        trajectory_id: traj.into(),
        call_index: i,
        sample_index: 0,
        parent_call: i.checked_sub(1),
        backend: "http://127.0.0.1:8001".into(),
        started_at: 0,
        finished_at: 0,
        prompt_delta_ids: (0..delta).map(|k| (k * 7919 + i) % 151_000).collect(),
        sampled_ids: (0..SAMPLED).map(|k| (k * 104_729 + i) % 151_000).collect(),
        logprobs: (0..SAMPLED).map(|k| Some(-(k as f32) / 1000.0)).collect(),
        finish_reason: "stop".into(),
        request: request.into(),
        response: response.into(),
        drift: None,
        parse_outcome: Some("ok".into()),
        moved_from: None,
        weight_version: Some(format!("step-{i}")),
        tokenizer_sha256: "a".repeat(64),
        template_sha256: "b".repeat(64),
        reward: None,
        truncated: false,
        normalized: Vec::new(),
        request_of: None,
        api: None,
        response_id: None,
        versions: Vec::new(),
        images: Vec::new(),
        model: None,
        adapter: None,
    }
}

fn best(rounds: usize, mut f: impl FnMut() -> u64) -> (Duration, u64) {
    let mut best = Duration::MAX;
    let mut tokens = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        tokens = f();
        best = best.min(t.elapsed());
    }
    (best, tokens)
}

fn report(name: &str, (took, tokens): (Duration, u64)) {
    let rate = tokens as f64 / took.as_secs_f64() / 1e6;
    println!(
        "{name:<34} {:>8.3} s  {:>7.1} M tokens/s",
        took.as_secs_f64(),
        rate
    );
}

fn main() {
    let samples: u32 = std::env::var("TITO_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let small = match std::env::var("TITO_BENCH_BODIES").as_deref() {
        Ok("small") => true,
        Ok("history") | Err(_) => false,
        Ok(other) => panic!("TITO_BENCH_BODIES={other}: expected history or small"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store: DynStore = tito::store::open(&url).unwrap_or_else(|e| panic!("open: {e}"));
    let t = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..64u32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for s in (w..samples).step_by(64) {
                    let id = format!("t-{s:06}");
                    for i in 0..TURNS {
                        if let Err(e) = store.append_call(call(&id, i, small)).await {
                            panic!("append: {e}");
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("{e}"));
        }
    });
    let per_sample = PROMPT + RESPONSE;
    println!(
        "stored {samples} samples x {per_sample} tokens ({} bodies) in {:.1} s",
        if small {
            "one-message"
        } else {
            "whole-history"
        },
        t.elapsed().as_secs_f64()
    );

    let all = TrajectoryFilter::default();
    let scan_tokens = || {
        let mut n = 0u64;
        for t in store.scan(&all).unwrap_or_else(|e| panic!("scan: {e}")) {
            let t = t.unwrap_or_else(|e| panic!("scan: {e}"));
            n += t
                .calls
                .iter()
                .map(|c| (c.prompt_delta_ids.len() + c.sampled_ids.len()) as u64)
                .sum::<u64>();
        }
        n
    };
    report("scan only", best(3, scan_tokens));

    let mut verl = ExportOptions::new(Format::Parquet, Layout::Verl);
    verl.prompt_length = Some(PROMPT as usize);
    verl.response_length = Some(RESPONSE as usize);
    let rows_only = |opts: &ExportOptions| {
        let mut stats = ExportStats::default();
        let mut rows = Vec::new();
        for t in store.scan(&all).unwrap_or_else(|e| panic!("scan: {e}")) {
            let t = t.unwrap_or_else(|e| panic!("scan: {e}"));
            rows_of(&t, opts, &mut stats, &mut rows).unwrap_or_else(|e| panic!("rows: {e}"));
            rows.clear();
        }
        stats.tokens
    };
    report("scan + verl rows", best(3, || rows_only(&verl)));

    let full = |opts: &ExportOptions| {
        let it = store.scan(&all).unwrap_or_else(|e| panic!("scan: {e}"));
        export(it, &*store, opts, std::io::sink(), &mut |_| {})
            .unwrap_or_else(|e| panic!("export: {e}"))
            .tokens
    };
    report("export parquet verl", best(3, || full(&verl)));
    let traj = ExportOptions::new(Format::Parquet, Layout::Trajectory);
    report("export parquet trajectory", best(3, || full(&traj)));
    let jsonl = ExportOptions::new(Format::Jsonl, Layout::Trajectory);
    report("export jsonl trajectory", best(3, || full(&jsonl)));
}
