//! Property test over real tokenizers (Qwen3 with thinking and tools, Llama
//! 3.1, DeepSeek V3): random multi-turn conversations driven through the
//! gateway by a mock backend that samples non-canonical tokenizations and a
//! client that re-serializes what it got back. For every conversation:
//! the sampled ids sit verbatim at their positions in the exported sample,
//! the mask is 1 exactly on them, prompt + response equals what the backend
//! saw on the last call plus its reply, and every continued call has a drift
//! record with a known cause.

mod common;

use std::sync::Arc;

use common::mock_vllm::{MockVllm, Scripted};
use common::{start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::Renderer;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "hello",
    "wonderful",
    "tokenization",
    "über",
    "naïve",
    "日本語",
    "😀",
    "42",
    "x_1",
    "  spaced",
    "fn main() {}",
    "\n",
    "tab\there",
    "HAVING",
    "reinforcement",
    "ok.",
];

fn load(name: &str) -> Arc<Renderer> {
    common::real_renderer(name, "")
}

fn end_of_turn(r: &Renderer) -> u32 {
    ["<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>"]
        .iter()
        .find_map(|t| r.token_to_id(t))
        .expect("an end-of-turn token")
}

/// Tokenizes `text` in random pieces: valid ids for the text that a fresh
/// tokenization would (almost always) not reproduce.
fn non_canonical(r: &Renderer, rng: &mut Rng, text: &str) -> Vec<u32> {
    let chars: Vec<char> = text.chars().collect();
    let mut ids = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let n = 1 + rng.below(3);
        let piece: String = chars[i..(i + n).min(chars.len())].iter().collect();
        ids.extend(r.encode(&piece).expect("encodes"));
        i += n;
    }
    ids
}

fn sentence(rng: &mut Rng) -> String {
    (0..3 + rng.below(5))
        .map(|_| rng.pick(WORDS))
        .collect::<Vec<_>>()
        .join(" ")
}

struct Turn {
    reply: Vec<u32>,
}

