//! Bundled-engine throughput: prefill and decode tokens/s and time to first
//! token at 1, 4, 8 and 16 concurrent requests, against llama.cpp driven
//! directly (one sequence, plain decode loop) in the same run.
//!
//! Run: `cargo bench --bench engine` (needs scripts/fetch-model.sh first).
//! Env: TITO_BENCH_PROMPT (prompt tokens, default 128), TITO_BENCH_GEN
//! (generated tokens per request, default 64), TITO_BENCH_THREADS (default 2),
//! TITO_BENCH_REPS (default 3: every figure is the best of that many runs,
//! direct and engine runs interleaved, so a noisy shared machine penalises
//! both sides alike).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tito::backend::{Backend, GenEvent, GenerateRequest, SamplingParams};
use tito::config::EngineConfig;
use tito::engine::EngineBackend;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic prompt of `n` ordinary tokens, different per request.
fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| 300 + ((i * 7919 + salt * 104_729) % 20_000) as u32)
        .collect()
}

/// prefill tok/s, per-stream decode tok/s, aggregate tok/s, TTFT mean ms, TTFT max ms.
type Row = (f64, f64, f64, f64, f64);

struct Run {
    ttft: Vec<Duration>,
    wall: Duration,
    /// Time until every request had its first token.
    all_first: Duration,
    generated: usize,
    prompt_tokens: usize,
}

async fn run_engine(
    engine: &Arc<EngineBackend>,
    conc: usize,
    p: usize,
    gen: usize,
    salt: usize,
) -> Run {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..conc {
        let engine = engine.clone();
        let req = GenerateRequest {
            request_id: format!("bench-{i}"),
            prompt_ids: Arc::new(prompt(p, salt + i)),
            params: SamplingParams {
                max_tokens: gen as u32,
                temperature: Some(0.0),
                ignore_eos: true,
                ..Default::default()
            },
        };
        tasks.push(tokio::spawn(async move {
            let mut s = engine.generate(req).await.expect("accepted");
            let mut first = None;
            let mut n = 0;
            while let Some(ev) = s.next().await {
                if let GenEvent::Tokens { ids, .. } = ev.expect("no error") {
                    first.get_or_insert_with(|| t0.elapsed());
                    n += ids.len();
                }
            }
            (first.unwrap_or_default(), n)
        }));
    }
    let mut ttft = Vec::new();
    let mut generated = 0;
    for t in tasks {
        let (f, n) = t.await.expect("task");
        ttft.push(f);
        generated += n;
    }
    let wall = t0.elapsed();
    let all_first = ttft.iter().copied().max().unwrap_or_default();
    Run {
        ttft,
        wall,
        all_first,
        generated,
        prompt_tokens: conc * p,
    }
}

fn direct(cfg: &EngineConfig, p: usize, gen: usize) -> (f64, f64) {
    tito::engine::direct::with_direct(&cfg.model, 2048, 512, cfg.threads, |d| {
        let toks = prompt(p, 0);
        let t0 = Instant::now();
        let mut logits = d.feed(&toks).expect("prefill");
        let prefill = t0.elapsed();
        let t1 = Instant::now();
        for _ in 0..gen {
            let next = logits
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                )
                .0 as u32;
            logits = d.feed(&[next]).expect("decode");
        }
        let decode = t1.elapsed();
        d.reset();
        (
            p as f64 / prefill.as_secs_f64(),
            gen as f64 / decode.as_secs_f64(),
        )
    })
    .expect("direct llama.cpp")
}

fn main() {
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.is_file() {
        eprintln!(
            "{} is missing: run scripts/fetch-model.sh first",
            model.display()
        );
        std::process::exit(1);
    }
    let p = env_usize("TITO_BENCH_PROMPT", 128);
    let gen = env_usize("TITO_BENCH_GEN", 64);
    let threads = env_usize("TITO_BENCH_THREADS", 2) as u32;
    let cfg = EngineConfig {
        model,
        max_batch: 16,
        n_ctx: 8192,
        threads,
        ..Default::default()
    };
    let reps = env_usize("TITO_BENCH_REPS", 3).max(1);
    let _ = direct(&cfg, p, 8); // warm-up

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = EngineBackend::start(&cfg).expect("engine");
    rt.block_on(async {
        let _ = run_engine(&engine, 1, p, 8, 999).await; // warm-up
        let (mut d_prefill, mut d_decode) = (0.0f64, 0.0f64);
        let mut best: Vec<Option<Row>> = vec![None; 4];
        for rep in 0..reps {
            let (dp, dd) = direct(&cfg, p, gen);
            d_prefill = d_prefill.max(dp);
            d_decode = d_decode.max(dd);
            for (k, conc) in [1usize, 4, 8, 16].into_iter().enumerate() {
                let r = run_engine(&engine, conc, p, gen, 1000 * (k + 1) + 100 * rep).await;
                let prefill = r.prompt_tokens as f64 / r.all_first.as_secs_f64();
                let decode_time = (r.wall - r.all_first).as_secs_f64().max(1e-9);
                let per_stream = (gen as f64 - 1.0) / decode_time;
                let aggregate = r.generated as f64 / r.wall.as_secs_f64();
                let mean = r.ttft.iter().map(|d| d.as_secs_f64()).sum::<f64>() / r.ttft.len() as f64;
                let row = (prefill, per_stream, aggregate, mean * 1000.0, r.all_first.as_secs_f64() * 1000.0);
                if best[k].is_none_or(|b| row.2 > b.2) {
                    best[k] = Some(row);
                }
            }
        }
        println!("prompt {p} tokens, {gen} generated per request, {threads} threads, best of {reps}");
        println!("direct llama.cpp (1 sequence): prefill {d_prefill:.0} tok/s, decode {d_decode:.1} tok/s");
        println!("| concurrent | prefill tok/s | decode tok/s (per stream) | aggregate output tok/s | TTFT mean / max (ms) |");
        println!("|---|---|---|---|---|");
        let single = best[0].map_or(1.0, |b| b.2);
        if let Some((prefill, per_stream, ..)) = best[0] {
            println!(
                "single stream vs direct: prefill {:.2}x, decode {:.2}x",
                prefill / d_prefill,
                per_stream / d_decode
            );
        }
        for (k, conc) in [1usize, 4, 8, 16].into_iter().enumerate() {
            if let Some((prefill, per_stream, aggregate, mean, max)) = best[k] {
                println!(
                    "| {conc} | {prefill:.0} | {per_stream:.1} | {aggregate:.1} ({:.2}x single) | {mean:.0} / {max:.0} |",
                    aggregate / single
                );
            }
        }
    });
}
