//! Chat completions through the gateway against a mock vLLM backend.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;
use tito::render::RenderInput;

fn encode(g: &common::Gateway, s: &str) -> Vec<u32> {
    g.renderer.encode(s).expect("encodes")
}

#[tokio::test]
async fn chat_sends_token_ids_and_returns_exact_ids() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut answer = encode(&g, "Hello wörld!");
    answer.push(IM_END);
    mock.push(Scripted::ids(answer.clone()));
    let messages =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    let resp = g
        .post(
            "/v1/chat/completions",
            json!({"model": "test-model", "messages": messages, "return_token_ids": true,
                   "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7, "max_tokens": 20,
                   "presence_penalty": 0.1, "frequency_penalty": 0.2, "stop": ["###"]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-trajectory-id").is_some());
    let body: Value = resp.json().await.expect("json");
    let msgs: Vec<Value> = serde_json::from_value(messages).expect("msgs");
    let expected_prompt = g
        .renderer
        .render_ids(&RenderInput {
            messages: &msgs,
            add_generation_prompt: true,
            ..Default::default()
        })
        .expect("renders");
    assert_eq!(body["prompt_token_ids"], json!(expected_prompt));
    assert_eq!(body["choices"][0]["token_ids"], json!(answer));
    assert_eq!(body["choices"][0]["message"]["content"], "Hello wörld!");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], expected_prompt.len());
    assert_eq!(body["usage"]["completion_tokens"], answer.len());
    // What the backend saw: token ids only, sampling mapped.
    let sent = mock.last_request();
    assert_eq!(sent["prompt"], json!(expected_prompt));
    assert_eq!(sent["return_token_ids"], true);
    assert_eq!(sent["skip_special_tokens"], false);
    assert_eq!(sent["temperature"], 0.5);
    assert!((sent["top_p"].as_f64().expect("top_p") - 0.9).abs() < 1e-6);
    assert_eq!(sent["top_k"], 40);
    assert_eq!(sent["seed"], 7);
    assert_eq!(sent["max_tokens"], 20);
    assert_eq!(sent["stop"], json!(["###"]));
    assert_eq!(sent["stop_token_ids"], json!([IM_END]));
    assert!(sent.get("messages").is_none());
}

#[tokio::test]
async fn chat_logprobs_in_openai_shape() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut answer = encode(&g, "ok");
    answer.push(IM_END);
    mock.push(Scripted {
        ids: answer.clone(),
        logprobs: Some(vec![-0.1, -0.2, -0.3]),
        ..Default::default()
    });
    let body: Value = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 2}),
        )
        .await
        .json()
        .await
        .expect("json");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), answer.len());
    assert_eq!(content[0]["token"], "o");
    assert!((content[1]["logprob"].as_f64().expect("lp") + 0.2).abs() < 1e-6);
    assert_eq!(content[0]["top_logprobs"].as_array().expect("top").len(), 2);
    assert_eq!(content[0]["bytes"], json!([b'o']));
    assert_eq!(mock.last_request()["logprobs"], 2);
}

#[tokio::test]
async fn streaming_matches_non_streaming() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let mut answer = encode(&g, "日本語 and emoji 🎉 done");
    answer.push(IM_END);
    mock.state.default.lock().expect("lock").ids = answer.clone();
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "return_token_ids": true});
    let plain: Value = g
        .post("/v1/chat/completions", req.clone())
        .await
        .json()
        .await
        .expect("json");

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let resp = g.post("/v1/chat/completions", sreq).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .expect("ct")
        .starts_with("text/event-stream"));
    let events = sse_events(resp).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["prompt_token_ids"], plain["prompt_token_ids"]);
    let mut ids: Vec<u64> = Vec::new();
    let mut text = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        for ch in c["choices"].as_array().expect("choices") {
            if let Some(t) = ch["token_ids"].as_array() {
                ids.extend(t.iter().filter_map(Value::as_u64));
            }
            if let Some(s) = ch["delta"]["content"].as_str() {
                assert!(!s.contains('\u{FFFD}'), "split character in {s:?}");
                text.push_str(s);
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    assert_eq!(json!(ids), plain["choices"][0]["token_ids"]);
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
    assert_eq!(finish.as_deref(), Some("stop"));
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], answer.len());
}

#[tokio::test]
async fn stop_string_trims_text_keeps_ids() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let answer = encode(&g, "one two END three four");
    mock.push(Scripted::ids(answer.clone()));
    let body: Value = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "count"}], "stop": "END", "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(body["choices"][0]["message"]["content"], "one two ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let upto = encode(&g, "one two END").len();
    assert_eq!(body["choices"][0]["token_ids"], json!(answer[..upto]));
}

