//! Replay-check overhead per sample, and what the check measures on the
//! bundled engine.
//!
//! 1. Mock vLLM over loopback: two-turn trajectories recorded through the
//!    gateway (SQLite store), then `POST /v1/trajectories/{id}/verify` one
//!    at a time: the whole path (read the trajectory, rebuild the sample,
//!    the backend round trip with `prompt_logprobs`, parse, compare, store
//!    the result). The mock answers from a table, so this is tito's own
//!    cost plus loopback HTTP; the comparison alone is timed separately.
//! 2. Bundled engine (skipped without the model): a teacher-forced pass over
//!    an L-token sequence against a plain prefill of the same length (a
//!    generation of one token): what computing every row's logits and
//!    log-softmax adds.
//! 3. Bundled engine: |Δ| between a greedy generation's logprobs (decode
//!    steps) and their replay (one prefill), by prompt length.
//!
//! Run: `cargo bench --bench verify` (part 2 and 3 need
//! scripts/fetch-model.sh). Env: TITO_BENCH_SAMPLES (mock samples, default
//! 32), TITO_BENCH_REPLY (reply tokens per turn, default 1000),
//! TITO_BENCH_ENGINE_LEN (engine sequence length, default 256),
//! TITO_BENCH_THREADS (engine threads, default 2), TITO_BENCH_REPS (engine
//! runs, best of; default 3).

#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mock_vllm::{MockVllm, Scripted};
use serde_json::{json, Value};
use tito::backend::{Backend, GenerateRequest, Generation, SamplingParams, ScoreRequest};
use tito::engine::EngineBackend;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::{build_app, AppState, Config};

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A reply of `n` byte tokens (the ChatML test tokenizer is byte-level).
fn reply(n: usize, salt: usize) -> Scripted {
    let mut ids: Vec<u32> = (0..n).map(|i| 97 + ((i + salt) % 26) as u32).collect();
    ids.push(IM_END);
    Scripted {
        logprobs: Some(
            (0..ids.len())
                .map(|i| -0.1 - (i % 50) as f32 / 40.0)
                .collect(),
        ),
        ids,
        ..Default::default()
    }
}

