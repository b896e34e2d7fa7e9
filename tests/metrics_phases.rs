//! The request path's phases are `tracing` spans, and the subscriber's
//! phase timer turns each into `tito_phase_duration_seconds{phase}`: a chat
//! or completions call passes parse, render, route, first_token and commit
//! once each.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway};
use serde_json::json;
use tito::render::testing::IM_END;
use tracing_subscriber::layer::SubscriberExt;

/// The count of one phase's histogram in a `/metrics` text.
fn phase_count(metrics: &str, phase: &str) -> u64 {
    let key = format!("tito_phase_duration_seconds_count{{phase=\"{phase}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_chat_call_is_timed_phase_by_phase() {
    // The same layer `tito serve` installs (crate::logging), alone.
    let subscriber = tracing_subscriber::registry().with(tito::metrics::PhaseTimer::layer());
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let mock = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let phases = ["parse", "render", "route", "first_token", "commit"];
    let before = g.get_text("/metrics").await;
    let before: Vec<u64> = phases.iter().map(|p| phase_count(&before, p)).collect();

    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = g.post("/t/phases/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    let after = g.get_text("/metrics").await;
    for (phase, was) in phases.iter().zip(&before) {
        assert_eq!(phase_count(&after, phase), was + 1, "{phase}:\n{after}");
    }

    // A completions call passes the same five.
    let body = json!({"prompt": "hi", "max_tokens": 4});
    let resp = g.post("/t/phases-2/v1/completions", body).await;
    assert_eq!(resp.status(), 200);
    let last = g.get_text("/metrics").await;
    for (phase, was) in phases.iter().zip(&before) {
        assert_eq!(phase_count(&last, phase), was + 2, "{phase}:\n{last}");
    }
}
