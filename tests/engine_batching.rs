//! Continuous batching: a sequence's output does not depend on who else is
//! in the batch; cancelled sequences free their slot; seeds reproduce;
//! logprobs are the log-softmax of llama.cpp's logits; a full queue fails fast;
//! the direct reference's sequences decoding together stay apart.
//!
//! "Does not depend" is bitwise: the same ids and the same logprobs (and
//! alternatives), compared with `==`, whether a sequence runs alone, with
//! others joining at later steps, or next to identical twins. The engine's
//! default `batch_invariant = true` runs ggml's reference kernels for this
//! (src/engine/kernels.rs).
#![cfg(feature = "engine")]

mod engine_support;

use engine_support::{assert_bitwise_same, collect, encode, greedy, request, start};
use futures::StreamExt;
use tito::backend::{Backend, BackendError, GenEvent, Generation, SamplingParams};
use tito::engine::direct::argmax;

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the mountains, there lived an old clockmaker who",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 17 times 3?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which",
];

fn greedy_lp(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        logprobs: Some(2),
        ..greedy(max_tokens)
    }
}

/// Runs `prompts[0]`, and starts each other prompt after the first has
/// produced one more token, so they join the batch at different steps.
async fn staggered(
    engine: &std::sync::Arc<tito::engine::EngineBackend>,
    prompts: &[Vec<u32>],
    params: &dyn Fn(usize) -> SamplingParams,
) -> Vec<Generation> {
    let mut first = engine
        .generate(request(&prompts[0], params(0)))
        .await
        .expect("accepted");
    let mut first_gen = Generation::default();
    let mut others = Vec::new();
    while let Some(ev) = first.next().await {
        let ev = ev.expect("no engine error");
        first_gen.push(ev.clone());
        match ev {
            GenEvent::Tokens { .. } => {
                let next = others.len() + 1;
                if next < prompts.len() {
                    let engine = engine.clone();
                    let p = prompts[next].clone();
                    let sp = params(next);
                    others.push(tokio::spawn(async move { collect(&engine, &p, sp).await }));
                }
            }
            GenEvent::Done { .. } => break,
            GenEvent::Versions(_) | GenEvent::PromptDrift(_) => {}
        }
    }
    assert_eq!(others.len(), prompts.len() - 1, "all sequences joined");
    let mut out = vec![first_gen];
    for handle in others {
        out.push(handle.await.expect("task"));
    }
    out
}

