//! The bundled inference engine: llama.cpp in-process (its C API, wrapped in
//! [`ffi`]; the `llama-cpp-2` crate for the backend and the reference loop)
//! with continuous batching, behind the same [`Backend`] trait as the HTTP
//! backends.
//!
//! Owns: starting the engine thread ([`lifecycle`], which runs [`worker`]'s
//! batching loop, and sleeps, wakes and reloads weights), the handle that submits
//! requests to it ([`EngineBackend`]), sampling ([`sampler`]), teacher-forced
//! scoring for the replay check ([`score`]) and the stand-alone `tito engine`
//! HTTP server ([`server`]). Must not: render chat templates or know about
//! trajectories; it speaks token ids only (the server also accepts text
//! prompts, tokenized with the GGUF's own tokenizer).
//!
//! Start it with [`EngineBackend::start`]; dropping the last handle ends the
//! requests still running (with an error), closes the command channel and
//! waits for the thread to free the model.

mod cells;
pub mod direct;
mod exp;
mod ffi;
pub mod kernels;
mod lifecycle;
pub mod logs;
mod rank;
pub mod sampler;
pub mod score;
pub mod server;
pub mod step_sample;
mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use llama_cpp_2::llama_backend::LlamaBackend;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::backend::{
    AdminOp, Backend, BackendError, FinishReason, GenEvent, GenStream, GenerateRequest,
    PositionLogprob, SamplingParams, ScoreRequest, StructuredOutput,
};
use crate::config::{Device, EngineConfig, LogprobsMode};

pub use score::PositionScore;
pub use worker::EngineStats;

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("cannot initialise llama.cpp: {0}")]
    Init(String),
    #[error("cannot load the engine model: {0}")]
    Load(String),
    #[error("engine configuration: {0}")]
    Config(String),
    #[error("the engine thread stopped before it was ready")]
    Stopped,
}

/// What the loaded engine reports about itself.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    /// KV-cache cells shared by all running sequences.
    pub n_ctx: u32,
    /// Longest sequence (prompt + completion) one request may reach.
    pub max_seq_len: u32,
    pub n_vocab: u32,
    pub max_batch: u32,
    /// End-of-generation token ids (llama.cpp's EOG set), sorted.
    pub eog_ids: Vec<u32>,
}

/// Resolved engine settings (config with defaults applied).
#[derive(Debug, Clone)]
pub(crate) struct EngineSettings {
    name: String,
    model: PathBuf,
    max_batch: u32,
    n_ctx: u32,
    threads: u32,
    prefill_chunk: u32,
    gpu_layers: u32,
    /// The logprob quantity every sampler reports (`[engine] logprobs_mode`).
    logprobs_mode: LogprobsMode,
    /// ggml's reference CPU kernels ([`kernels`]).
    batch_invariant: bool,
    /// Prefix reuse of cached KV cells ([`cells`]).
    kv_reuse: bool,
    /// The LoRA adapters served from the start: name and GGUF path.
    adapters: Vec<(String, PathBuf)>,
}

impl EngineSettings {
    fn from_config(cfg: &EngineConfig, name: &str) -> Result<Self, EngineError> {
        match cfg.device {
            Device::Cpu => {}
            Device::Cuda if cfg.batch_invariant => {
                return Err(EngineError::Config(
                    "engine.batch_invariant = true needs device = \"cpu\": only ggml's CPU kernels have a batch-invariant mode; set engine.batch_invariant = false to run on cuda".into(),
                ))
            }
            // Asked of the llama.cpp this binary runs on, not of the cargo
            // feature: a `--features cuda` build on a machine without a GPU
            // (or driver) would otherwise run every layer on the CPU unsaid.
            Device::Cuda if llama_backend()?.supports_gpu_offload() => {}
            Device::Cuda => {
                return Err(EngineError::Config(format!(
                    "engine.device = \"cuda\", but llama.cpp has no GPU to offload to (its devices: {}); it needs a build with `--features cuda` on a machine with an NVIDIA GPU and driver",
                    device_names()
                )))
            }
        }
        if cfg.batch_invariant {
            kernels::available().map_err(|e| EngineError::Config(kernels::refusal(&e)))?;
        }
        if !cfg.model.is_file() {
            return Err(EngineError::Load(format!(
                "{} does not exist (run scripts/fetch-model.sh for the default model)",
                cfg.model.display()
            )));
        }
        let threads = if cfg.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
        } else {
            cfg.threads
        };
        Ok(EngineSettings {
            name: name.to_string(),
            model: cfg.model.clone(),
            max_batch: cfg.max_batch.max(1),
            n_ctx: cfg.n_ctx,
            threads,
            prefill_chunk: cfg.prefill_chunk.max(1),
            gpu_layers: gpu_layers(cfg.device),
            logprobs_mode: cfg.logprobs_mode,
            batch_invariant: cfg.batch_invariant,
            kv_reuse: cfg.kv_reuse,
            adapters: Vec::new(),
        })
    }
}

