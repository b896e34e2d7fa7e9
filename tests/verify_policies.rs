//! The replay check of a two-policy trajectory: each policy's tokens are
//! replayed on its own weights (the planner's on the base model, the
//! coder's with its adapter), each check names its policy, and each
//! policy's export carries its own check.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::start_gateway;
use common::two_policies::{converse, two_policies, CODER, MODEL, TURNS};
use serde_json::{json, Value};

#[tokio::test]
async fn the_replay_check_replays_each_policys_tokens_on_its_own_weights() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(two_policies(&[mock.url()])).await;
    let turns = converse(&g, &mock, "v-pol").await;
    // The replay of the coder's first token is off by 0.5 nats.
    let row = &g.export_jsonl("trajectory=v-pol").await[0];
    let first_coder = row["prompt_ids"].as_array().expect("ids").len()
        + row["call_offsets"][1].as_u64().expect("offset") as usize;
    mock.shift_replay(first_coder, 0.5);
    let r = g.post("/v1/trajectories/v-pol/verify", json!({})).await;
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.expect("json");
    // One scoring pass per policy: the coder's names its adapter.
    let scored: Vec<Value> = mock
        .requests()
        .into_iter()
        .filter(|r| !r["prompt_logprobs"].is_null())
        .collect();
    assert_eq!(scored.len(), 2, "{scored:?}");
    assert!(scored.iter().any(|r| r.get("model").is_none()));
    assert!(scored.iter().any(|r| r["model"] == CODER));
    let own = |who: &str| -> u64 {
        TURNS
            .iter()
            .zip(&turns)
            .filter(|((speaker, _), _)| *speaker == who)
            .map(|(_, ids)| ids.len() as u64)
            .sum()
    };
    let samples = report["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 2, "{report}");
    for s in samples {
        assert_eq!(s["model"], MODEL, "{s}");
        let who = s["adapter"].as_str().unwrap_or(MODEL);
        // Exactly the policy's own sampled tokens are compared.
        assert_eq!(s["compared"], own(who), "{s}");
        let max = s["max_abs_diff"].as_f64().expect("max");
        let want = if who == CODER { 0.5 } else { 0.0 };
        assert!((max - want).abs() < 1e-3, "{s}");
    }
    assert!(samples.iter().any(|s| s["adapter"] == CODER));
    assert!(samples.iter().any(|s| s.get("adapter").is_none()));
    // Both are stored with the trajectory; a second check replaces them.
    let again = g.post("/v1/trajectories/v-pol/verify", json!({})).await;
    assert_eq!(again.status(), 200);
    let t = g.get_json("/v1/trajectories/v-pol").await;
    let replays = t["samples"][0]["replays"].as_array().expect("replays");
    assert_eq!(replays.len(), 2, "{t}");
    // Each policy's export carries its own check; the whole sample's, all.
    let replay_max = |query: &'static str| {
        let g = &g;
        async move {
            let rows = g.export_jsonl(&format!("trajectory=v-pol&{query}")).await;
            rows[0]["replay_max_abs_diff"].as_f64().expect("a number")
        }
    };
    assert_eq!(replay_max("model=test-model").await, 0.0);
    assert!((replay_max("adapter=coder").await - 0.5).abs() < 1e-3);
    assert!((replay_max("model=test-model&adapter=coder").await - 0.5).abs() < 1e-3);
    assert!((replay_max("layout=trajectory").await - 0.5).abs() < 1e-3);
}
