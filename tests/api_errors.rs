//! Every bad input gets an OpenAI-shaped error with the right status.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("error body is JSON");
    let err = body["error"].clone();
    assert!(err["message"].is_string(), "no error.message in {body}");
    assert!(err["type"].is_string(), "no error.type in {body}");
    assert!(
        err.get("param").is_some() && err.get("code").is_some(),
        "param/code keys in {body}"
    );
    (status, err)
}

async fn raw(g: &common::Gateway, path: &str, body: &'static str) -> reqwest::Response {
    g.client
        .post(g.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send")
}

#[tokio::test]
async fn bad_requests_are_400_with_reasons() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (s, e) = error_of(raw(&g, "/v1/chat/completions", "{\"messages\": [").await).await;
    assert_eq!(s, 400);
    assert!(e["message"]
        .as_str()
        .expect("msg")
        .contains("malformed JSON"));
    let (s, _) = error_of(raw(&g, "/v1/chat/completions", "").await).await;
    assert_eq!(s, 400);
    let (s, e) = error_of(
        g.post("/v1/chat/completions", json!({"model": "test-model"}))
            .await,
    )
    .await;
    assert_eq!(s, 400);
    assert!(e["message"].as_str().expect("msg").contains("messages"));
    let (s, e) = error_of(
        g.post("/v1/chat/completions", json!({"messages": []}))
            .await,
    )
    .await;
    assert_eq!((s, e["param"].as_str()), (400, Some("messages")));
    let (s, e) = error_of(
        g.post("/v1/chat/completions", json!({"messages": "hi"}))
            .await,
    )
    .await;
    assert_eq!((s, e["param"].as_str()), (400, Some("messages")));
    let cases = [
        ("temperature", json!("hot")),
        ("temperature", json!(5)),
        ("top_p", json!(1.5)),
        ("top_k", json!(0)),
        ("max_tokens", json!(0)),
        ("max_tokens", json!(-3)),
        ("n", json!(0)),
        ("seed", json!(1.5)),
        ("frequency_penalty", json!(9)),
        ("top_logprobs", json!(50)),
    ];
    for (param, value) in cases {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true});
        body[param] = value.clone();
        let (s, e) = error_of(g.post("/v1/chat/completions", body).await).await;
        assert_eq!(s, 400, "{param}={value}");
        assert_eq!(e["param"].as_str(), Some(param), "{param}={value}: {e}");
    }
    assert!(
        mock.requests().is_empty(),
        "no bad request reached the backend"
    );
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let mock = MockVllm::start(Scripted::ids(vec![b'k' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x", "name": "bob"}], "user": "u1", "metadata": {"a": 1}, "frobnicate": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn unknown_model_is_404_model_not_found() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(e["code"], "model_not_found");
    let (s, e) = error_of(
        g.post("/v1/completions", json!({"model": "gpt-9", "prompt": "x"}))
            .await,
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (404, Some("model_not_found")));
}

#[tokio::test]
async fn prompt_longer_than_context_names_both_numbers() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let long = "word ".repeat(400);
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 400);
    let msg = e["message"].as_str().expect("msg");
    assert!(msg.contains("512"), "{msg}");
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 600}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 400);
    assert!(e["message"].as_str().expect("msg").contains("600"));
}

#[tokio::test]
async fn body_over_limit_is_413() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "[server]\nmax_body_bytes = 2048\n")).await;
    let big = "x".repeat(4096);
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": big}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 413);
    assert!(e["message"].as_str().expect("msg").contains("2048"));

    // The trainer's JSON routes keep the extractor's status too.
    let reward = |body: String, content_type: &'static str| {
        g.client
            .post(g.url("/v1/trajectories/t/reward"))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let big = format!("{{\"reward\": 1.0, \"extra\": \"{}\"}}", "x".repeat(4096));
    let (s, _) = error_of(reward(big, "application/json").await.expect("send")).await;
    assert_eq!(s, 413);
    let (s, _) = error_of(
        reward("{\"reward\": 1.0}".into(), "text/plain")
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(s, 415);
    let r = reward("{\"reward\": \"high\"}".into(), "application/json")
        .await
        .expect("send");
    let (s, e) = error_of(r).await;
    assert_eq!((s, e["param"].as_str()), (400, Some("reward")), "{e}");
}

