//! Gemma 3 through the HTTP API on its real tokenizer and template: a
//! conversation whose roles do not alternate is refused as the template
//! refuses it (400, nothing sent or recorded), a system message is folded
//! into the first user turn as transformers renders it, and a second turn
//! continues the first one's prompt and sampled ids verbatim. Gemma 3's
//! template defines no tool calling (it never reads `tools`).

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::Renderer;

const ALTERNATE: &str = "Conversation roles must alternate user/assistant/user/assistant/...";

fn gemma3() -> std::sync::Arc<Renderer> {
    common::real_renderer("gemma3", "")
}

async fn setup() -> (MockVllm, Gateway) {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway_with(config(&[mock.url()], ""), gemma3()).await;
    (mock, g)
}

fn end_of_turn(r: &Renderer) -> u32 {
    r.token_to_id("<end_of_turn>").expect("<end_of_turn>")
}

/// The ids transformers gives for golden case `name` of gemma3.json.
fn golden_ids(name: &str) -> Vec<u32> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/goldens/gemma3.json");
    let text = std::fs::read_to_string(path).expect("golden fixture");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("golden JSON");
    let case = cases
        .iter()
        .find(|c| c["name"] == name)
        .expect("golden case");
    serde_json::from_value(case["ids"].clone()).expect("ids")
}

fn ids_of(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("token ids")
}

#[tokio::test]
async fn roles_that_do_not_alternate_are_400_and_record_nothing() {
    let (mock, g) = setup().await;
    let (u, a) = ("user", "assistant");
    let m = |role: &str, text: &str| json!({"role": role, "content": text});
    let conversations = [
        vec![m(u, "one"), m(u, "two")],
        vec![m(a, "Hi"), m(u, "Hello")],
        vec![m("system", "Be brief."), m(a, "Hi"), m(u, "Hello")],
        vec![m(u, "Hello"), m(a, "Hi"), m(a, "Again")],
    ];
    for (i, messages) in conversations.iter().enumerate() {
        for stream in [false, true] {
            let id = format!("gemma-bad-{i}-{stream}");
            let resp = g
                .post(
                    &format!("/t/{id}/v1/chat/completions"),
                    json!({"messages": messages, "stream": stream}),
                )
                .await;
            assert_eq!(resp.status().as_u16(), 400, "{messages:?} stream={stream}");
            let body: Value = resp.json().await.expect("JSON error body");
            let err = &body["error"];
            let msg = err["message"].as_str().expect("error.message");
            assert!(msg.contains(ALTERNATE), "{body}");
            assert!(err["type"].is_string(), "{body}");
            assert!(
                err.get("param").is_some() && err.get("code").is_some(),
                "{body}"
            );
            let t = g
                .client
                .get(g.url(&format!("/v1/trajectories/{id}")))
                .send()
                .await
                .expect("reachable");
            assert_eq!(t.status().as_u16(), 404, "{id} was recorded");
        }
    }
    let list = g.get_json("/v1/trajectories").await;
    assert_eq!(list["data"], json!([]), "nothing recorded: {list}");
    assert!(mock.requests().is_empty(), "no call reached the backend");
}

#[tokio::test]
async fn a_system_message_is_folded_into_the_first_user_turn() {
    let (mock, g) = setup().await;
    let r = g.renderer.clone();
    let sampled = [r.encode("Bonjour !").expect("enc"), vec![end_of_turn(&r)]].concat();
    mock.push(Scripted::ids(sampled.clone()));
    let messages = json!([
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning."},
    ]);
    let body = g
        .post_json(
            "/t/gemma-sys/v1/chat/completions",
            json!({"messages": messages, "return_token_ids": true}),
        )
        .await;
    let prompt = ids_of(&body["prompt_token_ids"]);
    // Exactly what transformers' apply_chat_template gives.
    assert_eq!(prompt, golden_ids("system_user"), "{body}");
    assert_eq!(mock.last_request()["prompt"], json!(prompt));
    assert_eq!(
        r.decode(&prompt, false).expect("decode"),
        "<bos><start_of_turn>user\nAnswer in French.\n\nGood morning.<end_of_turn>\n<start_of_turn>model\n"
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], "Bonjour !", "{body}");
    assert_eq!(choice["token_ids"], json!(sampled));
}

#[tokio::test]
async fn a_second_turn_continues_the_first_exactly() {
    let (mock, g) = setup().await;
    let r = g.renderer.clone();
    let eot = end_of_turn(&r);
    // Tokenized piece by piece: valid ids a fresh encode would not give.
    let pieces: Vec<u32> = ["Hi", " the", "re", "!"]
        .iter()
        .flat_map(|p| r.encode(p).expect("enc"))
        .collect();
    assert_ne!(pieces, r.encode("Hi there!").expect("enc"), "not canonical");
    let sampled1 = [pieces, vec![eot]].concat();
    mock.push(Scripted::ids(sampled1.clone()));
    let system = json!({"role": "system", "content": "You are Gemma."});
    let user1 = json!({"role": "user", "content": "Hello"});
    let path = "/t/gemma-two/v1/chat/completions";
    let body1 = g
        .post_json(
            path,
            json!({"messages": [system, user1], "return_token_ids": true}),
        )
        .await;
    let reply = body1["choices"][0]["message"]["content"].clone();
    assert_eq!(reply, "Hi there!", "{body1}");
    let prompt1 = ids_of(&body1["prompt_token_ids"]);

    let sampled2 = [r.encode("2").expect("enc"), vec![eot]].concat();
    mock.push(Scripted::ids(sampled2));
    let next = json!([system, user1, {"role": "assistant", "content": reply},
        {"role": "user", "content": "What is 1+1?"}]);
    let body2 = g
        .post_json(path, json!({"messages": next, "return_token_ids": true}))
        .await;
    assert_eq!(body2["choices"][0]["message"]["content"], "2", "{body2}");
    let prompt2 = ids_of(&body2["prompt_token_ids"]);
    let n = prompt1.len() + sampled1.len();
    assert!(prompt2.len() > n, "{body2}");
    assert_eq!(&prompt2[..prompt1.len()], &prompt1[..], "first prompt kept");
    assert_eq!(
        &prompt2[prompt1.len()..n],
        &sampled1[..],
        "sampled ids verbatim"
    );
    let tail = r.decode(&prompt2[n..], false).expect("decode");
    assert_eq!(
        tail,
        "\n<start_of_turn>user\nWhat is 1+1?<end_of_turn>\n<start_of_turn>model\n"
    );
    assert_eq!(mock.last_request()["prompt"], json!(prompt2));
    // One sample continued by the second call; a fresh render would have
    // re-tokenized the reply, which is recorded, not applied.
    let t = g.get_json("/v1/trajectories/gemma-two").await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
    assert_eq!(t["samples"].as_array().map(Vec::len), Some(1), "{t}");
    assert_eq!(t["drift"][0]["cause"], "bpe_retokenization", "{t}");
}