/// How many of the model's layers llama.cpp puts on the GPU for `device`:
/// none, or all of them (llama.cpp caps the count at the model's).
pub fn gpu_layers(device: Device) -> u32 {
    match device {
        Device::Cpu => 0,
        Device::Cuda => 999,
    }
}

/// llama.cpp's devices as `name (description)`, comma-separated.
pub fn device_names() -> String {
    llama_cpp_2::list_llama_ggml_backend_devices()
        .iter()
        .map(|d| format!("{} ({})", d.name, d.description))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The process-wide llama.cpp backend (llama.cpp allows one init per process).
pub fn llama_backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            logs::install();
            let backend = LlamaBackend::init().map_err(|e| e.to_string());
            tracing::info!(system_info = %kernels::system_info(), "llama.cpp kernels");
            backend
        })
        .as_ref()
        .map_err(|e| EngineError::Init(e.clone()))
}

/// Handle to a running engine; implements [`Backend`]. Dropping it stops the
/// engine thread and waits for it (see the `Drop` impl).
pub struct EngineBackend {
    name: String,
    tx: std::sync::mpsc::Sender<worker::Msg>,
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<worker::Shared>,
    max_queue: usize,
    info: EngineInfo,
}

impl EngineBackend {
    /// Loads the model on a new engine thread and waits until it is ready.
    /// Blocks for the model load (about a second for the default model).
    pub fn start(cfg: &EngineConfig) -> Result<Arc<EngineBackend>, EngineError> {
        Self::start_named(cfg, "engine", &[])
    }

