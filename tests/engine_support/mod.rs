//! Shared helpers for the engine tests: the fetched model file and small
//! engine configurations.
#![allow(dead_code)]

pub mod gguf_edit;
pub mod lora_gguf;

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use tito::backend::{Backend, GenerateRequest, Generation, SamplingParams};
use tito::config::EngineConfig;
use tito::engine::EngineBackend;

/// The SmolLM2 GGUF, or a failure naming the script that fetches it.
pub fn model_path() -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh first",
        p.display()
    );
    p
}

pub fn config(max_batch: u32) -> EngineConfig {
    EngineConfig {
        model: model_path(),
        max_batch,
        n_ctx: 2048,
        threads: 2,
        ..Default::default()
    }
}

pub fn start(max_batch: u32) -> Arc<EngineBackend> {
    EngineBackend::start(&config(max_batch)).expect("engine starts on the fetched model")
}

pub fn greedy(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        max_tokens,
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    }
}

pub fn request(prompt: &[u32], params: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        request_id: "test".into(),
        prompt_ids: Arc::new(prompt.to_vec()),
        params,
        images: None,
        adapter: None,
    }
}

/// Runs one request to completion.
pub async fn collect(engine: &EngineBackend, prompt: &[u32], params: SamplingParams) -> Generation {
    let mut stream = engine
        .generate(request(prompt, params))
        .await
        .expect("request accepted");
    let mut g = Generation::default();
    while let Some(ev) = stream.next().await {
        g.push(ev.expect("no engine error"));
    }
    g
}

/// Token ids of a text under the GGUF tokenizer.
pub fn encode(text: &str) -> Vec<u32> {
    let src = tito::render::gguf::load_tokenizer(&model_path()).expect("GGUF tokenizer loads");
    src.tokenizer
        .encode_fast(text, false)
        .expect("encodes")
        .get_ids()
        .to_vec()
}

/// Asserts two generations are bitwise the same: ids, each logprob's bits
/// and the alternatives.
pub fn assert_bitwise_same(what: &str, got: &Generation, want: &Generation) {
    assert_eq!(got.ids, want.ids, "{what}: sampled ids differ");
    assert_eq!(got.logprobs.len(), want.logprobs.len(), "{what}");
    for (j, (g, w)) in got.logprobs.iter().zip(&want.logprobs).enumerate() {
        assert!(
            g.logprob.map(f32::to_bits) == w.logprob.map(f32::to_bits) && g.top == w.top,
            "{what}: step {j}: got {g:?}, want {w:?}"
        );
    }
}