#[tokio::test]
async fn n_choices_fan_out_with_distinct_seeds() {
    let mock = MockVllm::start(Scripted::ids(vec![b'a' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let body: Value = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 3, "seed": 10}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(body["choices"].as_array().expect("choices").len(), 3);
    let mut seeds: Vec<u64> = mock
        .requests()
        .iter()
        .filter_map(|r| r["seed"].as_u64())
        .collect();
    seeds.sort_unstable();
    assert_eq!(seeds, vec![10, 11, 12]);
}

#[tokio::test]
async fn max_tokens_gives_length_finish() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(Scripted::ids(encode(&g, "a long answer that goes on")));
    let body: Value = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn trajectory_id_from_path_header_and_body() {
    let mock = MockVllm::start(Scripted::ids(vec![b'a' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let msg = json!({"messages": [{"role": "user", "content": "x"}], "trajectory_id": "from-body"});
    let r = g
        .post("/t/from-path/v1/chat/completions", msg.clone())
        .await;
    assert_eq!(r.headers()["x-trajectory-id"], "from-path");
    let r = g
        .client
        .post(g.url("/v1/chat/completions"))
        .header("X-Trajectory-Id", "from-header")
        .json(&msg)
        .send()
        .await
        .expect("send");
    assert_eq!(r.headers()["x-trajectory-id"], "from-header");
    let r = g.post("/v1/chat/completions", msg).await;
    assert_eq!(r.headers()["x-trajectory-id"], "from-body");
    let r = g
        .post(
            "/t/bad%20id/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn client_disconnect_cancels_backend_request() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    mock.push(Scripted {
        ids: encode(&g, "never ending story"),
        hang_after: Some(2),
        ..Default::default()
    });
    let mut resp = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "stream": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    // Read until some content arrived, then hang up.
    let mut seen = String::new();
    while !seen.contains("\"content\":\"n") {
        let chunk = resp.chunk().await.expect("read").expect("more data");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    tokio::time::timeout(std::time::Duration::from_secs(10), mock.wait_cancelled())
        .await
        .expect("the backend stream was cancelled after the client left");
}

#[tokio::test]
async fn models_and_health() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let models = g.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "test-model");
    assert_eq!(models["data"][0]["max_model_len"], 512);
    let models = g.get_json("/t/abc/v1/models").await;
    assert_eq!(models["object"], "list");
    let h = g.client.get(g.url("/health")).send().await.expect("get");
    assert_eq!(h.status(), 200);
}

/// Conversations over `LARGE_RENDER_BYTES` are rendered inside
/// `block_in_place` on a multi-threaded runtime: same prompt ids as inline,
/// for a normal turn and for `continue_final_message`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_conversations_render_off_the_worker_with_the_same_ids() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let mut cfg = config(&[mock.url()], "");
    cfg.model.max_model_len = 1_000_000;
    let g = start_gateway(cfg).await;
    let long = "many words of context ".repeat(4000);
    assert!(long.len() > tito::render::LARGE_RENDER_BYTES);
    let messages = json!([{"role": "user", "content": long}]);
    let resp = g
        .post(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 4}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let msgs: Vec<Value> = serde_json::from_value(messages.clone()).expect("messages");
    let expected = g
        .renderer
        .render_ids(&RenderInput {
            messages: &msgs,
            add_generation_prompt: true,
            ..Default::default()
        })
        .expect("render");
    assert_eq!(mock.last_request()["prompt"], json!(expected));

    let mut msgs = msgs;
    msgs.push(json!({"role": "assistant", "content": "Partial answer"}));
    let resp = g
        .post(
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 4, "continue_final_message": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let full = g
        .renderer
        .render(&RenderInput {
            messages: &msgs,
            add_generation_prompt: false,
            ..Default::default()
        })
        .expect("render");
    let end = full.rfind("Partial answer").expect("final content") + "Partial answer".len();
    let expected = g.renderer.encode(&full[..end]).expect("encode");
    assert_eq!(mock.last_request()["prompt"], json!(expected));
}

/// The logprob `bytes` of every token, concatenated, are the UTF-8 of the
/// content, and `token` is their text: on a byte-level vocabulary (Qwen3)
/// and on a SentencePiece one with byte fallback (Gemma 3), whose pieces are
/// text with `▁` for a space. Completions' `text_offset` counts those bytes.
#[tokio::test]
async fn logprob_bytes_spell_the_content_on_byte_level_and_sentencepiece_vocabularies() {
    let text = "acción é ł";
    for name in ["qwen3", "gemma3"] {
        let r = common::real_renderer(name, "");
        let mock = MockVllm::start(Scripted::default()).await;
        let g = common::start_gateway_with(config(&[mock.url()], ""), r.clone()).await;
        let ids = r.encode(text).expect("encodes");
        mock.push(Scripted::ids(ids.clone()));
        let body = g
            .post_json(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true}),
            )
            .await;
        let content = body["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("content");
        let per_token: Vec<Vec<u8>> = content
            .iter()
            .map(|e| serde_json::from_value(e["bytes"].clone()).expect("bytes"))
            .collect();
        assert_eq!(
            String::from_utf8(per_token.concat()).as_deref(),
            Ok(text),
            "{name}"
        );
        for (e, own) in content.iter().zip(&per_token) {
            if let Ok(s) = std::str::from_utf8(own) {
                assert_eq!(e["token"], s, "{name}");
            }
        }
        mock.push(Scripted::ids(ids.clone()));
        let body = g
            .post_json("/v1/completions", json!({"prompt": [1, 2], "logprobs": 0}))
            .await;
        let offsets: Vec<usize> =
            serde_json::from_value(body["choices"][0]["logprobs"]["text_offset"].clone())
                .expect("offsets");
        let starts: Vec<usize> = per_token
            .iter()
            .scan(0, |at, b| {
                let start = *at;
                *at += b.len();
                Some(start)
            })
            .collect();
        assert_eq!(
            offsets, starts,
            "{name}: each token starts at its byte offset"
        );
    }
}

/// A `continue_final_message` call is a sample of its own that no later
/// turn continues (its prompt ends inside the final message): a next turn
/// that repeats its history, then gives the continuation as its own message
/// (as served, or edited), starts a new sample with no drift event, on the
/// live gateway and on a fresh one that rebuilt the trajectory from the
/// store alike.
#[tokio::test]
async fn a_continued_final_message_parents_nothing_live_or_rebuilt() {
    let mock = MockVllm::start(Scripted::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open(&url).expect("store");
    let renderer = tito::render::testing::chatml_renderer();
    let reply = |s: &str| [renderer.encode(s).expect("encodes"), vec![IM_END]].concat();
    let user = json!({"role": "user", "content": "Hi"});
    let partial = json!({"role": "assistant", "content": "Hel"});
    let cases = [(false, "lo."), (true, "lo."), (false, "lo!"), (true, "lo!")];
    for (i, (fresh, echoed)) in cases.into_iter().enumerate() {
        let case = format!("fresh {fresh}, echoed {echoed}");
        let first =
            common::start_gateway_on(config(&[mock.url()], ""), renderer.clone(), store.clone())
                .await;
        let path = format!("/t/cont-{i}/v1/chat/completions");
        mock.push(Scripted::ids(reply("lo.")));
        let body = first
            .post_json(
                &path,
                json!({"messages": [user, partial], "continue_final_message": true}),
            )
            .await;
        assert_eq!(body["choices"][0]["message"]["content"], "lo.", "{body}");
        let second = if fresh {
            common::start_gateway_on(config(&[mock.url()], ""), renderer.clone(), store.clone())
                .await
        } else {
            first
        };
        mock.push(Scripted::ids(reply("Sure.")));
        let next = json!({"messages": [user, partial,
            {"role": "assistant", "content": echoed}, {"role": "user", "content": "More?"}]});
        let body = second.post_json(&path, next).await;
        assert_eq!(body["choices"][0]["message"]["content"], "Sure.", "{body}");
        let t = second.get_json(&format!("/v1/trajectories/cont-{i}")).await;
        assert_eq!(t["calls"][1]["parent_call"], Value::Null, "{case}: {t}");
        assert_eq!(t["calls"][1]["sample_index"], 1, "{case}: {t}");
        assert_eq!(t["drift"], json!([]), "{case}: {t}");
    }
}

/// A template that closed `<think></think>` in the prompt (Qwen3 with
/// `enable_thinking: false`) leaves no reasoning to split: a reasoning
/// parser whose replies start inside reasoning (`deepseek_r1`) serves the
/// reply as content then, and as reasoning when thinking is on.
#[tokio::test]
async fn a_prompt_that_closed_reasoning_serves_the_reply_as_content() {
    let r = common::real_renderer("qwen3", "");
    let mock = MockVllm::start(Scripted::default()).await;
    let mut cfg = config(&[mock.url()], "");
    cfg.model.reasoning_parser = "deepseek_r1".into();
    let g = common::start_gateway_with(cfg, r.clone()).await;
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    let reply = [r.encode("Hello there.").expect("encodes"), vec![im_end]].concat();
    let user = json!([{"role": "user", "content": "Hi"}]);
    for (thinking, content, reasoning) in [
        (false, json!("Hello there."), Value::Null),
        (true, json!(""), json!("Hello there.")),
    ] {
        mock.push(Scripted::ids(reply.clone()));
        let body = g
            .post_json(
                "/v1/chat/completions",
                json!({"messages": user, "chat_template_kwargs": {"enable_thinking": thinking}}),
            )
            .await;
        let m = &body["choices"][0]["message"];
        assert_eq!(m["content"], content, "thinking {thinking}: {body}");
        assert_eq!(
            m["reasoning_content"], reasoning,
            "thinking {thinking}: {body}"
        );
    }
}
