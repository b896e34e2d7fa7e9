//! Gateway replicas on one PostgreSQL store: a trajectory whose turns
//! alternate between two gateways keeps exact history, because a replica
//! whose view is behind the store (the other one served the last turn)
//! reads the calls it lacks before it prepares the call (from turn 2 on,
//! each replica's view is one call behind: a catch-up, not a reload).

mod common;
mod store_support;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway_on, Gateway};
use serde_json::{json, Value};
use tito::render::testing::{chatml_renderer, IM_END};

fn bytes_of(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

async fn chat(g: &Gateway, messages: &Value) -> Value {
    let resp = g
        .post(
            "/t/shared-1/v1/chat/completions",
            json!({"messages": messages, "return_token_ids": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_alternating_between_replicas_continue_the_exact_tokens() {
    let mock = MockVllm::start(Scripted::default()).await;
    let url = store_support::postgres_url();
    let extra = format!("[store]\nurl = \"{url}\"\n");
    let cfg = config(&[mock.url()], &extra);
    let open = || tito::store::open(&url).expect("open postgres");
    let a = start_gateway_on(cfg.clone(), chatml_renderer(), open()).await;
    let b = start_gateway_on(cfg, chatml_renderer(), open()).await;

    // Non-canonical samples ("Hello" as single bytes), so only the exact
    // history, not a fresh render, gives the expected prompts.
    let replies = ["Hello", "Again", "More", "Later", "Done"];
    let mut messages = vec![json!({"role": "user", "content": "turn 0"})];
    let mut expected_prompt: Vec<u32> = Vec::new();
    for (turn, (gateway, text)) in [&a, &b, &a, &b, &a].into_iter().zip(replies).enumerate() {
        let sampled = [bytes_of(text), vec![IM_END]].concat();
        mock.push(Scripted::ids(sampled.clone()));
        let r = chat(gateway, &json!(messages)).await;
        let prompt = ids(&r["prompt_token_ids"]);
        if turn > 0 {
            assert_eq!(
                prompt[..expected_prompt.len()],
                expected_prompt[..],
                "turn {turn} does not continue the exact tokens of turn {}",
                turn - 1
            );
        }
        assert_eq!(ids(&r["choices"][0]["token_ids"]), sampled);
        expected_prompt = [prompt, sampled].concat();
        messages.push(json!({"role": "assistant", "content": text}));
        messages.push(json!({"role": "user", "content": format!("turn {}", turn + 1)}));
    }

    // One chain of five calls, one sample, read the same from both.
    let t = a.get_json("/v1/trajectories/shared-1").await;
    assert_eq!(b.get_json("/v1/trajectories/shared-1").await, t);
    let parents: Vec<Value> = t["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["parent_call"].clone())
        .collect();
    let chain = [Value::Null, json!(0), json!(1), json!(2), json!(3)];
    assert_eq!(parents, chain, "{t}");
    let rows = b.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1, "one sample");
    assert_eq!(rows[0]["num_turns"], 5);
}
