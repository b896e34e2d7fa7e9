//! Exact multi-turn history end to end: the backend samples non-canonical
//! token ids, the client re-serializes what it got back, and the next prompt
//! still carries the sampled ids verbatim; drift and masks are recorded.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;
use tito::render::RenderInput;

fn bytes_of(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn render(g: &Gateway, messages: &Value, gen: bool) -> Vec<u32> {
    let msgs: Vec<Value> = serde_json::from_value(messages.clone()).expect("messages");
    g.renderer
        .render_ids(&RenderInput {
            messages: &msgs,
            add_generation_prompt: gen,
            ..Default::default()
        })
        .expect("renders")
}

async fn chat(g: &Gateway, tid: &str, messages: &Value) -> Value {
    let resp = g
        .post(
            &format!("/t/{tid}/v1/chat/completions"),
            json!({"messages": messages, "return_token_ids": true, "logprobs": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json")
}

async fn trajectory(g: &Gateway, tid: &str) -> Value {
    g.get_json(&format!("/v1/trajectories/{tid}")).await
}

#[tokio::test]
async fn sampled_ids_are_kept_verbatim_across_turns() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    // Turn 1: "Hello" sampled as five single-byte tokens (a fresh encode merges "Hell").
    let sampled1: Vec<u32> = [bytes_of("Hello"), vec![IM_END]].concat();
    assert_ne!(g.renderer.encode("Hello").expect("enc"), bytes_of("Hello"));
    mock.push(Scripted::ids(sampled1.clone()));
    let m1 = json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]);
    let r1 = chat(&g, "traj-a", &m1).await;
    let prompt1 = render(&g, &m1, true);
    assert_eq!(r1["prompt_token_ids"], json!(prompt1));

    // Turn 2: the client echoes the reply re-serialized (extra keys, other order).
    let sampled2: Vec<u32> = [g.renderer.encode("Bye").expect("enc"), vec![IM_END]].concat();
    mock.push(Scripted::ids(sampled2.clone()));
    let m2 = json!([
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"content": "Hello", "role": "assistant", "tool_calls": [], "refusal": null},
        {"role": "user", "content": "more"}
    ]);
    let r2 = chat(&g, "traj-a", &m2).await;
    let observation = g
        .renderer
        .encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
        .expect("enc");
    let expected2 = [prompt1.clone(), sampled1.clone(), observation.clone()].concat();
    assert_eq!(r2["prompt_token_ids"], json!(expected2));
    assert_eq!(mock.last_request()["prompt"], json!(expected2));
    assert_ne!(
        expected2,
        render(&g, &m2, true),
        "a fresh render would have drifted"
    );

    // The trajectory API reports the drift with its cause and position.
    let t = trajectory(&g, "traj-a").await;
    let drift = t["drift"].as_array().expect("drift list");
    assert_eq!(drift.len(), 1, "{t}");
    assert_eq!(drift[0]["cause"], "bpe_retokenization");
    assert_eq!(drift[0]["position"], prompt1.len());

    // Export: one sample, mask 1 exactly on the sampled ids.
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row["prompt_ids"], json!(prompt1));
    assert_eq!(
        row["response_ids"],
        json!([sampled1.clone(), observation.clone(), sampled2.clone()].concat())
    );
    let mask: Vec<u64> = [
        vec![1; sampled1.len()],
        vec![0; observation.len()],
        vec![1; sampled2.len()],
    ]
    .concat();
    assert_eq!(row["response_mask"], json!(mask));
    assert_eq!(row["num_turns"], 2);
    // prompt + response == what the backend saw on the last call + its sample.
    let mut all: Vec<u64> = serde_json::from_value(row["prompt_ids"].clone()).expect("ids");
    all.extend(serde_json::from_value::<Vec<u64>>(row["response_ids"].clone()).expect("ids"));
    let last: Vec<u64> =
        serde_json::from_value(mock.last_request()["prompt"].clone()).expect("ids");
    assert_eq!(
        all,
        [last, sampled2.iter().map(|&x| u64::from(x)).collect()].concat()
    );
}

