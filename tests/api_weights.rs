//! Weight updates through the gateway, against mocks that check vLLM 0.33's
//! request shapes: a hung backend bounds the call and leaves traffic
//! flowing, versions are per backend and set for the fleet only when every
//! backend took them, the version survives a restart, and the two-step
//! update forwards vLLM's pause / start / finish / resume.

mod common;

use std::sync::atomic::Ordering;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway_on, Gateway};
use serde_json::{json, Value};
use tito::render::testing::chatml_renderer;
use tito::render::testing::IM_END;

const TOKEN: &str = "admin-s3cret";

async fn post_admin(g: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let r = g
        .client
        .post(g.url(path))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("admin request");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

async fn get_admin(g: &Gateway, path: &str) -> Value {
    g.get_json_as(path, TOKEN).await
}

fn mock_reply() -> Scripted {
    Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])
}

async fn gateway(urls: &[String], store_url: &str) -> Gateway {
    let cfg = config(
        urls,
        &format!("[auth]\nadmin_tokens = [\"{TOKEN}\"]\n[store]\nurl = \"{store_url}\"\n"),
    );
    let store = tito::store::open(store_url).expect("store opens");
    start_gateway_on(cfg, chatml_renderer(), store).await
}

/// One call on trajectory `tid`; the weight version it was recorded with.
async fn call_version(g: &Gateway, tid: &str) -> Value {
    let r = g
        .post(
            &format!("/t/{tid}/v1/chat/completions"),
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let t = get_admin(g, &format!("/v1/trajectories/{tid}")).await;
    t["calls"][0]["weight_version"].clone()
}

fn backend<'a>(report: &'a Value, name_has: &str) -> &'a Value {
    report["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .find(|b| {
            b["backend"]
                .as_str()
                .or(b["name"].as_str())
                .is_some_and(|n| n.contains(name_has))
        })
        .unwrap_or_else(|| panic!("no backend {name_has} in {report}"))
}

