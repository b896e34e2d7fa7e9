//! Anthropic's Messages API end to end against the mock vLLM: a message
//! and its event stream, tool use over turns and thinking with its checked
//! signature continuing the trajectory exactly, stop sequences, auth by
//! `x-api-key`, and every error in Anthropic's shape.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

async fn gateway() -> (MockVllm, Gateway) {
    let mock = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    (mock, g)
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("token ids")
}

fn hello() -> Value {
    json!({"model": "test-model", "max_tokens": 16,
           "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn a_message_answers_in_anthropic_shape() {
    let (mock, g) = gateway().await;
    let resp = g.post("/t/msg-1/v1/messages", hello()).await;
    assert_eq!(resp.status(), 200);
    let m: Value = resp.json().await.expect("json");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert!(
        m["id"].as_str().is_some_and(|i| i.starts_with("msg_")),
        "{m}"
    );
    assert_eq!(m["content"], json!([{"type": "text", "text": "ok"}]));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["stop_sequence"], Value::Null);
    assert_eq!(m["usage"]["output_tokens"], 3);
    let prompt = ids(&mock.last_request()["prompt"]);
    assert_eq!(m["usage"]["input_tokens"], prompt.len());
    assert_eq!(mock.last_request()["max_tokens"], 16);
    let t = g.get_json("/v1/trajectories/msg-1").await;
    assert_eq!(t["calls"][0]["api"], "messages");
}

#[tokio::test]
async fn the_stream_is_named_events_in_order() {
    let (_mock, g) = gateway().await;
    let mut body = hello();
    body["stream"] = json!(true);
    let text = g
        .post("/t/msg-s/v1/messages", body)
        .await
        .text()
        .await
        .expect("body");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("named")
                .to_string();
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            (name, serde_json::from_str(data).expect("json"))
        })
        .collect();
    let mut names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    // One delta a streamed token.
    names.dedup();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (n, data) in &events {
        assert_eq!(data["type"], n.as_str());
    }
    assert_eq!(events[0].1["message"]["content"], json!([]));
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(text, "ok");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 3);
    assert!(delta["usage"]["input_tokens"]
        .as_u64()
        .is_some_and(|n| n > 0));
}

#[tokio::test]
async fn errors_are_in_anthropic_shape() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(
        &[mock.url()],
        "[auth]\napi_keys = [\"sk-ant-test-1\"]\n",
    ))
    .await;
    let post = |body: Value, key: Option<&'static str>| {
        let mut r = g.client.post(g.url("/v1/messages")).json(&body);
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        r.send()
    };
    let cases = [
        (
            json!({"model": "test-model", "messages": [{"role": "user", "content": "x"}]}),
            Some("sk-ant-test-1"),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": "other", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}),
            Some("sk-ant-test-1"),
            404,
            "not_found_error",
        ),
        (hello(), None, 401, "authentication_error"),
        (hello(), Some("wrong-key-000"), 401, "authentication_error"),
        (
            json!({"model": "test-model", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}),
            Some("sk-ant-test-1"),
            400,
            "invalid_request_error",
        ),
    ];
    for (body, key, status, kind) in cases {
        let resp = post(body.clone(), key).await.expect("send");
        assert_eq!(resp.status().as_u16(), status, "{body}");
        let e: Value = resp.json().await.expect("json");
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], kind, "{body}: {e}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    assert!(mock.requests().is_empty(), "nothing reached the backend");
    // The right key as x-api-key passes.
    mock.push(Scripted::ids(vec![b'k'.into(), IM_END]));
    let ok = post(hello(), Some("sk-ant-test-1")).await.expect("send");
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn a_stop_sequence_is_named() {
    let (mock, g) = gateway().await;
    mock.push(Scripted {
        ids: "hi END more".bytes().map(u32::from).collect(),
        ..Default::default()
    });
    let mut body = hello();
    body["stop_sequences"] = json!(["END"]);
    let m: Value = g
        .post("/v1/messages", body)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
    assert_eq!(m["stop_sequence"], "END");
    assert_eq!(m["content"][0]["text"], "hi ");
}

/// A Qwen3 gateway with the `think` reasoning parser: tool use and thinking
/// over turns, echoed back as blocks, continue the trajectory exactly.
#[tokio::test]
async fn tool_use_and_thinking_over_turns_continue_exactly() {
    let r = common::real_renderer("qwen3", "");
    let mock = MockVllm::start(Scripted::default()).await;
    let mut cfg = config(&[mock.url()], "");
    cfg.model.reasoning_parser = "think".into();
    // Room for a thinking budget (at least 1024) below `max_tokens`.
    cfg.model.max_model_len = 8192;
    let g = start_gateway_with(cfg, r.clone()).await;
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    let enc = |pieces: &[&str]| -> Vec<u32> {
        pieces
            .iter()
            .flat_map(|p| r.encode(p).expect("enc"))
            .collect()
    };
    let sampled1 = [
        enc(&[
            "<think>",
            "\nneed the tool\n",
            "</think>",
            "\n\n",
            "<tool_call>",
            "\n{\"name\": \"calc\", \"arguments\": {\"x\": \"2+2\"}}\n",
            "</tool_call>",
        ]),
        vec![im_end],
    ]
    .concat();
    mock.push(Scripted::ids(sampled1.clone()));
    let tools = json!([{"name": "calc", "description": "add",
        "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}]);
    let user = json!({"role": "user", "content": "2+2?"});
    let path = "/t/msg-tools/v1/messages";
    let first: Value = g
        .post(
            path,
            json!({"model": "test-model", "max_tokens": 2048, "tools": tools,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [user], "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let blocks = first["content"].as_array().cloned().expect("blocks");
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["thinking"], "need the tool");
    let tool_use = blocks
        .iter()
        .find(|b| b["type"] == "tool_use")
        .expect("tool_use")
        .clone();
    assert_eq!(tool_use["input"], json!({"x": "2+2"}));
    assert_eq!(mock.last_request()["prompt"], first["prompt_token_ids"]);

    mock.push(Scripted::ids([enc(&["4"]), vec![im_end]].concat()));
    let turn2 = json!({"model": "test-model", "max_tokens": 2048, "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [user, {"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "4"}]}],
        "return_token_ids": true});
    let second: Value = g
        .post(path, turn2.clone())
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(second["content"][0]["text"], "4", "{second}");
    let continued = [ids(&first["prompt_token_ids"]), sampled1].concat();
    let prompt2 = ids(&second["prompt_token_ids"]);
    assert_eq!(&prompt2[..continued.len()], &continued[..]);
    let t = g.get_json("/v1/trajectories/msg-tools").await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
    assert_eq!(t["calls"][1]["sample_index"], 0, "one sample: {t}");

    // The thinking changed: its signature no longer matches.
    let mut tampered = turn2;
    tampered["messages"][1]["content"][0]["thinking"] = json!("another thought");
    let resp = g.post(path, tampered).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.expect("json");
    assert_eq!(e["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn count_tokens_counts_with_the_template() {
    let (mock, g) = gateway().await;
    let mut body = hello();
    body.as_object_mut().map(|o| o.remove("max_tokens"));
    let v = g.post_json("/v1/messages/count_tokens", body).await;
    let m: Value = g
        .post("/v1/messages", hello())
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(v["input_tokens"], m["usage"]["input_tokens"]);
    assert_eq!(mock.requests().len(), 1, "counting generates nothing");
}
