//! One trajectory, two policies: a planner on the base model and a coder on
//! its LoRA adapter take turns in one conversation. Every call records the
//! policy that served it; `?model=` / `?adapter=` export each policy's rows
//! with the mask 1 exactly on the tokens that policy sampled (the other's
//! are observations), every sampled id kept verbatim in both. The replay
//! check replays each policy's tokens on its own weights: the planner's on
//! the base model, the coder's with its adapter.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

const MODEL: &str = "test-model";
const CODER: &str = "coder";

fn two_policies(urls: &[String]) -> tito::Config {
    config(
        urls,
        &format!("[[model.adapters]]\nname = \"{CODER}\"\npath = \"/loras/coder\"\n"),
    )
}

/// The ids the mock samples for `text` (ending the turn).
fn sampled(g: &Gateway, text: &str) -> Vec<u32> {
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    ids
}

/// Who speaks each turn, and what.
const TURNS: [(&str, &str); 4] = [
    (MODEL, "Plan: write add(a, b)."),
    (CODER, "def add(a, b): return a + b"),
    (MODEL, "Plan: test it."),
    (CODER, "assert add(1, 2) == 3"),
];

/// Runs the four turns on trajectory `tid`; returns each turn's sampled ids.
async fn converse(g: &Gateway, mock: &MockVllm, tid: &str) -> Vec<Vec<u32>> {
    let mut messages = vec![json!({"role": "user", "content": "Write and test add."})];
    let mut out = Vec::new();
    for (model, text) in TURNS {
        let ids = sampled(g, text);
        mock.push(Scripted::ids(ids.clone()));
        let r = g
            .post(
                &format!("/t/{tid}/v1/chat/completions"),
                json!({"model": model, "messages": messages}),
            )
            .await;
        assert_eq!(r.status(), 200, "turn of {model}");
        let sent = mock.last_request();
        match model {
            CODER => assert_eq!(sent["model"], CODER),
            _ => assert!(sent.get("model").is_none(), "the base model"),
        }
        let body: Value = r.json().await.expect("json");
        let content = body["choices"][0]["message"]["content"].clone();
        assert_eq!(content, text);
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": "next"}));
        out.push(ids);
    }
    out
}

