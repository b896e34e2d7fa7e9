//! OpenAI response shapes the SDKs read: `message.refusal`,
//! `system_fingerprint`, `GET /v1/models/{id}` with a stable `created`, and
//! OpenAI-shaped 404 / 405 bodies.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

#[tokio::test]
async fn chat_and_completions_carry_refusal_and_fingerprint() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, b'k' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = g.post("/v1/chat/completions", chat.clone()).await;
    let tid = r.headers()["x-trajectory-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["refusal"], Value::Null);
    assert!(v["choices"][0]["message"]
        .as_object()
        .expect("message")
        .contains_key("refusal"));
    let fp = v["system_fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    assert!(fp.starts_with("tito-"), "{fp}");
    // What was recorded is what was served, without the added field.
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    assert_eq!(
        t["calls"][0]["response"],
        json!({"role": "assistant", "content": "ok"})
    );

    let mut streamed = chat;
    streamed["stream"] = json!(true);
    let events = sse_events(g.post("/v1/chat/completions", streamed).await).await;
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        assert_eq!(c["system_fingerprint"], json!(fp), "{c}");
    }

    let c = g
        .post_json("/v1/completions", json!({"prompt": [1, 2]}))
        .await;
    assert_eq!(c["system_fingerprint"], json!(fp));
}

#[tokio::test]
async fn models_retrieve_and_openai_shaped_route_errors() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let list = g.get_json("/v1/models").await;
    let one = g.get_json("/v1/models/test-model").await;
    assert_eq!(one, list["data"][0]);
    assert_eq!(one["object"], "model");
    // `created` is stable across calls.
    assert_eq!(
        g.get_json("/v1/models").await["data"][0]["created"],
        one["created"]
    );
    assert_eq!(g.get_json("/t/x/v1/models/test-model").await, one);

    let r = g
        .client
        .get(g.url("/v1/models/other"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "model_not_found");

    let r = g
        .client
        .get(g.url("/v1/chat/completions"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 405);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "method_not_allowed");
    // Routes outside the API's own router too (found by scripts/fuzz.sh).
    for path in ["/metrics", "/openapi.json", "/health"] {
        let r = g
            .client
            .request(reqwest::Method::DELETE, g.url(path))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 405, "{path}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["code"], "method_not_allowed", "{path}");
    }

    let r = g
        .client
        .get(g.url("/v2/nothing"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.expect("json");
    assert!(e["error"]["message"].is_string());
}

#[tokio::test]
async fn openai_fields_tito_does_not_implement_are_refused_by_name() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let refused = [
        ("audio", json!({"voice": "alloy", "format": "wav"})),
        ("modalities", json!(["text", "audio"])),
        ("prediction", json!({"type": "content", "content": "x"})),
        ("web_search_options", json!({})),
        ("logit_bias", json!({"50256": -100})),
        ("reasoning_effort", json!("low")),
        ("verbosity", json!("low")),
        ("parallel_tool_calls", json!(false)),
    ];
    for (field, value) in refused {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
        body[field] = value;
        let r = g.post("/v1/chat/completions", body).await;
        assert_eq!(r.status(), 400, "{field}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["param"], field);
        assert_eq!(e["error"]["code"], "unsupported_parameter");
    }
    for (field, value) in [
        ("logit_bias", json!({"1": 5})),
        ("best_of", json!(3)),
        ("echo", json!(true)),
        ("suffix", json!("z")),
    ] {
        let mut body = json!({"prompt": [1, 2]});
        body[field] = value;
        let r = g.post("/v1/completions", body).await;
        assert_eq!(r.status(), 400, "{field}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["param"], field);
        assert_eq!(e["error"]["code"], "unsupported_parameter", "{field}");
    }
    assert!(
        mock.requests().is_empty(),
        "nothing refused reached the backend"
    );

    // Neutral values and fields without effect on generation are served.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "modalities": ["text"],
        "response_format": {"type": "text"}, "logit_bias": {}, "tool_choice": "auto",
        "parallel_tool_calls": true, "user": "u-1", "metadata": {"k": "v"}, "store": true,
        "service_tier": "auto", "prompt_cache_key": "p", "safety_identifier": "s"});
    assert_eq!(g.post("/v1/chat/completions", body).await.status(), 200);
    let body = json!({"prompt": [1, 2], "best_of": 1, "user": "u-1"});
    assert_eq!(g.post("/v1/completions", body).await.status(), 200);
}

#[tokio::test]
async fn response_format_reaches_the_backend_as_a_constraint() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut answer = g.renderer.encode(r#"{"city": "Paris"}"#).expect("encodes");
    answer.push(IM_END);
    mock.push(Scripted::ids(answer));
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false});
    let body = json!({"messages": [{"role": "user", "content": "capital of France?"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": schema, "strict": true}}});
    let v = g.post_json("/v1/chat/completions", body).await;
    assert_eq!(
        v["choices"][0]["message"]["content"],
        r#"{"city": "Paris"}"#
    );
    assert_eq!(
        mock.last_request()["structured_outputs"],
        json!({"json": schema})
    );

    let body = json!({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}});
    assert_eq!(g.post("/v1/chat/completions", body).await.status(), 200);
    assert_eq!(
        mock.last_request()["structured_outputs"],
        json!({"json_object": true})
    );

    let body = json!({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "yaml"}});
    let r = g.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["param"], "response_format.type");
}

