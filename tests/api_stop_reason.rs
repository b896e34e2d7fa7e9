//! `stop_reason` on every choice, as vLLM fills it: null when the sequence
//! ended on EOS or on length, the stop string that matched, or the
//! `stop_token_ids` token that ended it. Chat and completions, streamed and
//! not, over a mock vLLM backend.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::{ENDOFTEXT, IM_END};

/// One way a sequence ends: what the backend samples, what the request
/// adds, and the `(finish_reason, stop_reason)` the client must see.
struct Case {
    name: &'static str,
    sampled: Vec<u32>,
    request: Value,
    finish: &'static str,
    stop_reason: Value,
}

fn cases(g: &Gateway) -> Vec<Case> {
    let enc = |s: &str| g.renderer.encode(s).expect("encodes");
    let with = |s: &str, end: &[u32]| [enc(s), end.to_vec()].concat();
    vec![
        Case {
            name: "EOS",
            sampled: with("all done", &[IM_END]),
            request: json!({}),
            finish: "stop",
            stop_reason: Value::Null,
        },
        Case {
            name: "length",
            sampled: with("a long answer", &[IM_END]),
            request: json!({"max_tokens": 3}),
            finish: "length",
            stop_reason: Value::Null,
        },
        Case {
            name: "EOS sampled as the last token max_tokens allows",
            sampled: with("all done", &[IM_END]),
            request: json!({"max_tokens": enc("all done").len() + 1}),
            finish: "stop",
            stop_reason: Value::Null,
        },
        Case {
            name: "a stop token id sampled as the last token max_tokens allows",
            sampled: with("one two! three", &[IM_END]),
            request: json!({"stop_token_ids": [u32::from(b'!')], "max_tokens": enc("one two!").len()}),
            finish: "stop",
            stop_reason: json!(b'!'),
        },
        Case {
            name: "stop string",
            sampled: with("one END two", &[IM_END]),
            request: json!({"stop": ["never", "END"]}),
            finish: "stop",
            stop_reason: json!("END"),
        },
        Case {
            name: "the first of two stop strings to appear",
            sampled: with("x B y A z", &[IM_END]),
            request: json!({"stop": ["A", "B"]}),
            finish: "stop",
            stop_reason: json!("B"),
        },
        Case {
            name: "stop token id",
            sampled: with("one two! three", &[IM_END]),
            request: json!({"stop_token_ids": [u32::from(b'!')]}),
            finish: "stop",
            stop_reason: json!(b'!'),
        },
        Case {
            name: "a special stop token that is not EOS",
            sampled: with("done", &[ENDOFTEXT]),
            request: json!({"stop_token_ids": [ENDOFTEXT]}),
            finish: "stop",
            stop_reason: json!(ENDOFTEXT),
        },
        Case {
            name: "EOS listed as a stop token",
            sampled: with("done", &[IM_END]),
            request: json!({"stop_token_ids": [IM_END]}),
            finish: "stop",
            stop_reason: Value::Null,
        },
        Case {
            name: "EOS as a stop token under ignore_eos",
            sampled: with("done", &[IM_END]),
            request: json!({"stop_token_ids": [IM_END], "ignore_eos": true}),
            finish: "stop",
            stop_reason: json!(IM_END),
        },
    ]
}

/// The request body for one endpoint, with the case's fields merged in.
fn body(chat: bool, stream: bool, extra: &Value) -> Value {
    let mut b = if chat {
        json!({"messages": [{"role": "user", "content": "hi"}]})
    } else {
        json!({"prompt": "hi"})
    };
    b["stream"] = json!(stream);
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// `(finish_reason, stop_reason)` of choice 0, from the body or from the
/// stream's finish chunk (the one chunk whose choice has a finish reason).
async fn ending(resp: reqwest::Response, stream: bool) -> (Value, Value) {
    assert_eq!(resp.status(), 200);
    if !stream {
        let v: Value = resp.json().await.expect("json");
        let c = &v["choices"][0];
        assert!(c.get("stop_reason").is_some(), "{v}");
        return (c["finish_reason"].clone(), c["stop_reason"].clone());
    }
    let finals: Vec<Value> = sse_events(resp)
        .await
        .into_iter()
        .filter(|d| d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(&d).expect("chunk"))
        .filter_map(|c| c["choices"].get(0).cloned())
        .filter(|c| !c["finish_reason"].is_null())
        .collect();
    assert_eq!(finals.len(), 1, "one finish chunk: {finals:?}");
    let c = &finals[0];
    assert!(c.get("stop_reason").is_some(), "{c}");
    (c["finish_reason"].clone(), c["stop_reason"].clone())
}

#[tokio::test]
async fn stop_reason_is_filled_as_vllm_fills_it() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    for case in cases(&g) {
        for (chat, path) in [(true, "/v1/chat/completions"), (false, "/v1/completions")] {
            for stream in [false, true] {
                mock.push(Scripted::ids(case.sampled.clone()));
                let resp = g.post(path, body(chat, stream, &case.request)).await;
                let (finish, stop_reason) = ending(resp, stream).await;
                let what = format!("{} ({path}, stream {stream})", case.name);
                assert_eq!(finish, case.finish, "{what}");
                assert_eq!(stop_reason, case.stop_reason, "{what}");
            }
        }
    }
}

#[tokio::test]
async fn a_replayed_answer_keeps_its_stop_reason() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let sampled = [
        g.renderer.encode("one END two").expect("encodes"),
        vec![IM_END],
    ]
    .concat();
    mock.push(Scripted::ids(sampled));
    let req = json!({"messages": [{"role": "user", "content": "hi"}], "stop": ["END"]});
    let mut seen = Vec::new();
    for _ in 0..2 {
        let resp = g
            .client
            .post(g.url("/t/replayed/v1/chat/completions"))
            .header("Idempotency-Key", "k-1")
            .json(&req)
            .send()
            .await
            .expect("gateway reachable");
        seen.push(ending(resp, false).await);
    }
    assert_eq!(
        mock.requests().len(),
        1,
        "the second answer is the recorded one"
    );
    assert_eq!(seen[0], (json!("stop"), json!("END")));
    assert_eq!(seen[1], seen[0]);
}
