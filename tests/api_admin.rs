//! Operations through the gateway: admin token, sleep / wake-up ordering
//! with calls waiting in between, weight version tagging, /metrics.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

const TOKEN: &str = "s3cret-admin";

async fn admin(
    g: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = g.client.request(method, g.url(path)).bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.expect("admin request")
}

async fn gateway() -> (MockVllm, MockVllm, Gateway) {
    let a = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let b = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let g = start_gateway(config(
        &[a.url(), b.url()],
        &format!("[server]\nadmin_token = \"{TOKEN}\"\n"),
    ))
    .await;
    (a, b, g)
}

#[tokio::test]
async fn admin_routes_require_the_token() {
    let (_a, _b, g) = gateway().await;
    for path in ["/admin/backends", "/v1/export?format=jsonl"] {
        let r = g.client.get(g.url(path)).send().await.expect("get");
        assert_eq!(r.status(), 401, "{path}");
        let r = g
            .client
            .get(g.url(path))
            .bearer_auth("wrong")
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 401, "{path}");
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["error"]["type"], "authentication_error");
    }
    let r = admin(&g, reqwest::Method::GET, "/admin/backends", None).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["backends"].as_array().expect("list").len(), 2);
    assert_eq!(v["backends"][0]["healthy"], true);
}

#[tokio::test]
async fn calls_during_sleep_complete_after_wake_up() {
    let (a, b, g) = gateway().await;
    let r = admin(&g, reqwest::Method::POST, "/admin/sleep?level=1", None).await;
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.expect("json");
    assert_eq!(report["ok"], true);
    assert_eq!(report["backends"].as_array().expect("list").len(), 2);
    let v: Value = admin(&g, reqwest::Method::GET, "/admin/backends", None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(v["paused"], true);
    assert!(v["backends"]
        .as_array()
        .expect("list")
        .iter()
        .all(|b| b["sleeping"] == true));

    // Issued while asleep: it waits for admission.
    let call = g.spawn_chat("/v1/chat/completions");
    let r = admin(&g, reqwest::Method::POST, "/admin/wake_up", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(call.await.expect("join"), 200);
    // Each backend saw sleep, then wake_up; the call reached one only after.
    for m in [&a, &b] {
        let log = m.log();
        let admin_log: Vec<&String> = log.iter().filter(|l| !l.starts_with("/v1/")).collect();
        assert_eq!(
            admin_log,
            vec![
                "/server_info?config_format=json",
                "/sleep?level=1",
                "/wake_up"
            ],
            "{log:?}"
        );
    }
    let combined: Vec<String> = [a.log(), b.log()].concat();
    assert!(combined.iter().any(|l| l == "/v1/completions"));
    for m in [&a, &b] {
        let log = m.log();
        if let Some(pos) = log.iter().position(|l| l == "/v1/completions") {
            assert!(
                pos > log.iter().position(|l| l == "/wake_up").expect("woken"),
                "{log:?}"
            );
        }
    }
}

#[tokio::test]
async fn weight_version_tags_later_calls() {
    let (a, _b, g) = gateway().await;
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/weights",
        Some(json!({"version": "step-12"})),
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = g
        .post(
            "/t/w-1/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let rows = admin(
        &g,
        reqwest::Method::GET,
        "/v1/export?format=jsonl&layout=trajectory",
        None,
    )
    .await
    .text()
    .await
    .expect("body");
    let row: Value = serde_json::from_str(rows.lines().next().expect("row")).expect("json");
    assert_eq!(row["weight_version"], "step-12");
    // With a path the backends are asked to reload, in vLLM's shape.
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/weights",
        Some(json!({"version": "step-13", "path": "/ckpt/13"})),
    )
    .await;
    assert_eq!(r.status(), 200);
    // The reload, then the prefix cache computed with the old weights goes.
    let log = a.log();
    let tail: Vec<&str> = log.iter().rev().take(2).rev().map(String::as_str).collect();
    assert!(
        tail[0].starts_with("/collective_rpc") && tail[0].contains("/ckpt/13"),
        "{log:?}"
    );
    assert_eq!(
        tail[1], "/reset_prefix_cache?reset_running_requests=true",
        "{log:?}"
    );
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/weights",
        Some(json!({"version": ""})),
    )
    .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn backends_can_be_added_and_removed_at_runtime() {
    let (_a, _b, g) = gateway().await;
    let c = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/backends",
        Some(json!({"url": c.url(), "kind": "vllm"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.expect("json")["id"]
        .as_u64()
        .expect("id");
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/backends",
        Some(json!({"url": "nope", "kind": "vllm"})),
    )
    .await;
    assert_eq!(r.status(), 400);
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/backends",
        Some(json!({"url": c.url(), "kind": "sglang", "vllm_api": "generate", "name": "x"})),
    )
    .await;
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.expect("json");
    assert_eq!(err["error"]["param"], "vllm_api", "{err}");
    let r = admin(
        &g,
        reqwest::Method::DELETE,
        &format!("/admin/backends/{id}"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = admin(&g, reqwest::Method::DELETE, "/admin/backends/999", None).await;
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_the_named_series() {
    let (_a, _b, g) = gateway().await;
    let r = g
        .post(
            "/t/m-1/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let missing = g
        .client
        .get(g.url("/no/such/route"))
        .send()
        .await
        .expect("gateway reachable");
    assert_eq!(missing.status(), 404);
    // The first scrape is counted in the second. (Other tests of this
    // binary share the recorder: the counts may be higher than 1.)
    let _ = g.get_text("/metrics").await;
    let text = g.get_text("/metrics").await;
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
        let name = series.split('{').next().unwrap_or_default();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad name in {line}"
        );
        if series.contains('{') {
            assert!(series.ends_with('}'), "bad labels in {line}");
        }
    }
    for name in [
        "tito_requests_total{",
        "tito_request_duration_seconds_bucket{",
        "tito_time_to_first_token_seconds_bucket",
        "tito_tokens_total{kind=\"sampled\"}",
        "tito_tokens_total{kind=\"prompt\"}",
        "tito_backend_in_flight{",
        "tito_backend_healthy{",
        "tito_sticky_misses_total",
        "tito_store_commit_seconds_bucket",
        "tito_gateway_overhead_seconds_bucket{route=\"chat\"",
    ] {
        assert!(text.contains(name), "missing {name} in:\n{text}");
    }
    for series in [
        "tito_requests_total{route=\"/t/{tid}/v1/chat/completions\",status=\"200\"}",
        "tito_requests_total{route=\"unmatched\",status=\"404\"}",
        "tito_requests_total{route=\"/metrics\",status=\"200\"}",
    ] {
        assert!(text.contains(series), "missing {series} in:\n{text}");
    }
    // Every series has a HELP line, and the build is named.
    let helped: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    for typed in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = typed.split(' ').next().unwrap_or_default();
        assert!(helped.contains(&name), "no HELP for {name}");
    }
    assert!(
        text.contains(&format!(
            "tito_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
}

/// `/health` is liveness; `/ready` needs a backend that takes calls and a
/// store that commits, and says why not.
#[tokio::test]
async fn ready_follows_backend_availability() {
    let (_a, _b, g) = gateway().await;
    let r = g.client.get(g.url("/health")).send().await.expect("get");
    assert_eq!(r.status(), 200);
    let ready = |g: &Gateway| {
        let req = g.client.get(g.url("/ready"));
        async move {
            let r = req.send().await.expect("get");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    let (s, body) = ready(&g).await;
    assert_eq!(
        (s, &body["backends_ready"], &body["store"]),
        (200, &json!(2), &json!("writable"))
    );
    let r = admin(&g, reqwest::Method::POST, "/admin/sleep?level=1", None).await;
    assert_eq!(r.status(), 200);
    let (s, body) = ready(&g).await;
    assert_eq!(
        (s, &body["ready"], &body["backends_ready"]),
        (503, &json!(false), &json!(0))
    );
    let r = admin(&g, reqwest::Method::POST, "/admin/wake_up", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(ready(&g).await.0, 200);
}

/// `tito_backend_in_rotation` says whether calls may go to a backend: 0
/// while it sleeps, 1 once awake, and 0 once it is removed (its series stay
/// in the exporter, so they must stop claiming it serves).
#[tokio::test]
async fn backend_gauges_follow_rotation_and_removal() {
    let (a, b, g) = gateway().await;
    let value = |text: &str, series: &str, backend: &str| -> f64 {
        let prefix = format!("{series}{{backend=\"{backend}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
    };
    let text = g.get_text("/metrics").await;
    assert_eq!(value(&text, "tito_backend_in_rotation", &a.url()), 1.0);
    let r = admin(&g, reqwest::Method::POST, "/admin/sleep", Some(json!({}))).await;
    assert_eq!(r.status(), 200);
    let text = g.get_text("/metrics").await;
    assert_eq!(value(&text, "tito_backend_in_rotation", &a.url()), 0.0);
    assert_eq!(value(&text, "tito_backend_sleeping", &a.url()), 1.0);
    let r = admin(&g, reqwest::Method::POST, "/admin/wake_up", Some(json!({}))).await;
    assert_eq!(r.status(), 200);
    // Backends are numbered in `[[backends]]` order: b is 1.
    let r = admin(&g, reqwest::Method::DELETE, "/admin/backends/1", None).await;
    assert_eq!(r.status(), 200);
    let text = g.get_text("/metrics").await;
    assert_eq!(value(&text, "tito_backend_in_rotation", &a.url()), 1.0);
    for series in ["tito_backend_in_rotation", "tito_backend_healthy"] {
        assert_eq!(value(&text, series, &b.url()), 0.0, "{series}");
    }
}

/// `tito_gateway_overhead_seconds` leaves out the wait on the backend, its
/// first token included: a backend that takes 300 ms before each of its two
/// tokens makes a 600 ms call of which the gateway's own share is far below
/// one token's wait. (This binary's other tests call chat only, so the
/// completions series holds this call alone.)
#[tokio::test]
async fn gateway_overhead_leaves_out_the_wait_for_the_first_token() {
    let slow = MockVllm::start(Scripted {
        token_delay_ms: 300,
        ..Scripted::ids(vec![b'o'.into(), IM_END])
    })
    .await;
    let g = start_gateway(config(&[slow.url()], "")).await;
    let r = g
        .post(
            "/v1/completions",
            json!({"model": "test-model", "prompt": "hi", "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = g.get_text("/metrics").await;
    let sum = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    let took = sum("tito_request_duration_seconds_sum{route=\"/v1/completions\"}");
    let overhead = sum("tito_gateway_overhead_seconds_sum{route=\"completions\"}");
    assert!(took >= 0.6, "the call took {took} s");
    assert!(
        overhead < 0.3,
        "overhead {overhead} s of a {took} s call: the backend's wait is in it"
    );
}

/// Sleep is asked of every backend's server first: one started without
/// `--enable-sleep-mode` (what its `/server_info` says) refuses the whole
/// sleep with a 409 naming it and the flag, and no backend is put to
/// sleep; admission is not paused.
#[tokio::test]
async fn sleep_is_refused_naming_a_backend_without_sleep_mode() {
    let (a, b, g) = gateway().await;
    b.set_sleep_mode(false);
    let r = admin(&g, reqwest::Method::POST, "/admin/sleep?level=1", None).await;
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.expect("json");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("--enable-sleep-mode"), "{message}");
    assert!(message.contains(&format!("{}: ", b.url())), "{message}");
    assert!(!message.contains(&format!("{}: ", a.url())), "{message}");
    for m in [&a, &b] {
        assert!(
            !m.log().iter().any(|l| l.starts_with("/sleep")),
            "{:?}",
            m.log()
        );
    }
    let r = admin(&g, reqwest::Method::GET, "/admin/backends", None).await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["paused"], false, "{v}");
    let r = g.spawn_chat("/v1/chat/completions").await.expect("join");
    assert_eq!(r, 200, "calls go on");
}

/// A config without `[[backends]]` starts an empty fleet: calls and
/// `/ready` answer 503 naming the way out, and a backend added through
/// `POST /admin/backends` takes calls at once.
#[tokio::test]
async fn an_empty_fleet_starts_and_takes_calls_once_a_backend_is_added() {
    let g = start_gateway(config(
        &[],
        &format!("[auth]\nadmin_tokens = [\"{TOKEN}\"]\n"),
    ))
    .await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let r = g.post("/t/empty-1/v1/chat/completions", chat.clone()).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("POST /admin/backends")),
        "{body}"
    );
    let r = g.client.get(g.url("/ready")).send().await.expect("ready");
    assert_eq!(r.status(), 503);
    let c = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let r = admin(
        &g,
        reqwest::Method::POST,
        "/admin/backends",
        Some(json!({"url": c.url(), "kind": "vllm"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let r = g.post("/t/empty-2/v1/chat/completions", chat).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "ok");
}
