//! `/v1/completions`: text or token-id prompts, vLLM's return_token_ids shape.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

#[tokio::test]
async fn token_id_prompt_passes_through_untouched() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let answer = g.renderer.encode(" world").expect("encodes");
    mock.push(Scripted::ids([answer.clone(), vec![IM_END]].concat()));
    // Ids that a text round trip would not reproduce (non-canonical split).
    let prompt = vec![
        b'H' as u32,
        b'e' as u32,
        b'l' as u32,
        b'l' as u32,
        b'o' as u32,
    ];
    let body: Value = g
        .post(
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 10, "return_token_ids": true, "logprobs": 1}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(mock.last_request()["prompt"], json!(prompt));
    let c = &body["choices"][0];
    assert_eq!(body["object"], "text_completion");
    assert_eq!(c["prompt_token_ids"], json!(prompt));
    assert_eq!(
        c["token_ids"],
        json!([answer.clone(), vec![IM_END]].concat())
    );
    assert_eq!(c["text"], " world");
    assert_eq!(
        c["logprobs"]["tokens"].as_array().expect("tokens").len(),
        answer.len() + 1
    );
    assert_eq!(body["usage"]["prompt_tokens"], 5);
}

#[tokio::test]
async fn text_prompt_is_tokenized_by_the_gateway() {
    let mock = MockVllm::start(Scripted::ids(vec![b'!' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post(
            "/v1/completions",
            json!({"prompt": "Hello <|im_end|>", "max_tokens": 5}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let want = g.renderer.encode("Hello <|im_end|>").expect("encodes");
    assert_eq!(mock.last_request()["prompt"], json!(want));
}

#[tokio::test]
async fn out_of_vocab_ids_are_rejected() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post("/v1/completions", json!({"prompt": [1, 2, 999999]}))
        .await;
    assert_eq!(r.status(), 400);
    let r = g.post("/v1/completions", json!({"prompt": []})).await;
    assert_eq!(r.status(), 400);
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn batched_prompts_and_streaming() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, b'k' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let body: Value = g
        .post(
            "/v1/completions",
            json!({"prompt": [[1, 2], [3, 4, 5]], "n": 2, "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[2]["prompt_token_ids"], json!([3, 4, 5]));
    assert_eq!(choices[3]["index"], 3);

    let resp = g
        .post(
            "/v1/completions",
            json!({"prompt": [7, 8], "stream": true, "return_token_ids": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    let events = sse_events(resp).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("json"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["prompt_token_ids"], json!([7, 8]));
    let ids: Vec<u64> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .flat_map(|ch| ch["token_ids"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_u64())
        .collect();
    assert_eq!(ids, vec![b'o' as u64, b'k' as u64, IM_END as u64]);
    let text: String = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|ch| ch["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "ok");
    assert_eq!(
        chunks.last().expect("usage")["usage"]["completion_tokens"],
        3
    );
}

#[tokio::test]
async fn unsupported_options_are_explicit_errors() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post("/v1/completions", json!({"prompt": "x", "echo": true}))
        .await;
    assert_eq!(r.status(), 400);
    let r = g
        .post("/v1/completions", json!({"prompt": "x", "suffix": "y"}))
        .await;
    assert_eq!(r.status(), 400);
}
