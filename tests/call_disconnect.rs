//! Clients that hang up at any moment of a call: before the backend answers,
//! while tokens stream, or while the finished call is being recorded. The
//! next call on every trajectory must answer 200, and the store must hold
//! exactly what the backend was sent and sampled: every recorded call is a
//! completed backend answer (same prompt, same ids), none is recorded twice,
//! and every answer a client received in full is recorded.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::mock_vllm::{MockVllm, Scripted};
use common::watched_store::WatchedStore;
use common::{config, start_gateway, start_gateway_on};
use serde_json::{json, Value};
use tito::render::testing::{chatml_renderer, IM_END};

const TRAJECTORIES: u64 = 40;
const TOKEN_DELAY_MS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnects_at_any_moment_lose_nothing_and_duplicate_nothing() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut ids = g
        .renderer
        .encode("eight tokens or so of answer")
        .expect("encodes");
    ids.push(IM_END);
    let n_tokens = ids.len() as u64;
    mock.state.default.lock().expect("lock").ids = ids.clone();
    mock.state.default.lock().expect("lock").token_delay_ms = TOKEN_DELAY_MS;
    let backend_ms = n_tokens * TOKEN_DELAY_MS;

    // Client timeouts spread from "before the backend is asked" to "after
    // the answer": a deterministic sweep, streamed and not.
    let mut complete = HashMap::new();
    let calls = (0..TRAJECTORIES).map(|t| {
        let g = &g;
        async move {
            let stream = t % 2 == 1;
            let timeout = Duration::from_millis(t * (3 * backend_ms + 100) / TRAJECTORIES);
            let body = json!({"messages": [{"role": "user", "content": format!("task {t}")}],
                              "stream": stream, "return_token_ids": true});
            let client = reqwest::Client::builder()
                .timeout(timeout.max(Duration::from_millis(1)))
                .build()
                .expect("client");
            let got = async {
                let resp = client
                    .post(g.url(&format!("/t/d-{t}/v1/chat/completions")))
                    .json(&body)
                    .send()
                    .await
                    .ok()?;
                let text = resp.text().await.ok()?;
                // A whole answer: JSON, or a stream that reached [DONE].
                let whole = if stream {
                    text.contains("[DONE]") && text.contains("\"finish_reason\":\"stop\"")
                } else {
                    serde_json::from_str::<Value>(&text).is_ok()
                };
                whole.then_some(())
            }
            .await;
            (t, got.is_some())
        }
    });
    for (t, ok) in futures::future::join_all(calls).await {
        complete.insert(t, ok);
    }
    let answered = complete.values().filter(|ok| **ok).count();
    assert!(
        answered > 0 && answered < TRAJECTORIES as usize,
        "the sweep straddles the answer: {answered}"
    );

    // The next call on every trajectory answers 200 (no stale hot view, no
    // duplicate call slot).
    for t in 0..TRAJECTORIES {
        let body = json!({"messages": [{"role": "user", "content": format!("task {t}")}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "next"}]});
        let r = g.post(&format!("/t/d-{t}/v1/chat/completions"), body).await;
        assert_eq!(r.status(), 200, "trajectory d-{t}");
    }

    // The store against the backend's own log of completed answers.
    let completed = mock.completed();
    let rows = g.export_jsonl("layout=per_call").await;
    let mut by_traj: HashMap<String, Vec<&Value>> = HashMap::new();
    for r in &rows {
        by_traj
            .entry(r["trajectory_id"].as_str().expect("id").to_string())
            .or_default()
            .push(r);
    }
    let mut unmatched: Vec<(Vec<u32>, Vec<u32>)> = completed.clone();
    for r in &rows {
        let prompt: Vec<u32> = serde_json::from_value(r["prompt_ids"].clone()).expect("prompt");
        let sampled: Vec<u32> = serde_json::from_value(r["response_ids"].clone()).expect("ids");
        let pos = unmatched
            .iter()
            .position(|(p, s)| *p == prompt && *s == sampled)
            .unwrap_or_else(|| {
                panic!(
                    "recorded call {} is no completed backend answer",
                    r["trajectory_id"]
                )
            });
        unmatched.swap_remove(pos);
        let lps = r["response_logprobs"].as_array().expect("logprobs");
        assert!(lps.iter().all(Value::is_f64), "real logprobs: {lps:?}");
    }
    for t in 0..TRAJECTORIES {
        let calls = by_traj.get(&format!("d-{t}")).map_or(0, Vec::len);
        let first_recorded = calls == 2;
        if complete[&t] {
            assert!(
                first_recorded,
                "d-{t}: an answer the client received is recorded"
            );
        }
        assert!((1..=2).contains(&calls), "d-{t}: {calls} calls recorded");
    }
    // A completed backend answer that is not recorded can only be one whose
    // client left before the gateway read its last event.
    for (prompt, _) in &unmatched {
        let t = (0..TRAJECTORIES)
            .find(|t| {
                let m = vec![json!({"role": "user", "content": format!("task {t}")})];
                let input = tito::render::RenderInput {
                    messages: &m,
                    add_generation_prompt: true,
                    ..Default::default()
                };
                g.renderer.render_ids(&input).ok().as_ref() == Some(prompt)
            })
            .expect("an unrecorded answer is a first call of some trajectory");
        assert!(
            !complete[&t],
            "d-{t}: its client got the answer, so it is recorded"
        );
    }
}

/// A client that leaves while its finished call is being written: the write
/// goes on in a task of its own and the call is recorded, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_its_call_is_written_still_gets_it_recorded() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let watched = WatchedStore::new(tito::store::open("memory://").expect("store"));
    let store: tito::store::DynStore = watched.clone();
    let g = start_gateway_on(config(&[mock.url()], ""), chatml_renderer(), store).await;
    watched
        .hold_appends
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for (t, stream) in [(0, false), (1, true)] {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream});
        let url = g.url(&format!("/t/gone-{t}/v1/chat/completions"));
        let client = g.client.clone();
        let call = tokio::spawn(async move {
            let resp = client.post(url).json(&body).send().await?;
            resp.text().await
        });
        // The last token is in; the call is being written. The client leaves.
        bounded(watched.held.notified(), "the write begins").await;
        call.abort();
        let _ = call.await;
        // Its write now waits in another task, or was dropped with the
        // request.
        let moved = async {
            tokio::select! {
                () = watched.moved.notified() => {}
                () = watched.abandoned.notified() => {
                    panic!("gone-{t} (stream {stream}): the write was dropped with its client")
                }
            }
        };
        bounded(moved, "the write moves to a task of its own").await;
        watched.release.notify_one();
        bounded(watched.appended.notified(), "the write ends").await;
        let calls = g.export_jsonl("layout=per_call").await;
        let mine = calls
            .iter()
            .filter(|r| r["trajectory_id"] == format!("gone-{t}"))
            .count();
        assert_eq!(mine, 1, "gone-{t} (stream {stream}) is recorded once");
    }
}

/// `f`, or a failure naming `what` if it has not happened in 30 s (a
/// guard against a hang, not a synchronisation).
async fn bounded<F: std::future::Future>(f: F, what: &str) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 30 s"))
}
