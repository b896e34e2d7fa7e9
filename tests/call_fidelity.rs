//! What an unmodified agent leaves in the store: real logprobs whatever the
//! client asked (null where the backend gave none), one recorded call per
//! retried or re-keyed request, a graceful end when the response budget is
//! spent, and backends that hang before their first token given up and
//! retried elsewhere.

mod common;

use std::time::Duration;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

/// The mock's logprob for a sampled token: a known function of its id.
fn lp_of(id: u32) -> f32 {
    -((id % 37) as f32) / 8.0 - 0.125
}

fn scripted(g: &Gateway, text: &str) -> Scripted {
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    scripted_ids(ids)
}

/// A reply of exactly these ids, with the known logprob of each.
fn scripted_ids(ids: Vec<u32>) -> Scripted {
    Scripted {
        logprobs: Some(ids.iter().map(|i| lp_of(*i)).collect()),
        ids,
        ..Default::default()
    }
}

fn chat_body(user: &str) -> Value {
    json!({"model": "test-model", "messages": [{"role": "user", "content": user}],
           "return_token_ids": true})
}

async fn post_with(
    g: &Gateway,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = g.client.post(g.url(path)).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("gateway reachable")
}

/// Posts a first user turn on `path`, then returns that answer and the
/// messages of the next turn (first turn, the served reply, `then`).
async fn first_turn(g: &Gateway, path: &str, first: &str, then: &str) -> (Value, Value) {
    let r = g
        .post_json(
            path,
            json!({"messages": [{"role": "user", "content": first}]}),
        )
        .await;
    let served = r["choices"][0]["message"]["content"].clone();
    let next = json!([{"role": "user", "content": first}, {"role": "assistant", "content": served},
                      {"role": "user", "content": then}]);
    (r, next)
}

async fn calls_of(g: &Gateway, tid: &str) -> Vec<Value> {
    g.get_json(&format!("/v1/trajectories/{tid}")).await["calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn logprobs_are_recorded_when_the_client_did_not_ask() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let s = scripted(&g, "The capital is Paris.");
    let ids = s.ids.clone();
    mock.push(s);
    let r = g
        .post("/t/lp-1/v1/chat/completions", chat_body("capital?"))
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    // The client did not ask: its response carries none...
    assert_eq!(body["choices"][0]["logprobs"], Value::Null);
    assert_eq!(body["choices"][0]["token_ids"], json!(ids));
    // ...but the backend was asked for the sampled token's logprob...
    assert_eq!(mock.last_request()["logprobs"], 0);
    // ...and the export has exactly the backend's numbers.
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1);
    let want: Vec<Value> = ids.iter().map(|i| json!(lp_of(*i))).collect();
    assert_eq!(rows[0]["response_logprobs"], json!(want));
}

#[tokio::test]
async fn top_logprobs_asked_by_the_client_are_still_answered() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let s = scripted(&g, "ok");
    let ids = s.ids.clone();
    mock.push(s);
    let mut b = chat_body("x");
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(2);
    let body = g.post_json("/t/lp-2/v1/chat/completions", b).await;
    assert_eq!(mock.last_request()["logprobs"], 2);
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), ids.len());
    for (c, id) in content.iter().zip(&ids) {
        assert_eq!(c["logprob"], json!(f64::from(lp_of(*id))));
        assert_eq!(c["top_logprobs"].as_array().expect("top").len(), 2);
    }
}

#[tokio::test]
async fn a_backend_without_logprobs_leaves_nulls_never_zeros() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut s = scripted(&g, "no numbers here");
    s.no_logprobs = true;
    let n = s.ids.len();
    mock.push(s);
    let r = g.post("/t/lp-3/v1/chat/completions", chat_body("x")).await;
    assert_eq!(r.status(), 200);
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows[0]["response_logprobs"], json!(vec![Value::Null; n]));
    let metrics = g.get_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tito_calls_without_logprobs_total") && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// Sends the same body twice, the second time as the OpenAI SDK retries.
