//! Images at the edges of the call path: a Responses conversation continued
//! by `previous_response_id` (its images come back from the record as
//! `sha256:` references), a `data:` URL with leading whitespace (its bytes
//! still leave the stored request), token counts of requests with images,
//! and the replay check, which refuses a trajectory with images.

mod common;
mod vision_support;

use base64::Engine as _;
use serde_json::{json, Value};
use vision_support::*;

fn answers(n: usize) -> Vec<Vec<u32>> {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    (0..n)
        .map(|i| {
            [
                qwen.encode(&format!("Answer {i}.")).expect("enc"),
                vec![im_end],
            ]
            .concat()
        })
        .collect()
}

#[tokio::test]
async fn previous_response_id_continues_a_conversation_with_an_image() {
    let s = setup(answers(2), "").await;
    let img = png(64, 48, 31);
    let path = "/t/prev-vis/v1/responses";
    let first: Value =
        s.g.post(
            path,
            json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What is it?"},
                {"type": "input_image", "image_url": data_url(&img)}]}]}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(first["status"], "completed", "{first}");
    let second: Value =
        s.g.post(
            path,
            json!({"previous_response_id": first["id"], "input": "And its colour?"}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(second["status"], "completed", "{second}");
    let seen = s.seen.lock().expect("lock").clone();
    assert_eq!(seen[1]["image_data"], json!([data_url(&img)]));
    let rows =
        s.g.export_jsonl("layout=trajectory&trajectory=prev-vis")
            .await;
    assert_eq!(rows.len(), 1, "one sample: {rows:?}");
    assert_eq!(rows[0]["image_sha256"], json!([sha(&img)]));
}

#[tokio::test]
async fn a_data_url_with_leading_whitespace_is_stored_by_reference() {
    let s = setup(answers(1), "").await;
    let img = png(20, 20, 32);
    let url = format!("  \n{}", data_url(&img));
    assert_eq!(s.ask_image("ws-vis", &url).await.status(), 200);
    let t = s.stored("ws-vis").await;
    let request = t.calls[0].request.to_string();
    assert!(!request.contains("base64,"), "{request}");
    assert!(request.contains(&format!("sha256:{}", sha(&img))));
}

#[tokio::test]
async fn token_counts_include_the_image_runs() {
    let s = setup(vec![], "").await;
    let img = png(64, 48, 33);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&img);
    let text_only: Value = s
        .g
        .post(
            "/v1/messages/count_tokens",
            json!({"model": "test-model", "messages": [{"role": "user", "content": "What is it?"}]}),
        )
        .await
        .json()
        .await
        .expect("json");
    let with_image: Value = s
        .g
        .post(
            "/v1/messages/count_tokens",
            json!({"model": "test-model", "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
                {"type": "text", "text": "What is it?"}]}]}),
        )
        .await
        .json()
        .await
        .expect("json");
    let n = |v: &Value| v["input_tokens"].as_u64().unwrap_or_else(|| panic!("{v}"));
    // <|vision_start|>, 4 pads, <|vision_end|>.
    assert_eq!(n(&with_image), n(&text_only) + 6, "{with_image}");
    let responses: Value =
        s.g.post(
            "/v1/responses/input_tokens",
            json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": data_url(&img)},
                {"type": "input_text", "text": "What is it?"}]}]}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(n(&responses), n(&with_image), "{responses}");
    assert!(
        s.seen.lock().expect("lock").is_empty(),
        "counting asks no backend"
    );
}

#[tokio::test]
async fn the_replay_check_refuses_a_trajectory_with_images() {
    let s = setup(answers(1), "").await;
    let url = data_url(&png(20, 20, 34));
    assert_eq!(s.ask_image("replay-vis", &url).await.status(), 200);
    let resp =
        s.g.post("/v1/trajectories/replay-vis/verify", json!({}))
            .await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    let msg = error_message(&err);
    assert!(msg.contains("has images"), "{msg}");
    assert_eq!(s.seen.lock().expect("lock").len(), 1, "no replay was asked");
}
