//! 64 streaming agents through three weight updates, in `abort`, `keep`
//! and `wait` mode, against a vLLM-wire mock generating at a fixed token
//! rate with a skewed length distribution: no client error, no lost call,
//! every call's versions non-decreasing; in `abort` and `keep` mode the
//! long generations span updates (the updates did not wait for them), in
//! `wait` mode none does (each update drained first).

mod common;

use common::versioned::{VersionedMock, Wire};
use common::{sse_events, Gateway};
use serde_json::{json, Value};

const AGENTS: usize = 64;
const TURNS: usize = 2;

fn token() -> Box<common::versioned::TokenFn> {
    Box::new(|pos, version| {
        let id = u32::from(b'a' + (pos % 26) as u8);
        let v: f32 = version.trim_start_matches('v').parse().unwrap_or(0.0);
        (id, -0.01 * (pos % 7) as f32 - v)
    })
}

async fn post(g: &Gateway, path: &str, body: Value) -> Value {
    let r = g.post(path, body).await;
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.expect("json")
}

/// One agent: `TURNS` streamed calls on its trajectory; the number of
/// answers that were complete streams.
async fn agent(g: &Gateway, i: usize) -> usize {
    // Most calls short, one agent in eight long.
    let max_tokens = if i % 8 == 0 { 400 } else { 20 };
    let mut messages = vec![json!({"role": "user", "content": format!("task {i}")})];
    let mut ok = 0;
    for turn in 0..TURNS {
        let body = json!({"messages": messages, "max_tokens": max_tokens, "stream": true,
            "ignore_eos": true});
        let r = g
            .post(&format!("/t/agent-{i}/v1/chat/completions"), body)
            .await;
        assert_eq!(r.status(), 200, "agent {i} turn {turn}");
        let events = sse_events(r).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let mut text = String::new();
        let mut finish = None;
        for e in events.iter().filter(|e| *e != "[DONE]") {
            let v: Value = serde_json::from_str(e).expect("chunk");
            assert!(v.get("error").is_none(), "agent {i}: {v}");
            text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        assert_eq!(finish.as_deref(), Some("length"), "agent {i}");
        assert_eq!(text.len(), max_tokens, "agent {i}: every token once");
        messages.push(json!({"role": "assistant", "content": text}));
        messages.push(json!({"role": "user", "content": "go on"}));
        ok += 1;
    }
    ok
}

/// Runs the agents through three updates in `mode`; the recorded calls.
async fn run(mode: &str) -> Vec<Value> {
    let mock = VersionedMock::start(Wire::Vllm, "v1", token()).await;
    mock.set_interval(std::time::Duration::from_millis(2));
    let text = format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 4096\n{}\n[store]\nurl = \"memory://\"\n",
        mock.backend_toml()
    );
    let (g, _probes) =
        common::start_gateway_probing(tito::Config::from_toml(&text).expect("config")).await;
    let g = std::sync::Arc::new(g);
    // The first probe learns that the server reports per-token versions.
    mock.wait_version_asked().await;
    post(&g, "/admin/weights", json!({"version": "v1"})).await;
    let agents: Vec<_> = (0..AGENTS)
        .map(|i| {
            let g = g.clone();
            tokio::spawn(async move { agent(&g, i).await })
        })
        .collect();
    for (k, version) in ["v2", "v3", "v4"].into_iter().enumerate() {
        // Each update lands while generations run: after a share of the
        // tokens the whole run generates.
        mock.wait_generated(300 * (k as u64 + 1)).await;
        post(&g, "/admin/weights/begin", json!({"mode": mode})).await;
        mock.push_weights(version);
        post(&g, "/admin/weights/commit", json!({"version": version})).await;
    }
    let mut answered = 0;
    for a in agents {
        answered += a.await.expect("agent finished without a panic");
    }
    assert_eq!(answered, AGENTS * TURNS, "0 client errors");
    let mut calls = Vec::new();
    for i in 0..AGENTS {
        let t = g.get_json(&format!("/v1/trajectories/agent-{i}")).await;
        let mine = t["calls"].as_array().expect("calls").clone();
        assert_eq!(mine.len(), TURNS, "0 lost calls (agent {i})");
        let mut last = 0;
        for c in &mine {
            for span in c["versions"].as_array().expect("versions") {
                let seq = span["seq"].as_u64().expect("every span has its number");
                assert!(seq >= last, "versions never go back: {c}");
                last = seq;
            }
        }
        calls.extend(mine);
    }
    calls
}

fn spans(c: &Value) -> usize {
    c["versions"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_run_through_updates_in_abort_mode_and_in_wait_mode() {
    let aborted = run("abort").await;
    // The long generations were interrupted and continued, so the update
    // paused admission only for the backend's pause, not until they ended.
    assert!(
        aborted.iter().any(|c| spans(c) >= 2),
        "some call spans an update in abort mode"
    );
    let kept = run("keep").await;
    assert!(
        kept.iter().any(|c| spans(c) >= 2),
        "some call spans an update in keep mode, as the server reported"
    );
    let waited = run("wait").await;
    assert!(
        waited.iter().all(|c| spans(c) == 1),
        "every call ran on one version in wait mode"
    );
}
