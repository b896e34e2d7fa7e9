//! A backend answer the gateway cannot decode is that call's error only: a
//! 502 naming the backend, counted in `tito_backend_protocol_errors_total`,
//! and never a step toward opening the backend's circuit, so other clients
//! keep being served.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

#[tokio::test]
async fn undecodable_answers_fail_their_call_and_leave_the_circuit_closed() {
    let mock = MockVllm::start(Scripted::ids(vec![5, 6, IM_END])).await;
    let extra = "[router]\nfailure_threshold = 2\nmax_attempts = 1\n";
    let g = start_gateway(config(&[mock.url()], extra)).await;
    // More undecodable answers in a row than the failure threshold.
    for _ in 0..4 {
        mock.push(Scripted {
            garbage: true,
            ..Default::default()
        });
        let r = g.post("/v1/completions", json!({"prompt": [1, 2]})).await;
        assert_eq!(r.status(), 502);
        let e: Value = r.json().await.expect("json");
        let msg = e["error"]["message"].as_str().expect("message");
        assert!(
            msg.contains(&mock.url()) || msg.contains("127.0.0.1"),
            "{msg}"
        );
    }
    // Another client is still served by the same backend.
    let r = g
        .post(
            "/v1/completions",
            json!({"prompt": [3, 4], "return_token_ids": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["choices"][0]["token_ids"], json!([5, 6, IM_END]));
    let backends = g.get_json("/admin/backends").await;
    assert_eq!(backends["backends"][0]["circuit"], "closed", "{backends}");
    let metrics = g.get_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tito_backend_protocol_errors_total") && l.ends_with(" 4")),
        "{metrics}"
    );
}

#[tokio::test]
async fn null_optional_fields_in_a_backend_answer_are_served() {
    let mock = MockVllm::start(Scripted {
        ids: vec![5, 6, IM_END],
        null_optionals: true,
        ..Default::default()
    })
    .await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let body = json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
                      "top_logprobs": 2, "return_token_ids": true});
    let r = g.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), 3);
    assert!(content
        .iter()
        .all(|c| c["logprob"].is_f64() && c["top_logprobs"].as_array().is_some_and(Vec::is_empty)));
    let backends = g.get_json("/admin/backends").await;
    assert_eq!(
        backends["backends"][0]["consecutive_failures"], 0,
        "{backends}"
    );
}
