//! LoRA adapters on the bundled engine: an adapter GGUF of the fetched
//! model is served by name. An adapter whose delta is zero answers bitwise
//! as the model alone; a non-zero one changes the numbers. Sequences of the
//! model and of adapters batched together answer bitwise as each alone, and
//! cached cells are reused only under the weights that computed them.
//! Adapters are loaded, replaced and unloaded through the admin operations.
#![cfg(feature = "engine")]

mod engine_support;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine_support::lora_gguf::write_lora;
use engine_support::{assert_bitwise_same, config, encode, greedy, model_path};
use futures::StreamExt;
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
