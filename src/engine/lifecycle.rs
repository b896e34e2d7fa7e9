//! The engine thread's life: loading the model and its LoRA adapters,
//! creating the llama.cpp context, and the admin operations that change
//! them: sleep (level 1 frees the KV cache, level 2 unloads the model too),
//! wake-up, loading new weights from a GGUF file, and loading, replacing or
//! unloading an adapter (a LoRA GGUF of the model). Adapters belong to the
//! loaded model: new weights or a wake-up from level 2 load them again.
//!
//! Owns: the model and context lifetimes, the asleep state, and validating
//! new weights (the file exists, its tokenizer is the loaded one's, and it
//! loads). Must not: run sequences (that is [`super::worker`]); an admin
//! operation runs only once the worker has finished every request it
//! accepted before it, and requests sent after it run after it.
//!
//! New weights are loaded next to the old ones and swapped only once they
//! passed every check; on any failure the old weights keep serving.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use llama_cpp_2::llama_backend::LlamaBackend;

use super::ffi::{Context, ContextParams, Lora, Model};
use super::worker::{Ack, Control, Exit, Loras, Msg, Shared, Worker};
use super::{EngineError, EngineInfo, EngineSettings};
use crate::backend::BackendError;

/// The loaded weights and what the engine is doing with them.
struct Engine {
    backend: &'static LlamaBackend,
    /// `None` while asleep at level 2. Shared with the grammars of running
    /// sequences, which read its vocabulary.
    model: Option<Arc<Model>>,
    /// The GGUF file the weights come from (loaded, or to load on wake-up).
    path: PathBuf,
    /// The LoRA adapters served, by name: their GGUF files, and each one
    /// loaded for `model` (empty while the model is unloaded).
    adapters: std::collections::BTreeMap<String, PathBuf>,
    loras: Loras,
    /// sha256 of the `tokenizer.*` metadata of the first model: new weights
    /// must have the same (the gateway tokenizes for these weights).
    tokenizer_sha256: Result<String, String>,
    /// `Some(level)` while asleep.
    asleep: Option<u32>,
    info: EngineInfo,
    settings: EngineSettings,
    shared: Arc<Shared>,
}

/// The engine thread: loads the model, reports readiness, serves requests
/// and admin operations until the command channel closes.
pub(crate) fn run(
    settings: EngineSettings,
    shared: Arc<Shared>,
    rx: Receiver<Msg>,
    ready: std::sync::mpsc::Sender<Result<EngineInfo, EngineError>>,
) {
    /// Marks the engine stopped however the thread ends, a panic included.
    struct Stopped(Arc<Shared>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.alive.store(false, Ordering::SeqCst);
        }
    }
    let _stopped = Stopped(shared.clone());
    match start(settings, shared) {
        Ok(engine) => serve(engine, &rx, ready),
        Err(e) => {
            let _ = ready.send(Err(e));
        }
    }
}

fn start(settings: EngineSettings, shared: Arc<Shared>) -> Result<Engine, EngineError> {
    let backend = super::llama_backend()?;
    let model =
        load_model(backend, &settings.model, settings.gpu_layers).map_err(EngineError::Load)?;
    let adapters: std::collections::BTreeMap<String, PathBuf> =
        settings.adapters.iter().cloned().collect();
    let loras = load_loras(&model, &adapters).map_err(EngineError::Load)?;
    let n_ctx_train = model.n_ctx_train().max(1);
    let n_ctx = if settings.n_ctx == 0 {
        n_ctx_train.min(8192)
    } else {
        settings.n_ctx
    };
    let n_vocab = model.n_vocab();
    let eog_ids: Vec<u32> = (0..n_vocab).filter(|&t| model.is_eog(t)).collect();
    let info = EngineInfo {
        n_ctx,
        max_seq_len: n_ctx.min(n_ctx_train),
        n_vocab,
        max_batch: settings.max_batch,
        eog_ids,
    };
    Ok(Engine {
        backend,
        tokenizer_sha256: tokenizer_sha256(&settings.model),
        path: settings.model.clone(),
        model: Some(model),
        adapters,
        loras,
        asleep: None,
        info,
        settings,
        shared,
    })
}

fn load_model(backend: &LlamaBackend, path: &Path, gpu_layers: u32) -> Result<Arc<Model>, String> {
    Model::load(backend, path, gpu_layers).map(Arc::new)
}

/// Loads every adapter of `adapters` for `model`.
fn load_loras(
    model: &Arc<Model>,
    adapters: &std::collections::BTreeMap<String, PathBuf>,
) -> Result<Loras, String> {
    adapters
        .iter()
        .map(|(name, path)| {
            Lora::load(model, path)
                .map(|l| (name.clone(), Rc::new(l)))
                .map_err(|e| format!("LoRA adapter `{name}`: {e}"))
        })
        .collect()
}

fn tokenizer_sha256(path: &Path) -> Result<String, String> {
    crate::render::gguf::read_metadata(path)
        .map(|m| m.tokenizer_sha256)
        .map_err(|e| e.to_string())
}

