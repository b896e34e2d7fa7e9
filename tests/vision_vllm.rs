//! Images through vLLM's `/inference/v1/generate` (`[[backends]] vllm_api =
//! "generate"`): the vision agent of tests/vision_chat.rs (an image in the
//! first prompt, a tool result carrying a second, a last user turn) reaches
//! vLLM as `token_ids` with one pad per image and `content_parts` with the
//! images in order, continues exactly, and records real logprobs; a vLLM
//! that expands an image differently is recorded as drift; a vLLM backend on
//! `/v1/completions` still refuses images before anything is asked.

mod common;
mod vision_support;

use serde_json::{json, Value};
use tito::render::Renderer;
use vision_support::*;

struct Vllm {
    s: Setup,
}

async fn vllm_setup(script: Vec<Vec<u32>>, extra_pads: usize) -> Vllm {
    let dir = model_dir();
    let (url, seen) = vllm_generate_mock(script, extra_pads).await;
    let text = config_text(dir.path(), &url, "vllm", "").replace(
        "kind = \"vllm\"\n",
        "kind = \"vllm\"\nvllm_api = \"generate\"\n",
    );
    let config = tito::Config::from_toml(&text).expect("config");
    let renderer = Renderer::load(&config.model).expect("vision model loads");
    let store = tito::store::open_with_options("memory://", &Default::default()).expect("store");
    let g = common::start_gateway_on(config, renderer, store.clone()).await;
    Vllm {
        s: Setup {
            g,
            store,
            seen,
            _dir: dir,
        },
    }
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

#[tokio::test]
async fn a_vision_agent_over_vllm_generate_continues_exactly_with_real_logprobs() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let call = pieces(
        &qwen,
        &[
            "<tool_call>",
            "\n{\"name\": \"zoom\", \"arguments\": ",
            "{\"factor\": 2}}\n",
            "</tool_call>",
        ],
    );
    let answer2 = pieces(&qwen, &["A", " c", "at."]);
    let answer3 = pieces(&qwen, &["Bye", "."]);
    let v = vllm_setup(
        vec![
            [call.clone(), vec![im_end]].concat(),
            [answer2.clone(), vec![im_end]].concat(),
            [answer3.clone(), vec![im_end]].concat(),
        ],
        0,
    )
    .await;
    let s = &v.s;
    let pad = s.g.renderer.token_to_id(PAD).expect("pad");
    let (a, b) = (png(64, 48, 1), png(100, 60, 2));
    let user = json!({"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(&a)}}]});
    let path = "/t/vv-1/v1/chat/completions";
    let body = json!({"messages": [user], "tools": tools(), "return_token_ids": true,
                      "logprobs": true, "top_logprobs": 1});
    let first: Value = s.g.post(path, body).await.json().await.expect("json");
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let tool_call = first["choices"][0]["message"]["tool_calls"][0].clone();
    let prompt1 = ids(&first["prompt_token_ids"]);
    assert_eq!(runs(&prompt1, pad), [4]);

    let assistant =
        json!({"role": "assistant", "content": null, "tool_calls": [tool_call.clone()]});
    let tool = json!({"role": "tool", "tool_call_id": tool_call["id"], "content": [
        {"type": "text", "text": "zoomed:"},
        {"type": "image_url", "image_url": {"url": data_url(&b)}}]});
    let messages2 = json!([user, assistant, tool]);
    let body = json!({"messages": messages2, "tools": tools(), "return_token_ids": true});
    let second: Value = s.g.post(path, body).await.json().await.expect("json");
    assert_eq!(
        second["choices"][0]["message"]["content"], "A cat.",
        "{second}"
    );
    let prompt2 = ids(&second["prompt_token_ids"]);
    let kept = [prompt1.clone(), call.clone(), vec![im_end]].concat();
    assert_eq!(&prompt2[..kept.len()], kept.as_slice());
    assert_eq!(runs(&prompt2, pad), [4, 8]);

    let mut messages3 = messages2.as_array().expect("list").clone();
    messages3.push(json!({"role": "assistant", "content": "A cat."}));
    messages3.push(json!({"role": "user", "content": "Thanks!"}));
    let body = json!({"messages": messages3, "tools": tools(), "return_token_ids": true});
    let third: Value = s.g.post(path, body).await.json().await.expect("json");
    let prompt3 = ids(&third["prompt_token_ids"]);
    let kept = [prompt2.clone(), answer2, vec![im_end]].concat();
    assert_eq!(&prompt3[..kept.len()], kept.as_slice());

    // vLLM got one pad per image and every image of each prompt, in order.
    let seen = s.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    let (ua, ub) = (data_url(&a), data_url(&b));
    let want = [vec![ua.clone()], vec![ua.clone(), ub.clone()], vec![ua, ub]];
    for (sent, (images, prompt)) in seen
        .iter()
        .zip(want.iter().zip([&prompt1, &prompt2, &prompt3]))
    {
        let parts: Vec<Value> = images
            .iter()
            .map(|u| json!({"type": "image_url", "url": u}))
            .collect();
        assert_eq!(sent["content_parts"], json!(parts));
        assert_eq!(sent["return_token_ids"], json!(true));
        assert_eq!(sent["output_mode"], "tokens");
        let sent_ids = ids(&sent["token_ids"]);
        assert_eq!(runs(&sent_ids, pad), vec![1; images.len()]);
        // Expanding the sent ids as vLLM does gives the recorded prompt.
        assert_eq!(&expand(sent, 0), prompt);
    }
    assert_eq!(seen[0]["sampling_params"]["logprobs"], json!(1));

    // One exact sample: image tokens are prompt or observation (mask 0), the
    // first call's logprobs are vLLM's numbers, each image stored once.
    let rows = s.g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    let prompt = ids(&row["prompt_ids"]);
    let response = ids(&row["response_ids"]);
    let mask = ids(&row["response_mask"]);
    assert_eq!(prompt, prompt1);
    assert_eq!(
        [prompt.clone(), response.clone()].concat(),
        [prompt3, answer3, vec![im_end]].concat()
    );
    for (i, &t) in response.iter().enumerate() {
        if t == pad {
            assert_eq!(mask[i], 0, "image token at {i} is observation");
        }
    }
    let lps = row["response_logprobs"].as_array().expect("logprobs");
    let sampled = call.len() + 1;
    for (i, lp) in lps.iter().take(sampled).enumerate() {
        assert_eq!(lp, &json!(-0.5), "sampled token {i}");
    }
    assert_eq!(row["image_sha256"], json!([sha(&a), sha(&b)]));
    let drifts: Vec<_> = s
        .stored("vv-1")
        .await
        .calls
        .iter()
        .map(|c| c.drift.clone())
        .collect();
    // (A drift the diagnosis finds in the template's re-render of the tool
    // call may be there; vLLM's expansion matched tito's on every call.)
    assert!(
        drifts
            .iter()
            .flatten()
            .all(|d| d.cause != "image_placeholder"),
        "{drifts:?}"
    );
}

#[tokio::test]
async fn a_vllm_that_expands_an_image_differently_is_recorded_as_drift() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let v = vllm_setup(
        vec![[qwen.encode("Hm.").expect("enc"), vec![im_end]].concat()],
        1,
    )
    .await;
    let r = v.s.ask_image("vdrift-1", &data_url(&png(64, 48, 8))).await;
    assert_eq!(r.status(), 200);
    let r: Value = r.json().await.expect("json");
    assert_eq!(r["choices"][0]["message"]["content"], "Hm.", "{r}");
    let t = v.s.stored("vdrift-1").await;
    let drift = t.calls[0].drift.as_ref().expect("a drift");
    assert_eq!(drift.cause, "image_placeholder");
    let prompt = &t.calls[0].prompt_delta_ids;
    assert_eq!(drift.details["recorded_len"], json!(prompt.len()));
    assert_eq!(drift.details["backend_len"], json!(prompt.len() + 1));
}

#[tokio::test]
async fn a_text_call_over_vllm_generate_asks_no_prompt_echo() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let v = vllm_setup(
        vec![[qwen.encode("Hello there.").expect("enc"), vec![im_end]].concat()],
        0,
    )
    .await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let r: Value =
        v.s.g
            .post("/t/vtext-1/v1/chat/completions", body)
            .await
            .json()
            .await
            .expect("json");
    assert_eq!(r["choices"][0]["message"]["content"], "Hello there.", "{r}");
    let seen = v.s.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].get("content_parts").is_none(), "{}", seen[0]);
    assert!(seen[0].get("return_token_ids").is_none(), "{}", seen[0]);
}

#[test]
fn vllm_api_is_refused_on_a_backend_that_is_not_vllm() {
    let text = "[model]\nname = \"m\"\ntokenizer = \"t\"\n\
                [[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"sglang\"\nvllm_api = \"generate\"\n";
    let err = tito::Config::from_toml(text).expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("backends[0].vllm_api"), "{msg}");
    assert!(msg.contains("kind = \"vllm\" only"), "{msg}");
    let text = text.replace(
        "kind = \"sglang\"\nvllm_api = \"generate\"",
        "kind = \"vllm\"\nvllm_api = \"chat\"",
    );
    let err = tito::Config::from_toml(&text).expect_err("refused");
    assert!(err.to_string().contains("vllm_api"), "{err}");
}
