//! The mock vLLM writes its streamed events as text, not through a JSON
//! tree: pinned here byte for byte against vLLM's shape, so the tests that
//! read it keep reading what vLLM sends (key order, a float32 logprob widened
//! to a Python float, `null` for an optional left out).

#[path = "common/mock_vllm.rs"]
mod mock_vllm;

use mock_vllm::{MockVllm, Scripted};
use serde_json::json;

async fn stream(mock: &MockVllm, script: Scripted, logprobs: u64) -> String {
    mock.push(script);
    let body = json!({"prompt": [1, 2], "max_tokens": 4, "stream": true, "logprobs": logprobs});
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", mock.url()))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    r.text().await.expect("body")
}

#[tokio::test]
async fn streamed_events_are_vllm_shaped_byte_for_byte() {
    let mock = MockVllm::start(Scripted::ids(vec![7])).await;
    let script = Scripted {
        logprobs: Some(vec![-0.51, f32::NEG_INFINITY]),
        finish_reason: Some("length".into()),
        ..Scripted::ids(vec![7, 8])
    };
    let top2 = stream(&mock, script.clone(), 2).await;
    assert_eq!(
        top2,
        concat!(
            r#"data: {"choices":[{"index":0,"text":"x","token_ids":[7],"finish_reason":null,"prompt_token_ids":[1,2],"logprobs":{"tokens":["token_id:7"],"token_logprobs":[-0.5099999904632568],"top_logprobs":[{"token_id:7":-0.5099999904632568,"token_id:8":-1.5099999904632568}],"text_offset":[0]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"index":0,"text":"x","token_ids":[8],"finish_reason":null,"logprobs":{"tokens":["token_id:8"],"token_logprobs":[null],"top_logprobs":[{"token_id:8":null,"token_id:9":null}],"text_offset":[0]}}]}"#,
            "\n\n",
            r#"data: {"choices":[{"index":0,"text":"","token_ids":[],"finish_reason":"length"}]}"#,
            "\n\n",
            "data: [DONE]\n\n: end\n\n",
        )
    );
    let nulls = Scripted {
        null_optionals: true,
        ..Scripted::ids(vec![5])
    };
    let sampled_only = stream(&mock, nulls, 0).await;
    assert_eq!(
        sampled_only.lines().next(),
        Some(
            r#"data: {"choices":[{"index":0,"text":"x","token_ids":[5],"finish_reason":null,"prompt_token_ids":[1,2],"logprobs":{"tokens":null,"token_logprobs":[-0.5],"top_logprobs":null,"text_offset":null},"stop_reason":null}]}"#
        )
    );
}