async fn original_then_retry(g: &Gateway, path: &str, body: &Value) -> (Value, Value) {
    let a: Value = post_with(g, path, body, &[("x-stainless-retry-count", "0")])
        .await
        .json()
        .await
        .expect("json");
    let b: Value = post_with(g, path, body, &[("x-stainless-retry-count", "1")])
        .await
        .json()
        .await
        .expect("json");
    (a, b)
}

#[tokio::test]
async fn sdk_retry_with_the_same_body_gets_the_recorded_answer() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(scripted(&g, "first answer"));
    mock.push(scripted(&g, "a second generation"));
    let body = chat_body("hello");
    let (a, b) = original_then_retry(&g, "/t/retry-1/v1/chat/completions", &body).await;
    assert_eq!(a["id"], b["id"]);
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(a["prompt_token_ids"], b["prompt_token_ids"]);
    assert_eq!(mock.requests().len(), 1, "the backend was called once");
    assert_eq!(calls_of(&g, "retry-1").await.len(), 1);

    // The same body without the retry header is a new call.
    let c = g.post_json("/t/retry-1/v1/chat/completions", body).await;
    assert_ne!(c["id"], a["id"]);
    assert_eq!(mock.requests().len(), 2);
}

/// Without a trajectory id a body names nobody's call: two agents sending
/// the same prompt (one group's samples), the second a retry after a 429
/// that was never generated, each get their own generation and trajectory.
/// `Idempotency-Key` still finds an unnamed call.
#[tokio::test]
async fn sdk_retry_without_a_trajectory_id_is_not_answered_with_another_agents_call() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(scripted(&g, "agent a's answer"));
    mock.push(scripted(&g, "agent b's answer"));
    let (a, b) = original_then_retry(&g, "/v1/chat/completions", &chat_body("same prompt")).await;
    assert_ne!(a["id"], b["id"]);
    assert_ne!(a["choices"], b["choices"]);
    assert_eq!(mock.requests().len(), 2);
    let list = g.get_json("/v1/trajectories").await;
    assert_eq!(list["data"].as_array().expect("data").len(), 2);

    mock.push(scripted(&g, "keyed once"));
    let keyed = chat_body("keyed");
    let mut answers = Vec::new();
    for retry in ["0", "1"] {
        let key = [
            ("idempotency-key", "unnamed-1"),
            ("x-stainless-retry-count", retry),
        ];
        let resp = post_with(&g, "/v1/chat/completions", &keyed, &key).await;
        answers.push(resp.json::<Value>().await.expect("json"));
    }
    let (c, d) = (&answers[0], &answers[1]);
    assert_eq!(c["id"], d["id"]);
    assert_eq!(c["choices"], d["choices"]);
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn a_retry_of_an_older_call_generates_again() {
    // Only the trajectory's last call is answered again by body.
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    for t in ["one", "two", "three"] {
        mock.push(scripted(&g, t));
    }
    let path = "/t/retry-old/v1/chat/completions";
    let first = chat_body("first");
    post_with(&g, path, &first, &[]).await;
    post_with(&g, path, &chat_body("second"), &[]).await;
    let again = post_with(&g, path, &first, &[("x-stainless-retry-count", "1")]).await;
    assert_eq!(again.status(), 200);
    assert_eq!(mock.requests().len(), 3);
}

