//! Sleep, wake-up and weight updates on the bundled engine, through the
//! gateway on the real model: a call sent while the engine sleeps waits in
//! the gateway and succeeds after the wake-up; new weights from a GGUF path
//! change greedy answers and tag later calls with their version, also when
//! loaded while asleep; a missing file or another vocabulary is a 502 naming
//! the engine, and the weights it had keep serving; the two-step (pushed)
//! update is refused and called off; the gateway's window is the engine's
//! context.
#![cfg(feature = "engine")]

mod common;
mod engine_support;

use std::path::Path;
use std::sync::Arc;

use common::Gateway;
use engine_support::gguf_edit;
use serde_json::{json, Value};
use tito::backend::{Backend, BackendError, DynBackend};
use tito::engine::EngineBackend;
use tito::render::Renderer;
use tito::{build_app, AppState, Config};

const PROMPT: &str = "What is the capital of France?";

/// The gateway over one in-process engine on the fetched model; the engine
/// handle too, to look at it directly.
async fn gateway() -> (Gateway, Arc<EngineBackend>) {
    let model = engine_support::model_path();
    let text = format!(
        "[model]\nname = \"smol\"\ntokenizer = \"{m}\"\n\
         [[backends]]\nurl = \"engine\"\nkind = \"engine\"\n\
         [engine]\nmodel = \"{m}\"\nmax_batch = 2\nn_ctx = 2048\nthreads = 2\n\
         [store]\nurl = \"memory://\"\n",
        m = model.display()
    );
    let config = Config::from_toml(&text).expect("config");
    let renderer = Renderer::load(&config.model).expect("GGUF renderer");
    let cfg = config.engine.clone();
    let engine =
        tokio::task::spawn_blocking(move || EngineBackend::start_named(&cfg, "engine", &[]))
            .await
            .expect("join")
            .expect("engine starts");
    let backends: Vec<DynBackend> = vec![engine.clone()];
    let store = tito::store::open("memory://").expect("store");
    let state = AppState::new(config, renderer.clone(), backends, store).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        tito::server::serve(
            listener,
            tito::config::DEFAULT_MAX_CONNECTIONS,
            build_app(state),
            std::future::pending(),
        )
        .await;
    });
    let g = Gateway {
        addr,
        renderer,
        client: reqwest::Client::new(),
    };
    (g, engine)
}

fn chat_body() -> Value {
    json!({
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": true,
    })
}