    /// [`EngineBackend::start`] with the name used in logs and errors, and
    /// the LoRA adapters (GGUF files) it serves from the start.
    pub fn start_named(
        cfg: &EngineConfig,
        name: &str,
        adapters: &[crate::config::AdapterConfig],
    ) -> Result<Arc<EngineBackend>, EngineError> {
        let mut settings = EngineSettings::from_config(cfg, name)?;
        settings.adapters = adapters
            .iter()
            .map(|a| (a.name.clone(), PathBuf::from(&a.path)))
            .collect();
        let shared = Arc::new(worker::Shared {
            queued: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
            asleep: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            aborting: AtomicBool::new(false),
            stats: EngineStats::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tito-engine-{name}"))
            .spawn(move || lifecycle::run(settings, thread_shared, rx, ready_tx))
            .map_err(|e| EngineError::Init(format!("cannot spawn the engine thread: {e}")))?;
        let info = ready_rx.recv().map_err(|_| EngineError::Stopped)??;
        tracing::info!(
            engine = name,
            n_ctx = info.n_ctx,
            max_batch = info.max_batch,
            logprobs_mode = cfg.logprobs_mode.as_str(),
            "bundled engine ready"
        );
        Ok(Arc::new(EngineBackend {
            name: name.to_string(),
            tx,
            thread: Some(thread),
            shared,
            max_queue: cfg.max_queue as usize,
            info,
        }))
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// Requests waiting for a batch slot right now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    fn rejected(&self, message: String) -> BackendError {
        BackendError::Rejected {
            backend: self.name.clone(),
            message,
        }
    }

    /// The GBNF grammar of an output constraint: llama.cpp's own conversion
    /// of the JSON schema (any object for `json_object`).
    fn grammar(&self, req: &GenerateRequest) -> Result<Option<String>, BackendError> {
        let schema = match &req.params.structured {
            None => return Ok(None),
            Some(StructuredOutput::JsonObject) => serde_json::json!({"type": "object"}),
            Some(StructuredOutput::JsonSchema(s)) => s.clone(),
        };
        llama_cpp_2::json_schema_to_grammar(&schema.to_string())
            .map(Some)
            .map_err(|e| self.rejected(format!("cannot turn the JSON schema into a grammar: {e}")))
    }

    fn check(&self, req: &GenerateRequest) -> Result<(), BackendError> {
        if req.images.is_some() {
            return Err(self.rejected(
                "the bundled engine serves a text-only model: it takes no images".into(),
            ));
        }
        // Room for at least one generated token.
        self.check_ids(
            &req.prompt_ids,
            (self.info.max_seq_len as usize).saturating_sub(1),
        )
    }

    /// Non-empty, in the vocabulary, at most `max_len` tokens.
    fn check_ids(&self, prompt: &[u32], max_len: usize) -> Result<(), BackendError> {
        if prompt.is_empty() {
            return Err(self.rejected("the prompt is empty".into()));
        }
        if let Some(bad) = prompt.iter().find(|&&t| t >= self.info.n_vocab) {
            return Err(self.rejected(format!(
                "token id {bad} is out of the vocabulary (size {})",
                self.info.n_vocab
            )));
        }
        if prompt.len() > max_len {
            return Err(self.rejected(format!(
                "the prompt has {} tokens; this engine's context window is {} tokens",
                prompt.len(),
                self.info.max_seq_len
            )));
        }
        Ok(())
    }

    /// Counts a request into the queue, or refuses it when the queue is full
    /// or the engine sleeps.
    fn enter_queue(&self) -> Result<(), BackendError> {
        if self.shared.asleep.load(Ordering::SeqCst) {
            return Err(self.shared.asleep_error(&self.name));
        }
        if self.shared.queued.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(BackendError::Overloaded {
                backend: self.name.clone(),
                message: format!("{} requests already wait for a batch slot", self.max_queue),
            });
        }
        Ok(())
    }

    fn submit(&self, job: worker::Job) -> Result<(), BackendError> {
        self.tx.send(worker::Msg::Job(job)).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            BackendError::Unreachable {
                backend: self.name.clone(),
                message: "the engine thread has stopped".into(),
            }
        })
    }

    /// Teacher-forced pass over `ids` (up to the whole context window): for
    /// every position `i > 0`, how the model scores `ids[i]` after
    /// `ids[..i]` (see [`score`]); position 0 is `None`. Batched with other
    /// requests like a prompt; dropping the future cancels it.
    pub async fn score(&self, ids: Vec<u32>) -> Result<Vec<Option<PositionScore>>, BackendError> {
        self.score_with(ids, None).await
    }

    /// [`EngineBackend::score`] with the LoRA adapter `adapter` applied.
    pub async fn score_with(
        &self,
        ids: Vec<u32>,
        adapter: Option<Arc<str>>,
    ) -> Result<Vec<Option<PositionScore>>, BackendError> {
        self.check_ids(&ids, self.info.max_seq_len as usize)?;
        if ids.len() < 2 {
            return Ok(vec![None; ids.len()]);
        }
        self.enter_queue()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        self.submit(worker::Job {
            prompt: ids,
            // Unused by a scoring job; a fixed seed spares an OS RNG read.
            params: SamplingParams {
                seed: Some(0),
                ..Default::default()
            },
            grammar: None,
            adapter,
            tx: worker::Reply::Score(tx),
        })?;
        rx.recv().await.unwrap_or_else(|| {
            Err(BackendError::Unreachable {
                backend: self.name.clone(),
                message: "the engine thread stopped while scoring".into(),
            })
        })
    }
}