/// Rows of one `llama_decode`: a prefill chunk plus one decode row per slot.
pub(crate) fn batch_rows(settings: &EngineSettings) -> u32 {
    settings.prefill_chunk + settings.max_batch
}

fn new_context<'m>(engine: &Engine, model: &'m Model) -> Result<Context<'m>, EngineError> {
    let s = &engine.settings;
    let params = ContextParams {
        n_ctx: engine.info.n_ctx,
        n_batch: batch_rows(s),
        n_seq_max: super::cells::Cells::n_seq_max(s.max_batch, s.kv_reuse),
        threads: s.threads,
        // The reference kernels' attention is the per-row flash-attention loop.
        flash_attention: s.batch_invariant,
    };
    let ctx = Context::new(model, &params)
        .map_err(|e| EngineError::Load(format!("cannot create context: {e}")))?;
    if s.batch_invariant {
        super::kernels::set_reference_kernels(&ctx, true)
            .map_err(|e| EngineError::Config(super::kernels::refusal(&e)))?;
    }
    Ok(ctx)
}

/// What waits for the context to exist: the start-up, or a wake-up.
enum Waiter {
    Ready(std::sync::mpsc::Sender<Result<EngineInfo, EngineError>>),
    WakeUp(Ack),
}

fn serve(
    mut engine: Engine,
    rx: &Receiver<Msg>,
    ready: std::sync::mpsc::Sender<Result<EngineInfo, EngineError>>,
) {
    let mut worker = Worker::new(
        engine.info.clone(),
        engine.settings.clone(),
        engine.shared.clone(),
    );
    let mut waiter = Some(Waiter::Ready(ready));
    loop {
        if engine.asleep.is_none() {
            if let Some(model) = engine.model.as_ref() {
                let exit = match new_context(&engine, model) {
                    Ok(mut ctx) => {
                        match waiter.take() {
                            Some(Waiter::Ready(r)) => {
                                let _ = r.send(Ok(engine.info.clone()));
                            }
                            Some(Waiter::WakeUp(ack)) => {
                                let _ = ack.send(Ok("awake".into()));
                            }
                            None => {}
                        }
                        Some(worker.run(&mut ctx, rx, model, &engine.loras))
                    }
                    Err(e) => {
                        match waiter.take() {
                            Some(Waiter::Ready(r)) => {
                                let _ = r.send(Err(e));
                                return;
                            }
                            Some(Waiter::WakeUp(ack)) => {
                                let _ = ack.send(Err(match e {
                                    EngineError::Load(m) | EngineError::Config(m) => m,
                                    other => other.to_string(),
                                }));
                            }
                            None => tracing::error!(engine = %engine.settings.name, error = %e,
                                "the engine cannot serve: it stays asleep until a wake-up"),
                        }
                        None
                    }
                };
                match exit {
                    // No context: asleep until a wake-up succeeds.
                    None => engine.fall_asleep(1),
                    Some(Exit::Closed) => return,
                    Some(Exit::Control(c, ack)) => waiter = engine.control(c, ack),
                }
                continue;
            }
        }
        // Asleep: no context; requests that raced the sleep are refused.
        match rx.recv() {
            Ok(Msg::Job(job)) => {
                engine.shared.queued.fetch_sub(1, Ordering::SeqCst);
                job.tx
                    .fail(engine.shared.asleep_error(&engine.settings.name));
            }
            Ok(Msg::Control(c, ack)) => waiter = engine.control(c, ack),
            Err(_) => return,
        }
    }
}

impl Engine {
    fn fall_asleep(&mut self, level: u32) {
        self.shared.asleep.store(true, Ordering::SeqCst);
        let level = self.asleep.map_or(level, |l| l.max(level));
        if level >= 2 {
            // The adapters hold the model: both go.
            self.loras.clear();
            self.model = None;
        }
        self.asleep = Some(level);
    }