#[tokio::test]
async fn backend_unreachable_is_502_naming_it() {
    // Bind then drop a listener: nothing listens on that port afterwards.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let g = start_gateway(config(std::slice::from_ref(&url), "")).await;
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 502);
    assert!(e["message"].as_str().expect("msg").contains(&url), "{e}");
}

#[tokio::test]
async fn backend_failure_is_502_and_overload_503() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "[router]\nmax_attempts = 1\n")).await;
    mock.push(Scripted {
        error: Some((500, "kaboom".into())),
        ..Default::default()
    });
    let (s, e) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 502);
    assert!(e["message"].as_str().expect("msg").contains("kaboom"));
    mock.push(Scripted {
        error: Some((503, "queue full".into())),
        ..Default::default()
    });
    let (s, _) = error_of(
        g.post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(s, 503);
}

#[tokio::test]
async fn failure_before_first_token_is_retried_on_another_backend() {
    let bad = MockVllm::start(Scripted {
        error: Some((500, "down".into())),
        ..Default::default()
    })
    .await;
    let good = MockVllm::start(Scripted::ids(vec![b'y' as u32, IM_END])).await;
    let g = start_gateway(config(&[bad.url(), good.url()], "")).await;
    for _ in 0..4 {
        let r = g
            .post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "x"}]}),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(good.requests().len(), 4);
}

#[tokio::test]
async fn unknown_route_is_openai_404() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let r = g.client.get(g.url("/v1/nope")).send().await.expect("send");
    let (s, _) = error_of(r).await;
    assert_eq!(s, 404);
}

/// One request's work is bounded: prompts × n, stop token ids and stop
/// strings are capped before anything reaches a backend, and the gateway
/// keeps serving.
#[tokio::test]
async fn oversized_requests_are_refused_before_any_backend_call() {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let prompts: Vec<Vec<u32>> = (0..256).map(|_| vec![72, 105]).collect();
    let cases = [
        ("/v1/completions", json!({"prompt": prompts, "n": 64}), "n"),
        (
            "/v1/completions",
            json!({"prompt": [[72, 105], [72, 105]], "n": 129}),
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "stop_token_ids": (0..10_000).collect::<Vec<u32>>()}),
            "stop_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "stop_token_ids": [u32::MAX]}),
            "stop_token_ids",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                   "stop": ["x".repeat(2000)]}),
            "stop",
        ),
    ];
    for (path, body, param) in cases {
        let (s, e) = error_of(g.post(path, body).await).await;
        assert_eq!((s, e["param"].as_str()), (400, Some(param)), "{e}");
    }
    let (s, e) = error_of(
        g.client
            .get(g.url("/v1/export?layout=verl&prompt_length=1000000000&response_length=8"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(s, 400, "{e}");
    assert!(
        mock.log().iter().all(|l| l != "/v1/completions"),
        "no backend call"
    );
    // Still serving.
    let r = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
}

/// Beyond `[server] max_concurrent_requests` a request is answered 429 with
/// `Retry-After` and reaches no backend; a stream holds its slot until it
/// ends, and a slot frees when its client goes away.
#[tokio::test]
async fn requests_beyond_the_concurrency_limit_get_429() {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = start_gateway(config(
        &[mock.url()],
        "[server]\nmax_concurrent_requests = 2\n",
    ))
    .await;
    // Sequential answers free their slot: more calls than slots succeed.
    for _ in 0..3 {
        let r = g
            .post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "a"}]}),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    // Two streams that hang after their first token hold both slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        mock.push(Scripted {
            hang_after: Some(1),
            ..Scripted::ids(vec![72, 105, IM_END])
        });
        let mut r = g
            .post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
            )
            .await;
        assert_eq!(r.status(), 200);
        // The first chunk arrived: this stream is in flight.
        r.chunk().await.expect("read").expect("a first chunk");
        held.push(r);
    }
    let served = mock
        .log()
        .iter()
        .filter(|l| *l == "/v1/completions")
        .count();
    let r = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "b"}]}),
        )
        .await;
    assert_eq!(
        r.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let (s, e) = error_of(r).await;
    assert_eq!((s, e["code"].as_str()), (429, Some("rate_limit_exceeded")));
    let now = mock
        .log()
        .iter()
        .filter(|l| *l == "/v1/completions")
        .count();
    assert_eq!(now, served, "the refused request reached no backend");
    // The clients go away. Dropping a stream's body frees its slot and
    // cancels its backend call: once the mock saw both cancellations, both
    // slots are free.
    drop(held);
    loop {
        let notified = mock.state.cancel_notify.notified();
        if mock
            .state
            .cancelled
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 2
        {
            break;
        }
        notified.await;
    }
    let r = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "c"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
}

