//! `X-Request-Id` on every answer: the client's id when it is 1 to 128
//! visible ASCII characters, else one the gateway makes; on successes,
//! errors, streams and the operational routes alike.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::json;
use tito::render::testing::IM_END;

fn echoed(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-request-id")
        .unwrap_or_else(|| panic!("no X-Request-Id on {} {}", resp.status(), resp.url()))
        .to_str()
        .expect("ASCII")
        .to_string()
}

/// `req-` and 16 lower-case hex digits.
fn is_generated(id: &str) -> bool {
    id.strip_prefix("req-")
        .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

async fn chat(g: &Gateway, id: Option<&[u8]>, stream: bool) -> reqwest::Response {
    let mut req = g
        .client
        .post(g.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream}));
    if let Some(id) = id {
        let v = reqwest::header::HeaderValue::from_bytes(id).expect("sendable header");
        req = req.header("x-request-id", v);
    }
    req.send().await.expect("gateway reachable")
}

#[tokio::test]
async fn a_valid_client_id_is_echoed_unchanged() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let long = "x".repeat(128);
    for id in ["abc-123", "Trace/9f:e@x~!", long.as_str()] {
        for stream in [false, true] {
            let resp = chat(&g, Some(id.as_bytes()), stream).await;
            assert_eq!(resp.status(), 200);
            assert_eq!(echoed(&resp), id, "stream {stream}");
            resp.text().await.expect("body");
        }
    }
}

#[tokio::test]
async fn an_id_is_made_when_none_or_an_unusable_one_is_given() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let too_long = "x".repeat(129);
    let bad: [Option<&[u8]>; 5] = [
        None,
        Some(too_long.as_bytes()),
        Some(b"with space"),
        Some(b"tab\there"),
        Some("grüße".as_bytes()),
    ];
    let mut made = Vec::new();
    for id in bad {
        let resp = chat(&g, id, false).await;
        assert_eq!(resp.status(), 200);
        let got = echoed(&resp);
        assert!(is_generated(&got), "{id:?} gave {got:?}");
        made.push(got);
    }
    made.sort();
    made.dedup();
    assert_eq!(made.len(), 5, "a new id per request");
}

#[tokio::test]
async fn errors_and_other_routes_carry_it_too() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let send = |method: reqwest::Method, path: &str, body: Option<&str>| {
        let mut r = g
            .client
            .request(method, g.url(path))
            .header("x-request-id", "r-1");
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        r.send()
    };
    use reqwest::Method;
    let cases = [
        (Method::POST, "/v1/chat/completions", Some("{not json"), 400),
        (
            Method::POST,
            "/v1/chat/completions",
            Some(r#"{"model": "other", "messages": [{"role": "user", "content": "hi"}]}"#),
            404,
        ),
        (Method::GET, "/no/such/route", None, 404),
        (Method::GET, "/v1/chat/completions", None, 405),
        (Method::GET, "/health", None, 200),
        (Method::GET, "/metrics", None, 200),
        (Method::GET, "/v1/models", None, 200),
    ];
    for (method, path, body, status) in cases {
        let resp = send(method.clone(), path, body).await.expect("reachable");
        assert_eq!(resp.status(), status, "{method} {path}");
        assert_eq!(echoed(&resp), "r-1", "{method} {path}");
    }
    // A backend failure.
    mock.push(Scripted {
        error: Some((500, "boom".into())),
        ..Default::default()
    });
    let resp = chat(&g, Some(b"r-2"), false).await;
    assert!(resp.status().is_server_error(), "{}", resp.status());
    assert_eq!(echoed(&resp), "r-2");
}

#[tokio::test]
async fn the_body_limit_answer_carries_it() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "[server]\nmax_body_bytes = 1024\n")).await;
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]});
    let resp = g
        .client
        .post(g.url("/v1/chat/completions"))
        .header("x-request-id", "r-3")
        .json(&big)
        .send()
        .await
        .expect("reachable");
    assert_eq!(resp.status(), 413);
    assert_eq!(echoed(&resp), "r-3");
}
