//! One trajectory, two policies: a planner on the base model and a coder on
//! its LoRA adapter take turns in one conversation. Every call records the
//! policy that served it; `?model=` / `?adapter=` export each policy's rows
//! with the mask 1 exactly on the tokens that policy sampled (the other's
//! are observations), every sampled id kept verbatim in both.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::start_gateway;
use common::two_policies::{converse, two_policies, CODER, MODEL, TURNS};
use serde_json::{json, Value};

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