async fn mock_part(samples: usize, reply_len: usize) {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 16384\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n\
         [store]\nurl = \"sqlite://{}/spans.db\"\n",
        mock.url(),
        dir.path().display()
    ))
    .expect("config");
    let renderer = chatml_renderer();
    let store = tito::store::open(&config.store.url).expect("store");
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, renderer, backends, store.clone()).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(tito::api::no_delay(listener), build_app(state)).await;
    });
    let client = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    for i in 0..samples {
        let path = url(&format!("/t/b-{i}/v1/chat/completions"));
        mock.push(reply(reply_len, i));
        mock.push(reply(reply_len, i + 1));
        let first = json!({"messages": [{"role": "user", "content": "go"}]});
        let r: Value = client
            .post(&path)
            .json(&first)
            .send()
            .await
            .expect("call")
            .json()
            .await
            .expect("json");
        let served = r["choices"][0]["message"]["content"].clone();
        let second = json!({"messages": [{"role": "user", "content": "go"},
            {"role": "assistant", "content": served}, {"role": "user", "content": "on"}]});
        let r = client.post(&path).json(&second).send().await.expect("call");
        assert_eq!(r.status(), 200);
    }
    let mut tokens = 0usize;
    let mut compared = 0u64;
    let t0 = Instant::now();
    for i in 0..samples {
        let r = client
            .post(url(&format!("/v1/trajectories/b-{i}/verify")))
            .send()
            .await
            .expect("verify");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        let s = &v["samples"][0];
        assert_eq!(
            s["max_abs_diff"], 0.0,
            "the mock replays what it sampled: {s}"
        );
        compared += s["compared"].as_u64().unwrap_or(0);
    }
    let verify = t0.elapsed();
    // The backend round trip alone: raw bytes (the mock and loopback), then
    // through the vLLM client (plus reading the answer).
    let mut seqs: Vec<Vec<u32>> = Vec::new();
    for i in 0..samples {
        let t = store
            .get_trajectory(&format!("b-{i}"))
            .await
            .expect("read")
            .expect("exists");
        for s in tito::store::samples(&t).expect("samples") {
            seqs.push(tito::verify::sequence(&s));
        }
    }
    let t2 = Instant::now();
    for ids in &seqs {
        let body = json!({"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "stream": false});
        let bytes = client
            .post(mock.url() + "/v1/completions")
            .json(&body)
            .send()
            .await
            .expect("post")
            .bytes()
            .await
            .expect("body");
        std::hint::black_box(bytes);
    }
    let raw = t2.elapsed() / samples as u32;
    let vllm_cfg = Config::from_toml(&format!(
        "[model]\ntokenizer = \"x\"\n[[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n",
        mock.url()
    ))
    .expect("config");
    let vllm = tito::api::build_backends(&vllm_cfg)
        .expect("client")
        .remove(0);
    let t3 = Instant::now();
    for ids in &seqs {
        let req = ScoreRequest {
            request_id: "b".into(),
            ids: Arc::new(ids.clone()),
        };
        std::hint::black_box(vllm.prompt_logprobs(req).await.expect("scores"));
    }
    let client_call = t3.elapsed() / samples as u32;
    // The comparison alone, over the same samples.
    let mut all = Vec::new();
    for i in 0..samples {
        let t = store
            .get_trajectory(&format!("b-{i}"))
            .await
            .expect("read")
            .expect("exists");
        all.extend(tito::store::samples(&t).expect("samples"));
    }
    let replayed: Vec<Vec<tito::backend::PositionLogprob>> = all
        .iter()
        .map(|s| {
            let mut lps = vec![
                tito::backend::PositionLogprob {
                    logprob: None,
                    argmax: None
                };
                s.prompt_ids.len()
            ];
            lps.extend(
                s.response_logprobs
                    .iter()
                    .map(|&l| tito::backend::PositionLogprob {
                        logprob: l,
                        argmax: Some(true),
                    }),
            );
            lps
        })
        .collect();
    let reps = 20;
    let t1 = Instant::now();
    for _ in 0..reps {
        for (s, r) in all.iter().zip(&replayed) {
            tokens += s.prompt_ids.len() + s.response_ids.len();
            std::hint::black_box(tito::verify::compare(s, r, 0.1, "b", 0));
        }
    }
    let cmp = t1.elapsed() / (reps * samples) as u32;
    let per_sample = verify / samples as u32;
    let seq_len = tokens / (reps * samples);
    println!(
        "mock vLLM (loopback), {samples} samples of {seq_len} tokens ({} sampled each):",
        compared / samples as u64
    );
    println!(
        "  POST /verify, one at a time: {:.2} ms per sample ({:.1} M sequence tokens/s)",
        ms(per_sample),
        seq_len as f64 / per_sample.as_secs_f64() / 1e6
    );
    println!(
        "  the backend call alone:      {:.2} ms (raw HTTP bytes from the mock: {:.2} ms)",
        ms(client_call),
        ms(raw)
    );
    println!(
        "  the comparison alone:        {:.3} ms per sample",
        ms(cmp)
    );
}

fn engine_config(threads: u32) -> Option<tito::config::EngineConfig> {
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.is_file() {
        println!(
            "engine parts skipped: {} is missing (scripts/fetch-model.sh)",
            model.display()
        );
        return None;
    }
    Some(tito::config::EngineConfig {
        model,
        max_batch: 4,
        n_ctx: 4096,
        threads,
        ..Default::default()
    })
}

/// A deterministic sequence of `n` ordinary tokens.
fn sequence(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| 300 + ((i * 7919 + salt * 104_729) % 20_000) as u32)
        .collect()
}