#[tokio::test]
async fn idempotency_key_replays_chat_and_completions() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(scripted(&g, "keyed"));
    let path = "/t/key-1/v1/chat/completions";
    let a: Value = post_with(&g, path, &chat_body("k"), &[("idempotency-key", "K1")])
        .await
        .json()
        .await
        .expect("json");
    // Same key, the same JSON serialized another way: the recorded answer.
    let reordered = format!(
        "{{ \"return_token_ids\": true, \"messages\": {}, \"model\": \"test-model\" }}",
        chat_body("k")["messages"]
    );
    let b: Value = g
        .client
        .post(g.url(path))
        .header("idempotency-key", "K1")
        .header("content-type", "application/json")
        .body(reordered)
        .send()
        .await
        .expect("reachable")
        .json()
        .await
        .expect("json");
    assert_eq!(a, b);
    assert_eq!(mock.requests().len(), 1);
    // Same key with another body, on either endpoint: refused, not answered
    // with the other request's call.
    for (p, body) in [
        (path, chat_body("other")),
        ("/t/key-1/v1/completions", json!({"prompt": [1, 2]})),
    ] {
        let r = post_with(&g, p, &body, &[("idempotency-key", "K1")]).await;
        assert_eq!(r.status(), 409, "{p}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["code"], "idempotency_key_reused", "{e}");
    }
    assert_eq!(mock.requests().len(), 1);

    mock.push(Scripted::ids(vec![5, 6, 7, IM_END]));
    let cbody = json!({"prompt": [1, 2, 3], "return_token_ids": true});
    let cpath = "/t/key-2/v1/completions";
    let c: Value = post_with(&g, cpath, &cbody, &[("idempotency-key", "K2")])
        .await
        .json()
        .await
        .expect("json");
    let d: Value = post_with(&g, cpath, &cbody, &[("idempotency-key", "K2")])
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(c, d);
    assert_eq!(c["choices"][0]["token_ids"], json!([5, 6, 7, IM_END]));
    assert_eq!(mock.requests().len(), 2);
    assert_eq!(calls_of(&g, "key-2").await.len(), 1);
}

/// The concatenated `token_ids` of an SSE chat or completions stream, and
/// the finish reason.
fn streamed_ids(events: &[String]) -> (Vec<u64>, String) {
    let mut ids = Vec::new();
    let mut finish = String::new();
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(e).expect("chunk json");
        for c in v["choices"].as_array().into_iter().flatten() {
            for id in c["token_ids"].as_array().into_iter().flatten() {
                ids.push(id.as_u64().expect("id"));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (ids, finish)
}

#[tokio::test]
async fn streamed_retry_replays_the_recorded_stream() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let s = scripted(&g, "streamed once");
    let want: Vec<u64> = s.ids.iter().map(|i| u64::from(*i)).collect();
    mock.push(s);
    let mut body = chat_body("stream it");
    body["stream"] = json!(true);
    let path = "/t/retry-s/v1/chat/completions";
    let first = sse_events(post_with(&g, path, &body, &[]).await).await;
    let again =
        sse_events(post_with(&g, path, &body, &[("x-stainless-retry-count", "2")]).await).await;
    assert_eq!(streamed_ids(&first), (want.clone(), "stop".to_string()));
    assert_eq!(streamed_ids(&again), (want, "stop".to_string()));
    assert_eq!(again.last().map(String::as_str), Some("[DONE]"));
    let content = |events: &[String]| -> String {
        events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    };
    assert_eq!(content(&first), "streamed once");
    assert_eq!(content(&again), "streamed once");
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(calls_of(&g, "retry-s").await.len(), 1);
}

#[tokio::test]
async fn a_retry_during_the_original_waits_for_it() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut s = scripted(&g, "slow but single");
    s.token_delay_ms = 20;
    mock.push(s);
    mock.push(scripted(&g, "must not be generated"));
    let body = chat_body("slow");
    let path = "/t/retry-w/v1/chat/completions";
    let (a, b) = tokio::join!(
        post_with(&g, path, &body, &[("idempotency-key", "W")]),
        post_with(&g, path, &body, &[("idempotency-key", "W")]),
    );
    let a: Value = a.json().await.expect("json");
    let b: Value = b.json().await.expect("json");
    assert_eq!(a, b);
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(calls_of(&g, "retry-w").await.len(), 1);
}