fn calculator() -> Value {
    json!([{"type": "function", "function": {"name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
           {"type": "function", "function": {"name": "clock"}}])
}

#[tokio::test]
async fn forced_tool_choice_constrains_the_output_and_answers_tool_calls() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let reply = |text: &str| {
        let mut ids = g.renderer.encode(text).expect("encodes");
        ids.push(IM_END);
        Scripted::ids(ids)
    };
    let messages = json!([{"role": "user", "content": "6*7?"}]);

    // "required": a list of {name, parameters} over the tools.
    mock.push(reply(
        r#"[{"name": "calculator", "parameters": {"expression": "6*7"}}]"#,
    ));
    let body = json!({"messages": messages, "tools": calculator(), "tool_choice": "required"});
    let v = g.post_json("/v1/chat/completions", body).await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], Value::Null);
    assert_eq!(
        c["message"]["tool_calls"][0]["function"]["name"],
        "calculator"
    );
    assert_eq!(
        c["message"]["tool_calls"][0]["function"]["arguments"],
        r#"{"expression":"6*7"}"#
    );
    let schema = &mock.last_request()["structured_outputs"]["json"];
    assert_eq!(schema["type"], "array");
    assert_eq!(
        schema["items"]["anyOf"][0]["properties"]["name"]["enum"],
        json!(["calculator"])
    );

    // A named function: its arguments object, streamed as a tool call.
    mock.push(reply(r#"{"expression": "1+1"}"#));
    let body = json!({"messages": messages, "tools": calculator(), "stream": true,
        "tool_choice": {"type": "function", "function": {"name": "calculator"}}});
    let events = sse_events(g.post("/v1/chat/completions", body).await).await;
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    assert!(
        chunks.iter().all(|c| {
            let content = &c["choices"][0]["delta"]["content"];
            content.is_null() || content == ""
        }),
        "no JSON streamed as content"
    );
    let call = chunks
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .expect("a tool-call delta");
    assert_eq!(call["index"], 0);
    assert_eq!(call["function"]["arguments"], r#"{"expression":"1+1"}"#);
    assert_eq!(
        chunks
            .iter()
            .rev()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str()),
        Some("tool_calls")
    );
    assert_eq!(
        mock.last_request()["structured_outputs"]["json"]["required"],
        json!(["expression"])
    );

    // `parallel_tool_calls: false` with a named function is honoured: one
    // call is all the constraint allows.
    mock.push(reply(r#"{"expression": "2+2"}"#));
    let body = json!({"messages": messages, "tools": calculator(), "parallel_tool_calls": false,
        "tool_choice": {"type": "function", "function": {"name": "calculator"}}});
    let v = g.post_json("/v1/chat/completions", body).await;
    let calls = v["choices"][0]["message"]["tool_calls"].as_array();
    assert_eq!(calls.map(Vec::len), Some(1), "{v}");

    // A name not among the tools, or "required" without tools: 400.
    let body = json!({"messages": messages, "tools": calculator(),
        "tool_choice": {"type": "function", "function": {"name": "nope"}}});
    let r = g.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 400);
    let body = json!({"messages": messages, "tool_choice": "required"});
    assert_eq!(g.post("/v1/chat/completions", body).await.status(), 400);
}

#[tokio::test]
async fn deprecated_functions_map_to_tools_and_answer_function_call() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let call = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n</tool_call>";
    let mut ids = g.renderer.encode(call).expect("encodes");
    ids.push(IM_END);
    mock.push(Scripted::ids(ids));
    let mut answer = g.renderer.encode("42").expect("encodes");
    answer.push(IM_END);
    mock.push(Scripted::ids(answer));
    let functions = json!([{"name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]);
    let path = "/t/legacy-1/v1/chat/completions";
    let m1 = json!([{"role": "user", "content": "6*7?"}]);
    let v = g
        .post_json(
            path,
            json!({"messages": m1, "functions": functions, "function_call": "auto"}),
        )
        .await;
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "function_call", "{v}");
    assert!(c["message"].get("tool_calls").is_none(), "{v}");
    assert_eq!(c["message"]["function_call"]["name"], "calculator");
    assert_eq!(
        c["message"]["function_call"]["arguments"],
        r#"{"expression":"6*7"}"#
    );
    // The old-style next turn: the assistant's function_call, then the
    // function's result.
    let m2 = json!([{"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": null, "function_call": c["message"]["function_call"]},
        {"role": "function", "name": "calculator", "content": "42"}]);
    let r = g
        .post(path, json!({"messages": m2, "functions": functions}))
        .await;
    assert_eq!(r.status(), 200);
    let t = g.get_json("/v1/trajectories/legacy-1").await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
    assert_eq!(
        t["calls"][1]["normalized"],
        json!([
            "function_as_tool",
            "assistant_content_empty",
            "function_call_as_tool_calls"
        ])
    );
    // Both styles at once is a 400.
    let body = json!({"messages": m1, "functions": functions, "tools": [{"type": "function",
        "function": {"name": "x"}}]});
    assert_eq!(g.post(path, body).await.status(), 400);
}

/// `/ui/api/decode` answers the ids of the vocabulary and leaves the others
/// out (found by scripts/fuzz.sh: they were answered with "").
#[tokio::test]
async fn ui_decode_leaves_out_ids_outside_the_vocabulary() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post("/ui/api/decode", json!({"ids": [4_294_967_295u64, 72]}))
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["tokens"], json!({"72": "H"}));
}