/// Runs one random conversation; returns the replies and the trajectory id.
async fn conversation(
    g: &Gateway,
    mock: &MockVllm,
    name: &str,
    seed: u64,
    tools: bool,
    thinking: bool,
) -> (String, Vec<Turn>) {
    let r = g.renderer.clone();
    let eot = end_of_turn(&r);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let tid = format!("{name}-{seed}");
    let tool_defs = json!([{"type": "function", "function": {"name": "lookup", "description": "Look up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": sentence(&mut rng)}),
    ];
    let mut turns = Vec::new();
    let n_turns = 2 + rng.below(3);
    for t in 0..n_turns {
        let call_tool = tools && t + 1 < n_turns && rng.below(2) == 0;
        let mut text = String::new();
        if thinking {
            text.push_str(&format!("<think>\n{}\n</think>\n\n", sentence(&mut rng)));
        }
        if call_tool {
            text.push_str(&format!(
                "<tool_call>\n{{\"name\":   \"lookup\", \"arguments\": {{\"q\":\"{}\", \"n\": 2}}}}\n</tool_call>",
                rng.pick(&["a b", "wonderful", "x"])
            ));
        } else {
            text.push_str(&sentence(&mut rng));
        }
        let reply = [non_canonical(&r, &mut rng, &text), vec![eot]].concat();
        mock.push(Scripted::ids(reply.clone()));
        // Each turn the client writes its history anew; on odd turns the
        // earlier tool calls' argument keys come in reverse order.
        let history: Vec<Value> = messages.iter().map(|m| rewritten(m, t % 2 == 1)).collect();
        let mut body = json!({"messages": history, "return_token_ids": true});
        if tools {
            body["tools"] = tool_defs.clone();
        }
        let resp = g.post(&format!("/t/{tid}/v1/chat/completions"), body).await;
        assert_eq!(resp.status(), 200, "{name} seed {seed} turn {t}");
        let out: Value = resp.json().await.expect("json");
        let msg = &out["choices"][0]["message"];
        assert_eq!(out["choices"][0]["token_ids"], json!(reply));
        // The client re-serializes: keys reordered, reasoning dropped,
        // tool-call arguments re-encoded with other spacing and their keys
        // in another order (as Go's encoding/json sorts a map's keys).
        let mut echo = json!({"content": msg["content"], "role": "assistant"});
        if let Some(calls) = msg["tool_calls"].as_array() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let args = c["function"]["arguments"].as_str().expect("args");
                    json!({"type": "function", "id": c["id"], "function": {
                        "arguments": args_written(args, true, true),
                        "name": c["function"]["name"]}})
                })
                .collect();
            echo["tool_calls"] = json!(calls);
            messages.push(echo);
            messages.push(json!({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": sentence(&mut rng)}));
        } else {
            messages.push(echo);
            messages.push(json!({"role": "user", "content": sentence(&mut rng)}));
        }
        turns.push(Turn { reply });
    }
    (tid, turns)
}

/// Tool-call arguments `text` written again, their keys reversed when
/// `reverse`, indented when `pretty`.
fn args_written(text: &str, reverse: bool, pretty: bool) -> String {
    let args: serde_json::Map<String, Value> = serde_json::from_str(text).expect("json");
    let args: serde_json::Map<String, Value> = if reverse {
        args.into_iter().rev().collect()
    } else {
        args
    };
    let written = if pretty {
        serde_json::to_string_pretty(&args)
    } else {
        serde_json::to_string(&args)
    };
    written.expect("json")
}

/// `m` with each tool call's arguments written again, their keys reversed
/// when `reverse`.
fn rewritten(m: &Value, reverse: bool) -> Value {
    let mut m = m.clone();
    if let Some(calls) = m["tool_calls"].as_array_mut() {
        for c in calls {
            let text = c["function"]["arguments"].as_str().expect("args");
            c["function"]["arguments"] = json!(args_written(text, reverse, false));
        }
    }
    m
}

async fn check(g: &Gateway, mock: &MockVllm, tid: &str, turns: &[Turn]) {
    let rows: Vec<Value> = g
        .export_jsonl("layout=trajectory")
        .await
        .into_iter()
        .filter(|r| r["trajectory_id"] == tid)
        .collect();
    assert_eq!(rows.len(), 1, "{tid}: one sample per linear conversation");
    let row = &rows[0];
    let prompt: Vec<u32> = serde_json::from_value(row["prompt_ids"].clone()).expect("ids");
    let resp: Vec<u32> = serde_json::from_value(row["response_ids"].clone()).expect("ids");
    let mask: Vec<u8> = serde_json::from_value(row["response_mask"].clone()).expect("mask");
    assert_eq!(resp.len(), mask.len());
    // Mask-1 runs are exactly the replies, in order, verbatim.
    let mut runs: Vec<Vec<u32>> = Vec::new();
    let mut prev = 0u8;
    for (id, m) in resp.iter().zip(&mask) {
        if *m == 1 {
            if prev == 0 {
                runs.push(Vec::new());
            }
            if let Some(run) = runs.last_mut() {
                run.push(*id);
            }
        }
        prev = *m;
    }
    let replies: Vec<Vec<u32>> = turns.iter().map(|t| t.reply.clone()).collect();
    assert_eq!(runs, replies, "{tid}: sampled runs");
    // prompt + response == the last prompt the backend saw + the last reply.
    let last: Vec<u32> =
        serde_json::from_value(mock.last_request()["prompt"].clone()).expect("ids");
    let mut all = prompt.clone();
    all.extend(&resp);
    assert_eq!(
        all,
        [last, replies.last().cloned().unwrap_or_default()].concat(),
        "{tid}: final sequence"
    );
    // Every continued call reports drift with a known cause.
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    for c in t["calls"].as_array().expect("calls").iter().skip(1) {
        let cause = c["drift"]["cause"].as_str().unwrap_or("none");
        assert!(
            tito::trajectory::CAUSES.contains(&cause),
            "{tid}: call {} drift {cause}",
            c["call_index"]
        );
    }
}

async fn run(name: &str, tools: bool, thinking: bool, reasoning_parser: &str) {
    let r = load(name);
    let mock = MockVllm::start(Scripted::default()).await;
    let cfg = tito::Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 32768\n\
         reasoning_parser = \"{reasoning_parser}\"\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n[store]\nurl = \"memory://\"\n",
        mock.url()
    ))
    .expect("config");
    let g = start_gateway_with(cfg, r).await;
    for seed in 1..=6u64 {
        let (tid, turns) = conversation(&g, &mock, name, seed, tools, thinking).await;
        check(&g, &mock, &tid, &turns).await;
    }
}

#[tokio::test]
async fn qwen3_with_thinking_and_tools() {
    run("qwen3", true, true, "think").await;
}

#[tokio::test]
async fn llama3_1_multi_turn() {
    run("llama3_1", false, false, "").await;
}

#[tokio::test]
async fn deepseek_v3_multi_turn() {
    run("deepseek_v3", false, false, "").await;
}