#[tokio::test]
async fn a_spent_budget_ends_the_sample_with_length() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "[trajectory]\nresponse_length = 6\n")).await;
    mock.push(scripted(&g, "a long answer that will not fit"));
    let path = "/t/budget-1/v1/chat/completions";
    let (r, m2) = first_turn(&g, path, "go", "more").await;
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let resp = g.post(path, json!({"messages": m2})).await;
    assert_eq!(resp.status(), 200);
    let r2: Value = resp.json().await.expect("json");
    assert_eq!(r2["choices"][0]["finish_reason"], "length");
    assert_eq!(r2["choices"][0]["message"]["content"], "");
    assert_eq!(r2["usage"]["completion_tokens"], 0);
    assert_eq!(
        mock.requests().len(),
        1,
        "no backend call for a spent budget"
    );
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["truncated"], true);
    assert_eq!(rows[0]["num_turns"], 2);

    // Streamed: the same, as SSE.
    let resp = g.post(path, json!({"messages": m2, "stream": true})).await;
    assert_eq!(resp.status(), 200);
    let events = sse_events(resp).await;
    assert_eq!(streamed_ids(&events), (vec![], "length".to_string()));
    assert_eq!(mock.requests().len(), 1);
}

/// A reply whose EOS is the last token the budget allows ended on its own:
/// it is "stop", and the sample is not exported as truncated.
#[tokio::test]
async fn eos_on_the_budget_s_last_token_is_a_natural_end() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "[trajectory]\nresponse_length = 6\n")).await;
    let a = g.renderer.encode("a").expect("encodes")[0];
    let s = scripted_ids(vec![a, a, a, a, a, IM_END]);
    mock.push(s);
    let r = g
        .post_json("/t/budget-eos/v1/chat/completions", chat_body("go"))
        .await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["truncated"], false, "{}", rows[0]);
}

