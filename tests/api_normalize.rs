//! Request normalization before rendering (docs/api.md): what OpenAI clients
//! send that templates do not take is mapped, recorded with the call, and
//! history still continues exactly after a restart.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, start_gateway_on};
use serde_json::{json, Value};
use tito::render::testing::{chatml_renderer, IM_END};
use tito::render::{detect_content_format, ContentFormat, RenderInput};

fn render(g: &common::Gateway, messages: Value) -> Vec<u32> {
    let m: Vec<Value> = serde_json::from_value(messages).expect("messages");
    g.renderer
        .render_ids(&RenderInput {
            messages: &m,
            add_generation_prompt: true,
            ..Default::default()
        })
        .expect("renders")
}

async fn chat(g: &common::Gateway, path: &str, body: Value) -> (u16, Value) {
    let r = g.post(path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

#[tokio::test]
async fn developer_role_and_text_parts_reach_the_model_and_are_recorded() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (status, v) = chat(
        &g,
        "/t/norm-1/v1/chat/completions",
        json!({"messages": [
            {"role": "developer", "content": "Always answer in French."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}
        ], "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let want = render(
        &g,
        json!([{"role": "system", "content": "Always answer in French."},
               {"role": "user", "content": "Hello\nthere"}]),
    );
    assert_eq!(v["prompt_token_ids"], json!(want));
    let t = g.get_json("/v1/trajectories/norm-1").await;
    assert_eq!(
        t["calls"][0]["normalized"],
        json!(["developer_as_system", "text_parts_joined"])
    );
    // The request is kept as received.
    assert_eq!(t["calls"][0]["request"]["messages"][0]["role"], "developer");
}

#[tokio::test]
async fn tool_only_assistant_turns_and_tool_parts_render() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (status, v) = chat(
        &g,
        "/v1/chat/completions",
        json!({"messages": [
            {"role": "user", "content": "add"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "add", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]}
        ], "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let prompt: Vec<u32> = serde_json::from_value(v["prompt_token_ids"].clone()).expect("ids");
    let text = g.renderer.decode(&prompt, false).expect("decodes");
    assert!(text.contains("42") && !text.contains("'text'"), "{text}");
}

#[tokio::test]
async fn non_text_parts_are_refused_naming_the_part() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (status, e) = chat(
        &g,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["param"], "messages[0].content[1]");
    assert!(e["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("image_url"));
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn schema_valid_nulls_and_integral_floats_are_served() {
    let mock = MockVllm::start(Scripted::ids(vec![b'o' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let (status, v) = chat(
        &g,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "stream": null,
               "logprobs": null, "max_tokens": 4.0, "n": 1.0, "seed": -7, "top_p": 0}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(mock.last_request()["max_tokens"], 4);
    // vLLM takes a seed in the i64 range: it goes as the client sent it,
    // and the seeds of `n` choices wrap within that range.
    assert_eq!(mock.last_request()["seed"], -7);
    let (status, v) = chat(
        &g,
        "/v1/completions",
        json!({"prompt": [1, 2], "n": 2, "seed": i64::MAX}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let mut seeds: Vec<i64> = mock
        .requests()
        .iter()
        .rev()
        .take(2)
        .map(|r| r["seed"].as_i64().expect("an i64 seed"))
        .collect();
    seeds.sort_unstable();
    assert_eq!(seeds, [i64::MIN, i64::MAX]);
    let (status, v) = chat(
        &g,
        "/v1/completions",
        json!({"prompt": [1, 2], "stream": null, "echo": null, "logprobs": null}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, e) = chat(&g, "/v1/completions", json!({"prompt": null})).await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["param"], "prompt");
}

#[tokio::test]
async fn normalized_history_continues_exactly_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let mock = MockVllm::start(Scripted::default()).await;
    let cfg = || config(&[mock.url()], &format!("[store]\nurl = \"{url}\"\n"));
    let store = tito::store::open(&url).expect("store");
    let first = start_gateway_on(cfg(), chatml_renderer(), store.clone()).await;
    let mut answer = first.renderer.encode("Bonjour").expect("encodes");
    answer.push(IM_END);
    mock.push(Scripted::ids(answer.clone()));
    mock.push(Scripted::ids(answer));
    let m1 = json!([{"role": "developer", "content": "French only."},
                    {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]);
    let path = "/t/norm-r/v1/chat/completions";
    let (_, v) = chat(&first, path, json!({"messages": m1})).await;
    let served = v["choices"][0]["message"]["content"].clone();
    // A second gateway on the same store rebuilds the trajectory from it.
    let second = start_gateway_on(cfg(), chatml_renderer(), store).await;
    let m2 = json!([{"role": "developer", "content": "French only."},
                    {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                    {"role": "assistant", "content": served},
                    {"role": "user", "content": "More"}]);
    let (status, v) = chat(&second, path, json!({"messages": m2})).await;
    assert_eq!(status, 200, "{v}");
    let t = second.get_json("/v1/trajectories/norm-r").await;
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
    assert_eq!(t["calls"][1]["drift"], Value::Null, "{t}");
}

#[test]
fn content_format_is_detected_from_the_template() {
    let string = "{% for m in messages %}{{ m.role }}{{ m.content }}{% if '</think>' in message.content %}x{% endif %}{% endfor %}";
    assert_eq!(detect_content_format(string), ContentFormat::String);
    let parts =
        "{% for m in messages %}{% for part in m.content %}{{ part.text }}{% endfor %}{% endfor %}";
    assert_eq!(detect_content_format(parts), ContentFormat::Parts);
    let typed = "{% if item['type'] == 'image' %}<img>{% endif %}";
    assert_eq!(detect_content_format(typed), ContentFormat::Parts);
}
