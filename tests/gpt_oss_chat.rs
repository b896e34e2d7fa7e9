//! gpt-oss through the Harmony format end to end, against a mock backend
//! that samples Harmony text with non-canonical ids: three turns (a tool
//! call ending `<|call|>`, the answer after the tool result, a follow-up)
//! reach the client as OpenAI messages (`reasoning_content`, `tool_calls`,
//! `content`), streamed and not, and every turn's prompt continues the
//! earlier prompt + sampled ids verbatim, so the export is one sample.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::Renderer;

fn gpt_oss() -> std::sync::Arc<Renderer> {
    assert!(
        std::env::var_os("TIKTOKEN_ENCODINGS_BASE").is_some(),
        "TIKTOKEN_ENCODINGS_BASE is unset: source scripts/env.sh"
    );
    common::real_renderer("gptoss", "harmony")
}

/// `text` tokenized piece by piece: valid ids, not the canonical ones.
fn pieces(r: &Renderer, parts: &[&str]) -> Vec<u32> {
    parts
        .iter()
        .flat_map(|p| r.encode(p).expect("encodes"))
        .collect()
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

/// The three scripted completions (each from right after `<|start|>assistant`).
fn script(r: &Renderer) -> [Vec<u32>; 3] {
    [
        pieces(
            r,
            &[
                "<|channel|>analysis<|message|>",
                "Need the w",
                "eather.",
                "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                "{\"ci",
                "ty\": \"Par",
                "is\"}",
                "<|call|>",
            ],
        ),
        pieces(
            r,
            &[
                "<|channel|>analysis<|message|>",
                "It is sunny.",
                "<|end|><|start|>assistant<|channel|>final<|message|>",
                "Sunny in P",
                "aris, 21 °C.",
                "<|return|>",
            ],
        ),
        pieces(
            r,
            &["<|channel|>final<|message|>", "You're wel", "come!", "<|return|>"],
        ),
    ]
}

async fn gateway() -> (MockVllm, Gateway) {
    let r = gpt_oss();
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway_with(harmony_config(&[mock.url()]), r).await;
    (mock, g)
}

fn harmony_config(urls: &[String]) -> tito::config::Config {
    let mut cfg = config(urls, "");
    cfg.model.chat_template = "harmony".into();
    cfg.model.tool_parser = "gpt_oss".into();
    cfg.model.reasoning_parser = "gpt_oss".into();
    cfg
}

fn store(cfg: &tito::config::Config) -> tito::store::DynStore {
    let options = tito::store::StoreOptions::from(&cfg.store);
    tito::store::open_with_options(&cfg.store.url, &options).expect("store opens")
}

fn ids_of(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

#[tokio::test]
async fn three_turns_keep_every_sampled_id_and_answer_as_openai_messages() {
    let (mock, g) = gateway().await;
    let r = g.renderer.clone();
    let [s1, s2, s3] = script(&r);
    let user = json!({"role": "user", "content": "Weather in Paris?"});

    mock.push(Scripted::ids(s1.clone()));
    let b1 = g
        .post_json(
            "/t/oss-1/v1/chat/completions",
            json!({"messages": [user], "tools": tools(), "return_token_ids": true,
                   "reasoning_effort": "high"}),
        )
        .await;
    let m1 = &b1["choices"][0]["message"];
    assert_eq!(b1["choices"][0]["finish_reason"], "tool_calls", "{b1}");
    assert_eq!(m1["reasoning_content"], "Need the weather.");
    assert_eq!(m1["content"], Value::Null);
    let call = &m1["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    let p1 = ids_of(&b1["prompt_token_ids"]);
    assert_eq!(ids_of(&b1["choices"][0]["token_ids"]), s1);
    let prompt_text = r.decode(&p1, false).expect("decodes");
    assert!(prompt_text.contains("Reasoning: high"), "{prompt_text}");
    assert!(prompt_text.contains("Current date: "), "{prompt_text}");
    assert!(prompt_text.ends_with("<|start|>assistant"), "{prompt_text}");
    assert_eq!(mock.last_request()["prompt"], json!(p1));
    // Generation stops on `<|return|>` and `<|call|>`, never on `<|end|>`
    // (an analysis message ends with it and the turn goes on).
    let stops = ids_of(&mock.last_request()["stop_token_ids"]);
    let id = |t: &str| r.token_to_id(t).expect("a Harmony token");
    assert!(
        stops.contains(&id("<|return|>")) && stops.contains(&id("<|call|>")),
        "{stops:?}"
    );
    assert!(!stops.contains(&id("<|end|>")), "{stops:?}");

    // The agent echoes the call (arguments re-serialized) and the result.
    let echoed = json!({"role": "assistant", "content": null,
        "reasoning_content": "Need the weather.",
        "tool_calls": [{"id": call["id"], "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]});
    let result = json!({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 °C"});
    mock.push(Scripted::ids(s2.clone()));
    let body = json!({"messages": [user, echoed, result], "tools": tools(), "stream": true,
        "return_token_ids": true, "reasoning_effort": "high"});
    let events = sse_events(g.post("/t/oss-1/v1/chat/completions", body).await).await;
    let (mut reasoning, mut content) = (String::new(), String::new());
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let e: Value = serde_json::from_str(e).expect("event JSON");
        let d = &e["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!(reasoning, "It is sunny.");
    assert_eq!(content, "Sunny in Paris, 21 °C.");
    let p2 = ids_of(&mock.last_request()["prompt"]);
    assert_eq!(&p2[..p1.len()], &p1[..], "the first prompt, verbatim");
    assert_eq!(
        &p2[p1.len()..p1.len() + s1.len()],
        &s1[..],
        "sampled ids verbatim"
    );
    let observation = r
        .decode(&p2[p1.len() + s1.len()..], false)
        .expect("decodes");
    assert_eq!(
        observation,
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 21 °C<|end|><|start|>assistant"
    );

    let answer = json!({"role": "assistant", "content": "Sunny in Paris, 21 °C.",
        "reasoning_content": "It is sunny."});
    let thanks = json!({"role": "user", "content": "Thanks!"});
    mock.push(Scripted::ids(s3.clone()));
    let b3 = g
        .post_json(
            "/t/oss-1/v1/chat/completions",
            json!({"messages": [user, echoed, result, answer, thanks], "tools": tools(),
                   "reasoning_effort": "high"}),
        )
        .await;
    assert_eq!(b3["choices"][0]["message"]["content"], "You're welcome!");
    let canonical = r.encode("<|channel|>final<|message|>You're welcome!<|return|>");
    assert_ne!(
        canonical.ok().as_ref(),
        Some(&s3),
        "the scripted ids are not canonical"
    );
    let p3 = ids_of(&mock.last_request()["prompt"]);
    assert_eq!(&p3[..p2.len()], &p2[..]);
    assert_eq!(&p3[p2.len()..p2.len() + s2.len()], &s2[..]);

    // One sample: mask 1 exactly on the three sampled runs.
    let rows = g.export_jsonl("layout=trajectory&trajectory=oss-1").await;
    assert_eq!(rows.len(), 1, "one sample: {rows:?}");
    let resp = ids_of(&rows[0]["response_ids"]);
    let mask: Vec<u8> = serde_json::from_value(rows[0]["response_mask"].clone()).expect("mask");
    let sampled: Vec<u32> = resp
        .iter()
        .zip(&mask)
        .filter(|(_, m)| **m == 1)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(sampled, [s1.clone(), s2.clone(), s3.clone()].concat());

    // The re-rendering drops the answered turn's analysis and writes `<|end|>`
    // for `<|return|>`: reported as drift, the sampled ids kept.
    let t = g.get_json("/v1/trajectories/oss-1").await;
    assert!(t["drift"].as_array().is_some_and(|d| !d.is_empty()), "{t}");
}

#[tokio::test]
async fn the_date_is_the_trajectorys_own_or_the_requests() {
    let (mock, g) = gateway().await;
    let r = g.renderer.clone();
    let [_, _, s3] = script(&r);
    let user = json!({"role": "user", "content": "Hi"});
    mock.push(Scripted::ids(s3.clone()));
    g.post_json(
        "/t/oss-date/v1/chat/completions",
        json!({"messages": [user], "chat_template_kwargs": {"conversation_start_date": "2025-03-04"}}),
    )
    .await;
    let text = r
        .decode(&ids_of(&mock.last_request()["prompt"]), false)
        .expect("decodes");
    assert!(text.contains("Current date: 2025-03-04"), "{text}");
    assert!(
        text.contains("Reasoning: medium"),
        "the default effort: {text}"
    );
}

#[tokio::test]
async fn parsers_that_do_not_suit_the_format_are_refused_at_start() {
    let r = gpt_oss();
    let mut cfg = harmony_config(&[]);
    cfg.model.tool_parser = "hermes".into();
    let err = tito::api::AppState::new(cfg.clone(), r, Vec::new(), store(&cfg))
        .err()
        .expect("hermes is refused")
        .to_string();
    assert!(
        err.contains("model.tool_parser") && err.contains("gpt_oss"),
        "{err}"
    );
    let q = common::real_renderer("qwen3", "");
    let mut cfg = config(&[], "");
    cfg.model.reasoning_parser = "gpt_oss".into();
    let err = tito::api::AppState::new(cfg.clone(), q, Vec::new(), store(&cfg))
        .err()
        .expect("gpt_oss needs harmony")
        .to_string();
    assert!(err.contains("chat_template = \"harmony\""), "{err}");
}

/// The Responses API over gpt-oss: `reasoning.effort` reaches the system
/// message; analysis is a reasoning item, the call a `function_call` item;
/// the `function_call_output` turn continues the sampled ids verbatim.
#[tokio::test]
async fn responses_carry_reasoning_items_and_function_calls() {
    let (mock, g) = gateway().await;
    let r = g.renderer.clone();
    let [s1, s2, _] = script(&r);
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    mock.push(Scripted::ids(s1.clone()));
    let first = g
        .post_json(
            "/t/oss-resp/v1/responses",
            json!({"model": "test-model", "input": "Weather in Paris?", "tools": tools,
                   "reasoning": {"effort": "low"}}),
        )
        .await;
    let p1 = ids_of(&mock.last_request()["prompt"]);
    let text = r.decode(&p1, false).expect("decodes");
    assert!(text.contains("Reasoning: low"), "{text}");
    let output = first["output"].as_array().expect("output items");
    let kinds: Vec<&str> = output.iter().filter_map(|i| i["type"].as_str()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{first}");
    let call = &output[1];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], "{\"city\": \"Paris\"}");

    mock.push(Scripted::ids(s2.clone()));
    let second = g
        .post_json(
            "/t/oss-resp/v1/responses",
            json!({"model": "test-model", "tools": tools, "reasoning": {"effort": "low"},
                   "previous_response_id": first["id"],
                   "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]}),
        )
        .await;
    let message = second["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "message"))
        .expect("a message item");
    assert_eq!(
        message["content"][0]["text"], "Sunny in Paris, 21 °C.",
        "{second}"
    );
    // The analysis message's ids (its header and `<|end|>` included).
    let analysis = r
        .encode("<|channel|>analysis<|message|>It is sunny.<|end|>")
        .expect("encodes")
        .len();
    assert_eq!(
        second["usage"]["output_tokens_details"]["reasoning_tokens"], analysis,
        "{second}"
    );
    let p2 = ids_of(&mock.last_request()["prompt"]);
    assert_eq!(&p2[..p1.len() + s1.len()], &[p1, s1].concat()[..]);
}

/// The Messages API over gpt-oss: analysis is a thinking block, the call a
/// `tool_use` block; the `tool_result` turn continues exactly.
#[tokio::test]
async fn messages_carry_thinking_and_tool_use_blocks() {
    let (mock, g) = gateway().await;
    let r = g.renderer.clone();
    let [s1, s2, _] = script(&r);
    let tools = json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let user = json!({"role": "user", "content": "Weather in Paris?"});
    mock.push(Scripted::ids(s1.clone()));
    let first = g
        .post_json(
            "/t/oss-msg/v1/messages",
            json!({"model": "test-model", "max_tokens": 256, "tools": tools, "messages": [user]}),
        )
        .await;
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let blocks = first["content"].as_array().cloned().expect("blocks");
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["thinking"], "Need the weather.");
    let tool_use = blocks
        .iter()
        .find(|b| b["type"] == "tool_use")
        .expect("tool_use")
        .clone();
    assert_eq!(tool_use["input"], json!({"city": "Paris"}));
    let p1 = ids_of(&mock.last_request()["prompt"]);

    mock.push(Scripted::ids(s2.clone()));
    let second = g
        .post_json(
            "/t/oss-msg/v1/messages",
            json!({"model": "test-model", "max_tokens": 256, "tools": tools,
                "messages": [user, {"role": "assistant", "content": blocks},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "sunny"}]}]}),
        )
        .await;
    let texts: Vec<&Value> = second["content"]
        .as_array()
        .expect("blocks")
        .iter()
        .filter(|b| b["type"] == "text")
        .collect();
    assert_eq!(texts[0]["text"], "Sunny in Paris, 21 °C.", "{second}");
    let p2 = ids_of(&mock.last_request()["prompt"]);
    assert_eq!(&p2[..p1.len() + s1.len()], &[p1, s1].concat()[..]);
}
