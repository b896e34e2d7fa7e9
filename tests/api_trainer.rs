//! The trainer's side of the HTTP API over a mock backend: groups and task
//! metadata named by an unmodified agent (`/g/{gid}/t/{tid}/v1`, header,
//! body), the metadata and group endpoints, reward parts, per-call weight
//! versions, the verl layout's default pad id, and consumer-group export
//! pages with their acknowledgements.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::{ENDOFTEXT, IM_END};

async fn gateway() -> (MockVllm, Gateway) {
    let mock = MockVllm::start(Scripted::ids(vec![72, 105, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    (mock, g)
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

async fn post_h(g: &Gateway, path: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = g.client.post(g.url(path)).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn completions_served(mock: &MockVllm) -> usize {
    mock.log()
        .iter()
        .filter(|l| *l == "/v1/completions")
        .count()
}

#[tokio::test]
async fn an_agent_names_its_group_and_task_through_base_url_header_or_body() {
    let (mock, g) = gateway().await;
    // base_url = http://host/g/task-7/t/a/v1: nothing else changes in the agent.
    let (s, _) = post_h(&g, "/g/task-7/t/a/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 200);
    let t = g.get_json("/v1/trajectories/a").await;
    assert_eq!(t["group"], "task-7");
    // Header, and body fields with task metadata, on other trajectories.
    let (s, _) = post_h(
        &g,
        "/t/b/v1/chat/completions",
        user("hi"),
        &[("X-Trajectory-Group", "task-7")],
    )
    .await;
    assert_eq!(s, 200);
    let mut body = user("hi");
    body["trajectory_group"] = json!("task-7");
    body["trajectory_metadata"] =
        json!({"data_source": "gsm8k", "index": 12, "extra_info": {"split": "test"}});
    let (s, _) = post_h(&g, "/t/c/v1/chat/completions", body, &[]).await;
    assert_eq!(s, 200);
    let c = g.get_json("/v1/trajectories/c").await;
    assert_eq!(
        (
            &c["group"],
            &c["data_source"],
            &c["index"],
            &c["extra_info"]
        ),
        (
            &json!("task-7"),
            &json!("gsm8k"),
            &json!(12),
            &json!({"split": "test"})
        )
    );

    // A different group for a trajectory is refused before anything is generated.
    let served = completions_served(&mock).await;
    let (s, e) = post_h(&g, "/g/task-8/t/a/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 409, "{e}");
    assert_eq!(e["error"]["code"], "conflict");
    assert_eq!(completions_served(&mock).await, served, "no backend call");
    // Malformed names and metadata are 400s naming the parameter.
    let (s, e) = post_h(&g, "/g/bad%20id/t/d/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 400, "{e}");
    let mut body = user("hi");
    body["trajectory_metadata"] = json!({"extra_info": [1, 2]});
    let (s, e) = post_h(&g, "/t/d/v1/chat/completions", body, &[]).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(e["error"]["param"], "trajectory_metadata.extra_info");
    assert_eq!(completions_served(&mock).await, served, "no backend call");

    // The group endpoint lists the three, with rewards and reward parts.
    for (id, r) in [("a", 1.0), ("b", 0.0)] {
        let (s, _) = post_h(
            &g,
            &format!("/v1/trajectories/{id}/reward"),
            json!({"reward": r, "extra": {"acc": r}}),
            &[],
        )
        .await;
        assert_eq!(s, 200);
    }
    let group = g.get_json("/v1/groups/task-7").await;
    assert_eq!(group["size"], 3);
    assert_eq!(group["finished"], 0);
    assert_eq!(group["complete"], false);
    assert_eq!(group["rewarded"], 2);
    assert_eq!(group["mean_reward"], 0.5);
    assert_eq!(
        group["trajectories"][0]["reward_extra_info"],
        json!({"acc": 1.0})
    );
    let r = g
        .client
        .get(g.url("/v1/groups/none"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404);

    // Only complete groups are exported with complete_groups=true.
    assert!(g.export_jsonl("complete_groups=true").await.is_empty());
    for id in ["a", "b", "c"] {
        let (s, _) = post_h(&g, &format!("/v1/trajectories/{id}/finish"), json!({}), &[]).await;
        assert_eq!(s, 200);
    }
    let rows = g.export_jsonl("complete_groups=true").await;
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["group"] == "task-7"));
    assert_eq!(rows[0]["reward_extra_info"], json!({"acc": 1.0}));
    assert!(g
        .export_jsonl("complete_groups=true&group_size=4")
        .await
        .is_empty());
}

#[tokio::test]
async fn metadata_endpoint_creates_merges_and_refuses() {
    let (_mock, g) = gateway().await;
    let (s, m) = post_h(
        &g,
        "/v1/trajectories/pre/metadata",
        json!({"group": "g", "data_source": "math", "index": 3}),
        &[],
    )
    .await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(
        (m["num_calls"].clone(), m["group"].clone()),
        (json!(0), json!("g"))
    );
    // The agent's first call lands in the registered trajectory.
    let (s, _) = post_h(&g, "/t/pre/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 200);
    let (s, m) = post_h(
        &g,
        "/v1/trajectories/pre/metadata",
        json!({"extra_info": {"k": 1}}),
        &[],
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        (&m["num_calls"], &m["data_source"], &m["extra_info"]),
        (&json!(1), &json!("math"), &json!({"k": 1}))
    );
    for (body, status) in [
        (json!({}), 400),
        (json!({"grupo": "x"}), 400),
        (json!({"extra_info": "text"}), 400),
        (json!({"group": "other"}), 409),
    ] {
        let (s, e) = post_h(&g, "/v1/trajectories/pre/metadata", body.clone(), &[]).await;
        assert_eq!(s, status, "{body}: {e}");
        assert!(e["error"]["message"].is_string());
    }
    // Reward parts belong to the trajectory and must be an object.
    for body in [
        json!({"reward": 1.0, "call": 0, "extra": {"a": 1}}),
        json!({"reward": 1.0, "extra": 3}),
    ] {
        let (s, _) = post_h(&g, "/v1/trajectories/pre/reward", body, &[]).await;
        assert_eq!(s, 400);
    }
}

#[tokio::test]
async fn a_sample_spanning_a_weight_update_shows_both_versions() {
    let (mock, g) = gateway().await;
    let (s, _) = post_h(&g, "/admin/weights", json!({"version": "step-9"}), &[]).await;
    assert_eq!(s, 200);
    let (s, first) = post_h(&g, "/t/w/v1/chat/completions", user("one"), &[]).await;
    assert_eq!(s, 200);
    let (s, _) = post_h(&g, "/admin/weights", json!({"version": "step-10"}), &[]).await;
    assert_eq!(s, 200);
    let reply = first["choices"][0]["message"].clone();
    let next = json!({"messages": [{"role": "user", "content": "one"}, reply,
                                   {"role": "user", "content": "two"}]});
    let (s, _) = post_h(&g, "/t/w/v1/chat/completions", next, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(completions_served(&mock).await, 2);
    let rows = g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1, "one sample over two turns");
    let row = &rows[0];
    assert_eq!(row["weight_versions"], json!(["step-9", "step-10"]));
    // Natural order: step-9 is older than step-10.
    assert_eq!(row["min_weight_version"], "step-9");
    assert_eq!(row["max_weight_version"], "step-10");
    assert_eq!(row["weight_version"], "step-10");
    // The second call's sampled ids start after the first's and the new turn.
    let offsets = row["call_offsets"].as_array().expect("offsets");
    let mask = row["response_mask"].as_array().expect("mask");
    let second = offsets[1].as_u64().expect("offset") as usize;
    assert_eq!(offsets[0], 0);
    assert_eq!(mask[second], 1);
    assert_eq!(mask[second - 1], 0, "the new user turn is an observation");
}

#[tokio::test]
async fn verl_export_pads_with_the_tokenizer_pad_id_and_caps_lengths() {
    let (_mock, g) = gateway().await;
    let (s, _) = post_h(&g, "/t/v/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 200);
    let rows = g
        .export_jsonl("layout=verl&prompt_length=64&response_length=8")
        .await;
    let prompts = rows[0]["prompts"].as_array().expect("prompts");
    // The chatml test tokenizer's pad token is <|endoftext|>.
    assert_eq!(prompts[0], json!(ENDOFTEXT));
    assert_eq!(rows[0]["responses"][7], json!(ENDOFTEXT));
    assert_eq!(
        rows[0]["uid"], "v",
        "a trajectory without a group is its own"
    );
    let rows = g
        .export_jsonl("layout=verl&prompt_length=64&response_length=8&pad_id=5")
        .await;
    assert_eq!(rows[0]["prompts"][0], json!(5));
    let r = g
        .client
        .get(g.url("/v1/export?layout=verl&prompt_length=64&response_length=131073"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.expect("json");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("131072")),
        "{e}"
    );
}

async fn page(g: &Gateway, query: &str) -> (u16, Option<String>, usize, String) {
    let r = g
        .client
        .get(g.url(&format!("/v1/export?format=jsonl&{query}")))
        .send()
        .await
        .expect("get");
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let cursor = header("x-export-cursor");
    let count = header("x-export-trajectories")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, cursor, count, r.text().await.expect("body"))
}

#[tokio::test]
async fn consumer_pages_are_leased_until_acknowledged() {
    let (_mock, g) = gateway().await;
    for i in 0..5 {
        let id = format!("e{i}");
        let (s, _) = post_h(&g, &format!("/t/{id}/v1/chat/completions"), user("hi"), &[]).await;
        assert_eq!(s, 200);
        if i < 4 {
            post_h(&g, &format!("/v1/trajectories/{id}/finish"), json!({}), &[]).await;
        }
    }
    let (s, cursor, n, body) = page(&g, "consumer=ppo&limit=3").await;
    assert_eq!((s, n, body.lines().count()), (200, 3, 3));
    let cursor = cursor.expect("cursor");
    let (_, second, n, body) = page(&g, "consumer=ppo&limit=3").await;
    assert_eq!(
        (n, body.lines().count()),
        (1, 1),
        "the 4th finished one only"
    );
    let (_, none, n, body) = page(&g, "consumer=ppo").await;
    assert_eq!((none, n, body.as_str()), (None, 0, ""), "all leased");
    let ack = |c: String| {
        let g = &g;
        async move {
            post_h(
                g,
                "/v1/export/ack",
                json!({"consumer": "ppo", "cursor": c}),
                &[],
            )
            .await
        }
    };
    let (s, a) = ack(cursor.clone()).await;
    assert_eq!(
        (s, &a["trajectories"], &a["already_acknowledged"]),
        (200, &json!(3), &json!(false))
    );
    let (s, a) = ack(cursor).await;
    assert_eq!((s, &a["already_acknowledged"]), (200, &json!(true)));
    let (s, e) = ack("0123".into()).await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("cursor_expired")));
    let (s, _) = ack(second.expect("second cursor")).await;
    assert_eq!(s, 200);
    for bad in [
        "consumer=ppo&status=active",
        "consumer=ppo&limit=0",
        "consumer=ppo&lease_s=0",
        "consumer=no%20spaces",
    ] {
        let (s, _, _, body) = page(&g, bad).await;
        assert_eq!(s, 400, "{bad}: {body}");
    }
    let (s, e) = post_h(&g, "/v1/export/ack", json!({"consumer": "ppo"}), &[]).await;
    assert_eq!(s, 400, "{e}");
}

/// A consumer's page whose prompts are longer than `prompt_length` has no
/// rows for them: the headers are sent before that is known, so the rows
/// left out are counted by consumer in `/metrics`.
#[tokio::test]
async fn rows_left_out_for_a_long_prompt_are_counted() {
    let (_mock, g) = gateway().await;
    let (s, _) = post_h(&g, "/t/long-1/v1/chat/completions", user("hi"), &[]).await;
    assert_eq!(s, 200);
    post_h(&g, "/v1/trajectories/long-1/finish", json!({}), &[]).await;
    let (s, _, n, body) = page(
        &g,
        "consumer=short&prompt_length=1&response_length=8&layout=verl",
    )
    .await;
    assert_eq!((s, n, body.lines().count()), (200, 1, 0));
    let metrics = g.get_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tito_export_rows_skipped_total{consumer=\"short\"} 1"),
        "{metrics}"
    );
}
