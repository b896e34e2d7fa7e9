//! The engine's calls into llama.cpp's C API (through `llama-cpp-sys-2`):
//! the model, the context, the batch and the grammar sampler the serving
//! path uses, as owned Rust values that free what they hold.
//!
//! The engine creates its model and contexts here rather than through
//! `llama-cpp-2`'s wrappers because it needs the raw context pointer, which
//! those keep private: [`backends`] hands it to a C++ shim that reaches the
//! context's scheduler for the batch-invariant mode ([`super::kernels`]).
//! `llama-cpp-2` still initialises the backend (a [`LlamaBackend`] proves
//! it was) and drives [`super::direct`], the reference loop the engine is
//! tested against.
//!
//! Owns: every `unsafe` call of the serving path. Each pointer is checked
//! for null where it is made and freed exactly once, by its owner's `Drop`;
//! what borrows from what is in the types: a [`Context`] borrows its
//! [`Model`], a [`Grammar`] keeps its model alive through an `Arc`. Must
//! not: hand a raw pointer out of this module.

pub(crate) mod backends;
mod grammar;
mod lora;

use std::alloc::{handle_alloc_error, Layout};
use std::ffi::CString;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_sys_2 as sys;

pub(crate) use grammar::Grammar;
pub(crate) use lora::Lora;

/// Loaded weights (`llama_model`).
pub(crate) struct Model {
    ptr: NonNull<sys::llama_model>,
}

impl Model {
    /// Loads the GGUF file at `path` with `gpu_layers` layers on the GPU.
    pub(crate) fn load(_: &LlamaBackend, path: &Path, gpu_layers: u32) -> Result<Model, String> {
        let shown = path.display();
        let text = path
            .to_str()
            .ok_or_else(|| format!("{shown}: the path is not UTF-8"))?;
        let c_path = CString::new(text).map_err(|_| format!("{shown}: the path has a NUL byte"))?;
        // SAFETY: returns a plain struct by value.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = i32::try_from(gpu_layers).unwrap_or(i32::MAX);
        // SAFETY: the backend is initialised (the `LlamaBackend` argument);
        // `c_path` is NUL-terminated and outlives the call; `params` is
        // llama.cpp's default set, whose pointers are null or its own.
        let raw = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), params) };
        NonNull::new(raw)
            .map(|ptr| Model { ptr })
            .ok_or_else(|| format!("{shown}: llama.cpp could not load the model"))
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: `self.ptr` is a live model; the vocabulary it returns
        // lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    /// The context length the model was trained with.
    pub(crate) fn n_ctx_train(&self) -> u32 {
        // SAFETY: `self.ptr` is a live model; this only reads it.
        let n = unsafe { sys::llama_model_n_ctx_train(self.ptr.as_ptr()) };
        u32::try_from(n).unwrap_or(0)
    }

    /// Tokens in the vocabulary.
    pub(crate) fn n_vocab(&self) -> u32 {
        // SAFETY: the vocabulary of a live model; this only reads it.
        let n = unsafe { sys::llama_vocab_n_tokens(self.vocab()) };
        u32::try_from(n).unwrap_or(0)
    }

    /// Whether `token` ends a generation (llama.cpp's EOG set).
    pub(crate) fn is_eog(&self, token: u32) -> bool {
        let Ok(id) = i32::try_from(token) else {
            return false;
        };
        // SAFETY: the vocabulary of a live model; this looks `id` up in a
        // set, any value allowed.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), id) }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the model was loaded by `Model::load` and is freed only
        // here; every context borrows it and every grammar holds an `Arc` of
        // it, so none outlives it.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// How a [`Context`] is made.
pub(crate) struct ContextParams {
    /// KV-cache cells.
    pub n_ctx: u32,
    /// Rows of one `llama_decode` (also its micro-batch: one graph a step).
    pub n_batch: u32,
    /// Sequence ids the cache holds.
    pub n_seq_max: u32,
    /// Threads for decode and prefill alike.
    pub threads: u32,
    /// Flash attention on; otherwise llama.cpp decides.
    pub flash_attention: bool,
}

/// A llama.cpp context (`llama_context`): the KV cache and the compute
/// graph of one model.
pub(crate) struct Context<'m> {
    ptr: NonNull<sys::llama_context>,
    /// Logits per row.
    n_vocab: usize,
    /// The LoRA adapter its decodes apply ([`Context::set_lora`]), kept
    /// alive while it is set.
    lora: Option<std::rc::Rc<Lora>>,
    _model: PhantomData<&'m Model>,
}