/// One greedy call on a new trajectory: (status, sampled ids, weight version).
async fn chat(g: &Gateway) -> (u16, Vec<u64>, Value) {
    let r = g.post("/v1/chat/completions", chat_body()).await;
    let status = r.status().as_u16();
    let tid = r
        .headers()
        .get("x-trajectory-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = r.json().await.expect("json");
    if status != 200 {
        return (status, Vec::new(), body);
    }
    let ids = body["choices"][0]["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect();
    let tid = tid.expect("trajectory id");
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    (status, ids, t["calls"][0]["weight_version"].clone())
}

async fn admin(g: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let r = g.post(path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// The engine's own greedy answer to the prompt (not through the gateway).
async fn direct(engine: &EngineBackend) -> Vec<u32> {
    let prompt = engine_support::encode(PROMPT);
    engine_support::collect(engine, &prompt, engine_support::greedy(8))
        .await
        .ids
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_while_the_engine_sleeps_waits_and_succeeds_after_wake_up() {
    let (g, engine) = gateway().await;
    let (status, before, _) = chat(&g).await;
    assert_eq!(status, 200);

    for level in [1, 2] {
        let (status, report) = admin(&g, &format!("/admin/sleep?level={level}"), json!({})).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["backends"][0]["state"], "asleep", "{report}");
        let response = report["backends"][0]["response"].as_str().expect("text");
        assert!(response.contains(&format!("level {level}")), "{response}");

        // The engine itself refuses work while asleep, with a clear error.
        let refused = engine
            .generate(engine_support::request(
                &[1, 2, 3],
                engine_support::greedy(1),
            ))
            .await
            .err()
            .expect("refused while asleep");
        assert!(
            matches!(&refused, BackendError::Overloaded { message, .. } if message.contains("asleep")),
            "{refused}"
        );

        // Through the gateway the call waits for admission: it reaches the
        // engine only after the wake-up (else the engine would refuse it).
        let g2 = Gateway {
            addr: g.addr,
            renderer: g.renderer.clone(),
            client: g.client.clone(),
        };
        let call = tokio::spawn(async move { chat(&g2).await });
        let (status, report) = admin(&g, "/admin/wake_up", json!({})).await;
        assert_eq!(status, 200, "{report}");
        assert_eq!(report["backends"][0]["state"], "awake", "{report}");
        let (status, after, _) = call.await.expect("join");
        assert_eq!(status, 200);
        assert_eq!(
            after, before,
            "same weights, same greedy answer (level {level})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_weights_change_answers_and_bad_ones_leave_the_old_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = engine_support::model_path();
    let negated = dir.path().join("negated.gguf");
    let other_vocab = dir.path().join("other-vocab.gguf");
    gguf_edit::negated_output_norm(&model, &negated);
    gguf_edit::other_vocabulary(&model, &other_vocab);
    let (g, engine) = gateway().await;

    let (_, original, version) = chat(&g).await;
    assert_eq!(version, Value::Null, "initial weights");

    // One step, from disk: other answers, tagged with the new version.
    let (status, report) = admin(
        &g,
        "/admin/weights",
        json!({"version": "v2", "path": path_str(&negated)}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["weight_version"], "v2");
    let (status, v2, version) = chat(&g).await;
    assert_eq!(status, 200);
    assert_ne!(v2, original, "other weights, other greedy answer");
    assert_eq!(version, "v2");
    let served = direct(&engine).await;

    // Bad paths: 502 naming the engine, and the v2 weights keep serving.
    let missing = dir.path().join("missing.gguf");
    for (path, why) in [
        (&missing, "is not a file"),
        (&other_vocab, "tokenizer differs"),
    ] {
        let (status, report) = admin(
            &g,
            "/admin/weights",
            json!({"version": "v3", "path": path_str(path)}),
        )
        .await;
        assert_eq!(status, 502, "{report}");
        let b = &report["backends"][0];
        assert_eq!(b["backend"], "engine", "{report}");
        let error = b["error"].as_str().expect("error");
        assert!(
            error.contains("backend engine") && error.contains(why),
            "{error}"
        );
        assert_eq!(report["weight_version"], "v2", "{report}");
        assert_eq!(direct(&engine).await, served, "old weights still serve");
    }

    // Loaded while asleep (level 2: the model is unloaded), served on wake-up.
    let (status, report) = admin(&g, "/admin/sleep?level=2", json!({})).await;
    assert_eq!(status, 200, "{report}");
    let (status, report) = admin(
        &g,
        "/admin/weights",
        json!({"version": "v4", "path": path_str(&model)}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    let (status, report) = admin(&g, "/admin/wake_up", json!({})).await;
    assert_eq!(status, 200, "{report}");
    let (status, back, version) = chat(&g).await;
    assert_eq!(status, 200);
    assert_eq!(back, original, "the original weights again");
    assert_eq!(version, "v4");

    // Weights pushed by a trainer: the engine refuses to begin, the update
    // is called off, and calls flow again.
    let (status, report) = admin(&g, "/admin/weights/begin", json!({})).await;
    assert_eq!(status, 502, "{report}");
    let error = report["backends"][0]["error"].as_str().expect("error");
    assert!(error.contains("pushed by a trainer"), "{error}");
    assert_eq!(report["paused"], false, "{report}");
    assert_eq!(report["aborted"][0]["ok"], true, "{report}");
    assert_eq!(chat(&g).await.0, 200);
}

/// The gateway's window is the engine's context (`n_ctx = 2048` here, less
/// than the model file's): a longer prompt is refused by the gateway with
/// `context_length_exceeded` naming 2048, before the engine sees it, and
/// `/v1/models` says 2048.
#[tokio::test]
async fn the_window_is_the_in_process_engine_s_context() {
    let (g, _engine) = gateway().await;
    let models = g.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["max_model_len"], 2048, "{models}");
    let long = "word ".repeat(2100);
    let r = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2048")),
        "{body}"
    );
}

/// A one-step update in `abort` mode (the same GGUF under a new label)
/// stops a generation the engine runs; the call continues on the reloaded
/// weights and is recorded as one call with the seam.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_update_mid_generation_continues_the_call_on_the_reloaded_weights() {
    let (g, _engine) = gateway().await;
    let (status, report) = admin(&g, "/admin/weights", json!({"version": "v1"})).await;
    assert_eq!(status, 200, "{report}");
    let max_tokens = 400;
    let body = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true, "stream": true});
    let mut r = g
        .client
        .post(g.url("/t/engine-abort/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    // The head comes with the first token: the engine is generating.
    let first = r.chunk().await.expect("chunk").expect("a first chunk");
    let path = path_str(&engine_support::model_path());
    let (status, report) = admin(
        &g,
        "/admin/weights",
        json!({"version": "v2", "path": path, "mode": "abort"}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["mode"], "abort");
    let mut text = String::from_utf8_lossy(&first).to_string();
    text.push_str(&r.text().await.expect("rest of the stream"));
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "one whole stream"
    );
    assert!(!text.contains("\"error\""), "{text}");
    let t = g.get_json("/v1/trajectories/engine-abort").await;
    let calls = t["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "one call in the store");
    let c = &calls[0];
    assert_eq!(c["sampled_ids"].as_array().expect("ids").len(), max_tokens);
    assert_eq!(c["finish_reason"], "length");
    let spans = c["versions"].as_array().expect("versions");
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!(spans[0], json!({"start": 0, "version": "v1", "seq": 1}));
    let seam = spans[1]["start"].as_u64().expect("seam");
    assert!(seam > 0 && seam < max_tokens as u64, "{seam}");
    assert_eq!(spans[1]["version"], "v2");
    assert_eq!(spans[1]["seq"], 2);
    assert!(c["logprobs"]
        .as_array()
        .expect("lps")
        .iter()
        .all(Value::is_number));
}
