//! The vision agent of tests/vision_chat.rs over the Responses and Messages
//! APIs: an image in the first prompt, a tool result carrying a second one
//! (`function_call_output` with `input_image`, `tool_result` with an
//! `image` block), then a last user turn. Each trajectory is one exact
//! sample holding both images' pad runs, each image stored once, and SGLang
//! got every prompt's images in order.

mod common;
mod vision_support;

use base64::Engine as _;
use serde_json::{json, Value};
use tito::render::Renderer;
use vision_support::*;

/// The scripted replies: a `zoom` tool call, then two answers.
fn script(qwen: &Renderer) -> Vec<Vec<u32>> {
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let call = pieces(
        qwen,
        &[
            "<tool_call>",
            "\n{\"name\": \"zoom\", \"arguments\": ",
            "{\"factor\": 2}}\n",
            "</tool_call>",
        ],
    );
    vec![
        [call, vec![im_end]].concat(),
        [pieces(qwen, &["A", " cat."]), vec![im_end]].concat(),
        [pieces(qwen, &["Bye", "."]), vec![im_end]].concat(),
    ]
}

/// One sample whose pad runs are the two images', each image stored once,
/// and SGLang given [a], [a, b], [a, b].
async fn check(s: &Setup, tid: &str, a: &[u8], b: &[u8]) {
    let pad = s.g.renderer.token_to_id(PAD).expect("pad");
    let rows =
        s.g.export_jsonl(&format!("layout=trajectory&trajectory={tid}"))
            .await;
    assert_eq!(rows.len(), 1, "{tid}: one sample: {rows:?}");
    let row = &rows[0];
    let ids: Vec<u32> = serde_json::from_value(row["prompt_ids"].clone()).expect("ids");
    let response: Vec<u32> = serde_json::from_value(row["response_ids"].clone()).expect("ids");
    let mask: Vec<u32> = serde_json::from_value(row["response_mask"].clone()).expect("mask");
    assert_eq!(
        runs(&[ids, response.clone()].concat(), pad),
        [4, 8],
        "{tid}"
    );
    assert!(response
        .iter()
        .zip(&mask)
        .all(|(&t, &m)| t != pad || m == 0));
    assert_eq!(row["image_sha256"], json!([sha(a), sha(b)]));
    for bytes in [a, b] {
        let stored = s
            .store
            .image(&sha(bytes))
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(stored.bytes.as_slice(), bytes);
    }
    let seen = s.seen.lock().expect("lock").clone();
    let sent: Vec<Value> = seen.iter().map(|b| b["image_data"].clone()).collect();
    let (a, b) = (data_url(a), data_url(b));
    assert_eq!(sent, [json!([a]), json!([a, b]), json!([a, b])], "{tid}");
}

#[tokio::test]
async fn a_responses_agent_whose_tool_output_is_an_image_continues_exactly() {
    let qwen = common::real_renderer("qwen3", "");
    let s = setup(script(&qwen), "").await;
    let (a, b) = (png(64, 48, 11), png(100, 60, 12));
    let tools = json!([{"type": "function", "name": "zoom", "description": "Zoom in",
        "parameters": {"type": "object", "properties": {"factor": {"type": "integer"}}}}]);
    let path = "/t/resp-vis/v1/responses";
    let user = json!({"role": "user", "content": [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": data_url(&a)}]});
    let first: Value =
        s.g.post(path, json!({"input": [user], "tools": tools}))
            .await
            .json()
            .await
            .expect("json");
    let call = first["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|o| o["type"] == "function_call")
        .cloned()
        .unwrap_or_else(|| panic!("a function call: {first}"));
    let output = json!({"type": "function_call_output", "call_id": call["call_id"], "output": [
        {"type": "input_image", "image_url": data_url(&b)}]});
    let second: Value =
        s.g.post(path, json!({"input": [user, call, output], "tools": tools}))
            .await
            .json()
            .await
            .expect("json");
    assert_eq!(
        second.pointer("/output/0/content/0/text"),
        Some(&json!("A cat.")),
        "{second}"
    );
    let answer =
        json!({"role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]});
    let third: Value =
        s.g.post(
            path,
            json!({"input": [user, call, output, answer, {"role": "user", "content": "Thanks!"}],
                   "tools": tools}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(third["status"], "completed", "{third}");
    check(&s, "resp-vis", &a, &b).await;
}

#[tokio::test]
async fn a_messages_agent_whose_tool_result_is_an_image_continues_exactly() {
    let qwen = common::real_renderer("qwen3", "");
    let s = setup(script(&qwen), "").await;
    let (a, b) = (png(64, 48, 21), png(100, 60, 22));
    let b64 = |x: &[u8]| base64::engine::general_purpose::STANDARD.encode(x);
    let tools = json!([{"name": "zoom", "description": "Zoom in",
        "input_schema": {"type": "object", "properties": {"factor": {"type": "integer"}}}}]);
    let path = "/t/msg-vis/v1/messages";
    let user = json!({"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&a)}},
        {"type": "text", "text": "What is in this picture?"}]});
    let body = |messages: Value| json!({"model": "test-model", "max_tokens": 256, "tools": tools, "messages": messages});
    let first: Value =
        s.g.post(path, body(json!([user])))
            .await
            .json()
            .await
            .expect("json");
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let tool_use = first["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|c| c["type"] == "tool_use")
        .cloned()
        .expect("a tool_use block");
    let assistant = json!({"role": "assistant", "content": [tool_use]});
    let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"],
        "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&b)}}]}]});
    let second: Value =
        s.g.post(path, body(json!([user, assistant, result])))
            .await
            .json()
            .await
            .expect("json");
    assert_eq!(second["content"][0]["text"], "A cat.", "{second}");
    let third: Value =
        s.g.post(
            path,
            body(json!([user, assistant, result,
                {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
                {"role": "user", "content": "Thanks!"}])),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(third["stop_reason"], "end_turn", "{third}");
    check(&s, "msg-vis", &a, &b).await;
}