/// An agent with a fixed `max_tokens` larger than the window has room for:
/// the sample's budget caps what is asked first, and what is asked fits.
#[tokio::test]
async fn the_budget_caps_max_tokens_before_the_window_is_checked() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "[trajectory]\nresponse_length = 6\n")).await;
    mock.push(scripted(&g, "capped"));
    let body = json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 600});
    let resp = g
        .post("/t/budget-cap/v1/chat/completions", body.clone())
        .await;
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    assert_eq!(mock.last_request()["max_tokens"], 6);
    // Without a budget, the same request does not fit the 512-token window.
    let plain = start_gateway(config(&[mock.url()], "")).await;
    let resp = plain.post("/t/no-budget/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_spent_budget_can_still_be_an_error() {
    let mock = MockVllm::start(Scripted::default()).await;
    let extra = "[trajectory]\nresponse_length = 4\non_budget_exhausted = \"error\"\n";
    let g = start_gateway(config(&[mock.url()], extra)).await;
    mock.push(scripted(&g, "too long to fit"));
    let path = "/t/budget-2/v1/chat/completions";
    let (_, m2) = first_turn(&g, path, "go", "more").await;
    let resp = g.post(path, json!({"messages": m2})).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.expect("json");
    assert_eq!(e["error"]["code"], "response_budget_exhausted");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn a_backend_hung_before_its_first_token_is_given_up_and_retried() {
    for stream in [false, true] {
        let hung = MockVllm::start(Scripted {
            ids: vec![1, 2, 3],
            hang_after: Some(0),
            ..Default::default()
        })
        .await;
        let ok = MockVllm::start(Scripted::ids(vec![7, 8, IM_END])).await;
        let extra = "[router]\npolicy = \"round_robin\"\nfirst_token_timeout_ms = 300\n";
        let g = start_gateway(config(&[hung.url(), ok.url()], extra)).await;
        let mut body = json!({"prompt": [4, 5], "return_token_ids": true, "stream": stream});
        for i in 0..2 {
            body["trajectory_id"] = json!(format!("hung-{stream}-{i}"));
            let resp = tokio::time::timeout(
                Duration::from_secs(20),
                g.post("/v1/completions", body.clone()),
            )
            .await
            .expect("answered");
            assert_eq!(resp.status(), 200);
            let ids = if stream {
                streamed_ids(&sse_events(resp).await).0
            } else {
                let v: Value = resp.json().await.expect("json");
                v["choices"][0]["token_ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect()
            };
            assert_eq!(ids, vec![7, 8, u64::from(IM_END)]);
        }
        assert!(!hung.requests().is_empty(), "the hung backend was tried");
    }
}

/// A backend that aborts a request before its first token (paused for a
/// weight update) generated nothing: the call goes to another backend, and
/// with none left it is a 503, not a recorded call of no tokens.
#[tokio::test]
async fn a_backend_abort_before_the_first_token_is_retried_elsewhere() {
    let aborting = || Scripted {
        ids: vec![],
        finish_reason: Some("abort".into()),
        ..Default::default()
    };
    let paused = MockVllm::start(aborting()).await;
    let ok = MockVllm::start(Scripted::ids(vec![7, 8, IM_END])).await;
    let extra = "[router]\npolicy = \"round_robin\"\n";
    let g = start_gateway(config(&[paused.url(), ok.url()], extra)).await;
    for i in 0..2 {
        let body = json!({"prompt": [4, 5], "return_token_ids": true,
                          "trajectory_id": format!("paused-{i}")});
        let v = g.post_json("/v1/completions", body).await;
        assert_eq!(v["choices"][0]["token_ids"], json!([7, 8, IM_END]), "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    assert!(
        !paused.requests().is_empty(),
        "the paused backend was tried"
    );

    let only = start_gateway(config(&[paused.url()], "")).await;
    let body = json!({"prompt": [4, 5], "trajectory_id": "paused-only"});
    let resp = only.post("/v1/completions", body).await;
    assert_eq!(resp.status(), 503);
    assert!(calls_of(&only, "paused-only").await.is_empty());
}

/// A backend that aborts a request after some tokens cut a sample the model
/// did not end: the client gets a 503 (a stream: an error event), and
/// nothing is recorded, so the client's retry starts the turn again.
#[tokio::test]
async fn a_backend_abort_after_tokens_is_an_error_and_records_nothing() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    for stream in [false, true] {
        mock.push(Scripted {
            ids: vec![7, 8],
            finish_reason: Some("abort".into()),
            ..Default::default()
        });
        let tid = format!("cut-{stream}");
        let body = json!({"prompt": [4, 5], "trajectory_id": tid, "stream": stream});
        let resp = g.post("/v1/completions", body).await;
        if stream {
            let events = sse_events(resp).await;
            let error = events
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .find(|e| e.get("error").is_some());
            assert!(error.is_some(), "an error event: {events:?}");
        } else {
            assert_eq!(resp.status(), 503);
        }
        assert!(calls_of(&g, &tid).await.is_empty(), "stream {stream}");
    }
}

/// SGLang's `/generate`, streaming the whole answer in one cumulative event,
/// with `output_token_logprobs` when asked (`null` logprobs when `bare`).
async fn sglang_mock(
    answer: Vec<u32>,
    bare: bool,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::{get, post};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let generate = move |axum::Json(body): axum::Json<Value>| {
        let answer = answer.clone();
        let log = log.clone();
        async move {
            let asked = body["return_logprob"] == json!(true);
            log.lock().expect("lock").push(body);
            let lps: Vec<Value> = answer
                .iter()
                .map(|id| json!([if bare { Value::Null } else { json!(lp_of(*id)) }, id, null]))
                .collect();
            let mut meta = json!({"completion_tokens": answer.len(),
                                  "finish_reason": {"type": "stop", "matched": IM_END}});
            if asked {
                meta["output_token_logprobs"] = json!(lps);
            }
            let ev = json!({"output_ids": answer, "meta_info": meta});
            (
                [("content-type", "text/event-stream")],
                format!("data: {ev}\n\ndata: [DONE]\n\n"),
            )
        }
    };
    let app = axum::Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn sglang_logprobs_are_recorded_and_missing_ones_are_null() {
    for bare in [false, true] {
        let renderer = tito::render::testing::chatml_renderer();
        let mut answer = renderer.encode("from sglang").expect("encodes");
        answer.push(IM_END);
        let (url, seen) = sglang_mock(answer.clone(), bare).await;
        let extra = format!("[[backends]]\nurl = \"{url}\"\nkind = \"sglang\"\n");
        let g = start_gateway(config(&[], &extra)).await;
        let r = g.post("/t/sg-1/v1/chat/completions", chat_body("hi")).await;
        assert_eq!(r.status(), 200);
        let sent = seen
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .expect("a request");
        assert_eq!(sent["return_logprob"], true);
        assert_eq!(sent["top_logprobs_num"], 0);
        let rows = g.export_jsonl("layout=trajectory").await;
        let want: Vec<Value> = answer
            .iter()
            .map(|id| if bare { Value::Null } else { json!(lp_of(*id)) })
            .collect();
        assert_eq!(rows[0]["response_logprobs"], json!(want), "bare = {bare}");
    }
}

#[tokio::test]
async fn queued_acks_answer_before_the_commit_and_still_record_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = MockVllm::start(Scripted::default()).await;
    let extra = format!(
        "[store]\nurl = \"sqlite://{}/spans.db\"\nack = \"queued\"\n",
        dir.path().display()
    );
    let g = start_gateway(config(&[mock.url()], &extra)).await;
    mock.push(scripted(&g, "first"));
    mock.push(scripted(&g, "second"));
    let path = "/t/queued-1/v1/chat/completions";
    let (_, m2) = first_turn(&g, path, "a", "b").await;
    let r2 = g.post(path, json!({"messages": m2})).await;
    assert_eq!(r2.status(), 200);
    // `finish` is committed after every call answered before it.
    let f = g.post("/v1/trajectories/queued-1/finish", json!({})).await;
    assert_eq!(f.status(), 200);
    let calls = calls_of(&g, "queued-1").await;
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1]["parent_call"], 0);
    let t = g.get_json("/v1/trajectories/queued-1").await;
    assert_eq!(t["incomplete"], false);
}

