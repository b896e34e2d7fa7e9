//! `tito engine` answers the vLLM `/v1/completions` and SGLang `/generate`
//! shapes, and the vLLM client in `tito::backend::vllm` reads its answers.
#![cfg(feature = "engine")]

mod engine_support;

use futures::StreamExt;
use serde_json::{json, Value};
use tito::backend::Backend;
use tito::engine::server::{app, EngineServer};

async fn spawn_server() -> String {
    let cfg = engine_support::config(4);
    let state = tokio::task::spawn_blocking(move || EngineServer::start(&cfg))
        .await
        .expect("join")
        .expect("engine server starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app(state)).await.expect("serve");
    });
    format!("http://{addr}")
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_server_speaks_vllm_and_sglang() {
    let base = spawn_server().await;
    let prompt = engine_support::encode("The capital of France is");

    // vLLM completions, token-id prompt, logprobs keyed by id.
    let (status, v) = post(
        &base,
        "/v1/completions",
        json!({
            "prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true,
            "logprobs": 2, "return_token_ids": true, "return_tokens_as_token_ids": true,
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    let ids: Vec<u64> = serde_json::from_value(choice["token_ids"].clone()).expect("token_ids");
    assert_eq!(ids.len(), 5);
    assert_eq!(choice["prompt_token_ids"], json!(prompt));
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        choice["logprobs"]["tokens"][0],
        format!("token_id:{}", ids[0])
    );
    assert_eq!(
        choice["logprobs"]["token_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(5)
    );
    assert!(choice["logprobs"]["top_logprobs"][0]
        .as_object()
        .is_some_and(|m| m.len() >= 2));
    assert!(!choice["text"].as_str().unwrap_or("").is_empty());
    assert_eq!(v["usage"]["completion_tokens"], 5);

    // Text prompt gives the same greedy ids.
    let (_, t) = post(
        &base,
        "/v1/completions",
        json!({
            "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0,
            "ignore_eos": true, "return_token_ids": true,
        }),
    )
    .await;
    assert_eq!(t["choices"][0]["token_ids"], choice["token_ids"]);

    // SGLang generate.
    let (status, g) = post(
        &base,
        "/generate",
        json!({
            "input_ids": prompt, "return_logprob": true,
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true},
        }),
    )
    .await;
    assert_eq!(status, 200, "{g}");
    assert_eq!(g["output_ids"], choice["token_ids"]);
    assert_eq!(g["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(g["meta_info"]["prompt_tokens"], prompt.len());
    let lps = g["meta_info"]["output_token_logprobs"]
        .as_array()
        .expect("logprobs");
    assert_eq!(lps.len(), 5);
    assert_eq!(lps[0][1], ids[0]);
    assert_eq!(lps[0][0], choice["logprobs"]["token_logprobs"][0]);

    // OpenAI-shaped error.
    let (status, e) = post(
        &base,
        "/v1/completions",
        json!({"prompt": [], "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"]["message"].as_str().is_some(), "{e}");

    // The gateway's vLLM client reads the engine (it always streams).
    let toml =
        format!("[[backends]]\nurl = \"{base}\"\nkind = \"engine\"\n[model]\ntokenizer = \"x\"\n");
    let config = tito::Config::from_toml(&toml).expect("config");
    let client =
        tito::backend::vllm::VllmBackend::new(&config.backends[0], &config.router).expect("client");
    {
        let mut req = engine_support::request(&prompt, engine_support::greedy(5));
        req.params.logprobs = Some(1);
        let mut s = client.generate(req).await.expect("generate");
        let mut gen = tito::backend::Generation::default();
        while let Some(ev) = s.next().await {
            gen.push(ev.expect("event"));
        }
        let got: Vec<u64> = gen.ids.iter().map(|&i| u64::from(i)).collect();
        assert_eq!(got, ids);
        assert_eq!(gen.logprobs.len(), 5);
        assert_eq!(gen.finish_reason, Some(tito::backend::FinishReason::Length));
    }
    // An output constraint travels over the wire (vLLM's
    // `structured_outputs`) and the engine honours it.
    {
        let mut req = engine_support::request(&prompt, engine_support::greedy(64));
        req.params.structured = Some(tito::backend::StructuredOutput::JsonSchema(json!({
            "type": "object", "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"], "additionalProperties": false})));
        let mut s = client.generate(req).await.expect("generate");
        let mut gen = tito::backend::Generation::default();
        while let Some(ev) = s.next().await {
            gen.push(ev.expect("event"));
        }
        let src = tito::render::gguf::load_tokenizer(&engine_support::model_path()).expect("tok");
        let text = src.tokenizer.decode(&gen.ids, true).expect("decodes");
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
        assert!(v["ok"].is_boolean(), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_server_streams_sse_with_done() {
    let base = spawn_server().await;
    let prompt = engine_support::encode("Hello");
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": true, "stream": true, "return_token_ids": true}),
        ),
        (
            "/generate",
            json!({"input_ids": prompt, "stream": true, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": true}}),
        ),
    ] {
        let events = sse_data(&base, path, body).await;
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{path}: {events:?}"
        );
        let last: Value = serde_json::from_str(&events[events.len() - 2]).expect("JSON event");
        if path == "/generate" {
            assert_eq!(
                last["output_ids"].as_array().map(Vec::len),
                Some(3),
                "{last}"
            );
        } else {
            assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
        }
    }
}

/// The `data:` payloads of the SSE body a streamed request gets, `[DONE]`
/// included.
async fn sse_data(base: &str, path: &str, body: Value) -> Vec<String> {
    let text = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// The JSON events of an SSE body, `[DONE]` left out.
async fn events(base: &str, path: &str, body: Value) -> Vec<Value> {
    sse_data(base, path, body)
        .await
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("JSON event"))
        .collect()
}

/// The last JSON event of an SSE body (before `[DONE]`).
async fn last_event(base: &str, path: &str, body: Value) -> Value {
    events(base, path, body).await.pop().expect("an event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_server_fills_stop_reason_as_vllm() {
    let base = spawn_server().await;
    let prompt = engine_support::encode("The capital of France is");
    let greedy = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0,
                        "ignore_eos": true, "return_token_ids": true});
    let (status, v) = post(&base, "/v1/completions", greedy.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["stop_reason"], Value::Null);
    let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).expect("ids");
    // Greedy again, stopping on the third token (at its first occurrence).
    let stop = ids[2];
    let upto = ids.iter().position(|&t| t == stop).expect("present") + 1;
    let mut body = greedy;
    body["stop_token_ids"] = json!([stop]);
    let (status, v) = post(&base, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    assert_eq!(c["stop_reason"], json!(stop), "{v}");
    assert_eq!(c["token_ids"], json!(ids[..upto]));
    body["stream"] = json!(true);
    let last = last_event(&base, "/v1/completions", body).await;
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{last}");
    assert_eq!(last["choices"][0]["stop_reason"], json!(stop), "{last}");
}

/// Parameters vLLM refuses are refused here too, before any generation (a
/// direct client is not checked by the gateway); `/health` says the engine
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_server_refuses_what_vllm_refuses() {
    let base = spawn_server().await;
    let prompt = engine_support::encode("Hello");
    for (path, extra, param) in [
        ("/v1/completions", json!({"logprobs": 21}), "logprobs"),
        (
            "/v1/completions",
            json!({"repetition_penalty": 0.0}),
            "repetition_penalty",
        ),
        ("/v1/completions", json!({"top_k": -2}), "top_k"),
        (
            "/generate",
            json!({"sampling_params": {"repetition_penalty": -1.0}}),
            "repetition_penalty",
        ),
        (
            "/generate",
            json!({"sampling_params": {"top_k": -5}}),
            "top_k",
        ),
    ] {
        let mut body = json!({"max_tokens": 2});
        if path == "/generate" {
            body = json!({"input_ids": prompt});
        } else {
            body["prompt"] = json!(prompt);
        }
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, e) = post(&base, path, body).await;
        assert_eq!(
            (status, e["error"]["param"].as_str()),
            (400, Some(param)),
            "{path}: {e}"
        );
    }
    let health = reqwest::get(format!("{base}/health"))
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
}

/// A streamed reply's text, decoded as its ids arrive, is the text the same
/// reply gets whole: vLLM's deltas joined, SGLang's last (cumulative) text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_is_the_whole_replys_text() {
    let base = spawn_server().await;
    let prompt = engine_support::encode("Write a short poem about the sea, with emoji.");
    let vllm = json!({"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": true,
        "return_token_ids": true});
    let (status, whole) = post(&base, "/v1/completions", vllm.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let mut streamed = vllm;
    streamed["stream"] = json!(true);
    let chunks = events(&base, "/v1/completions", streamed).await;
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, whole["choices"][0]["text"].as_str().expect("text"));
    assert!(!joined.is_empty());

    let sglang = json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 48,
        "temperature": 0, "ignore_eos": true}});
    let (status, whole) = post(&base, "/generate", sglang.clone()).await;
    assert_eq!(status, 200, "{whole}");
    let mut streamed = sglang;
    streamed["stream"] = json!(true);
    let chunks = events(&base, "/generate", streamed).await;
    let last = chunks.last().expect("an event");
    assert_eq!(last["output_ids"], whole["output_ids"]);
    assert_eq!(last["text"], whole["text"]);
    // Each chunk's text is the text of the chunks before it, and more.
    for pair in chunks.windows(2) {
        let (a, b) = (pair[0]["text"].as_str(), pair[1]["text"].as_str());
        assert!(
            b.unwrap_or_default().starts_with(a.unwrap_or_default()),
            "{pair:?}"
        );
    }
}