#[tokio::test]
async fn a_hung_backend_is_named_traffic_resumes_and_the_version_waits_for_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_url = format!("sqlite://{}/spans.db", dir.path().display());
    let a = MockVllm::start(mock_reply()).await;
    let b = MockVllm::start(mock_reply()).await;
    let g = gateway(&[a.url(), b.url()], &store_url).await;
    let b_port = b.addr.port().to_string();

    b.state.hang_admin.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let (status, report) = post_admin(
        &g,
        "/admin/weights",
        json!({"version": "v1", "path": "/ckpt/1", "timeout_s": 1}),
    )
    .await;
    assert_eq!(status, 502, "{report}");
    assert!(started.elapsed().as_secs() < 30, "bounded by timeout_s");
    assert_eq!(report["ok"], false);
    assert_eq!(report["paused"], false, "admission resumed");
    assert_eq!(
        report["weight_version"],
        Value::Null,
        "fleet version unchanged"
    );
    let hung = backend(&report, &b_port);
    assert_eq!(hung["outcome"], "timed_out", "{report}");
    assert!(
        hung["state"]
            .as_str()
            .expect("state")
            .starts_with("out of rotation"),
        "{report}"
    );
    let took = backend(&report, &a.addr.port().to_string());
    assert_eq!(took["ok"], true);
    assert_eq!(took["state"], "serving weights v1");
    // vLLM's shape: the reload, then the prefix cache reset.
    let log = a.log();
    let admin_log: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("/v1/"))
        .collect();
    assert_eq!(
        admin_log,
        [
            r#"/collective_rpc {"method":"reload_weights","kwargs":{"weights_path":"/ckpt/1"}}"#,
            "/reset_prefix_cache?reset_running_requests=true"
        ]
    );

    // Traffic flows to the backend that took the update, tagged with what
    // it serves; the hung one gets nothing.
    for i in 0..4 {
        assert_eq!(call_version(&g, &format!("h-{i}")).await, "v1");
    }
    assert!(
        b.log().iter().all(|l| !l.starts_with("/v1/")),
        "{:?}",
        b.log()
    );
    let backends = get_admin(&g, "/admin/backends").await;
    assert!(backend(&backends, &b_port)["weights_error"]
        .as_str()
        .is_some_and(|e| e.contains("did not answer")));

    // A later update that every backend takes sets the fleet's version,
    // and brings the hung one back.
    b.state.hang_admin.store(false, Ordering::SeqCst);
    let (status, report) = post_admin(
        &g,
        "/admin/weights",
        json!({"version": "v2", "path": "/ckpt/2"}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["weight_version"], "v2");
    let backends = get_admin(&g, "/admin/backends").await;
    assert_eq!(backends["weight_version"], "v2");
    assert_eq!(backend(&backends, &b_port)["weights_error"], Value::Null);

    // A restart on the same store keeps the last version every backend took.
    let c = MockVllm::start(mock_reply()).await;
    let restarted = gateway(&[c.url()], &store_url).await;
    assert_eq!(
        get_admin(&restarted, "/admin/backends").await["weight_version"],
        "v2"
    );
    assert_eq!(call_version(&restarted, "after-restart").await, "v2");
    drop(restarted);

    // A failed reload (vLLM answers 500) leaves the fleet version alone.
    a.state.fail_reload.store(true, Ordering::SeqCst);
    let (status, report) = post_admin(
        &g,
        "/admin/weights",
        json!({"version": "v3", "path": "/ckpt/3"}),
    )
    .await;
    assert_eq!(status, 502, "{report}");
    assert_eq!(report["weight_version"], "v2");
    let failed = backend(&report, &a.addr.port().to_string());
    assert_eq!(failed["outcome"], "failed");
    assert!(failed["error"]
        .as_str()
        .is_some_and(|e| e.contains("no such checkpoint")));

    // After a restart, what each backend serves is unknown (one took v3,
    // one failed half-way): calls are recorded without a version, not with
    // v2, until an update succeeds everywhere.
    drop(g);
    let g2 = gateway(&[c.url()], &store_url).await;
    assert_eq!(
        get_admin(&g2, "/admin/backends").await["weight_version"],
        Value::Null
    );
    assert_eq!(call_version(&g2, "in-doubt").await, Value::Null);
    let (status, report) = post_admin(
        &g2,
        "/admin/weights",
        json!({"version": "v4", "path": "/ckpt/4"}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(call_version(&g2, "after-v4").await, "v4");
}

#[tokio::test]
async fn two_step_update_forwards_vllm_pause_start_finish_resume() {
    let a = MockVllm::start(mock_reply()).await;
    a.state.transfer_configured.store(true, Ordering::SeqCst);
    let g = gateway(&[a.url()], "memory://").await;

    let (status, report) = post_admin(&g, "/admin/weights/commit", json!({"version": "x"})).await;
    assert_eq!(status, 409, "commit without begin: {report}");
    assert!(report["error"]["message"].is_string());
    // Paused by a sleep is not an update in progress either.
    let (status, _) = post_admin(&g, "/admin/sleep", json!({"level": 1})).await;
    assert_eq!(status, 200);
    let (status, report) = post_admin(&g, "/admin/weights/commit", json!({"version": "x"})).await;
    assert_eq!(status, 409, "commit while asleep: {report}");
    let (status, _) = post_admin(&g, "/admin/wake_up", json!({})).await;
    assert_eq!(status, 200);

    let (status, report) = post_admin(&g, "/admin/weights/begin", json!({})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["paused"], true);
    assert!(a.state.paused.load(Ordering::SeqCst));

    // A call made while the trainer pushes waits for the commit.
    let waiting = g.spawn_chat("/t/during/v1/chat/completions");
    let (status, report) =
        post_admin(&g, "/admin/weights/commit", json!({"version": "step-9"})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["weight_version"], "step-9");
    assert_eq!(waiting.await.expect("join"), 200);
    assert!(!a.state.paused.load(Ordering::SeqCst));
    let t = get_admin(&g, "/v1/trajectories/during").await;
    assert_eq!(t["calls"][0]["weight_version"], "step-9");
    let log = a.log();
    let admin_log: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("/v1/"))
        .collect();
    assert_eq!(
        admin_log,
        [
            "/server_info?config_format=json",
            "/sleep?level=1",
            "/wake_up",
            "/pause?mode=wait",
            "/start_weight_update",
            r#"/finish_weight_update {"weight_version":"step-9"}"#,
            "/reset_prefix_cache?reset_running_requests=true",
            "/resume"
        ]
    );
    // The call reached the backend only after the resume.
    let call_at = log
        .iter()
        .position(|l| l.starts_with("/v1/"))
        .expect("call");
    let resume_at = log.iter().position(|l| l == "/resume").expect("resume");
    assert!(call_at > resume_at, "{log:?}");
    // Committed once: a second commit has nothing to end.
    let (status, _) = post_admin(&g, "/admin/weights/commit", json!({"version": "y"})).await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn a_refused_begin_is_called_off_everywhere_and_traffic_resumes() {
    let a = MockVllm::start(mock_reply()).await;
    let b = MockVllm::start(mock_reply()).await;
    a.state.transfer_configured.store(true, Ordering::SeqCst);
    // b runs without --weight-transfer-config: vLLM refuses the start.
    let g = gateway(&[a.url(), b.url()], "memory://").await;
    let (status, report) = post_admin(&g, "/admin/weights/begin", json!({})).await;
    assert_eq!(status, 502, "{report}");
    assert_eq!(report["paused"], false);
    let refused = backend(&report, &b.addr.port().to_string());
    assert!(refused["error"]
        .as_str()
        .is_some_and(|e| e.contains("Weight transfer not configured")));
    assert_eq!(report["aborted"].as_array().map(Vec::len), Some(2));
    // Neither backend is left paused or mid-transfer.
    for m in [&a, &b] {
        assert!(!m.state.paused.load(Ordering::SeqCst), "{:?}", m.log());
        assert!(!m.state.transfer_started.load(Ordering::SeqCst));
    }
    assert_eq!(call_version(&g, "after-abort").await, Value::Null);
}

/// A begun update called off (the trainer's push failed before it changed
/// anything): every backend's update ends without new weights, the weight
/// version is the one before the begin, a call waiting in admission goes
/// through, and a second call-off or a commit has nothing to end.
#[tokio::test]
async fn a_begun_update_is_called_off_and_the_version_stays() {
    let a = MockVllm::start(mock_reply()).await;
    a.state.transfer_configured.store(true, Ordering::SeqCst);
    let g = gateway(&[a.url()], "memory://").await;
    let (status, report) = post_admin(&g, "/admin/weights/cancel", json!({})).await;
    assert_eq!(status, 409, "nothing begun: {report}");
    assert!(report["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("no weight update")));
    let (status, _) = post_admin(&g, "/admin/weights", json!({"version": "step-1"})).await;
    assert_eq!(status, 200);
    let (status, report) = post_admin(&g, "/admin/weights/begin", json!({})).await;
    assert_eq!(status, 200, "{report}");
    let waiting = g.spawn_chat("/t/during-cancel/v1/chat/completions");
    let (status, report) = post_admin(&g, "/admin/weights/cancel", json!({})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["called_off"], true);
    assert_eq!(report["paused"], false);
    assert_eq!(report["weight_version"], "step-1");
    assert_eq!(waiting.await.expect("join"), 200);
    let t = get_admin(&g, "/v1/trajectories/during-cancel").await;
    assert_eq!(t["calls"][0]["weight_version"], "step-1");
    assert!(!a.state.paused.load(Ordering::SeqCst), "{:?}", a.log());
    assert!(
        !a.state.transfer_started.load(Ordering::SeqCst),
        "{:?}",
        a.log()
    );
    assert!(
        a.log()
            .iter()
            .any(|l| l.starts_with("/finish_weight_update")),
        "{:?}",
        a.log()
    );
    for (path, body) in [
        ("/admin/weights/cancel", json!({})),
        ("/admin/weights/commit", json!({"version": "step-2"})),
    ] {
        let (status, report) = post_admin(&g, path, body).await;
        assert_eq!(status, 409, "{path}: {report}");
    }
    let fleet = get_admin(&g, "/admin/backends").await;
    assert_eq!(fleet["weight_version"], "step-1", "{fleet}");
}

/// Admission stays paused while any reason holds, and a weight update is
/// refused while the backends sleep (a reload into a sleeping vLLM is lost
/// at wake-up, when its host copy of the old weights is copied back): a
/// call waits for the wake-up instead of failing on sleeping backends, and
/// the update goes through once they are awake. Neither a wake-up nor
/// another update cuts into a two-step update.
#[tokio::test]
async fn each_pause_ends_only_with_its_own_operation() {
    let a = MockVllm::start(mock_reply()).await;
    a.state.transfer_configured.store(true, Ordering::SeqCst);
    let g = gateway(&[a.url()], "memory://").await;

    let (status, report) = post_admin(&g, "/admin/sleep", json!({"level": 1})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["paused_for"], json!(["asleep"]));
    let reload = json!({"version": "v1", "path": "/ckpt/1"});
    for (path, body) in [
        ("/admin/weights", reload.clone()),
        ("/admin/weights/begin", json!({})),
    ] {
        let (status, report) = post_admin(&g, path, body).await;
        assert_eq!(status, 409, "{path} while asleep: {report}");
        assert!(
            report["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("POST /admin/wake_up first")),
            "{report}"
        );
    }
    assert!(
        !a.log()
            .iter()
            .any(|l| l.starts_with("/collective_rpc") || l.starts_with("/pause")),
        "nothing reached the sleeping backend: {:?}",
        a.log()
    );
    assert_eq!(
        get_admin(&g, "/admin/backends").await["paused_for"],
        json!(["asleep"])
    );
    // A call made now waits for the wake-up.
    let waiting = g.spawn_chat("/t/asleep/v1/chat/completions");
    assert_eq!(get_admin(&g, "/admin/backends").await["paused"], true);
    let (status, report) = post_admin(&g, "/admin/wake_up", json!({})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(waiting.await.expect("join"), 200);
    let log = a.log();
    let woken = log.iter().position(|l| l == "/wake_up").expect("woken");
    let called = log
        .iter()
        .position(|l| l.starts_with("/v1/"))
        .expect("call");
    assert!(called > woken, "{log:?}");
    let (status, report) = post_admin(&g, "/admin/weights", reload).await;
    assert_eq!(status, 200, "awake, the reload goes through: {report}");
    assert_eq!(call_version(&g, "after-wake").await, "v1");

    // A two-step update: only its commit ends its pause.
    let (status, report) = post_admin(&g, "/admin/weights/begin", json!({})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["paused_for"], json!(["weight_update"]));
    for (path, body) in [
        ("/admin/wake_up", json!({})),
        ("/admin/weights/begin", json!({})),
        (
            "/admin/weights",
            json!({"version": "v3", "path": "/ckpt/3"}),
        ),
        ("/admin/weights", json!({"version": "v3"})),
    ] {
        let (status, report) = post_admin(&g, path, body).await;
        assert_eq!(status, 409, "{path} during an update: {report}");
        assert!(
            report["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("/admin/weights/commit")),
            "{report}"
        );
    }
    assert_eq!(
        get_admin(&g, "/admin/backends").await["paused_for"],
        json!(["weight_update"])
    );
    let (status, report) = post_admin(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["paused"], false);
    assert_eq!(call_version(&g, "after-commit").await, "v2");
}

/// Admin operations run one at a time: while one waits on its backends,
/// another gets a 409 naming the reason.
#[tokio::test]
async fn an_admin_operation_in_progress_refuses_another() {
    let a = MockVllm::start(mock_reply()).await;
    let g = gateway(&[a.url()], "memory://").await;
    a.state.hang_admin.store(true, Ordering::SeqCst);
    let seen = a.state.admin_seen.notified();
    tokio::pin!(seen);
    seen.as_mut().enable();
    let url = g.url("/admin/sleep");
    let client = g.client.clone();
    let sleeping = tokio::spawn(async move {
        client
            .post(url)
            .bearer_auth(TOKEN)
            // Long enough for the refusals below on a loaded machine.
            .json(&json!({"level": 1, "timeout_s": 5}))
            .send()
            .await
            .expect("send")
            .status()
    });
    seen.await;
    for path in ["/admin/wake_up", "/admin/weights/begin", "/admin/sleep"] {
        let (status, report) = post_admin(&g, path, json!({})).await;
        assert_eq!(status, 409, "{path}: {report}");
        assert!(
            report["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("another admin operation")),
            "{report}"
        );
    }
    // The hung sleep ends at its deadline, naming the backend.
    assert_eq!(sleeping.await.expect("join"), 502);
}

/// `/admin/sleep` takes its fields in the query string too, numbers
/// included, and a bad one is an OpenAI-shaped 400 naming it.
#[tokio::test]
async fn sleep_reads_its_query_string() {
    let a = MockVllm::start(mock_reply()).await;
    let g = gateway(&[a.url()], "memory://").await;
    let send = |query: &str| {
        g.client
            .post(g.url(&format!("/admin/sleep?{query}")))
            .bearer_auth(TOKEN)
            .send()
    };
    let r = send("level=2&drain_timeout_s=30&timeout_s=5")
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["level"], 2, "{body}");
    let r = send("level=x").await.expect("send");
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("an OpenAI-shaped error");
    assert_eq!(body["error"]["param"], "level", "{body}");
}

/// A trainer whose HTTP client gives up while an update drains does not
/// leave the gateway half-way: the update goes on in a task of its own,
/// reaches the backends once the drain ends, and admission resumes.
#[tokio::test]
async fn an_update_whose_client_left_still_finishes_and_resumes_admission() {
    let a = MockVllm::start(mock_reply()).await;
    let g = gateway(&[a.url()], "memory://").await;
    a.push(Scripted {
        hold_after: Some(1),
        ..mock_reply()
    });
    let mut held = g
        .post(
            "/t/held/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await;
    held.chunk().await.expect("read").expect("a first chunk");
    let gave_up = g
        .client
        .post(g.url("/admin/weights"))
        .bearer_auth(TOKEN)
        .timeout(std::time::Duration::from_millis(300))
        .json(&json!({"version": "v1", "path": "/ckpt/1"}))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(
        get_admin(&g, "/admin/backends").await["paused_for"],
        json!(["admin_operation"]),
        "still draining"
    );
    let seen = a.state.admin_seen.notified();
    tokio::pin!(seen);
    seen.as_mut().enable();
    a.release_held();
    // Bounds for a broken build only: the update reaches the backend, then
    // resumes admission.
    let failsafe = std::time::Duration::from_secs(20);
    tokio::time::timeout(failsafe, seen)
        .await
        .expect("the update went on after its client left");
    let version = tokio::time::timeout(failsafe, call_version(&g, "after"))
        .await
        .expect("admission resumed");
    assert_eq!(version, "v1");
}

/// An update's `mode` is echoed: `wait` (drain first) by default,
/// `abort` as asked, `keep` as the `abort` it runs as (saying so); an
/// unknown mode is a 400 naming `mode` and reaches no backend.
#[tokio::test]
async fn an_update_mode_is_echoed_and_an_unknown_one_is_refused_by_name() {
    let a = MockVllm::start(mock_reply()).await;
    a.state.transfer_configured.store(true, Ordering::SeqCst);
    let g = gateway(&[a.url()], "memory://").await;
    for path in ["/admin/weights", "/admin/weights/begin"] {
        let mut body = json!({"version": "v1", "path": "/ckpt/1", "mode": "fast"});
        if path.ends_with("begin") {
            body = json!({"mode": "fast"});
        }
        let (status, report) = post_admin(&g, path, body).await;
        assert_eq!(status, 400, "{path}: {report}");
        assert_eq!(report["error"]["param"], "mode", "{report}");
    }
    assert!(
        a.log().iter().all(|l| l.starts_with("/v1/")),
        "nothing reached the backend: {:?}",
        a.log()
    );
    for (mode, runs_as) in [
        (None, "wait"),
        (Some("wait"), "wait"),
        (Some("abort"), "abort"),
        (Some("keep"), "abort"),
    ] {
        let mut body = json!({"version": "v1", "path": "/ckpt/1"});
        if let Some(m) = mode {
            body["mode"] = json!(m);
        }
        let (status, report) = post_admin(&g, "/admin/weights", body).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["mode"], runs_as, "{report}");
        let mut begin = json!({});
        if let Some(m) = mode {
            begin["mode"] = json!(m);
        }
        let (status, begun) = post_admin(&g, "/admin/weights/begin", begin).await;
        assert_eq!(status, 200, "{begun}");
        assert_eq!(begun["mode"], runs_as, "{begun}");
        if mode == Some("keep") {
            assert_eq!(begun["asked_mode"], "keep");
            assert!(begun["fallback"]
                .as_str()
                .is_some_and(|f| f.contains("abort")));
        }
        let (status, _) = post_admin(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
        assert_eq!(status, 200);
    }
    let pauses: Vec<String> = a
        .log()
        .into_iter()
        .filter(|l| l.starts_with("/pause"))
        .collect();
    assert!(
        pauses.iter().any(|l| l.contains("mode=abort")),
        "{pauses:?}"
    );
    let b = get_admin(&g, "/admin/backends").await;
    assert_eq!(b["backends"][0]["update_modes"], json!(["wait", "abort"]));
    let keep = b["backends"][0]["keep"].as_str().expect("keep asked");
    assert!(
        keep.starts_with("runs as abort") && keep.contains("0.33"),
        "{keep}"
    );
}
