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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use mock_vllm::{MockVllm, Scripted};
use serde_json::{json, Value};
use tito::backend::{
    Backend, GenerateRequest, Generation, PositionLogprob, SamplingParams, ScoreRequest,
};
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

/// A backend that answers every scoring request at once with the answer
/// prepared for its `request_id` (tito's own cost, without a model's).
async fn instant_backend(answers: HashMap<String, Bytes>) -> String {
    let answers = Arc::new(answers);
    let handler = move |body: Bytes| {
        let answers = answers.clone();
        async move {
            let text = String::from_utf8_lossy(&body);
            let id = text
                .split("\"request_id\":\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default();
            let answer = answers.get(id).cloned().unwrap_or_default();
            ([("content-type", "application/json")], answer)
        }
    };
    let app = axum::Router::new()
        .route("/v1/completions", axum::routing::post(handler))
        .route("/health", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(
            tito::server::CappedListener::new(listener, tito::config::DEFAULT_MAX_CONNECTIONS),
            app,
        )
        .await;
    });
    format!("http://{addr}")
}

async fn mock_part(samples: usize, reply_len: usize) {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 16384\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\nname = \"mock\"\n\
         [store]\nurl = \"sqlite://{}/spans.db\"\n",
        mock.url(),
        dir.path().display()
    ))
    .expect("config");
    let store = tito::store::open(&config.store.url).expect("store");
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, chatml_renderer(), backends, store.clone()).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        tito::server::serve(
            listener,
            tito::config::DEFAULT_MAX_CONNECTIONS,
            build_app(state),
            std::future::pending(),
        )
        .await;
    });
    let client = reqwest::Client::new();
    let url = move |p: &str| format!("http://{addr}{p}");
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
    let verify_all = |backend: &'static str| {
        let client = client.clone();
        async move {
            let t0 = Instant::now();
            let mut compared = 0;
            for i in 0..samples {
                let r = client
                    .post(url(&format!("/v1/trajectories/b-{i}/verify")))
                    .json(&json!({"backend": backend}))
                    .send()
                    .await
                    .expect("verify");
                assert_eq!(r.status(), 200);
                let v: Value = r.json().await.expect("json");
                let s = &v["samples"][0];
                assert_eq!(s["max_abs_diff"], 0.0, "replays what was sampled: {s}");
                compared += s["compared"].as_u64().unwrap_or(0);
            }
            (t0.elapsed() / samples as u32, compared / samples as u64)
        }
    };
    let (with_mock, compared) = verify_all("mock").await;

    // The mock's answers, prepared once, served by a backend that answers at
    // once: what is left is tito's own cost per sample.
    let mut answers = HashMap::new();
    let mut all = Vec::new();
    for i in 0..samples {
        let t = store
            .get_trajectory(&format!("b-{i}"))
            .await
            .expect("read")
            .expect("exists");
        for s in tito::store::samples(&t).expect("samples") {
            let body = json!({"prompt": tito::verify::sequence(&s), "max_tokens": 1,
                              "prompt_logprobs": 0, "stream": false});
            let bytes = client
                .post(mock.url() + "/v1/completions")
                .json(&body)
                .send()
                .await
                .expect("post")
                .bytes()
                .await
                .expect("body");
            answers.insert(format!("verify-b-{i}-{}", s.sample), bytes);
            all.push(s);
        }
    }
    let answer_bytes = answers.values().map(Bytes::len).sum::<usize>() / samples;
    let instant = instant_backend(answers).await;
    let r = client
        .post(url("/admin/backends"))
        .json(&json!({"url": instant, "kind": "vllm", "name": "instant"}))
        .send()
        .await
        .expect("add backend");
    assert!(r.status().is_success(), "{}", r.status());
    let mut own = Duration::MAX;
    for _ in 0..3 {
        own = own.min(verify_all("instant").await.0);
    }

    // The comparison alone.
    let replayed: Vec<Vec<PositionLogprob>> = all
        .iter()
        .map(|s| {
            let none = PositionLogprob {
                logprob: None,
                argmax: None,
            };
            let mut lps = vec![none; s.prompt_ids.len()];
            lps.extend(s.response_logprobs.iter().map(|&l| PositionLogprob {
                logprob: l,
                argmax: Some(true),
            }));
            lps
        })
        .collect();
    let labels = std::collections::BTreeMap::new();
    let reps = 20;
    let t1 = Instant::now();
    for _ in 0..reps {
        for (s, r) in all.iter().zip(&replayed) {
            std::hint::black_box(tito::verify::compare(s, r, 0.1, "b", 0, &labels));
        }
    }
    let cmp = t1.elapsed() / (reps * all.len()) as u32;
    let seq_len = all
        .iter()
        .map(|s| s.prompt_ids.len() + s.response_ids.len())
        .sum::<usize>()
        / all.len();
    println!("replay check over HTTP, {samples} samples of {seq_len} tokens ({compared} sampled each), one at a time:");
    println!(
        "  POST /verify, mock vLLM (in-process) answering:   {:.2} ms per sample",
        ms(with_mock)
    );
    println!("  POST /verify, a backend answering at once:         {:.2} ms per sample ({:.1} M tokens/s; {} kB answer)",
        ms(own), seq_len as f64 / own.as_secs_f64() / 1e6, answer_bytes / 1000);
    println!(
        "  the comparison alone:                              {:.3} ms per sample",
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
        images: None,
        adapter: None,
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
                adapter: None,
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
                adapter: None,
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
