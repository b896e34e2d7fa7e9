//! LoRA adapters on the bundled engine: an adapter GGUF of the fetched
//! model is served by name. An adapter whose delta is zero answers bitwise
//! as the model alone; a non-zero one changes the numbers. Sequences of the
//! model and of adapters batched together answer bitwise as each alone, and
//! cached cells are reused only under the weights that computed them.
//! Adapters are loaded, replaced and unloaded through the admin operations,
//! and through the gateway: `[[model.adapters]]` on an engine backend are
//! listed, picked by a request's `model`, recorded, and changed by
//! `POST /admin/adapters`.
#![cfg(feature = "engine")]

mod common;
mod engine_support;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine_support::lora_gguf::write_lora;
use engine_support::{assert_bitwise_same, config, encode, greedy, model_path};
use futures::StreamExt;
use serde_json::{json, Value};
use tito::backend::{AdminOp, Backend, BackendError, GenerateRequest, Generation};
use tito::config::AdapterConfig;
use tito::engine::EngineBackend;

/// Writes the test adapters in a fresh directory: `zero` (no delta) and
/// `bump`/`other` (two different non-zero ones).
fn adapters() -> (tempfile::TempDir, Vec<AdapterConfig>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = model_path();
    let mut out = Vec::new();
    for (name, strength, seed) in [("zero", 0.0, 1), ("bump", 0.5, 2), ("other", 0.5, 3)] {
        let path = dir.path().join(format!("{name}.gguf"));
        write_lora(&model, &path, 4, strength, seed);
        out.push(AdapterConfig {
            name: name.into(),
            path: path.display().to_string(),
        });
    }
    (dir, out)
}

fn start(max_batch: u32, adapters: &[AdapterConfig]) -> Arc<EngineBackend> {
    EngineBackend::start_named(&config(max_batch), "engine", adapters).expect("engine starts")
}

fn prompt() -> Vec<u32> {
    encode("<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n")
}

fn req(adapter: Option<&str>, prompt: &[u32]) -> GenerateRequest {
    GenerateRequest {
        request_id: "lora".into(),
        prompt_ids: Arc::new(prompt.to_vec()),
        params: tito::backend::SamplingParams {
            logprobs: Some(2),
            ..greedy(16)
        },
        images: None,
        adapter: adapter.map(Arc::from),
    }
}

async fn run(engine: &EngineBackend, adapter: Option<&str>, prompt: &[u32]) -> Generation {
    try_run(engine, adapter, prompt)
        .await
        .expect("no engine error")
}

