//! Multi-turn KV reuse on the bundled engine: a prompt that starts with a
//! finished (or running) sequence's tokens shares their cells and feeds only
//! the rest, and the output is bitwise the output without reuse.
#![cfg(feature = "engine")]

mod engine_support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine_support::{assert_bitwise_same, collect, config, encode};
use tito::backend::{Generation, SamplingParams};
use tito::engine::EngineBackend;

fn params(seed: i64) -> SamplingParams {
    SamplingParams {
        max_tokens: 20,
        temperature: Some(0.8),
        seed: Some(seed),
        ignore_eos: true,
        logprobs: Some(2),
        ..Default::default()
    }
}

fn engine(n_ctx: u32, reuse: bool) -> Arc<EngineBackend> {
    let mut cfg = config(4);
    cfg.n_ctx = n_ctx;
    cfg.kv_reuse = reuse;
    EngineBackend::start(&cfg).expect("engine starts")
}

const TURNS: &[&str] = &[
    "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|>\n<|im_start|>user\nWhich of them is the longest?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|>\n<|im_start|>user\nAnd which country does it end in?<|im_end|>\n<|im_start|>assistant\n",
];

/// Runs the three turns of one conversation, each prompt being the previous
/// prompt, its sampled tokens and the next user message. Returns each turn's
/// prompt and generation.
async fn conversation(engine: &EngineBackend, seed: i64) -> Vec<(Vec<u32>, Generation)> {
    let mut prompt = Vec::new();
    let mut out = Vec::new();
    for (t, text) in TURNS.iter().enumerate() {
        prompt.extend(encode(text));
        let g = collect(engine, &prompt, params(seed + t as i64)).await;
        out.push((prompt.clone(), g.clone()));
        prompt.extend(&g.ids);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_turn_conversation_reuses_its_cells_and_answers_the_same() {
    let with = engine(2048, true);
    let without = engine(2048, false);
    let a = conversation(&with, 7).await;
    let b = conversation(&without, 7).await;
    for (t, ((pa, ga), (pb, gb))) in a.iter().zip(&b).enumerate() {
        assert_eq!(pa, pb, "turn {t}: prompts");
        assert_bitwise_same(&format!("turn {t}"), ga, gb);
    }
    let prompt_tokens: u64 = a.iter().map(|(p, _)| p.len() as u64).sum();
    let reused = with.stats().reused_tokens.load(Ordering::Relaxed);
    let fed = with.stats().prefill_tokens.load(Ordering::Relaxed);
    assert_eq!(without.stats().reused_tokens.load(Ordering::Relaxed), 0);
    assert_eq!(
        reused + fed,
        prompt_tokens,
        "each prompt token is reused or fed once"
    );
    assert!(
        reused * 2 >= prompt_tokens,
        "{reused} of {prompt_tokens} prompt tokens reused over three turns"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_dropped_for_space_is_computed_again_exactly() {
    // 384 cells: the other conversations' turns fill the cache, so the first
    // conversation's cells are gone when its second turn comes.
    let with = engine(384, true);
    let without = engine(384, false);
    let mut runs = Vec::new();
    for e in [&with, &without] {
        let first = conversation_turns(e, 11, 1).await;
        for other in 0..4 {
            conversation_turns(e, 100 + other, 2).await;
        }
        let (p0, g0) = &first[0];
        let mut prompt = p0.clone();
        prompt.extend(&g0.ids);
        prompt.extend(encode(TURNS[1]));
        let reused_before = e.stats().reused_tokens.load(Ordering::Relaxed);
        let second = collect(e, &prompt, params(12)).await;
        let reused = e.stats().reused_tokens.load(Ordering::Relaxed) - reused_before;
        assert!(
            (reused as usize) < p0.len(),
            "turn 1 took {reused} cached tokens: its prefix was still cached"
        );
        runs.push((g0.clone(), second));
    }
    assert_bitwise_same("turn 0", &runs[0].0, &runs[1].0);
    assert_bitwise_same("turn 1, its prefix computed again", &runs[0].1, &runs[1].1);
    let compactions = with.stats().compactions.load(Ordering::Relaxed);
    assert!(
        compactions > 0,
        "the cache was never full: the test tests nothing"
    );
}

/// The first `turns` turns of [`conversation`] with prompts that differ per
/// seed (so other conversations share only the system prompt).
async fn conversation_turns(
    engine: &EngineBackend,
    seed: i64,
    turns: usize,
) -> Vec<(Vec<u32>, Generation)> {
    let mut prompt = encode(&format!(
        "<|im_start|>system\nConversation {seed}.<|im_end|>\n"
    ));
    let mut out = Vec::new();
    for (t, text) in TURNS.iter().take(turns).enumerate() {
        prompt.extend(encode(text));
        let g = collect(engine, &prompt, params(seed + t as i64)).await;
        out.push((prompt.clone(), g.clone()));
        prompt.extend(&g.ids);
    }
    out
}