#[tokio::test]
async fn length_stop_gets_end_of_turn_glue_with_mask_zero() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    // The model is cut by max_tokens: no <|im_end|> sampled.
    mock.push(Scripted::ids(bytes_of("abcdef")));
    let m1 = json!([{"role": "user", "content": "go"}]);
    let r = g
        .post(
            "/t/traj-len/v1/chat/completions",
            json!({"messages": m1, "max_tokens": 3}),
        )
        .await;
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    mock.push(Scripted::ids(vec![b'z'.into(), IM_END]));
    let m2 = json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": "abc"},
                    {"role": "user", "content": "on"}]);
    chat(&g, "traj-len", &m2).await;
    let prompt1 = render(&g, &m1, true);
    let glue_and_turn = g
        .renderer
        .encode("<|im_end|>\n<|im_start|>user\non<|im_end|>\n<|im_start|>assistant\n")
        .expect("enc");
    let expected = [prompt1, bytes_of("abc"), glue_and_turn].concat();
    assert_eq!(mock.last_request()["prompt"], json!(expected));
    let rows = g.export_jsonl("layout=trajectory").await;
    let mask = rows[0]["response_mask"].as_array().expect("mask");
    assert_eq!(mask[3], 0, "the end-of-turn glue was never sampled");
}

#[tokio::test]
async fn edited_history_starts_a_new_sample_and_branches_are_samples() {
    let mock = MockVllm::start(Scripted::ids(vec![b'A'.into(), IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let m1 = json!([{"role": "user", "content": "q"}]);
    chat(&g, "traj-e", &m1).await;
    // Two continuations of the same call: the second one branches.
    let cont = |next: &str| {
        json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"},
               {"role": "user", "content": next}])
    };
    chat(&g, "traj-e", &cont("x")).await;
    chat(&g, "traj-e", &cont("y")).await;
    // The client edits the assistant reply: no served call is continued.
    let edited = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "B"},
                        {"role": "user", "content": "z"}]);
    chat(&g, "traj-e", &edited).await;
    let t = trajectory(&g, "traj-e").await;
    let calls = t["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 4);
    assert_eq!(calls[1]["parent_call"], 0);
    assert_eq!(calls[2]["parent_call"], 0);
    assert_eq!(calls[1]["sample_index"], calls[0]["sample_index"]);
    assert_ne!(calls[2]["sample_index"], calls[1]["sample_index"]);
    assert_eq!(calls[3]["parent_call"], Value::Null);
    assert_eq!(calls[3]["drift"]["cause"], "client_edit");
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 3, "branch x, branch y, edited conversation");
    assert!(rows.iter().all(|r| r["trajectory_id"] == "traj-e"));
    let per_call = g.export_jsonl("layout=per_call").await;
    assert_eq!(per_call.len(), 4);
}

#[tokio::test]
async fn template_mode_uses_fresh_render_and_splits_on_drift() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(
        &[mock.url()],
        "[trajectory]\nhistory = \"template\"\n",
    ))
    .await;
    mock.push(Scripted::ids([bytes_of("Hello"), vec![IM_END]].concat()));
    let m1 = json!([{"role": "user", "content": "hi"}]);
    chat(&g, "traj-t", &m1).await;
    mock.push(Scripted::ids(vec![b'k'.into(), IM_END]));
    let m2 = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "more"}]);
    chat(&g, "traj-t", &m2).await;
    assert_eq!(mock.last_request()["prompt"], json!(render(&g, &m2, true)));
    let t = trajectory(&g, "traj-t").await;
    let calls = t["calls"].as_array().expect("calls");
    assert_eq!(
        calls[1]["parent_call"],
        Value::Null,
        "fresh render does not extend the sampled ids"
    );
    assert_eq!(calls[1]["drift"]["cause"], "bpe_retokenization");
    // Canonical sampling extends cleanly: same sample.
    mock.push(Scripted::ids(
        [g.renderer.encode("Sure").expect("enc"), vec![IM_END]].concat(),
    ));
    let m3 = json!([{"role": "user", "content": "a"}]);
    chat(&g, "traj-t2", &m3).await;
    let m4 = json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "Sure"},
                    {"role": "user", "content": "b"}]);
    chat(&g, "traj-t2", &m4).await;
    let t = trajectory(&g, "traj-t2").await;
    assert_eq!(t["calls"][1]["parent_call"], 0);
    assert_eq!(t["calls"][1]["drift"], Value::Null);
}

