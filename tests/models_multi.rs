//! Two models behind one gateway (`[[models]]`): Qwen3 and Llama 3.1
//! tokenizers, each with its own mock vLLM. Each request reaches only its
//! model's backends and is rendered with its model's template; one
//! trajectory alternating between them keeps each model's calls as its own
//! sample (the tokenizers differ), exact across turns, and `?model=`
//! exports each with the mask 1 on its own sampled tokens.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{start_models, Gateway};
use serde_json::{json, Value};
use tito::render::Renderer;

const QWEN: &str = "qwen";
const CODER: &str = "qwen-coder";
const LLAMA: &str = "llama";
// The trajectory test's names: metrics are process-wide, so its policies
// must not share labels with the test running beside it.
const DUO_QWEN: &str = "duo-qwen";
const DUO_LLAMA: &str = "duo-llama";

fn tokenizer(name: &str) -> String {
    common::tokenizer_dir(name).display().to_string()
}

/// Qwen3 with an inline backend and an adapter; Llama 3.1 on a named
/// `[[backends]]` entry.
fn two_models(qwen: &MockVllm, llama: &MockVllm, [q, c, l]: [&str; 3]) -> tito::Config {
    let text = format!(
        r#"
[[models]]
name = "{q}"
tokenizer = "{qt}"
max_model_len = 4096
[[models.adapters]]
name = "{c}"
path = "/loras/coder"
[[models.backends]]
url = "{qu}"
kind = "vllm"
name = "qwen-gpu"

[[models]]
name = "{l}"
tokenizer = "{lt}"
tool_parser = "llama3_json"
max_model_len = 4096
backends = ["llama-gpu"]

[[backends]]
name = "llama-gpu"
url = "{lu}"
kind = "vllm"

[store]
url = "memory://"
"#,
        qt = tokenizer("qwen3"),
        lt = tokenizer("llama3_1"),
        qu = qwen.url(),
        lu = llama.url(),
    );
    tito::Config::from_toml(&text).expect("two models load")
}

struct Fleet {
    g: Gateway,
    qwen: MockVllm,
    llama: MockVllm,
    renderers: [std::sync::Arc<Renderer>; 2],
    config: tito::Config,
    store: tito::store::DynStore,
}

async fn fleet(names: [&str; 3]) -> Fleet {
    let qwen = MockVllm::start(Scripted::default()).await;
    let llama = MockVllm::start(Scripted::default()).await;
    let config = two_models(&qwen, &llama, names);
    let views = config.served();
    let renderers = [0, 1].map(|i| Renderer::load(&views[i].model).expect("loads"));
    let store = tito::store::open("memory://").expect("store");
    let g = start_models(config.clone(), store.clone()).await;
    Fleet {
        g,
        qwen,
        llama,
        renderers,
        config,
        store,
    }
}

/// The ids a model's mock samples for `text`, ending the turn with the
/// model's end-of-turn token.
fn sampled(r: &Renderer, end: &str, text: &str) -> Vec<u32> {
    let mut ids = r.encode(text).expect("encodes");
    ids.push(r.token_to_id(end).expect("end-of-turn token"));
    ids
}