/// A backend whose streams stall after their first token fails those calls
/// on the idle deadline, and the failures count against its health like
/// failures before the first token: after `failure_threshold` of them its
/// circuit opens.
#[tokio::test]
async fn stalls_after_the_first_token_count_against_the_backend() {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = common::start_gateway(config(
        &[mock.url()],
        "[router]\nidle_stream_timeout_ms = 50\nfailure_threshold = 2\n",
    ))
    .await;
    for t in 0..2 {
        mock.push(Scripted {
            hang_after: Some(1),
            ..Scripted::ids(vec![72, 105, IM_END])
        });
        let r = g
            .post(
                &format!("/t/stall-{t}/v1/chat/completions"),
                json!({"messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        let (status, e) = error_of(r).await;
        assert_eq!(status, 504, "{e}");
    }
    let backends = g.get_json("/admin/backends").await;
    assert_eq!(backends["backends"][0]["circuit"], "open", "{backends}");
}

/// The router's and extractors' own refusals (a path that is not UTF-8, a
/// method the route does not take) come in OpenAI's shape too.
#[tokio::test]
async fn extractor_refusals_are_openai_shaped() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = common::start_gateway(config(&[mock.url()], "")).await;
    let r = g
        .post(
            "/t/%FF/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    let (s, e) = error_of(r).await;
    assert_eq!(s, 400, "{e}");
    let r = g
        .client
        .get(g.url("/v1/trajectories/%FF"))
        .send()
        .await
        .expect("send");
    let (s, e) = error_of(r).await;
    assert_eq!(s, 400, "{e}");
    let r = g
        .client
        .delete(g.url("/v1/chat/completions"))
        .send()
        .await
        .expect("send");
    assert!(r.headers().get("allow").is_some());
    let (s, _) = error_of(r).await;
    assert_eq!(s, 405);
}

/// A stream the gateway ends itself (a stop string reached before the
/// backend's finish) counts as a success: it resets the failure count, so
/// stalls separated by good calls do not add up to an open circuit.
#[tokio::test]
async fn a_stream_ended_by_a_stop_string_is_a_success() {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = common::start_gateway(config(
        &[mock.url()],
        "[router]\nidle_stream_timeout_ms = 50\nfailure_threshold = 2\n",
    ))
    .await;
    for t in 0..2 {
        mock.push(Scripted {
            hang_after: Some(1),
            ..Scripted::ids(vec![72, 105, IM_END])
        });
        let r = g
            .post(
                &format!("/t/stall-{t}/v1/chat/completions"),
                json!({"messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(r.status(), 504);
        // Between the stalls, a call cut short by its stop string.
        mock.push(Scripted::ids(vec![72, 105, 33, 33, IM_END]));
        let r = g
            .post(
                &format!("/t/stopped-{t}/v1/chat/completions"),
                json!({"messages": [{"role": "user", "content": "hi"}], "stop": ["i"]}),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let backends = g.get_json("/admin/backends").await;
    assert_eq!(backends["backends"][0]["circuit"], "closed", "{backends}");
    assert_eq!(
        backends["backends"][0]["consecutive_failures"], 0,
        "{backends}"
    );
}