async fn try_run(
    engine: &EngineBackend,
    adapter: Option<&str>,
    prompt: &[u32],
) -> Result<Generation, BackendError> {
    let mut stream = engine.generate(req(adapter, prompt)).await?;
    let mut g = Generation::default();
    while let Some(ev) = stream.next().await {
        g.push(ev?);
    }
    Ok(g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_adapter_answers_as_the_model_and_a_real_one_changes_the_numbers() {
    let (_dir, list) = adapters();
    let engine = start(2, &list);
    let p = prompt();
    let base = run(&engine, None, &p).await;
    let zero = run(&engine, Some("zero"), &p).await;
    assert_bitwise_same("zero adapter", &zero, &base);
    let bump = run(&engine, Some("bump"), &p).await;
    assert_eq!(bump.ids.len(), base.ids.len());
    assert_ne!(
        bump.logprobs[0].logprob, base.logprobs[0].logprob,
        "the adapter's delta reaches the first token's logprob"
    );
    let other = run(&engine, Some("other"), &p).await;
    assert_ne!(other.logprobs[0].logprob, bump.logprobs[0].logprob);
    // The same adapter again: the same answer.
    assert_bitwise_same("bump again", &run(&engine, Some("bump"), &p).await, &bump);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_of_several_adapters_batched_together_answer_as_each_alone() {
    let (_dir, list) = adapters();
    let p = prompt();
    let alone = start(1, &list);
    let mut want = Vec::new();
    for a in [None, Some("bump"), Some("other")] {
        want.push(run(&alone, a, &p).await);
    }
    let batched = start(6, &list);
    let plan = [
        None,
        Some("bump"),
        Some("other"),
        Some("bump"),
        None,
        Some("other"),
    ];
    let runs = plan.iter().map(|a| run(&batched, *a, &p));
    let got = futures::future::join_all(runs).await;
    for (i, (a, g)) in plan.iter().zip(&got).enumerate() {
        let w = match a {
            None => &want[0],
            Some("bump") => &want[1],
            _ => &want[2],
        };
        assert_bitwise_same(&format!("sequence {i} ({a:?})"), g, w);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_cells_are_reused_only_under_the_weights_that_computed_them() {
    let (_dir, list) = adapters();
    let p = prompt();
    let fresh = start(2, &list);
    let bump_alone = run(&fresh, Some("bump"), &p).await;
    let engine = start(2, &list);
    let reused = || engine.stats().reused_tokens.load(Ordering::SeqCst);
    run(&engine, None, &p).await;
    assert_eq!(reused(), 0);
    // The model's cells of the same prompt are not the adapter's.
    let bump = run(&engine, Some("bump"), &p).await;
    assert_eq!(
        reused(),
        0,
        "no cell computed without the adapter is reused"
    );
    assert_bitwise_same("bump after base", &bump, &bump_alone);
    // The adapter's own cells are.
    let again = run(&engine, Some("bump"), &p).await;
    assert!(reused() > 0, "the adapter's cells are reused");
    assert_bitwise_same("bump reusing its cells", &again, &bump_alone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_loaded_replaced_and_unloaded_by_admin_operations() {
    let (dir, list) = adapters();
    let path = |n: &str| -> String { dir.path().join(format!("{n}.gguf")).display().to_string() };
    let engine = start(2, &[]);
    let p = prompt();
    let base = run(&engine, None, &p).await;
    let refused = try_run(&engine, Some("bump"), &p).await;
    assert!(
        matches!(&refused, Err(BackendError::Rejected { message, .. })
            if message.contains("no LoRA adapter `bump`")),
        "{refused:?}"
    );
    let load = |name: &str, file: String| AdminOp::LoadAdapter {
        name: name.into(),
        path: file,
        replace: false,
    };
    engine
        .admin(&load("bump", path("bump")))
        .await
        .expect("loads");
    let bump = run(&engine, Some("bump"), &p).await;
    assert_ne!(bump.logprobs[0].logprob, base.logprobs[0].logprob);
    // New weights under the same name: the zero adapter's.
    engine
        .admin(&load("bump", path("zero")))
        .await
        .expect("replaces");
    assert_bitwise_same(
        "replaced by zero",
        &run(&engine, Some("bump"), &p).await,
        &base,
    );
    // A file that is not an adapter of the model: refused, the served one
    // stays.
    let err = engine
        .admin(&load("bump", model_path().display().to_string()))
        .await
        .expect_err("a model is not an adapter");
    assert!(err.to_string().contains("LoRA adapter"), "{err}");
    let missing = PathBuf::from("/nonexistent/a.gguf").display().to_string();
    assert!(engine.admin(&load("x", missing)).await.is_err());
    assert_bitwise_same("still zero", &run(&engine, Some("bump"), &p).await, &base);
    engine
        .admin(&AdminOp::UnloadAdapter {
            name: "bump".into(),
        })
        .await
        .expect("unloads");
    assert!(try_run(&engine, Some("bump"), &p).await.is_err());
    assert!(engine
        .admin(&AdminOp::UnloadAdapter {
            name: "bump".into()
        })
        .await
        .is_err());
    drop(list);
}

const TOKEN: &str = "s3cret-admin";

/// A greedy chat call on `model` for trajectory `tid`: status and body.
async fn chat(g: &common::Gateway, tid: &str, model: &str) -> (u16, Value) {
    let r = g
        .post(
            &format!("/t/{tid}/v1/chat/completions"),
            json!({"model": model, "messages": [{"role": "user", "content": "Name a river."}],
                   "max_tokens": 6, "temperature": 0, "logprobs": true}),
        )
        .await;
    (r.status().as_u16(), r.json().await.expect("json"))
}

fn first_logprob(v: &Value) -> f64 {
    v["choices"][0]["logprobs"]["content"][0]["logprob"]
        .as_f64()
        .unwrap_or_else(|| panic!("a logprob: {v}"))
}

async fn admin(g: &common::Gateway, body: Value) -> (u16, Value) {
    let r = g
        .client
        .post(g.url("/admin/adapters"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("admin");
    (r.status().as_u16(), r.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_engine_adapters_by_name_and_changes_them_at_run_time() {
    let (dir, _) = adapters();
    let m = model_path();
    let file = |n: &str| dir.path().join(format!("{n}.gguf")).display().to_string();
    let text = format!(
        "[server]\nadmin_token = \"{TOKEN}\"\n\
         [model]\nname = \"smol\"\ntokenizer = \"{m}\"\n\
         [[model.adapters]]\nname = \"bump\"\npath = \"{bump}\"\n\
         [[backends]]\nurl = \"engine\"\nkind = \"engine\"\n\
         [engine]\nmodel = \"{m}\"\nmax_batch = 2\nn_ctx = 2048\nthreads = 2\n\
         [store]\nurl = \"memory://\"\n",
        m = m.display(),
        bump = file("bump"),
    );
    let config = tito::Config::from_toml(&text).expect("config");
    let store = tito::store::open("memory://").expect("store");
    let g = common::start_models(config, store).await;

    let models: Value = g.get_json("/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["smol", "bump"]);
    let (status, base) = chat(&g, "e-1", "smol").await;
    assert_eq!(status, 200, "{base}");
    let (status, bump) = chat(&g, "e-2", "bump").await;
    assert_eq!(status, 200, "{bump}");
    assert_eq!(bump["model"], "bump");
    assert_ne!(
        first_logprob(&bump),
        first_logprob(&base),
        "the adapter's numbers"
    );
    let t = g.get_json_as("/v1/trajectories/e-2", TOKEN).await;
    assert_eq!(t["calls"][0]["adapter"], "bump", "{t}");

    // Loaded at run time from a file on the engine's disk.
    let (status, report) = admin(&g, json!({"name": "other", "path": file("other")})).await;
    assert_eq!(status, 200, "{report}");
    let (status, other) = chat(&g, "e-3", "other").await;
    assert_eq!(status, 200, "{other}");
    assert_ne!(first_logprob(&other), first_logprob(&bump));
    // Replaced by the zero adapter: the model's own numbers.
    let (status, report) = admin(&g, json!({"name": "bump", "path": file("zero")})).await;
    assert_eq!(status, 200, "{report}");
    let (_, zeroed) = chat(&g, "e-4", "bump").await;
    assert_eq!(first_logprob(&zeroed), first_logprob(&base));
    // A file that is not an adapter: 502 naming the engine, nothing changes.
    let (status, report) =
        admin(&g, json!({"name": "bump", "path": m.display().to_string()})).await;
    assert_eq!(status, 502, "{report}");
    let (_, still) = chat(&g, "e-5", "bump").await;
    assert_eq!(first_logprob(&still), first_logprob(&base));
    let (status, _) = admin(&g, json!({"name": "bump", "action": "unload"})).await;
    assert_eq!(status, 200);
    let (status, gone) = chat(&g, "e-6", "bump").await;
    assert_eq!(status, 404, "{gone}");
    assert_eq!(gone["error"]["code"], "model_not_found");
}
