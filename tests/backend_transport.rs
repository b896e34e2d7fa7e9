//! The gateway over an `https://` vLLM backend whose certificate chains to
//! a private CA, given as the backend's `ca_file`: calls (streamed and not),
//! health, an admin operation and the replay check go through the one
//! transport the gateway has for `http://` and `https://` alike. Without
//! the CA the backend is unreachable, and `ca_file` on an `http://` URL is
//! a config error.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::tls::TestCa;
use common::{start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;
use tito::Config;

const ADMIN: &str = "transport-admin-token";

fn config_for(url: &str, ca_file: Option<&std::path::Path>) -> Config {
    let ca = ca_file.map_or(String::new(), |p| {
        format!("ca_file = \"{}\"\n", p.display())
    });
    config_with(url, &ca)
}

/// One vLLM backend at `url` with the `[[backends]]` lines `backend`.
fn config_with(url: &str, backend: &str) -> Config {
    let text = format!(
        "[model]\nname = \"test-model\"\ntokenizer = \"unused\"\nmax_model_len = 512\n\
         [[backends]]\nurl = \"{url}\"\nkind = \"vllm\"\n{backend}\
         [auth]\nadmin_tokens = [\"{ADMIN}\"]\n[store]\nurl = \"memory://\"\n"
    );
    Config::from_toml(&text).expect("valid config")
}

/// `POST /admin/sleep?level=1` through the gateway: status and report.
async fn sleep(g: &Gateway) -> (u16, Value) {
    let r = g
        .client
        .post(g.url("/admin/sleep?level=1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("sleep");
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// The mock vLLM behind TLS, with a server certificate `ca` signed.
async fn mock_over_tls(ca: &TestCa) -> MockVllm {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    MockVllm::serve_on(ca.listener(tcp), true, reply())
}

fn reply() -> Scripted {
    Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])
}

async fn over_tls() -> (TestCa, MockVllm, Gateway) {
    let ca = TestCa::new();
    let mock = mock_over_tls(&ca).await;
    assert!(mock.url().starts_with("https://"));
    let g = start_gateway(config_for(&mock.url(), Some(&ca.ca_file))).await;
    (ca, mock, g)
}

#[tokio::test]
async fn calls_stream_and_not_over_https() {
    let (_ca, mock, g) = over_tls().await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "return_token_ids": true});
    let resp = g.post("/t/tls-1/v1/chat/completions", body.clone()).await;
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "ok");
    assert_eq!(v["choices"][0]["token_ids"], json!([b'o', b'k', IM_END]));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let resp = g.post("/t/tls-2/v1/chat/completions", streamed).await;
    assert_eq!(resp.status(), 200);
    let events = common::sse_events(resp).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let content: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(content, "ok");
    assert_eq!(mock.requests().len(), 2);
    // The wire body is vLLM's token-in request.
    assert!(mock.last_request()["prompt"].is_array());
}

#[tokio::test]
async fn health_and_admin_go_over_https() {
    let (ca, mock, g) = over_tls().await;
    let cfg = config_for(&mock.url(), Some(&ca.ca_file));
    let backend = tito::backend::build_backend(&cfg.backends[0], &cfg.router).expect("backend");
    backend.health().await.expect("healthy over https");
    let (status, v) = sleep(&g).await;
    assert_eq!(status, 200);
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        mock.log().iter().any(|l| l.starts_with("/sleep")),
        "{:?}",
        mock.log()
    );
}

#[tokio::test]
async fn the_replay_check_goes_over_https() {
    let (_ca, mock, g) = over_tls().await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = g.post("/t/tls-verify/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    let r = g
        .client
        .post(g.url("/v1/trajectories/tls-verify/verify"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("verify");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let v: Value = r.json().await.expect("json");
    let sample = &v["samples"][0];
    assert_eq!(sample["max_abs_diff"], json!(0.0), "{v}");
    mock.wait_scored(1).await;
}

#[tokio::test]
async fn without_the_ca_the_backend_is_unreachable() {
    let ca = TestCa::new();
    let mock = mock_over_tls(&ca).await;
    let cfg = config_for(&mock.url(), None);
    let backend = tito::backend::build_backend(&cfg.backends[0], &cfg.router).expect("backend");
    match backend.health().await {
        Err(tito::backend::BackendError::Unreachable { .. }) => {}
        other => panic!("expected unreachable, got {other:?}"),
    }
    let g = start_gateway(cfg).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = g.post("/t/no-ca/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.expect("json");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("unreachable"), "{message}");
    assert!(mock.requests().is_empty());
}

#[test]
fn a_ca_file_needs_an_https_url() {
    let text = "[model]\ntokenizer = \"unused\"\n[[backends]]\nurl = \"http://127.0.0.1:1\"\n\
                kind = \"vllm\"\nca_file = \"ca.pem\"\n";
    let err = Config::from_toml(text).expect_err("refused").to_string();
    assert!(err.contains("backends[0].ca_file"), "{err}");
    assert!(err.contains("https://"), "{err}");
}

#[test]
fn an_unreadable_ca_file_fails_at_start_up_naming_the_key() {
    let cfg = config_for(
        "https://127.0.0.1:1",
        Some(std::path::Path::new("/nonexistent/ca.pem")),
    );
    let err = match tito::api::build_backends(&cfg) {
        Ok(_) => panic!("built a backend with a missing CA file"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("backends.ca_file"), "{err}");
}

/// A backend's `api_key` goes with every request to it and its
/// `admin_api_key` with the admin ones, as `Authorization: Bearer`; neither
/// shows in the config's debug output.
#[tokio::test]
async fn backend_keys_go_with_their_requests() {
    let mock = MockVllm::start(reply()).await;
    let cfg = config_with(
        &mock.url(),
        "api_key = \"backend-key-1\"\nadmin_api_key = \"backend-admin-key-1\"\n",
    );
    let shown = format!("{cfg:?}");
    assert!(
        !shown.contains("backend-key-1") && !shown.contains("backend-admin-key-1"),
        "{shown}"
    );
    let g = start_gateway(cfg).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = g.post("/t/keys-1/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(sleep(&g).await.0, 200);
    let seen = mock.authorizations();
    let of = |path: &str| -> Vec<Option<String>> {
        seen.iter()
            .filter(|(p, _)| p == path)
            .map(|(_, a)| a.clone())
            .collect()
    };
    let api = Some("Bearer backend-key-1".to_string());
    let admin = Some("Bearer backend-admin-key-1".to_string());
    assert_eq!(
        of("/v1/completions"),
        std::slice::from_ref(&api),
        "{seen:?}"
    );
    assert_eq!(of("/sleep"), [admin], "{seen:?}");
    assert!(of("/health").iter().all(|a| *a == api), "{seen:?}");
}

#[test]
fn a_backend_key_that_is_no_token_fails_naming_the_key() {
    let text = "[model]\nname = \"m\"\ntokenizer = \"unused\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:9\"\nkind = \"sglang\"\nadmin_api_key = \"has space\"\n\
         [store]\nurl = \"memory://\"\n";
    let e = Config::from_toml(text).expect_err("refused").to_string();
    assert!(e.contains("backends[0].admin_api_key"), "{e}");
    assert!(!e.contains("has space"), "the key is not shown: {e}");
}