#[async_trait::async_trait]
impl Backend for EngineBackend {
    /// The engine keeps the path and loads it at wake-up (level 2) or swaps
    /// at once (level 1).
    fn reloads_while_asleep(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "engine"
    }

    fn max_model_len(&self) -> Option<u32> {
        Some(self.info.max_seq_len)
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        self.check(&req)?;
        let grammar = self.grammar(&req)?;
        if req.params.max_tokens == 0 {
            let done = GenEvent::Done {
                finish_reason: FinishReason::Length,
            };
            return Ok(Box::pin(futures::stream::iter([Ok(done)])));
        }
        self.enter_queue()?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.submit(worker::Job {
            prompt: req.prompt_ids.to_vec(),
            params: req.params,
            grammar,
            adapter: req.adapter,
            tx: worker::Reply::Generate(tx),
        })?;
        Ok(UnboundedReceiverStream::new(rx).boxed())
    }

    async fn prompt_logprobs(
        &self,
        req: ScoreRequest,
    ) -> Result<Vec<PositionLogprob>, BackendError> {
        let scores = self.score_with(req.ids.to_vec(), req.adapter).await?;
        Ok(scores
            .into_iter()
            .map(|s| PositionLogprob {
                logprob: s.map(|s| s.logprob),
                argmax: s.map(|s| s.rank == 1),
            })
            .collect())
    }

    async fn health(&self) -> Result<(), BackendError> {
        if self.shared.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(BackendError::Unreachable {
                backend: self.name.clone(),
                message: "the engine thread has stopped".into(),
            })
        }
    }

    /// Sleep, wake-up and one-step weight updates from a GGUF path (see
    /// [`lifecycle`]). The engine cannot take weights pushed by a trainer:
    /// it refuses to begin a two-step update, so the gateway calls the
    /// update off on every backend.
    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError> {
        let control = match op {
            // The engine keeps its weights in host memory while asleep.
            AdminOp::SleepCheck => return Ok("the bundled engine can sleep".into()),
            AdminOp::KeepCheck => {
                return Err(self.rejected(
                    "the bundled engine cannot keep a generation paused through a reload: \
                     its generations are stopped and continued (abort)"
                        .into(),
                ))
            }
            AdminOp::Sleep { level } if (1..=2).contains(level) => {
                // Refuse new requests now; those already sent finish first.
                self.shared.asleep.store(true, Ordering::SeqCst);
                worker::Control::Sleep { level: *level }
            }
            AdminOp::Sleep { level } => {
                return Err(self.rejected(format!("sleep level {level}: expected 1 or 2")))
            }
            AdminOp::WakeUp => worker::Control::WakeUp,
            AdminOp::UpdateWeights { path, .. } => worker::Control::Reload {
                path: PathBuf::from(path),
            },
            AdminOp::BeginWeightUpdate { .. } => {
                return Err(self.rejected(
                    "the bundled engine cannot take weights pushed by a trainer (NCCL / IPC): \
                     load them from a GGUF file with POST /admin/weights {\"version\", \"path\"}"
                        .into(),
                ))
            }
            AdminOp::FinishWeightUpdate { .. } => {
                return Err(self.rejected(
                    "no weight update was begun on the bundled engine (it takes weights only \
                     from a GGUF file: POST /admin/weights {\"version\", \"path\"})"
                        .into(),
                ))
            }
            AdminOp::AbortWeightUpdate => return Ok("no weight update to call off".into()),
            // Replacing a served adapter loads the file again: llama.cpp
            // has no in-place update of an adapter's weights.
            AdminOp::LoadAdapter { name, path, .. } => worker::Control::LoadAdapter {
                name: name.clone(),
                path: PathBuf::from(path),
            },
            AdminOp::UnloadAdapter { name } => {
                worker::Control::UnloadAdapter { name: name.clone() }
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stopped = || BackendError::Unreachable {
            backend: self.name.clone(),
            message: "the engine thread has stopped".into(),
        };
        // An update in `abort` mode stops the generations in flight until
        // the reload has answered (or this call is dropped: a deadline).
        let abort = matches!(
            op,
            AdminOp::UpdateWeights {
                mode: crate::backend::UpdateMode::Abort | crate::backend::UpdateMode::Keep,
                ..
            }
        );
        let _aborting = abort.then(|| Aborting::set(&self.shared.aborting));
        self.tx
            .send(worker::Msg::Control(control, tx))
            .map_err(|_| stopped())?;
        match rx.await {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(message)) => Err(self.rejected(message)),
            Err(_) => Err(stopped()),
        }
    }
}

