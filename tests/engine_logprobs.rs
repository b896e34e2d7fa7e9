//! `[engine] logprobs_mode`: the engine reports the sampled token's logprob
//! on every token, asked or not, as vLLM's `raw_logprobs` (log-softmax of the
//! model's logits, the default) or `processed_logprobs` (after penalties and
//! temperature). The mode changes the reported number, never the draw.
#![cfg(feature = "engine")]

mod engine_support;

use engine_support::{collect, encode, greedy};
use tito::backend::{Generation, SamplingParams};
use tito::config::LogprobsMode;
use tito::engine::EngineBackend;

const PROMPT: &str = "Once upon a time, in a small village by the mountains,";
const TEMPERATURE: f32 = 0.7;

fn engine(mode: LogprobsMode) -> std::sync::Arc<EngineBackend> {
    let cfg = tito::config::EngineConfig {
        logprobs_mode: mode,
        ..engine_support::config(1)
    };
    EngineBackend::start(&cfg).expect("engine starts on the fetched model")
}

fn sampled() -> SamplingParams {
    SamplingParams {
        max_tokens: 12,
        temperature: Some(TEMPERATURE),
        seed: Some(4242),
        ignore_eos: true,
        logprobs: None,
        ..Default::default()
    }
}

fn logprobs(g: &Generation) -> Vec<f32> {
    assert_eq!(
        g.logprobs.len(),
        g.ids.len(),
        "one logprob per sampled token"
    );
    g.logprobs
        .iter()
        .enumerate()
        .map(|(i, l)| {
            assert!(l.top.is_empty(), "step {i}: no alternatives were asked for");
            l.logprob
                .unwrap_or_else(|| panic!("step {i}: the engine gave no logprob"))
        })
        .collect()
}

/// `log_softmax(logits / t)[token]` of each step, from llama.cpp directly.
fn reference(prompt: &[u32], ids: &[u32], t: f32) -> Vec<f32> {
    let path = engine_support::model_path();
    tito::engine::direct::with_direct(&path, tito::config::Device::Cpu, 2048, 512, 2, |d| {
        let mut logits = d.feed(prompt).expect("prefill");
        let mut out = Vec::new();
        for &id in ids {
            let z: Vec<f32> = logits.iter().map(|l| l / t).collect();
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = f64::from(max)
                + z.iter()
                    .map(|&v| f64::from(v - max).exp())
                    .sum::<f64>()
                    .ln();
            out.push((f64::from(z[id as usize]) - lse) as f32);
            logits = d.feed(&[id]).expect("decode");
        }
        out
    })
    .expect("direct llama.cpp runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sampled_token_has_a_logprob_even_unasked() {
    let engine = engine(LogprobsMode::RawLogprobs);
    let prompt = encode(PROMPT);
    let g = collect(&engine, &prompt, greedy(6)).await;
    assert_eq!(g.ids.len(), 6);
    let lps = logprobs(&g);
    assert!(lps.iter().all(|l| l.is_finite() && *l <= 0.0), "{lps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_processed_modes_report_different_numbers_for_the_same_draw() {
    let prompt = encode(PROMPT);
    let raw = collect(&engine(LogprobsMode::RawLogprobs), &prompt, sampled()).await;
    let processed = collect(&engine(LogprobsMode::ProcessedLogprobs), &prompt, sampled()).await;
    assert_eq!(raw.ids.len(), 12);
    assert_eq!(raw.ids, processed.ids, "the mode must not change the draw");
    let (raw_lp, processed_lp) = (logprobs(&raw), logprobs(&processed));
    let want_raw = reference(&prompt, &raw.ids, 1.0);
    let want_processed = reference(&prompt, &raw.ids, TEMPERATURE);
    let mut differ = 0;
    for i in 0..raw.ids.len() {
        assert!(
            (raw_lp[i] - want_raw[i]).abs() < 1e-3,
            "step {i}: raw {} vs log_softmax(logits) {}",
            raw_lp[i],
            want_raw[i]
        );
        assert!(
            (processed_lp[i] - want_processed[i]).abs() < 1e-3,
            "step {i}: processed {} vs log_softmax(logits / T) {}",
            processed_lp[i],
            want_processed[i]
        );
        if (raw_lp[i] - processed_lp[i]).abs() > 1e-3 {
            differ += 1;
        }
    }
    // Only a token whose probability is ~1 has the same logprob at any T.
    assert!(
        differ * 2 >= raw.ids.len(),
        "raw {raw_lp:?} vs processed {processed_lp:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_constrains_the_engines_output() {
    use tito::backend::StructuredOutput;
    let engine = engine(LogprobsMode::RawLogprobs);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": false
    });
    let prompt = encode("<|im_start|>user\nWhat is the capital of France? Answer in JSON.<|im_end|>\n<|im_start|>assistant\n");
    let params = SamplingParams {
        structured: Some(StructuredOutput::JsonSchema(schema)),
        ..greedy(40)
    };
    let g = collect(&engine, &prompt, params).await;
    let src = tito::render::gguf::load_tokenizer(&engine_support::model_path()).expect("tokenizer");
    let text = src.tokenizer.decode(&g.ids, true).expect("decodes");
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.keys().collect::<Vec<_>>(), vec!["city"], "{text}");
    assert!(
        obj["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 12),
        "{text}"
    );
    assert!(g
        .logprobs
        .iter()
        .all(|l| l.logprob.is_some_and(f32::is_finite)));

    // A schema llama.cpp cannot turn into a grammar is refused up front.
    let bad = SamplingParams {
        structured: Some(StructuredOutput::JsonSchema(serde_json::json!({"type": 7}))),
        ..greedy(4)
    };
    let req = tito::backend::GenerateRequest {
        request_id: "bad".into(),
        prompt_ids: std::sync::Arc::new(prompt),
        params: bad,
        images: None,
        adapter: None,
    };
    use tito::backend::Backend;
    assert!(matches!(
        engine.generate(req).await,
        Err(tito::backend::BackendError::Rejected { .. })
    ));
}
