//! Decoding one vLLM stream chunk into events (`VllmDecoder::on_data`), the
//! work the gateway does for every token a vLLM backend streams:
//! - sampled_only: as every call asks (`logprobs: 0`); vLLM still lists the
//!   sampled token among the alternatives, which nobody keeps;
//! - top5: a client asked for 5 alternatives.
//!
//! Run: `cargo bench --bench decode`

#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use tito::backend::pump::EventDecoder;
use tito::backend::vllm::VllmDecoder;

// The allocator the gateway runs with (src/main.rs): glibc's malloc costs
// allocation-heavy code differently.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One chunk as vLLM writes it with `return_tokens_as_token_ids`, with `k`
/// alternatives (at least the sampled token).
fn chunk(k: u32) -> String {
    let id = 15234;
    let lp = -0.712_345_671_653_747_6_f64;
    let top: Vec<String> = (0..k.max(1))
        .map(|j| format!("\"token_id:{}\":{}", id + j, lp - f64::from(j)))
        .collect();
    format!(
        "{{\"id\":\"cmpl-0\",\"object\":\"text_completion\",\"created\":1764400000,\
         \"model\":\"m\",\"choices\":[{{\"index\":0,\"text\":\"token_id:{id}\",\
         \"token_ids\":[{id}],\"finish_reason\":null,\"logprobs\":{{\"tokens\":\
         [\"token_id:{id}\"],\"token_logprobs\":[{lp}],\"top_logprobs\":[{{{}}}],\
         \"text_offset\":[0]}}}}]}}",
        top.join(",")
    )
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("vllm_chunk");
    for (name, k) in [("sampled_only", 0), ("top5", 5)] {
        let data = chunk(k);
        let mut decoder = VllmDecoder::new("b", Some(k));
        let events = decoder.on_data(&data).unwrap();
        assert_eq!(events.len(), 1, "{data}");
        g.bench_function(name, |b| b.iter(|| decoder.on_data(&data).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
