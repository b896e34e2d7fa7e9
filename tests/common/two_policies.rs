//! Two policies in one conversation, for the policy tests: a planner on
//! the base model and a coder on its LoRA adapter take turns on the vLLM
//! mock.

use serde_json::{json, Value};
use tito::render::testing::IM_END;

use super::mock_vllm::{MockVllm, Scripted};
use super::{config, Gateway};

pub const MODEL: &str = "test-model";
pub const CODER: &str = "coder";

pub fn two_policies(urls: &[String]) -> tito::Config {
    config(
        urls,
        &format!("[[model.adapters]]\nname = \"{CODER}\"\npath = \"/loras/coder\"\n"),
    )
}

/// The ids the mock samples for `text` (ending the turn).
pub fn sampled(g: &Gateway, text: &str) -> Vec<u32> {
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    ids
}

/// Who speaks each turn, and what.
pub const TURNS: [(&str, &str); 4] = [
    (MODEL, "Plan: write add(a, b)."),
    (CODER, "def add(a, b): return a + b"),
    (MODEL, "Plan: test it."),
    (CODER, "assert add(1, 2) == 3"),
];

/// Runs the four turns on trajectory `tid`; returns each turn's sampled ids.
pub async fn converse(g: &Gateway, mock: &MockVllm, tid: &str) -> Vec<Vec<u32>> {
    let mut messages = vec![json!({"role": "user", "content": "Write and test add."})];
    let mut out = Vec::new();
    for (model, text) in TURNS {
        let ids = sampled(g, text);
        mock.push(Scripted::ids(ids.clone()));
        let r = g
            .post(
                &format!("/t/{tid}/v1/chat/completions"),
                json!({"model": model, "messages": messages}),
            )
            .await;
        assert_eq!(r.status(), 200, "turn of {model}");
        let sent = mock.last_request();
        match model {
            CODER => assert_eq!(sent["model"], CODER),
            _ => assert!(sent.get("model").is_none(), "the base model"),
        }
        let body: Value = r.json().await.expect("json");
        let content = body["choices"][0]["message"]["content"].clone();
        assert_eq!(content, text);
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": "next"}));
        out.push(ids);
    }
    out
}
