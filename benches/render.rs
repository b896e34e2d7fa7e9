//! Render + tokenize throughput with the real Qwen3 tokenizer and template:
//! the peers bench's two-message chat, and conversations of about 1k, 8k and
//! 32k tokens, built programmatically.
//!
//! Needs `.cache/tokenizers/qwen3` (scripts/fetch-tokenizers.sh); without it
//! the bench says so and exits successfully (benches are not tests).
//!
//! `render_tokenize` uses the fast encoder, `render_tokenize_crate` the
//! tokenizers crate, side by side.
//!
//! `turns`: a conversation at its 1st and 50th user turn, as Qwen3 (chat
//! template + tokenizer) and as gpt-oss (the Harmony format through
//! `openai-harmony`, which writes the ids itself; needs
//! `$TIKTOKEN_ENCODINGS_BASE`, set by `source scripts/env.sh`).
//! scripts/bench_render_harmony.py times PyPI `openai-harmony` on the same
//! conversations.
//!
//! Run: cargo bench --bench render -- --warm-up-time 1 --measurement-time 3

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{black_box, BenchmarkId, Criterion, Throughput};
use openai_harmony::chat::Role;
use serde_json::{json, Value as Json};
use tito::config::ModelConfig;
use tito::render::harmony;
use tito::render::{RenderInput, Renderer};

// The allocator the gateway runs with (src/main.rs): glibc's malloc costs
// allocation-heavy code differently.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 3] = [1_000, 8_000, 32_000];

/// Turn texts that mix prose, code, digits, unicode and tool traffic, so the
/// tokenizer sees what agent conversations look like.
fn turn_text(i: usize) -> String {
    match i % 4 {
        0 => format!(
            "Step {i}: please read the file src/module_{i}.rs and explain what the function \
             `process_batch` does, in particular how it handles errors and retries when the \
             upstream service returns HTTP 503. Also list edge cases you would test."
        ),
        1 => format!(
            "Here is the code:\n```rust\nfn process_batch(items: &[Item]) -> Result<usize, Error> {{\n    \
             let mut done = 0;\n    for (n, item) in items.iter().enumerate() {{\n        \
             if n % {m} == 0 {{ retry(item, 3)?; }}\n        done += item.weight * {i};\n    }}\n    \
             Ok(done)\n}}\n```\nThe loop retries every {m}th item up to 3 times.",
            m = i % 7 + 2
        ),
        2 => format!(
            "Résumé {i}: 数据处理完成，共 {} 条记录；错误率 {:.3}%. Ünïcödé ✓ 🚀 — next: batch #{}.",
            i * 1_237,
            (i as f64) * 0.137,
            i + 1
        ),
        _ => format!(
            "{{\"status\": \"ok\", \"rows\": [{}], \"elapsed_ms\": {}, \"note\": \"see   spaced    output\"}}",
            (0..8).map(|k| (k * i).to_string()).collect::<Vec<_>>().join(", "),
            i * 31 % 997
        ),
    }
}

/// A conversation whose rendered prompt is at least `target` tokens.
fn conversation(renderer: &Renderer, target: usize) -> Vec<Json> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a careful coding agent."})];
    let mut i = 0;
    loop {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": turn_text(i)}));
        i += 1;
        if role == "user" {
            let input = RenderInput {
                messages: &messages,
                add_generation_prompt: true,
                ..RenderInput::default()
            };
            let n = renderer
                .render_ids(&input)
                .map(|ids| ids.len())
                .unwrap_or(0);
            if n >= target {
                return messages;
            }
        }
    }
}

fn load(name: &str, chat_template: &str) -> Option<Arc<Renderer>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/tokenizers")
        .join(name);
    if !dir.join("tokenizer.json").is_file() {
        eprintln!(
            "render bench skipped: {} is missing; run scripts/fetch-tokenizers.sh",
            dir.display()
        );
        return None;
    }
    let model = ModelConfig {
        tokenizer: dir,
        chat_template: chat_template.into(),
        ..ModelConfig::default()
    };
    match Renderer::load(&model) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("render bench skipped: {e}");
            None
        }
    }
}