/// The prompts, plus one long enough that attention spans more than 512
/// cells (where ggml's fast kernels split the cells between threads).
fn prompts() -> Vec<Vec<u32>> {
    let mut p: Vec<Vec<u32>> = PROMPTS.iter().map(|p| encode(p)).collect();
    let long = PROMPTS[3].repeat(30);
    let long = encode(&long);
    assert!(long.len() > 520, "{} tokens", long.len());
    p[5] = long;
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_is_bitwise_the_same_alone_and_batched() {
    let engine = start(8);
    let prompts = prompts();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(collect(&engine, p, greedy_lp(16)).await);
    }
    let batched = staggered(&engine, &prompts, &|_| greedy_lp(16)).await;
    for (i, (got, want)) in batched.iter().zip(&alone).enumerate() {
        assert_bitwise_same(&format!("sequence {i}"), got, want);
    }
    assert_eq!(engine.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_twins_in_one_batch_agree_with_each_other_and_alone() {
    let engine = start(8);
    let prompt = encode(PROMPTS[6]);
    let alone = collect(&engine, &prompt, greedy_lp(24)).await;
    let mut twins = Vec::new();
    for _ in 0..6 {
        let engine = engine.clone();
        let p = prompt.clone();
        twins.push(tokio::spawn(async move {
            collect(&engine, &p, greedy_lp(24)).await
        }));
    }
    for (i, t) in twins.into_iter().enumerate() {
        let got = t.await.expect("task");
        assert_bitwise_same(&format!("twin {i}"), &got, &alone);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_is_bitwise_the_same_alone_and_batched() {
    let engine = start(8);
    let prompts = prompts();
    let params = |i: usize| sampled(1000 + i as i64);
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        alone.push(collect(&engine, p, params(i)).await);
    }
    let batched = staggered(&engine, &prompts, &params).await;
    for (i, (got, want)) in batched.iter().zip(&alone).enumerate() {
        assert_bitwise_same(&format!("sequence {i}"), got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_sequence_frees_its_slot() {
    let engine = start(1);
    let prompt = encode(PROMPTS[0]);
    let mut long = engine
        .generate(request(&prompt, greedy(1500)))
        .await
        .expect("accepted");
    let first = long.next().await.expect("a token").expect("no error");
    assert!(matches!(first, GenEvent::Tokens { .. }));
    drop(long);
    // With max_batch = 1 this only finishes if the cancelled sequence left.
    let g = collect(&engine, &prompt, greedy(4)).await;
    assert_eq!(g.ids.len(), 4);
    assert_eq!(g.finish_reason, Some(tito::backend::FinishReason::Length));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_fails_fast_with_overloaded() {
    let mut cfg = engine_support::config(1);
    cfg.max_queue = 1;
    let engine = tito::engine::EngineBackend::start(&cfg).expect("starts");
    let prompt = encode(PROMPTS[0]);
    let mut running = engine
        .generate(request(&prompt, greedy(1500)))
        .await
        .expect("accepted");
    running.next().await.expect("a token").expect("no error"); // now admitted
    let _waiting = engine
        .generate(request(&prompt, greedy(4)))
        .await
        .expect("queued");
    let Err(err) = engine.generate(request(&prompt, greedy(4))).await else {
        panic!("a third request must be refused while one runs and one waits");
    };
    assert!(matches!(err, BackendError::Overloaded { .. }), "{err}");
}

fn sampled(seed: i64) -> SamplingParams {
    SamplingParams {
        max_tokens: 24,
        temperature: Some(1.0),
        seed: Some(seed),
        ignore_eos: true,
        logprobs: Some(3),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_reproduces_at_temperature_one() {
    let engine = start(4);
    let prompt = encode(PROMPTS[3]);
    let a = collect(&engine, &prompt, sampled(1234)).await;
    let b = collect(&engine, &prompt, sampled(1234)).await;
    assert_eq!(a.ids.len(), 24);
    assert_eq!(a.ids, b.ids);
    assert_eq!(a.logprobs, b.logprobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_log_softmax_of_the_logits() {
    let engine = start(2);
    let prompt = encode(PROMPTS[1]);
    let g = collect(&engine, &prompt, sampled(99)).await;
    assert_eq!(g.logprobs.len(), g.ids.len());
    let path = engine_support::model_path();
    let expected =
        tito::engine::direct::with_direct(&path, tito::config::Device::Cpu, 2048, 512, 2, |d| {
            let mut logits = d.feed(&prompt).expect("prefill");
            let mut out = Vec::new();
            for &t in &g.ids {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lse = max
                    + logits
                        .iter()
                        .map(|&l| f64::from(l - max).exp())
                        .sum::<f64>()
                        .ln() as f32;
                let mut top: Vec<(u32, f32)> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| (i as u32, l - lse))
                    .collect();
                top.sort_by(|a, b| b.1.total_cmp(&a.1));
                top.truncate(3);
                out.push((logits[t as usize] - lse, top));
                logits = d.feed(&[t]).expect("decode");
            }
            out
        })
        .expect("direct llama.cpp runs");
    for (i, (lp, (want, want_top))) in g.logprobs.iter().zip(&expected).enumerate() {
        let got = lp.logprob.expect("the engine always reports a logprob");
        assert!((got - want).abs() < 1e-3, "step {i}: {got} vs {want}");
        assert_eq!(lp.top.len(), 3);
        for ((id, l), (wid, wl)) in lp.top.iter().zip(want_top) {
            assert!(
                (l - wl).abs() < 1e-3,
                "step {i}: top {id}:{l} vs {wid}:{wl}"
            );
        }
    }
}

/// A sequence's logits rows: its prompt's last, then one a greedy step.
type Rows = Vec<Vec<f32>>;

/// Each sequence's [`Rows`] when
/// three sequences decode together through the direct reference
/// (`benches/engine.rs`'s ceiling at 16 concurrent), and when each runs
/// alone in its own context.
fn direct_rows(prompts: &[Vec<u32>], steps: usize) -> (Vec<Rows>, Vec<Rows>) {
    use tito::config::Device;
    use tito::engine::direct::{with_direct, with_direct_seqs};
    let path = engine_support::model_path();
    let alone = prompts
        .iter()
        .map(|p| {
            with_direct(&path, Device::Cpu, 2048, 512, 2, |d| {
                let mut rows = vec![d.feed(p).expect("prefill")];
                for _ in 0..steps {
                    let next = argmax(rows.last().expect("a row"));
                    rows.push(d.feed(&[next]).expect("decode"));
                }
                rows
            })
            .expect("direct llama.cpp runs")
        })
        .collect();
    let n = prompts.len() as u32;
    let together = with_direct_seqs(&path, Device::Cpu, 2048, 512, n, true, 2, |d| {
        let mut rows: Vec<Rows> = prompts
            .iter()
            .enumerate()
            .map(|(s, p)| vec![d.feed_seq(s, p).expect("prefill")])
            .collect();
        assert!(d.feed_seq(prompts.len(), &[1]).is_err(), "no such sequence");
        assert!(d
            .decode_each(&vec![1; prompts.len() + 1], |_, _| {})
            .is_err());
        for _ in 0..steps {
            let next: Vec<u32> = rows
                .iter()
                .map(|r| argmax(r.last().expect("a row")))
                .collect();
            d.decode_each(&next, |s, row| rows[s].push(row.to_vec()))
                .expect("decode");
        }
        rows
    })
    .expect("direct llama.cpp runs");
    (alone, together)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn direct_sequences_decoding_together_each_follow_their_own_prompt() {
    let prompts: Vec<Vec<u32>> = [0, 2, 4].iter().map(|&i| encode(PROMPTS[i])).collect();
    let (alone, together) = direct_rows(&prompts, 4);
    let mut own = 0.0f32;
    let mut other = f32::INFINITY;
    for s in 0..prompts.len() {
        assert_eq!(together[s].len(), 5);
        let tokens = |rows: &[Vec<f32>]| rows.iter().map(|r| argmax(r)).collect::<Vec<_>>();
        assert_eq!(tokens(&together[s]), tokens(&alone[s]), "sequence {s}");
        for (step, row) in together[s].iter().enumerate() {
            own = own.max(max_diff(row, &alone[s][step]));
            for o in (0..prompts.len()).filter(|&o| o != s) {
                other = other.min(max_diff(row, &alone[o][step]));
            }
        }
    }
    eprintln!("max |logit together - alone|: own sequence {own}, nearest other sequence {other}");
    // Measured on the 2-core machine: own 0 (the same bits), nearest other
    // 17.8. The bound on own leaves room for CPUs whose kernels sum in
    // another order at another batch shape. A row handed to the wrong
    // sequence lands near the other side; tokens fed at wrong positions or
    // under wrong sequence ids llama.cpp's batch check refuses (the decode
    // fails; checked with both).
    assert!(own < 0.05 && other > 1.0, "own {own}, other {other}");
}

/// The step counters a bench reads split each step: `llama_decode` and
/// sampling are parts of the step's whole time, all of them published by
/// the time the stream ends (read right after it, as the bench does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_counters_split_the_steps_time() {
    use std::sync::atomic::Ordering::Relaxed;
    let engine = start(2);
    let g = collect(&engine, &encode(PROMPTS[0]), greedy(6)).await;
    assert_eq!(g.ids.len(), 6);
    let s = engine.stats();
    let (steps, all) = (s.steps.load(Relaxed), s.step_ns.load(Relaxed));
    let (decode, sample) = (s.decode_ns.load(Relaxed), s.sample_ns.load(Relaxed));
    assert!(steps >= 6, "{steps} steps for 6 tokens");
    assert!(
        decode > 0 && sample > 0,
        "decode {decode} ns, sample {sample} ns"
    );
    assert!(decode + sample <= all, "{decode} + {sample} > {all} ns");
}