/// The mask a policy's export must have: 1 on its own turns' ids, 0 on the
/// other's and on everything between turns.
fn want_mask(row: &Value, turns: &[Vec<u32>], own: &str) -> Vec<u8> {
    let offsets: Vec<usize> = row["call_offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .map(|o| o.as_u64().expect("offset") as usize)
        .collect();
    let len = row["response_ids"].as_array().expect("ids").len();
    let mut mask = vec![0u8; len];
    for ((speaker, _), (ids, &at)) in TURNS.iter().zip(turns.iter().zip(&offsets)) {
        if *speaker == own {
            mask[at..at + ids.len()].fill(1);
        }
    }
    mask
}

fn ids_of(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[tokio::test]
async fn each_policys_export_masks_exactly_its_own_sampled_tokens() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(two_policies(&[mock.url()])).await;
    let turns = converse(&g, &mock, "duo").await;

    // Each call names the policy that served it.
    let t = g.get_json("/v1/trajectories/duo").await;
    let policies: Vec<(Value, Value)> = t["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| (c["model"].clone(), c["adapter"].clone()))
        .collect();
    let base = (json!(MODEL), Value::Null);
    let coder = (json!(MODEL), json!(CODER));
    assert_eq!(policies, [base.clone(), coder.clone(), base, coder]);

    // One sample: every turn continues the ids of the one before.
    let all = g.export_jsonl("trajectory=duo").await;
    assert_eq!(all.len(), 1, "one sample");
    let all = &all[0];
    assert_eq!(all["num_turns"], 4);
    assert_eq!(
        (&all["model"], &all["adapter"]),
        (&Value::Null, &Value::Null)
    );

    for (query, own, adapter) in [
        (format!("model={MODEL}"), MODEL, Value::Null),
        (format!("adapter={CODER}"), CODER, json!(CODER)),
        (
            format!("model={MODEL}&adapter={CODER}"),
            CODER,
            json!(CODER),
        ),
    ] {
        let rows = g.export_jsonl(&format!("trajectory=duo&{query}")).await;
        assert_eq!(rows.len(), 1, "{query}");
        let row = &rows[0];
        assert_eq!(row["model"], MODEL, "{query}");
        assert_eq!(row["adapter"], adapter, "{query}");
        // The same ids as the whole sample: nothing dropped or re-tokenized.
        assert_eq!(ids_of(&row["prompt_ids"]), ids_of(&all["prompt_ids"]));
        assert_eq!(ids_of(&row["response_ids"]), ids_of(&all["response_ids"]));
        let mask: Vec<u8> = ids_of(&row["response_mask"])
            .into_iter()
            .map(|m| m as u8)
            .collect();
        assert_eq!(mask, want_mask(row, &turns, own), "{query}");
        // Numbers only where this policy sampled.
        let lps = row["response_logprobs"].as_array().expect("logprobs");
        for (m, lp) in mask.iter().zip(lps) {
            assert_eq!(*m == 1, !lp.is_null(), "{query}: logprob where mask is 1");
        }
        // Each policy's own turns, id for id.
        let response = ids_of(&row["response_ids"]);
        let kept: Vec<u64> = response
            .iter()
            .zip(&mask)
            .filter(|(_, m)| **m == 1)
            .map(|(id, _)| *id)
            .collect();
        let own_ids: Vec<u64> = TURNS
            .iter()
            .zip(&turns)
            .filter(|((speaker, _), _)| *speaker == own)
            .flat_map(|(_, ids)| ids.iter().map(|&i| i as u64))
            .collect();
        assert_eq!(kept, own_ids, "{query}");
    }

    // per_call: only the policy's calls, each mask all 1.
    let rows = g
        .export_jsonl(&format!("trajectory=duo&layout=per_call&adapter={CODER}"))
        .await;
    let calls: Vec<u64> = rows
        .iter()
        .map(|r| r["call"].as_u64().expect("call"))
        .collect();
    assert_eq!(calls, [1, 3]);
    for (row, ids) in rows.iter().zip([&turns[1], &turns[3]]) {
        assert_eq!(row["adapter"], CODER);
        let want: Vec<u64> = ids.iter().map(|&i| i as u64).collect();
        assert_eq!(ids_of(&row["response_ids"]), want);
        assert!(ids_of(&row["response_mask"]).iter().all(|&m| m == 1));
    }

    // A policy that served nothing here has no rows.
    let none = g.export_jsonl("trajectory=duo&adapter=judge").await;
    assert!(none.is_empty(), "{none:?}");

    // The metrics count each policy's calls and sampled tokens (this is the
    // only test of the binary that makes calls).
    let text = g.get_text("/metrics").await;
    for (policy, turns) in [
        (MODEL, [&turns[0], &turns[2]]),
        (CODER, [&turns[1], &turns[3]]),
    ] {
        let tokens: usize = turns.iter().map(|t| t.len()).sum();
        for line in [
            format!("tito_policy_calls_total{{policy=\"{policy}\"}} 2"),
            format!("tito_policy_sampled_tokens_total{{policy=\"{policy}\"}} {tokens}"),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line} in:\n{text}"
            );
        }
    }
}

#[tokio::test]
async fn a_malformed_policy_filter_is_refused_by_its_name() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(two_policies(&[mock.url()])).await;
    for (query, param) in [("model=", "model"), ("adapter=", "adapter")] {
        let r = g
            .client
            .get(g.url(&format!("/v1/export?{query}")))
            .send()
            .await
            .expect("export");
        assert_eq!(r.status(), 400, "{query}");
        let err: Value = r.json().await.expect("json");
        assert_eq!(err["error"]["param"], param, "{query}");
    }
}

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