#[tokio::test]
async fn response_budget_caps_max_tokens_and_marks_truncation() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(
        &[mock.url()],
        "[trajectory]\nresponse_length = 12\non_budget_exhausted = \"error\"\n",
    ))
    .await;
    mock.push(Scripted::ids(bytes_of("abcdefghijklmnopqrstuvwxyz")));
    let m1 = json!([{"role": "user", "content": "go"}]);
    let body = chat(&g, "traj-b", &m1).await;
    assert_eq!(mock.last_request()["max_tokens"], 12);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows[0]["truncated"], true);
    assert!(rows[0]["response_ids"].as_array().expect("ids").len() <= 12);
    // The sample is full: with on_budget_exhausted = "error", a continuation
    // is refused with a clear error (the default answers 200 with
    // finish_reason "length", see tests/call_fidelity.rs).
    let m2 = json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": "abcdefghijkl"},
                    {"role": "user", "content": "more"}]);
    let r = g
        .post("/t/traj-b/v1/chat/completions", json!({"messages": m2}))
        .await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.expect("json");
    assert_eq!(e["error"]["code"], "response_budget_exhausted");
}

#[tokio::test]
async fn completions_with_token_prompts_continue_by_prefix() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(Scripted::ids(vec![7, 8, IM_END]));
    let r = g
        .post("/t/traj-c/v1/completions", json!({"prompt": [1, 2, 3]}))
        .await;
    assert_eq!(r.status(), 200);
    mock.push(Scripted::ids(vec![9, IM_END]));
    let r = g
        .post(
            "/t/traj-c/v1/completions",
            json!({"prompt": [1, 2, 3, 7, 8, IM_END, 4, 5]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0]["response_ids"],
        json!([7, 8, IM_END, 4, 5, 9, IM_END])
    );
    assert_eq!(rows[0]["response_mask"], json!([1, 1, 1, 0, 0, 1, 1]));
}

#[tokio::test]
async fn finished_trajectory_refuses_calls_before_generating() {
    let mock = MockVllm::start(Scripted::ids(vec![b'A'.into(), IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let m1 = json!([{"role": "user", "content": "q"}]);
    chat(&g, "traj-f", &m1).await;
    let pins = |v: serde_json::Value| v["backends"][0]["sticky"].clone();
    assert_eq!(pins(g.get_json("/admin/backends").await), 1);
    let r = g
        .client
        .post(g.url("/v1/trajectories/traj-f/finish"))
        .send()
        .await
        .expect("finish");
    assert_eq!(r.status(), 200);
    // Its pin is gone: finished trajectories do not fill the sticky map.
    assert_eq!(pins(g.get_json("/admin/backends").await), 0);
    let before = mock.requests().len();
    let m2 = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"},
                    {"role": "user", "content": "again"}]);
    let r = g
        .post("/t/traj-f/v1/chat/completions", json!({"messages": m2}))
        .await;
    assert_eq!(r.status(), 409);
    assert_eq!(
        mock.requests().len(),
        before,
        "nothing was generated for a finished trajectory"
    );
    let r = g
        .client
        .post(g.url("/v1/trajectories/nope/finish"))
        .send()
        .await
        .expect("finish");
    assert_eq!(r.status(), 404);
    let r = g
        .client
        .post(g.url("/v1/trajectories/traj-f/reward"))
        .json(&json!({"reward": 1.0}))
        .send()
        .await
        .expect("reward");
    assert_eq!(r.status(), 200);
    let rows = g.export_jsonl("layout=trajectory&status=finished").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["reward"], 1.0);
}