impl<'m> Context<'m> {
    pub(crate) fn new(model: &'m Model, p: &ContextParams) -> Result<Context<'m>, String> {
        // SAFETY: returns a plain struct by value.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = p.n_ctx;
        params.n_batch = p.n_batch;
        params.n_ubatch = p.n_batch;
        params.n_seq_max = p.n_seq_max;
        params.kv_unified = true;
        let threads = i32::try_from(p.threads).unwrap_or(i32::MAX);
        params.n_threads = threads;
        params.n_threads_batch = threads;
        if p.flash_attention {
            params.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
        }
        // SAFETY: `model` is live and outlives the context (`'m`); a model is
        // used by one thread (`Model` is neither `Send` nor `Sync`), so no
        // other context is being made from it meanwhile.
        let raw = unsafe { sys::llama_init_from_model(model.ptr.as_ptr(), params) };
        let ptr = NonNull::new(raw).ok_or("llama.cpp could not create the context")?;
        Ok(Context {
            ptr,
            n_vocab: model.n_vocab() as usize,
            lora: None,
            _model: PhantomData,
        })
    }

    /// Runs the model on `batch`.
    pub(crate) fn decode(&mut self, batch: &Batch) -> Result<(), DecodeError> {
        // SAFETY: a live context; `batch`'s arrays hold `n_tokens` written
        // rows (`Batch::add`), and llama.cpp checks their tokens and
        // sequence ids before it uses them.
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw) };
        match code {
            0 => Ok(()),
            1 => Err(DecodeError::NoKvCacheSlot),
            c => Err(DecodeError::Failed(c)),
        }
    }

    /// Waits until the last decode's work is done.
    pub(crate) fn synchronize(&self) {
        // SAFETY: a live context, used by this thread only (`Context` is not
        // `Sync`); waiting changes no logits already handed out.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) }
    }

    /// The logits of batch row `row` of the last decode.
    ///
    /// # Panics
    ///
    /// When the last decode asked no logits of `row` (a bug of the caller).
    pub(crate) fn logits(&self, row: i32) -> &[f32] {
        // SAFETY: a live context, used by this thread only; llama.cpp checks
        // `row` and returns null for a row without logits.
        let data = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), row) };
        assert!(
            !data.is_null(),
            "llama.cpp has no logits for batch row {row}"
        );
        // SAFETY: a row of logits is `n_vocab` floats. llama.cpp moves rows
        // (into batch order) only on the first read after a decode, before it
        // returns a pointer, and writes them again only in the next decode,
        // which needs `&mut self` and so ends this borrow first.
        unsafe { std::slice::from_raw_parts(data, self.n_vocab) }
    }

    /// The KV cache (`llama_memory_t`), valid while the context lives.
    fn memory(&self) -> sys::llama_memory_t {
        // SAFETY: a live context; this only reads it.
        unsafe { sys::llama_get_memory(self.ptr.as_ptr()) }
    }

    /// Empties the KV cache.
    pub(crate) fn clear_cache(&mut self) {
        // SAFETY: the cache of a live context (null is accepted too).
        unsafe { sys::llama_memory_clear(self.memory(), true) }
    }

    /// Removes sequence `seq` from the KV cache.
    pub(crate) fn remove_seq(&mut self, seq: i32) -> bool {
        // SAFETY: the cache of a live context; llama.cpp asserts `seq` is a
        // sequence id of the context (aborting otherwise).
        unsafe { sys::llama_memory_seq_rm(self.memory(), seq, -1, -1) }
    }

    /// Makes sequence `dst` share `src`'s cells: its first `len` positions,
    /// or all of them.
    pub(crate) fn copy_seq(&mut self, src: i32, dst: i32, len: Option<usize>) {
        let (p0, p1) = match len {
            Some(n) => (0, i32::try_from(n).unwrap_or(i32::MAX)),
            None => (-1, -1),
        };
        // SAFETY: the cache of a live context; llama.cpp asserts both ids are
        // sequence ids of the context (aborting otherwise).
        unsafe { sys::llama_memory_seq_cp(self.memory(), src, dst, p0, p1) }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: made by `Context::new` and freed only here; what borrows
        // from it (logits, backends) borrows `self` and is gone by now.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

/// Why a decode failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// No room in the KV cache for the batch (llama.cpp's code 1).
    #[error("no KV cache slot for the batch")]
    NoKvCacheSlot,
    /// Any other code (llama.cpp logs the reason).
    #[error("code {0}")]
    Failed(i32),
}

/// The rows of one decode (`llama_batch`), one sequence id each.
pub(crate) struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

/// [`Batch::add`] on a full batch.
#[derive(Debug)]
pub(crate) struct BatchFull;

impl Batch {
    /// A batch of up to `capacity` rows.
    pub(crate) fn new(capacity: usize) -> Batch {
        let capacity = capacity.clamp(1, i32::MAX as usize);
        // SAFETY: allocates `capacity` rows of token ids, positions, logits
        // flags and one sequence id each; no embeddings (0).
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        let batch = Batch { raw, capacity };
        if !batch.allocated() {
            handle_alloc_error(Layout::new::<sys::llama_batch>());
        }
        batch
    }

    /// Whether every array `llama_batch_init` allocated is there (it does
    /// not check `malloc`).
    fn allocated(&self) -> bool {
        let r = &self.raw;
        if r.token.is_null()
            || r.pos.is_null()
            || r.n_seq_id.is_null()
            || r.seq_id.is_null()
            || r.logits.is_null()
        {
            return false;
        }
        // SAFETY: `seq_id` holds `capacity` row pointers (and a null end).
        (0..self.capacity).all(|i| !unsafe { *r.seq_id.add(i) }.is_null())
    }

    pub(crate) fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Rows added since the last clear.
    pub(crate) fn n_tokens(&self) -> i32 {
        self.raw.n_tokens
    }

    /// Adds `token` at position `pos` of sequence `seq`; `logits`: the
    /// decode computes this row's logits.
    pub(crate) fn add(
        &mut self,
        token: u32,
        pos: usize,
        seq: i32,
        logits: bool,
    ) -> Result<(), BatchFull> {
        let i = usize::try_from(self.raw.n_tokens).map_err(|_| BatchFull)?;
        if i >= self.capacity {
            return Err(BatchFull);
        }
        // Out of range ids and positions are written as they come; llama.cpp
        // refuses the batch at decode.
        let token = i32::try_from(token).unwrap_or(-1);
        let pos = i32::try_from(pos).unwrap_or(-1);
        // SAFETY: `i < capacity`, and every array was allocated with
        // `capacity` rows (`Batch::new`), row `i`'s sequence ids with one.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = 1;
            **self.raw.seq_id.add(i) = seq;
            *self.raw.logits.add(i) = i8::from(logits);
        }
        self.raw.n_tokens += 1;
        Ok(())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: allocated by `llama_batch_init` in `Batch::new`, freed only
        // here.
        unsafe { sys::llama_batch_free(self.raw) }
    }
}