async fn generate(engine: &EngineBackend, prompt: &[u32], max_tokens: u32) -> Generation {
    let req = GenerateRequest {
        request_id: "bench".into(),
        prompt_ids: Arc::new(prompt.to_vec()),
        params: SamplingParams {
            max_tokens,
            temperature: Some(0.0),
            ignore_eos: true,
            ..Default::default()
        },
    };
    let mut stream = engine.generate(req).await.expect("accepted");
    let mut g = Generation::default();
    while let Some(ev) = stream.next().await {
        g.push(ev.expect("no engine error"));
    }
    g
}

async fn engine_overhead(engine: &EngineBackend, len: usize, reps: usize) {
    let mut best_score = Duration::MAX;
    let mut best_prefill = Duration::MAX;
    for r in 0..reps {
        let t = Instant::now();
        generate(engine, &sequence(len, 2 * r), 1).await;
        best_prefill = best_prefill.min(t.elapsed());
        let ids = Arc::new(sequence(len, 2 * r + 1));
        let t = Instant::now();
        let out = engine
            .prompt_logprobs(ScoreRequest {
                request_id: "bench".into(),
                ids,
            })
            .await
            .expect("scores");
        best_score = best_score.min(t.elapsed());
        assert_eq!(out.len(), len);
    }
    println!("bundled engine, one {len}-token sequence (best of {reps}):");
    println!(
        "  replay (logits + log-softmax on every row): {:.0} ms ({:.0} tok/s)",
        ms(best_score),
        len as f64 / best_score.as_secs_f64()
    );
    println!(
        "  plain prefill (generate 1 token):           {:.0} ms ({:.0} tok/s)",
        ms(best_prefill),
        len as f64 / best_prefill.as_secs_f64()
    );
    println!(
        "  replay overhead over a prefill: {:+.0} %",
        (best_score.as_secs_f64() / best_prefill.as_secs_f64() - 1.0) * 100.0
    );
}

async fn engine_deltas(engine: &EngineBackend) {
    println!("bundled engine, greedy 16 tokens after an L-token prompt, then replayed:");
    println!(
        "  {:>5}  {:>10}  {:>10}  {:>10}",
        "L", "max |Δ|", "mean |Δ|", "not argmax"
    );
    for &len in &[16usize, 32, 47, 48, 64, 128, 256, 512] {
        let prompt = sequence(len, 7);
        let g = generate(engine, &prompt, 16).await;
        let mut ids = prompt.clone();
        ids.extend(&g.ids);
        let out = engine
            .prompt_logprobs(ScoreRequest {
                request_id: "bench".into(),
                ids: Arc::new(ids),
            })
            .await
            .expect("scores");
        let (mut max, mut sum, mut flips) = (0.0f64, 0.0f64, 0);
        for (i, rec) in g.logprobs.iter().enumerate() {
            let r = out[len + i];
            let d = (f64::from(rec.logprob.unwrap_or(f32::NAN))
                - f64::from(r.logprob.unwrap_or(f32::NAN)))
            .abs();
            max = max.max(d);
            sum += d;
            flips += usize::from(r.argmax == Some(false));
        }
        println!(
            "  {len:>5}  {max:>10.2e}  {:>10.2e}  {flips:>7}/16",
            sum / g.ids.len() as f64
        );
    }
}

#[tokio::main]
async fn main() {
    mock_part(
        env_usize("TITO_BENCH_SAMPLES", 32),
        env_usize("TITO_BENCH_REPLY", 1000),
    )
    .await;
    let threads = env_usize("TITO_BENCH_THREADS", 2) as u32;
    let Some(cfg) = engine_config(threads) else {
        return;
    };
    let engine = tokio::task::spawn_blocking(move || EngineBackend::start(&cfg))
        .await
        .expect("join")
        .expect("engine starts");
    let len = env_usize("TITO_BENCH_ENGINE_LEN", 256);
    engine_overhead(&engine, len, env_usize("TITO_BENCH_REPS", 3)).await;
    engine_deltas(&engine).await;
}
