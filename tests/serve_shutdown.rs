//! Ending well. `tito serve` on SIGTERM stops accepting, lets the streams in
//! flight finish and be recorded, and exits 0; past `server.drain_timeout_s`
//! it exits anyway. A stream whose client stops reading ends after
//! `server.sse_send_timeout_s`, and its backend sequence is cancelled.
#![cfg(feature = "engine")]

mod common;
mod engine_support;

use std::time::Duration;

use common::mock_vllm::{MockVllm, Scripted};
use common::process::Tito;
use serde_json::json;

/// A test that fails rather than hangs when what it waits for never comes.
const FAILSAFE: Duration = Duration::from_secs(120);

/// SmolLM2's `<|im_end|>` (the GGUF is the gateway's tokenizer here).
const IM_END: u32 = 2;

fn serve(mock: &MockVllm, dir: &std::path::Path, drain_timeout_s: u64) -> (Tito, String) {
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndrain_timeout_s = {drain_timeout_s}\n\
             [model]\nname = \"m\"\ntokenizer = \"{}\"\n\
             [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n\
             [store]\nurl = \"sqlite://{}/spans.db\"\n",
            engine_support::model_path().display(),
            mock.url(),
            dir.display(),
        ),
    )
    .expect("write config");
    let cfg = cfg.to_str().expect("utf-8").to_string();
    let mut tito = Tito::spawn(
        &["serve", "--config", &cfg, "--log-format", "json"],
        Some("info"),
    );
    let listening = tokio::task::block_in_place(|| tito.wait_for("tito listening"));
    let addr = listening["addr"].as_str().expect("addr").to_string();
    (tito, addr)
}

async fn stream_request(addr: &str, tid: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{addr}/t/{tid}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .expect("reachable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_streams_in_flight_finish_and_be_recorded_then_exits_0() {
    let mock = MockVllm::start(Scripted::ids(vec![28, IM_END])).await;
    mock.push(Scripted {
        ids: vec![28, 29, 30, 31, IM_END],
        hold_after: Some(2),
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut tito, addr) = serve(&mock, dir.path(), 60);

    let resp = stream_request(&addr, "drain-1").await;
    assert_eq!(resp.status(), 200);
    tokio::time::timeout(FAILSAFE, mock.wait_held(1))
        .await
        .expect("the stream reached its hold");
    tito.terminate();
    tokio::task::block_in_place(|| tito.wait_for("shutting down: finishing calls in flight"));
    // Signalled with a stream half-way: it goes on to its end.
    mock.release_held();
    let body = tokio::time::timeout(FAILSAFE, resp.text())
        .await
        .expect("the stream ended")
        .expect("body");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(!body.contains("\"error\""), "{body}");
    let status = tokio::task::block_in_place(|| tito.wait_exit(FAILSAFE)).expect("exited");
    assert_eq!(status.code(), Some(0), "{status:?}");

    // Recorded: the whole answer, in the store the process left behind.
    let store = tito::store::open(&format!("sqlite://{}/spans.db", dir.path().display()))
        .expect("store opens");
    let t = store
        .get_trajectory("drain-1")
        .await
        .expect("read")
        .expect("recorded");
    assert_eq!(t.calls.len(), 1);
    assert_eq!(t.calls[0].sampled_ids, [28, 29, 30, 31, IM_END]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_drain_deadline_the_process_exits_anyway() {
    let mock = MockVllm::start(Scripted::ids(vec![28, IM_END])).await;
    mock.push(Scripted {
        ids: vec![28, 29, IM_END],
        hold_after: Some(1),
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut tito, addr) = serve(&mock, dir.path(), 1);
    let resp = stream_request(&addr, "late-1").await;
    assert_eq!(resp.status(), 200);
    tokio::time::timeout(FAILSAFE, mock.wait_held(1))
        .await
        .expect("the stream reached its hold");
    tito.terminate();
    // Never released: the deadline (1 s) ends the process.
    let status = tokio::task::block_in_place(|| tito.wait_exit(FAILSAFE)).expect("exited");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let lines = tokio::task::block_in_place(|| tito.stop());
    assert!(
        lines.iter().any(|(_, l)| l.contains("drain timeout")),
        "{lines:#?}"
    );
    // The backend's sequence was cancelled when the process went.
    tokio::time::timeout(FAILSAFE, mock.wait_cancelled())
        .await
        .expect("cancelled");
}

/// In process: a client that keeps its connection but reads nothing. Once
/// the socket buffers are full, the stream's writes wait; after
/// `sse_send_timeout_s` the gateway gives up on it and cancels the backend.
#[tokio::test]
async fn a_stream_whose_client_stopped_reading_is_ended_and_its_backend_cancelled() {
    // 250,000 tokens: far more SSE bytes than loopback socket buffers hold.
    let ids: Vec<u32> = (0..250_000u32).map(|i| 72 + i % 20).collect();
    let mock = MockVllm::start(Scripted::ids(ids)).await;
    mock.quiet();
    let text = format!(
        "[server]\nsse_send_timeout_s = 1\n[model]\nname = \"test-model\"\n\
         tokenizer = \"unused\"\nmax_model_len = 300000\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n[store]\nurl = \"memory://\"\n",
        mock.url()
    );
    let g = common::start_gateway(tito::config::Config::from_toml(&text).expect("config")).await;
    let resp = g
        .post(
            "/t/slow-reader/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                   "max_tokens": 260_000}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    // Hold the response without reading it.
    tokio::time::timeout(FAILSAFE, mock.wait_cancelled())
        .await
        .expect("the backend sequence was cancelled");
    drop(resp);
    let metrics = g.get_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tito_sse_send_timeouts_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
}