/// Holds [`worker::Shared::aborting`] set while it lives.
struct Aborting<'a>(&'a AtomicBool);

impl<'a> Aborting<'a> {
    fn set(flag: &'a AtomicBool) -> Self {
        flag.store(true, Ordering::SeqCst);
        Aborting(flag)
    }
}

impl Drop for Aborting<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Drop for EngineBackend {
    /// Tells the engine thread to stop (the requests it still runs end with
    /// an error at its next step), closes the command channel (this handle
    /// holds its only sender), and waits for the thread to free the llama.cpp
    /// context and model. Left running, a thread still freeing a CUDA context
    /// when `main` returns races CUDA's teardown at exit, and the process
    /// aborts ("CUDA error: driver shutting down").
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let (closed, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.tx, closed));
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(engine = %self.name, "the engine thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_invariance_on_cuda_is_refused_with_the_key_to_change() {
        let cfg = EngineConfig {
            device: Device::Cuda,
            ..Default::default()
        };
        let Err(EngineError::Config(msg)) = EngineSettings::from_config(&cfg, "engine") else {
            panic!("engine.batch_invariant = true on cuda must be refused");
        };
        assert!(msg.contains("engine.batch_invariant = false"), "{msg}");
    }

    /// The drop ends a generation still running, at the engine's next step,
    /// and returns once the thread has freed the model: it neither waits for
    /// the generation to finish nor leaves the thread to free it at exit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_engine_ends_what_it_runs_and_waits_for_its_thread() {
        let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let cfg = EngineConfig {
            model,
            n_ctx: 512,
            threads: 1,
            ..Default::default()
        };
        let engine = EngineBackend::start(&cfg).expect("engine starts (scripts/fetch-model.sh)");
        let request = GenerateRequest {
            request_id: "long".into(),
            prompt_ids: Arc::new(vec![1, 9690, 198]),
            params: crate::backend::SamplingParams {
                max_tokens: 100_000,
                temperature: Some(0.0),
                ignore_eos: true,
                ..Default::default()
            },
            images: None,
            adapter: None,
        };
        let mut stream = engine.generate(request).await.expect("accepted");
        let first = stream.next().await;
        assert!(
            matches!(first, Some(Ok(GenEvent::Tokens { .. }))),
            "{first:?}"
        );
        let shared = engine.shared.clone();
        drop(engine);
        // `alive` turns false only after the thread dropped its model and context.
        assert!(
            !shared.alive.load(Ordering::SeqCst),
            "the engine thread still runs after its handle was dropped"
        );
        let mut last = None;
        while let Some(event) = stream.next().await {
            last = Some(event);
        }
        assert!(
            matches!(last, Some(Err(BackendError::Unreachable { .. }))),
            "the generation was finished, not ended: {last:?}"
        );
    }

    #[test]
    fn cuda_is_refused_where_llama_cpp_has_no_gpu() {
        let cfg = EngineConfig {
            device: Device::Cuda,
            batch_invariant: false,
            model: "/nonexistent/model.gguf".into(),
            ..Default::default()
        };
        let gpu = llama_backend().expect("backend").supports_gpu_offload();
        match EngineSettings::from_config(&cfg, "engine") {
            Err(EngineError::Config(msg)) => {
                assert!(!gpu, "refused although llama.cpp has a GPU: {msg}");
                assert!(
                    msg.contains("--features cuda") && msg.contains("CPU"),
                    "{msg}"
                );
            }
            // With a GPU the device is accepted and the missing model is next.
            Err(EngineError::Load(msg)) => assert!(gpu, "accepted without a GPU: {msg}"),
            other => panic!("unexpected: {other:?}"),
        }
    }
}