#[tokio::test]
async fn each_model_is_listed_and_reached_alone() {
    let f = fleet([QWEN, CODER, LLAMA]).await;
    let list = f.g.get_json("/v1/models").await;
    let ids: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, [QWEN, CODER, LLAMA]);
    assert_eq!(list["data"][1]["parent"], QWEN);
    assert_eq!(list["data"][2]["parent"], Value::Null);
    assert_eq!(list["data"][2]["root"], LLAMA);
    let one = f.g.get_json(&format!("/v1/models/{LLAMA}")).await;
    assert_eq!(one["id"], LLAMA);

    // A wrong id is 404 naming every served id.
    let r =
        f.g.post(
            "/v1/chat/completions",
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.expect("json");
    assert_eq!(err["error"]["code"], "model_not_found");
    let msg = err["error"]["message"].as_str().expect("message");
    for id in [QWEN, CODER, LLAMA] {
        assert!(msg.contains(id), "{msg}");
    }
    // The same through Anthropic's Messages, in its shape.
    let r =
        f.g.post(
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.expect("json");
    assert_eq!(err["type"], "error", "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains(LLAMA));

    // Ready: every model has a backend that takes calls.
    let ready = f.g.get_json("/ready").await;
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["backends"], 2);
    let per: Vec<&str> = ready["models"]
        .as_array()
        .expect("models")
        .iter()
        .map(|m| m["model"].as_str().expect("model"))
        .collect();
    assert_eq!(per, [QWEN, LLAMA]);

    // Each request reaches only its model's backend, rendered with its
    // model's template.
    for (model, mock, other, marker) in [
        (QWEN, &f.qwen, &f.llama, "<|im_start|>user"),
        (CODER, &f.qwen, &f.llama, "<|im_start|>user"),
        (
            LLAMA,
            &f.llama,
            &f.qwen,
            "<|start_header_id|>user<|end_header_id|>",
        ),
    ] {
        let before = other.requests().len();
        let r =
            f.g.post(
                "/v1/chat/completions",
                json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(r.status(), 200, "{model}");
        assert_eq!(
            other.requests().len(),
            before,
            "{model} reached another model's backend"
        );
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["model"], model);
        let (prompt, _) = mock.completed().last().cloned().expect("a completion");
        let r = &f.renderers[usize::from(model == LLAMA)];
        let text = r.decode(&prompt, false).expect("decodes");
        assert!(text.contains(marker), "{model}: {text}");
    }
    // Admin routes pick their model by `?model=`.
    let b =
        f.g.get_json(&format!("/admin/backends?model={LLAMA}"))
            .await;
    let names: Vec<&str> = b["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["llama-gpu"]);
    let r =
        f.g.post(
            &format!("/admin/weights?model={LLAMA}"),
            json!({"version": "v2"}),
        )
        .await;
    assert_eq!(r.status(), 400, "weight updates are the first model's");
    let r =
        f.g.post(
            "/admin/backends?model=nope",
            json!({"url": "http://127.0.0.1:9", "kind": "vllm"}),
        )
        .await;
    assert_eq!(r.status(), 404);
}

/// Who speaks each turn, and what.
const TURNS: [(&str, &str); 4] = [
    (DUO_QWEN, "Plan: write add."),
    (DUO_LLAMA, "def add(a, b): return a + b"),
    (DUO_QWEN, "Plan: test it."),
    (DUO_LLAMA, "assert add(1, 2) == 3"),
];

#[tokio::test]
async fn one_trajectory_two_tokenizers_keeps_each_models_samples_exact() {
    let f = fleet([DUO_QWEN, CODER, DUO_LLAMA]).await;
    let tid = "duo";
    let mut messages = vec![json!({"role": "user", "content": "Write and test add."})];
    let mut turns = Vec::new();
    for (model, text) in TURNS {
        let (mock, r, end) = match model {
            DUO_QWEN => (&f.qwen, &f.renderers[0], "<|im_end|>"),
            _ => (&f.llama, &f.renderers[1], "<|eot_id|>"),
        };
        let ids = sampled(r, end, text);
        mock.push(Scripted::ids(ids.clone()));
        let resp =
            f.g.post(
                &format!("/t/{tid}/v1/chat/completions"),
                json!({"model": model, "messages": messages}),
            )
            .await;
        assert_eq!(resp.status(), 200, "turn of {model}");
        let body: Value = resp.json().await.expect("json");
        let content = body["choices"][0]["message"]["content"].clone();
        assert_eq!(content, text);
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": "next"}));
        turns.push(ids);
    }

    // Each model's later call continued its own earlier one: its prompt
    // starts with that call's prompt and sampled ids, verbatim.
    for mock in [&f.qwen, &f.llama] {
        let done = mock.completed();
        assert_eq!(done.len(), 2);
        let mut exact = done[0].0.clone();
        exact.extend_from_slice(&done[0].1);
        assert!(
            done[1].0.starts_with(&exact),
            "the second call extends the first"
        );
    }

    let t = f.g.get_json(&format!("/v1/trajectories/{tid}")).await;
    let calls = t["calls"].as_array().expect("calls");
    let of = |i: usize, k: &str| calls[i][k].clone();
    assert_eq!(
        (0..4).map(|i| of(i, "model")).collect::<Vec<_>>(),
        [
            json!(DUO_QWEN),
            json!(DUO_LLAMA),
            json!(DUO_QWEN),
            json!(DUO_LLAMA)
        ]
    );
    assert_eq!(of(2, "parent_call"), 0);
    assert_eq!(of(3, "parent_call"), 1);
    assert_eq!(of(1, "parent_call"), Value::Null);
    assert_eq!(of(1, "drift")["cause"], "other_policy", "{}", calls[1]);
    assert_ne!(of(0, "sample_index"), of(1, "sample_index"));

    // The viewer's text of each sampled segment is in its own model's
    // tokenizer.
    let said: Vec<String> = t["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .flat_map(|s| s["segments"].as_array().cloned().unwrap_or_default())
        .filter(|seg| seg["kind"] == "sampled")
        .filter_map(|seg| seg["text"].as_str().map(str::to_string))
        .collect();
    for (_, text) in TURNS {
        assert!(
            said.iter().any(|s| s.contains(text)),
            "{text:?} in {said:?}"
        );
    }

    // Each model's export: one sample, its own calls, mask 1 exactly on its
    // sampled ids; the other model's turns are in its prompt as text.
    for (model, own) in [(DUO_QWEN, [0, 2]), (DUO_LLAMA, [1, 3])] {
        let rows =
            f.g.export_jsonl(&format!("trajectory={tid}&model={model}"))
                .await;
        assert_eq!(rows.len(), 1, "{model}");
        let row = &rows[0];
        assert_eq!(row["model"], model);
        let ids: Vec<u64> = row["response_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id"))
            .collect();
        let mask: Vec<u64> = row["response_mask"]
            .as_array()
            .expect("mask")
            .iter()
            .map(|v| v.as_u64().expect("mask"))
            .collect();
        let offsets: Vec<usize> = row["call_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|v| v.as_u64().expect("offset") as usize)
            .collect();
        assert_eq!(offsets.len(), 2, "{model}: its two calls");
        let mut want = vec![0u64; ids.len()];
        for (turn, &at) in own.iter().zip(&offsets) {
            let got: Vec<u32> = ids[at..at + turns[*turn].len()]
                .iter()
                .map(|&i| i as u32)
                .collect();
            assert_eq!(got, turns[*turn], "{model}: turn {turn} verbatim");
            want[at..at + turns[*turn].len()].fill(1);
        }
        assert_eq!(mask, want, "{model}");
    }
    // Unfiltered: two samples, one per model.
    assert_eq!(
        f.g.export_jsonl(&format!("trajectory={tid}")).await.len(),
        2
    );

    let metrics = f.g.get_text("/metrics").await;
    for model in [DUO_QWEN, DUO_LLAMA] {
        let line = format!("tito_policy_calls_total{{policy=\"{model}\"}} 2");
        assert!(metrics.lines().any(|l| l == line), "{line}");
    }

    // A gateway started over the same store (a restart) rebuilds each
    // model's view from its own calls and continues them.
    let g2 = start_models(f.config.clone(), f.store.clone()).await;
    let ids = sampled(&f.renderers[1], "<|eot_id|>", "done");
    f.llama.push(Scripted::ids(ids));
    let resp = g2
        .post(
            &format!("/t/{tid}/v1/chat/completions"),
            json!({"model": DUO_LLAMA, "messages": messages}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let done = f.llama.completed();
    let mut exact = done[1].0.clone();
    exact.extend_from_slice(&done[1].1);
    assert!(
        done[2].0.starts_with(&exact),
        "continues call 3 after the restart"
    );
    let t = g2.get_json(&format!("/v1/trajectories/{tid}")).await;
    assert_eq!(t["calls"][4]["parent_call"], 3);
}