#[tokio::test]
async fn a_call_slot_taken_by_another_gateway_catches_up_instead_of_failing() {
    // Two gateways over one store: each keeps its own hot view, so the
    // second to record a turn finds its call slot taken.
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let mock = MockVllm::start(Scripted::default()).await;
    let cfg = || config(&[mock.url()], &format!("[store]\nurl = \"{url}\"\n"));
    let store = tito::store::open(&url).expect("store");
    let renderer = tito::render::testing::chatml_renderer();
    let a = common::start_gateway_on(cfg(), renderer.clone(), store.clone()).await;
    let b = common::start_gateway_on(cfg(), renderer, store).await;
    for t in ["one", "two", "three"] {
        mock.push(scripted(&a, t));
    }
    let path = "/t/shared-1/v1/chat/completions";
    let (_, m2) = first_turn(&a, path, "start", "go on").await;
    // B loads the trajectory (one call) and records call 1.
    assert_eq!(b.post(path, json!({"messages": m2})).await.status(), 200);
    // A still thinks slot 1 is free: its commit meets the store's call 1,
    // reads the call it lacks, and records in slot 2.
    let resp = a.post(path, json!({"messages": m2})).await;
    assert_eq!(resp.status(), 200);
    let calls = calls_of(&a, "shared-1").await;
    let idx: Vec<u64> = calls
        .iter()
        .filter_map(|c| c["call_index"].as_u64())
        .collect();
    assert_eq!(idx, vec![0, 1, 2]);
    assert_eq!(calls[2]["parent_call"], 0);
    assert_ne!(calls[2]["sample_index"], calls[1]["sample_index"]);
}