#[tokio::test]
async fn history_continues_exactly_after_a_restart() {
    let mock = MockVllm::start(Scripted::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open(&url).expect("store");
    let renderer = tito::render::testing::chatml_renderer();
    let first =
        common::start_gateway_on(config(&[mock.url()], ""), renderer.clone(), store.clone()).await;
    let sampled1: Vec<u32> = [bytes_of("Hello"), vec![IM_END]].concat();
    mock.push(Scripted::ids(sampled1.clone()));
    let m1 = json!([{"role": "user", "content": "hi"}]);
    chat(&first, "traj-r", &m1).await;
    // A new gateway (empty in-memory view) on the same store.
    let second = common::start_gateway_on(config(&[mock.url()], ""), renderer, store.clone()).await;
    mock.push(Scripted::ids(vec![b'k'.into(), IM_END]));
    let m2 = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "more"}]);
    let r2 = chat(&second, "traj-r", &m2).await;
    let observation = second
        .renderer
        .encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
        .expect("enc");
    let expected = [render(&second, &m1, true), sampled1, observation].concat();
    assert_eq!(r2["prompt_token_ids"], json!(expected));
    let t = trajectory(&second, "traj-r").await;
    assert_eq!(t["calls"][1]["parent_call"], 0);
    assert_eq!(t["calls"][1]["drift"]["cause"], "bpe_retokenization");
    // A third gateway rebuilds from a call that continued another (the
    // SQLite store keeps that body's messages apart) and continues it.
    let renderer = second.renderer.clone();
    let third = common::start_gateway_on(config(&[mock.url()], ""), renderer, store).await;
    mock.push(Scripted::ids(vec![b'z'.into(), IM_END]));
    let m3 = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "more"}, {"role": "assistant", "content": "k"},
                    {"role": "user", "content": "again"}]);
    let r3 = chat(&third, "traj-r", &m3).await;
    let observation = third
        .renderer
        .encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
        .expect("enc");
    let r2_prompt: Vec<u32> = serde_json::from_value(r2["prompt_token_ids"].clone()).expect("ids");
    let expected = [r2_prompt, vec![b'k'.into(), IM_END], observation].concat();
    assert_eq!(r3["prompt_token_ids"], json!(expected));
    let t = trajectory(&third, "traj-r").await;
    assert_eq!(t["calls"][2]["parent_call"], 1);
    // The kept "Hello" bytes, as in call 1: not a history the client edited.
    assert_eq!(t["calls"][2]["drift"]["cause"], "bpe_retokenization");
    assert_eq!(t["calls"][1]["request"]["messages"], m2);
}

/// One HTTP request stores its body once: the other calls it started point
/// at it, and a branch continued on a fresh gateway (history rebuilt from
/// the store) still finds the messages it extends.
#[tokio::test]
async fn a_request_body_is_stored_once_per_request() {
    let mock = MockVllm::start(Scripted::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("spans.db");
    let store = tito::store::open(&format!("sqlite://{}", path.display())).expect("store");
    let renderer = tito::render::testing::chatml_renderer();
    let first =
        common::start_gateway_on(config(&[mock.url()], ""), renderer.clone(), store.clone()).await;
    for word in ["Aa", "Bb", "Cc"] {
        mock.push(Scripted::ids([bytes_of(word), vec![IM_END]].concat()));
    }
    let m1 = json!([{"role": "user", "content": "hi"}]);
    let r = first
        .post("/t/n3/v1/chat/completions", json!({"messages": m1, "n": 3}))
        .await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.expect("json");
    // /v1/completions: 2 prompts x n 2 on another trajectory.
    let r = first
        .post(
            "/t/p2/v1/completions",
            json!({"prompt": [[72, 105], [72, 106]], "n": 2, "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let conn = rusqlite::Connection::open(&path).expect("raw");
    let rows: Vec<(String, i64, String, Option<i64>)> = conn
        .prepare(
            "SELECT t.id, c.call_index, c.request, c.request_of FROM calls c \
             JOIN trajectories t ON t.seq = c.traj ORDER BY t.seq, c.call_index",
        )
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(rows.len(), 7);
    for (id, n) in [("n3", 3), ("p2", 4)] {
        let mine: Vec<_> = rows.iter().filter(|r| r.0 == id).collect();
        assert_eq!(mine.len(), n, "{id}");
        assert_ne!(mine[0].2, "null", "{id}: the first call holds the body");
        assert_eq!(mine[0].3, None);
        for r in &mine[1..] {
            assert_eq!((r.2.as_str(), r.3), ("null", Some(0)), "{id}: {r:?}");
        }
    }
    // Continue choice 2's branch from a gateway that rebuilds history from
    // the store: its messages are found through `request_of`.
    let second = common::start_gateway_on(config(&[mock.url()], ""), renderer, store.clone()).await;
    mock.push(Scripted::ids(vec![b'k'.into(), IM_END]));
    let reply = answer["choices"][2]["message"]["content"].clone();
    assert_eq!(reply, "Cc");
    let m2 = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "more"}]);
    chat(&second, "n3", &m2).await;
    let t = trajectory(&second, "n3").await;
    assert_eq!(t["calls"][3]["parent_call"], 2, "continues choice 2");
    assert_eq!(t["calls"][3]["drift"], Value::Null);
    assert_eq!(t["calls"][2]["request_of"], 0);
}
