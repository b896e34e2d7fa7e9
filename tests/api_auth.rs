//! The auth model end to end: each role's routes take its tokens and refuse
//! others with a 401 in OpenAI's shape and a `WWW-Authenticate` challenge;
//! an agent's API key reads no trajectory; token files; a non-loopback
//! gateway with an open trainer or admin role does not start.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::api::auth::{check_exposure, Auth};
use tito::render::testing::IM_END;

const API: &str = "agent-key-0001";
const TRAINER: &str = "trainer-token-01";
const ADMIN: &str = "admin-token-0001";

async fn gateway(extra: &str) -> (MockVllm, Gateway) {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], extra)).await;
    (mock, g)
}

async fn call(g: &Gateway, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = g.client.request(method.clone(), g.url(path));
    if method == reqwest::Method::POST {
        let body = if path.contains("completions") {
            json!({"messages": [{"role": "user", "content": "hi"}]})
        } else if path.ends_with("/reward") {
            json!({"reward": 1.0})
        } else if path.ends_with("/ack") {
            json!({"consumer": "c", "cursor": "x"})
        } else {
            json!({"version": "v"})
        };
        req = req.json(&body);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    if status == 401 {
        let challenge = r
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(challenge.starts_with("Bearer"), "{path}: {challenge:?}");
    }
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn each_role_takes_its_own_tokens() {
    let (_mock, g) = gateway(&format!(
        "[auth]\napi_keys = [\"{API}\"]\ntrainer_tokens = [\"{TRAINER}\"]\n\
         admin_tokens = [\"{ADMIN}\"]\n"
    ))
    .await;
    // The agent's first call creates trajectory `t`.
    let (s, _) = call(&g, "POST", "/t/t/v1/chat/completions", Some(API)).await;
    assert_eq!(s, 200);

    let routes: [(&str, &str, &[&str]); 10] = [
        ("POST", "/v1/chat/completions", &[API]),
        ("POST", "/g/g/t/u/v1/chat/completions", &[API]),
        ("GET", "/v1/models", &[API]),
        ("GET", "/v1/trajectories", &[TRAINER, ADMIN]),
        ("GET", "/v1/trajectories/t", &[TRAINER, ADMIN]),
        ("POST", "/v1/trajectories/t/reward", &[TRAINER, ADMIN]),
        ("GET", "/v1/groups/g", &[TRAINER, ADMIN]),
        ("GET", "/v1/export?format=jsonl", &[TRAINER, ADMIN]),
        ("GET", "/admin/backends", &[ADMIN]),
        ("POST", "/admin/weights", &[ADMIN]),
    ];
    for (method, path, allowed) in routes {
        for token in [
            None,
            Some("wrong-token-0"),
            Some(API),
            Some(TRAINER),
            Some(ADMIN),
        ] {
            let (s, body) = call(&g, method, path, token).await;
            let ok = token.is_some_and(|t| allowed.contains(&t));
            if ok {
                assert_ne!(s, 401, "{method} {path} with {token:?}: {body}");
            } else {
                assert_eq!(s, 401, "{method} {path} with {token:?}: {body}");
                assert_eq!(body["error"]["type"], "authentication_error");
                assert_eq!(body["error"]["code"], "invalid_api_key");
            }
        }
    }
    // An agent's key reads and rewards no trajectory, its own included.
    let (s, _) = call(&g, "GET", "/v1/trajectories/t", Some(API)).await;
    assert_eq!(s, 401);
    let (s, _) = call(&g, "POST", "/v1/trajectories/t/finish", Some(API)).await;
    assert_eq!(s, 401);
    // Liveness and metrics stay open.
    for path in ["/health", "/metrics"] {
        let r = g.client.get(g.url(path)).send().await.expect("get");
        assert_eq!(r.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn open_roles_need_no_token_and_files_hold_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("trainers.txt");
    std::fs::write(&file, format!("# trainers\n{TRAINER}\n\n")).expect("write");
    let (_mock, g) = gateway(&format!(
        "[auth]\ntrainer_tokens_file = \"{}\"\n",
        file.display()
    ))
    .await;
    // No api keys, no admin tokens: those routes are open.
    let (s, _) = call(&g, "POST", "/t/t/v1/chat/completions", None).await;
    assert_eq!(s, 200);
    let (s, _) = call(&g, "GET", "/admin/backends", None).await;
    assert_eq!(s, 200);
    let (s, _) = call(&g, "GET", "/v1/trajectories/t", None).await;
    assert_eq!(s, 401);
    let (s, _) = call(&g, "GET", "/v1/trajectories/t", Some(TRAINER)).await;
    assert_eq!(s, 200);
}

#[test]
fn bad_tokens_are_refused_at_load_naming_the_key() {
    let text = "[model]\ntokenizer = \"unused\"\n[[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"vllm\"\n\
                [auth]\napi_keys = [\"short\"]\n";
    let e = tito::Config::from_toml(text)
        .expect_err("too short")
        .to_string();
    // The key is named; the secret is not echoed.
    assert!(e.contains("auth.api_keys") && !e.contains("short\""), "{e}");
}

const BACKEND: &str = "http://127.0.0.1:1";

#[test]
fn an_exposed_gateway_without_tokens_does_not_start() {
    let exposed = |extra: &str| {
        let mut c = config(&[BACKEND.to_string()], extra);
        c.server.listen = "0.0.0.0:0".into();
        c
    };
    let c = exposed("");
    let e = check_exposure(&c, &Auth::from_config(&c).expect("auth"))
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("auth.trainer_tokens") && e.contains("auth.admin_tokens"),
        "{e}"
    );
    assert!(e.contains("--insecure-open"), "{e}");
    // Only the admin role open: named alone.
    let c = exposed(&format!("[auth]\ntrainer_tokens = [\"{TRAINER}\"]\n"));
    let e = check_exposure(&c, &Auth::from_config(&c).expect("auth"))
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("auth.admin_tokens") && !e.contains("auth.trainer_tokens"),
        "{e}"
    );
    // An admin token also guards the trainer's routes: enough to start.
    let c = exposed(&format!("[auth]\nadmin_tokens = [\"{ADMIN}\"]\n"));
    assert!(check_exposure(&c, &Auth::from_config(&c).expect("auth")).is_ok());
    let mut c = exposed("");
    c.insecure_open = true;
    assert!(check_exposure(&c, &Auth::from_config(&c).expect("auth")).is_ok());
    let c = config(&[BACKEND.to_string()], "");
    assert!(
        check_exposure(&c, &Auth::from_config(&c).expect("auth")).is_ok(),
        "loopback"
    );
}

#[test]
fn the_binary_refuses_to_serve_exposed_and_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        "[server]\nlisten = \"0.0.0.0:0\"\n[model]\ntokenizer = \"unused\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"vllm\"\n[store]\nurl = \"memory://\"\n",
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tito"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .expect("run tito");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auth.trainer_tokens"), "{err}");
}

