//! OpenAI's Responses API end to end against the mock vLLM: answers and
//! their typed event stream, multi-turn continuation both by replaying
//! output items and by `previous_response_id` (the sampled ids verbatim in
//! the next prompt), retrieval and deletion, `store: false`, retries, and
//! bad input refused in OpenAI's shape with nothing recorded.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway, start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

fn ok_reply() -> Scripted {
    Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])
}

async fn gateway() -> (MockVllm, Gateway) {
    let mock = MockVllm::start(ok_reply()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    (mock, g)
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("token ids")
}

#[tokio::test]
async fn a_response_answers_with_its_output_and_usage() {
    let (mock, g) = gateway().await;
    let body = json!({"model": "test-model", "input": "hi", "return_token_ids": true});
    let resp = g.post("/t/resp-1/v1/responses", body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-trajectory-id"], "resp-1");
    let r: Value = resp.json().await.expect("json");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert!(
        r["id"].as_str().is_some_and(|id| id.starts_with("resp_")),
        "{r}"
    );
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(r["output"][0]["content"][0]["text"], "ok");
    let prompt = ids(&r["prompt_token_ids"]);
    assert_eq!(r["usage"]["input_tokens"], prompt.len());
    assert_eq!(r["usage"]["output_tokens"], 3);
    assert_eq!(
        ids(&r["token_ids"]),
        vec![u32::from(b'o'), u32::from(b'k'), IM_END]
    );
    assert_eq!(ids(&mock.last_request()["prompt"]), prompt);
    // The call is recorded as a Responses call, under its response id.
    let t = g.get_json("/v1/trajectories/resp-1").await;
    assert_eq!(t["calls"][0]["api"], "responses", "{t}");
    assert_eq!(t["calls"][0]["response_id"], r["id"]);
}

#[tokio::test]
async fn the_stream_is_the_typed_event_sequence() {
    let (_mock, g) = gateway().await;
    let body = json!({"model": "test-model", "input": "hi", "stream": true});
    let resp = g.post("/t/resp-s/v1/responses", body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("body");
    assert!(!text.contains("[DONE]"), "{text}");
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).expect("json event"))
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], n, "{e}");
    }
    // Every event is named as its type.
    let names: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("event: ")))
        .collect();
    assert_eq!(names, kinds);
    let delta: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(delta, "ok");
    let id = &events[0]["response"]["id"];
    let done = events.last().expect("completed");
    assert_eq!(&done["response"]["id"], id);
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], "ok");
    for k in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
}