/// The peers bench's request (`benches/peers.rs`): a system prompt and one
/// user message, the fresh prompt of every call there.
fn short_chat() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "Write one short sentence about the sea. (request 1)"}),
    ]
}

fn bench_render(c: &mut Criterion, renderer: &Renderer) {
    let mut group = c.benchmark_group("qwen3");
    let cases = std::iter::once(("chat".to_string(), short_chat())).chain(SIZES.map(|target| {
        (
            format!("{}k", target / 1000),
            conversation(renderer, target),
        )
    }));
    for (name, messages) in cases {
        let input = RenderInput {
            messages: &messages,
            add_generation_prompt: true,
            ..RenderInput::default()
        };
        let tokens = renderer.render_ids(&input).map(|v| v.len()).unwrap_or(0);
        group.throughput(Throughput::Elements(tokens as u64));
        let label = format!("{name}_{tokens}tok");
        group.bench_with_input(BenchmarkId::new("render", &label), &input, |b, input| {
            b.iter(|| renderer.render(black_box(input)))
        });
        group.bench_with_input(
            BenchmarkId::new("render_tokenize", &label),
            &input,
            |b, input| b.iter(|| renderer.render_ids(black_box(input))),
        );
        // The same through the `tokenizers` crate (the fast encoder's reference).
        group.bench_with_input(
            BenchmarkId::new("render_tokenize_crate", &label),
            &input,
            |b, input| {
                b.iter(|| {
                    renderer
                        .render(black_box(input))
                        .and_then(|t| renderer.encode_reference(&t))
                })
            },
        );
    }
    group.finish();
}

/// A system prompt and `n` user turns, each but the last answered (the
/// texts of `turn_text`, in order).
fn turns(n: usize) -> Vec<Json> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a careful coding agent."})];
    for i in 0..n {
        messages.push(json!({"role": "user", "content": turn_text(2 * i)}));
        if i + 1 < n {
            messages.push(json!({"role": "assistant", "content": turn_text(2 * i + 1)}));
        }
    }
    messages
}

fn bench_turns(c: &mut Criterion, name: &str, renderer: &Renderer) {
    let mut group = c.benchmark_group(format!("turns/{name}"));
    // A fixed date: Harmony's system message names one.
    let kwargs = json!({"conversation_start_date": "2026-01-15"});
    for n in [1, 50] {
        let messages = turns(n);
        let input = RenderInput {
            messages: &messages,
            add_generation_prompt: true,
            kwargs: kwargs.as_object(),
            ..RenderInput::default()
        };
        let tokens = renderer.render_ids(&input).map(|v| v.len()).unwrap_or(0);
        group.throughput(Throughput::Elements(tokens as u64));
        let label = format!("turn{n}_{tokens}tok");
        group.bench_with_input(
            BenchmarkId::new("render_tokenize", &label),
            &input,
            |b, input| b.iter(|| renderer.render_ids(black_box(input))),
        );
        // Harmony renders message by message from a cache of each message's
        // ids (every message here is cached after the first iteration, as
        // a later call's earlier messages are); `crate_whole` is the crate
        // rendering the whole conversation, nothing cached: a first call.
        if let Some(h) = renderer.harmony() {
            group.bench_with_input(BenchmarkId::new("crate_whole", &label), &input, |b, i| {
                b.iter(|| {
                    let convo = harmony::conversation(i.messages, i.tools, i.kwargs).ok()?;
                    h.encoding()
                        .render_conversation_for_completion(&convo.messages, Role::Assistant, None)
                        .ok()
                })
            });
        }
    }
    group.finish();
}

fn main() {
    let Some(renderer) = load("qwen3", "") else {
        return;
    };
    let mut criterion = Criterion::default().configure_from_args();
    bench_render(&mut criterion, &renderer);
    bench_turns(&mut criterion, "qwen3", &renderer);
    if let Some(gpt_oss) = load("gptoss", "harmony") {
        bench_turns(&mut criterion, "gpt_oss", &gpt_oss);
    }
    criterion.final_summary();
}