    /// Runs one admin operation (the context is gone: the worker is idle).
    /// A wake-up is answered once the context exists again: it is returned
    /// as the waiter.
    fn control(&mut self, c: Control, ack: Ack) -> Option<Waiter> {
        let name = self.settings.name.clone();
        match c {
            Control::Sleep { level } => {
                self.fall_asleep(level);
                let what = if self.model.is_none() {
                    "KV cache freed and model unloaded"
                } else {
                    "KV cache freed"
                };
                tracing::info!(engine = %name, level, "engine asleep: {what}");
                let _ = ack.send(Ok(format!("asleep (level {level}): {what}")));
                None
            }
            Control::WakeUp => {
                if self.asleep.is_none() {
                    let _ = ack.send(Ok("already awake".into()));
                    return None;
                }
                if self.model.is_none() {
                    let loaded = load_model(self.backend, &self.path, self.settings.gpu_layers)
                        .map_err(|e| format!("cannot load the model again: {e}"))
                        .and_then(|m| load_loras(&m, &self.adapters).map(|l| (m, l)));
                    match loaded {
                        Ok((m, l)) => {
                            self.model = Some(m);
                            self.loras = l;
                        }
                        Err(e) => {
                            let _ = ack.send(Err(e));
                            return None;
                        }
                    }
                }
                self.asleep = None;
                self.shared.asleep.store(false, Ordering::SeqCst);
                tracing::info!(engine = %name, "engine awake");
                Some(Waiter::WakeUp(ack))
            }
            Control::Reload { path } => {
                let answer = self.reload(&path);
                match &answer {
                    Ok(_) => tracing::info!(engine = %name, path = %path.display(),
                        "engine weights loaded"),
                    Err(e) => tracing::error!(engine = %name, path = %path.display(), error = %e,
                        "engine weights not loaded: the old weights keep serving"),
                }
                let _ = ack.send(answer);
                None
            }
            Control::LoadAdapter {
                name: adapter,
                path,
            } => {
                let answer = self.load_adapter(&adapter, &path);
                match &answer {
                    Ok(_) => tracing::info!(engine = %name, adapter, path = %path.display(),
                        "engine LoRA adapter loaded"),
                    Err(e) => tracing::error!(engine = %name, adapter, error = %e,
                        "engine LoRA adapter not loaded"),
                }
                let _ = ack.send(answer);
                None
            }
            Control::UnloadAdapter { name: adapter } => {
                let answer = match self.adapters.remove(&adapter) {
                    Some(_) => {
                        self.loras.remove(&adapter);
                        tracing::info!(engine = %name, adapter, "engine LoRA adapter unloaded");
                        Ok(format!("LoRA adapter `{adapter}` unloaded"))
                    }
                    None => Err(format!("the engine serves no LoRA adapter `{adapter}`")),
                };
                let _ = ack.send(answer);
                None
            }
        }
    }

    /// Serves the LoRA GGUF at `path` as `name`, in place of a served one
    /// of that name only once it loaded. Asleep at level 2 (no model), the
    /// file is loaded at the wake-up.
    fn load_adapter(&mut self, name: &str, path: &Path) -> Result<String, String> {
        let shown = path.display();
        if !path.is_file() {
            return Err(format!(
                "cannot load LoRA adapter `{name}`: {shown} is not a file"
            ));
        }
        if let Some(model) = &self.model {
            let lora = Lora::load(model, path)
                .map_err(|e| format!("cannot load LoRA adapter `{name}`: {e}"))?;
            self.loras.insert(name.to_string(), Rc::new(lora));
        }
        self.adapters.insert(name.to_string(), path.to_path_buf());
        Ok(format!("LoRA adapter `{name}` loaded from {shown}"))
    }

    /// Loads and checks the weights at `path`; swaps them in only when every
    /// check passed.
    fn reload(&mut self, path: &Path) -> Result<String, String> {
        let shown = path.display();
        if !path.is_file() {
            return Err(format!("cannot load weights: {shown} is not a file"));
        }
        let loaded = self.tokenizer_sha256.as_ref().map_err(|e| {
            format!("cannot check new weights: the loaded model's tokenizer is unreadable ({e})")
        })?;
        let new = tokenizer_sha256(path).map_err(|e| format!("cannot load weights: {e}"))?;
        if &new != loaded {
            return Err(format!(
                "cannot load weights from {shown}: its tokenizer differs from the loaded model's \
                 (tokenizer sha256 {new}, loaded {loaded}); new weights must keep the vocabulary"
            ));
        }
        let model = load_model(self.backend, path, self.settings.gpu_layers)
            .map_err(|e| format!("cannot load weights: {e}"))?;
        let n_vocab = model.n_vocab();
        if n_vocab != self.info.n_vocab {
            return Err(format!(
                "cannot load weights from {shown}: {n_vocab} tokens, the loaded model has {}",
                self.info.n_vocab
            ));
        }
        if model.n_ctx_train() < self.info.max_seq_len {
            return Err(format!(
                "cannot load weights from {shown}: trained context {} is shorter than this \
                 engine's {}",
                model.n_ctx_train(),
                self.info.max_seq_len
            ));
        }
        // The adapters are loaded again for the new weights; one that does
        // not load leaves the old weights serving.
        let loras = load_loras(&model, &self.adapters)
            .map_err(|e| format!("cannot load weights from {shown}: {e}"))?;
        self.path = path.to_path_buf();
        // Asleep at level 2, the model stays unloaded until the wake-up.
        if self.asleep.is_some_and(|l| l >= 2) {
            self.model = None;
            self.loras.clear();
        } else {
            self.model = Some(model);
            self.loras = loras;
        }
        Ok(format!("weights loaded from {shown}"))
    }
}

impl Shared {
    /// The error of a request sent while the engine sleeps.
    pub(crate) fn asleep_error(&self, name: &str) -> BackendError {
        BackendError::Overloaded {
            backend: name.to_string(),
            message: "the engine is asleep: it takes requests again after a wake-up \
                      (POST /admin/wake_up)"
                .into(),
        }
    }
}