/// A page on another site cannot drive an open gateway: the browser's
/// no-preflight writes (a `text/plain` body, a GET with side effects) are
/// refused with a 403 whatever the role, and change nothing; the same
/// request from the gateway's own page, or from a client that is not a
/// browser, goes through.
#[tokio::test]
async fn a_page_on_another_site_cannot_drive_an_open_gateway() {
    let (_mock, g) = gateway("").await;
    let add = |headers: &[(&str, &str)]| {
        let mut req = g
            .client
            .post(g.url("/admin/backends"))
            .header("content-type", "text/plain")
            .body(r#"{"url": "http://127.0.0.1:9", "kind": "vllm"}"#);
        for (k, v) in headers {
            req = req.header(k.to_string(), v.to_string());
        }
        req.send()
    };
    let origin = format!(
        "http://{}",
        g.url("")
            .trim_start_matches("http://")
            .trim_end_matches('/')
    );
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("origin", "http://evil.example")],
    ] {
        let r = add(&headers).await.expect("send");
        assert_eq!(r.status(), 403, "{headers:?}");
        let body: Value = r.json().await.expect("json");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("cross-site")),
            "{body}"
        );
    }
    let r = g
        .client
        .get(g.url("/v1/export?consumer=c&limit=10"))
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403, "a cross-site GET with side effects");
    let r = g
        .client
        .post(g.url("/v1/chat/completions"))
        .header("sec-fetch-site", "cross-site")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403, "a cross-site chat call");
    let backends = g.get_json("/admin/backends").await;
    assert_eq!(backends["backends"].as_array().map(Vec::len), Some(1));

    let same_origin = add(&[
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ])
    .await
    .expect("send");
    assert_eq!(same_origin.status(), 201);
    let r = g
        .client
        .post(g.url("/admin/backends"))
        .json(&json!({"url": "http://127.0.0.1:10", "kind": "vllm"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201, "a client that is not a browser");
}

#[test]
fn the_legacy_admin_token_is_checked_like_the_others() {
    let text = "[model]\ntokenizer = \"unused\"\n[[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"vllm\"\n\
                [server]\nadmin_token = \"a\"\n";
    let e = tito::Config::from_toml(text)
        .expect_err("too short")
        .to_string();
    assert!(e.contains("server.admin_token"), "{e}");
}