#[tokio::test]
async fn previous_response_id_continues_the_trajectory_exactly() {
    let (mock, g) = gateway().await;
    let first: Value = g
        .post(
            "/v1/responses",
            json!({"input": "hi", "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let prompt1 = ids(&first["prompt_token_ids"]);
    let sampled1 = ids(&first["token_ids"]);
    let resp = g
        .post(
            "/v1/responses",
            json!({"input": "more", "previous_response_id": first["id"], "return_token_ids": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let tid = resp.headers()["x-trajectory-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    let second: Value = resp.json().await.expect("json");
    let prompt2 = ids(&second["prompt_token_ids"]);
    let continued = [prompt1.clone(), sampled1].concat();
    assert_eq!(
        &prompt2[..continued.len()],
        &continued[..],
        "sampled ids kept verbatim"
    );
    assert_eq!(ids(&mock.last_request()["prompt"]), prompt2);
    // Both calls are one trajectory, one sample.
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    assert_eq!(t["calls"].as_array().map(Vec::len), Some(2), "{t}");
    assert_eq!(t["calls"][1]["parent_call"], 0);
    g.post(&format!("/v1/trajectories/{tid}/finish"), json!({}))
        .await;
    let rows = g.export_jsonl("layout=trajectory").await;
    let sample: Vec<&Value> = rows
        .iter()
        .filter(|r| r["trajectory_id"] == tid.as_str())
        .collect();
    assert_eq!(sample.len(), 1, "{rows:?}");
    assert_eq!(ids(&sample[0]["prompt_ids"]), prompt1);
}

#[tokio::test]
async fn replayed_output_items_continue_the_trajectory_exactly() {
    let (_mock, g) = gateway().await;
    let path = "/t/resp-items/v1/responses";
    let first: Value = g
        .post(
            path,
            json!({"input": [{"role": "user", "content": "hi"}], "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let mut input = vec![json!({"role": "user", "content": "hi"})];
    input.extend(first["output"].as_array().cloned().unwrap_or_default());
    input.push(json!({"role": "user", "content": "more"}));
    let second: Value = g
        .post(path, json!({"input": input, "return_token_ids": true}))
        .await
        .json()
        .await
        .expect("json");
    let continued = [ids(&first["prompt_token_ids"]), ids(&first["token_ids"])].concat();
    let prompt2 = ids(&second["prompt_token_ids"]);
    assert_eq!(&prompt2[..continued.len()], &continued[..]);
    let t = g.get_json("/v1/trajectories/resp-items").await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
}

#[tokio::test]
async fn a_stored_response_reads_back_until_it_is_deleted() {
    let (_mock, g) = gateway().await;
    let r: Value = g
        .post(
            "/t/resp-get/v1/responses",
            json!({"input": "hi", "metadata": {"k": "v"}}),
        )
        .await
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id").to_string();
    let got = g.get_json(&format!("/v1/responses/{id}")).await;
    for key in [
        "id",
        "status",
        "output",
        "usage",
        "metadata",
        "created_at",
        "model",
    ] {
        assert_eq!(got[key], r[key], "{key}: {got}");
    }
    let items = g.get_json(&format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["content"][0]["text"], "hi");
    assert_eq!(items["has_more"], false);

    let del = g
        .client
        .delete(g.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(del.status(), 200);
    let v: Value = del.json().await.expect("json");
    assert_eq!(v, json!({"id": id, "object": "response", "deleted": true}));
    let gone = g
        .client
        .get(g.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(gone.status(), 404);
    let e: Value = gone.json().await.expect("json");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    // Deleted: no longer continued by id; the call itself stays recorded.
    let cont = g
        .post(
            "/v1/responses",
            json!({"input": "x", "previous_response_id": id}),
        )
        .await;
    assert_eq!(cont.status(), 404);
    let e: Value = cont.json().await.expect("json");
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    assert_eq!(e["error"]["param"], "previous_response_id");
    let t = g.get_json("/v1/trajectories/resp-get").await;
    assert_eq!(t["calls"].as_array().map(Vec::len), Some(1));
}

/// The retrieval routes under a trajectory's path prefix (where the
/// `openai` SDK's `base_url` points) name the trajectory too: each still
/// finds the response by its id.
#[tokio::test]
async fn retrieval_routes_answer_under_a_trajectory_path() {
    let (_mock, g) = gateway().await;
    let r: Value = g
        .post("/g/grp/t/resp-path/v1/responses", json!({"input": "hi"}))
        .await
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id").to_string();
    for prefix in ["/t/resp-path", "/g/grp/t/resp-path"] {
        let got = g.get_json(&format!("{prefix}/v1/responses/{id}")).await;
        assert_eq!(got["id"], r["id"], "{prefix}: {got}");
        assert_eq!(got["output"], r["output"], "{prefix}");
        let items = g
            .get_json(&format!("{prefix}/v1/responses/{id}/input_items"))
            .await;
        assert_eq!(
            items["data"][0]["content"][0]["text"], "hi",
            "{prefix}: {items}"
        );
    }
    let del = g
        .client
        .delete(g.url(&format!("/t/resp-path/v1/responses/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(del.status(), 200);
    let gone = g
        .client
        .get(g.url(&format!("/t/resp-path/v1/responses/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(gone.status(), 404);
}

#[tokio::test]
async fn store_false_answers_without_keeping_a_retrievable_response() {
    let (_mock, g) = gateway().await;
    let r: Value = g
        .post(
            "/t/resp-nostore/v1/responses",
            json!({"input": "hi", "store": false}),
        )
        .await
        .json()
        .await
        .expect("json");
    let id = r["id"].as_str().expect("id");
    let got = g
        .client
        .get(g.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .expect("get");
    assert_eq!(got.status(), 404);
    let t = g.get_json("/v1/trajectories/resp-nostore").await;
    assert_eq!(t["calls"][0]["api"], "responses");
    assert_eq!(t["calls"][0]["response_id"], Value::Null);
}

#[tokio::test]
async fn an_sdk_retry_is_answered_from_the_record() {
    let (mock, g) = gateway().await;
    let body = json!({"input": "hi"});
    let first: Value = g
        .post("/t/resp-retry/v1/responses", body.clone())
        .await
        .json()
        .await
        .expect("json");
    let again = g
        .client
        .post(g.url("/t/resp-retry/v1/responses"))
        .header("x-stainless-retry-count", "1")
        .json(&body)
        .send()
        .await
        .expect("retry");
    let again: Value = again.json().await.expect("json");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["output"], first["output"]);
    assert_eq!(mock.requests().len(), 1, "the retry generated nothing");
}

#[tokio::test]
async fn bad_input_is_refused_by_name_and_nothing_is_recorded() {
    let (mock, g) = gateway().await;
    let cases = [
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            400,
            "input[0].call_id",
        ),
        (
            json!({"input": "x", "tools": [{"type": "file_search"}]}),
            400,
            "tools[0]",
        ),
        (json!({"input": "x", "background": true}), 400, "background"),
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            404,
            "previous_response_id",
        ),
        (json!({"input": "x", "model": "other"}), 404, "model"),
        (
            json!({"input": "x", "max_output_tokens": -1}),
            400,
            "max_output_tokens",
        ),
    ];
    for (body, status, param) in cases {
        let resp = g.post("/t/resp-bad/v1/responses", body.clone()).await;
        assert_eq!(resp.status().as_u16(), status, "{body}");
        let e: Value = resp.json().await.expect("json");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    assert!(mock.requests().is_empty());
    let t = g
        .client
        .get(g.url("/v1/trajectories/resp-bad"))
        .send()
        .await
        .expect("get");
    assert_eq!(t.status(), 404, "nothing was recorded");
}

#[tokio::test]
async fn input_tokens_counts_with_the_template() {
    let (_mock, g) = gateway().await;
    let v = g
        .post_json("/v1/responses/input_tokens", json!({"input": "hi"}))
        .await;
    assert_eq!(v["object"], "response.input_tokens");
    let r: Value = g
        .post(
            "/v1/responses",
            json!({"input": "hi", "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(v["input_tokens"], ids(&r["prompt_token_ids"]).len());
}

/// A Qwen3 gateway whose model calls a tool: the function call item
/// carries the recorded call id, and the tool's output continues exactly.
#[tokio::test]
async fn a_function_call_round_trip_keeps_the_sampled_ids() {
    let r = common::real_renderer("qwen3", "");
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway_with(config(&[mock.url()], ""), r.clone()).await;
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    let call: Vec<u32> = [
        "<tool_call>",
        "\n{\"name\": \"calc\", \"arguments\":  {\"x\": \"2+2\"}}\n",
        "</tool_call>",
    ]
    .iter()
    .flat_map(|p| r.encode(p).expect("enc"))
    .collect();
    let sampled = [call, vec![im_end]].concat();
    mock.push(Scripted::ids(sampled.clone()));
    let tools = json!([{"type": "function", "name": "calc",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}]);
    let path = "/t/resp-tools/v1/responses";
    let first: Value = g
        .post(
            path,
            json!({"input": "2+2?", "tools": tools, "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let fc = first["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .cloned();
    let fc = fc.expect("a function call item");
    assert_eq!(fc["name"], "calc");
    let call_id = fc["call_id"].as_str().expect("call id").to_string();
    let recorded = g.get_json("/v1/trajectories/resp-tools").await;
    assert_eq!(
        recorded["calls"][0]["response"]["tool_calls"][0]["id"],
        call_id.as_str()
    );

    mock.push(Scripted::ids(
        r.encode("4")
            .expect("enc")
            .into_iter()
            .chain([im_end])
            .collect(),
    ));
    let second: Value = g
        .post(
            path,
            json!({"previous_response_id": first["id"], "tools": tools,
            "input": [{"type": "function_call_output", "call_id": call_id, "output": "4"}],
            "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let continued = [ids(&first["prompt_token_ids"]), sampled].concat();
    let prompt2 = ids(&second["prompt_token_ids"]);
    assert_eq!(&prompt2[..continued.len()], &continued[..]);
    assert_eq!(second["output"][0]["content"][0]["text"], "4");
}

#[tokio::test]
async fn a_rebuilt_trajectory_continues_a_response_exactly() {
    // The first gateway records; a second one over the same store (a
    // restart) continues by previous_response_id from the stored calls.
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let mock = MockVllm::start(ok_reply()).await;
    let store_cfg = format!("[store]\nurl = \"{url}\"\n");
    let g1 = start_gateway(config(&[mock.url()], &store_cfg)).await;
    let first: Value = g1
        .post(
            "/v1/responses",
            json!({"instructions": "be kind", "input": "hi", "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    drop(g1);
    let g2 = start_gateway(config(&[mock.url()], &store_cfg)).await;
    let resp = g2
        .post(
            "/v1/responses",
            json!({"instructions": "be kind", "input": "more",
            "previous_response_id": first["id"], "return_token_ids": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let tid = resp.headers()["x-trajectory-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    let second: Value = resp.json().await.expect("json");
    let continued = [ids(&first["prompt_token_ids"]), ids(&first["token_ids"])].concat();
    let prompt2 = ids(&second["prompt_token_ids"]);
    assert_eq!(&prompt2[..continued.len()], &continued[..]);
    let t = g2.get_json(&format!("/v1/trajectories/{tid}")).await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
    assert_eq!(t["calls"][1]["drift"], Value::Null, "{t}");
}

#[tokio::test]
async fn streamed_and_whole_answers_agree() {
    let (_mock, g) = gateway().await;
    let whole: Value = g
        .post("/t/resp-agree-1/v1/responses", json!({"input": "hi"}))
        .await
        .json()
        .await
        .expect("json");
    let resp = g
        .post(
            "/t/resp-agree-2/v1/responses",
            json!({"input": "hi", "stream": true}),
        )
        .await;
    let events = sse_events(resp).await;
    let done: Value = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|e| e["type"] == "response.completed")
        .expect("completed");
    let streamed = &done["response"];
    assert_eq!(
        streamed["output"][0]["content"],
        whole["output"][0]["content"]
    );
    assert_eq!(streamed["usage"], whole["usage"]);
}
