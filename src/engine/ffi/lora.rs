//! A LoRA adapter of the loaded model (`llama_adapter_lora`), and setting
//! the one a context applies.

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use super::{Context, Model};

/// Numbers every adapter loaded, so that two loads of one name (new
/// weights) never share cached cells.
static LOADS: AtomicU64 = AtomicU64::new(1);

/// LoRA weights loaded next to a model's (llama.cpp keeps them in the
/// model's device buffers and adds them in the graph of a context that has
/// them set).
pub(crate) struct Lora {
    ptr: NonNull<sys::llama_adapter_lora>,
    /// Unique to this load (never 0, the base model's key).
    pub(crate) key: u64,
    /// The adapter belongs to the model and is freed before it.
    _model: Arc<Model>,
}

impl Lora {
    /// Loads the LoRA GGUF at `path` for `model`; llama.cpp checks that it
    /// is an adapter of the model's architecture whose tensors exist in the
    /// model with matching shapes.
    pub(crate) fn load(model: &Arc<Model>, path: &Path) -> Result<Lora, String> {
        let shown = path.display();
        let text = path
            .to_str()
            .ok_or_else(|| format!("{shown}: the path is not UTF-8"))?;
        let c_path = CString::new(text).map_err(|_| format!("{shown}: the path has a NUL byte"))?;
        // SAFETY: a live model, kept alive by the `Arc` stored next to the
        // adapter; `c_path` is NUL-terminated and outlives the call.
        // llama.cpp catches its own errors and returns null for them.
        let raw = unsafe { sys::llama_adapter_lora_init(model.ptr.as_ptr(), c_path.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            format!(
                "{shown}: llama.cpp could not load it as a LoRA adapter of this model \
                 (a GGUF with general.type = adapter, adapter.type = lora, the model's \
                 architecture and tensor shapes)"
            )
        })?;
        Ok(Lora {
            ptr,
            key: LOADS.fetch_add(1, Ordering::Relaxed),
            _model: model.clone(),
        })
    }
}

impl Drop for Lora {
    fn drop(&mut self) {
        // SAFETY: made by `Lora::load` and freed only here, before its model
        // (held by `_model`); a context that applies it holds an `Rc` of it
        // (`Context::set_lora`), so none uses it after this.
        unsafe { sys::llama_adapter_lora_free(self.ptr.as_ptr()) }
    }
}

impl Context<'_> {
    /// Applies `lora` (at scale 1) in the decodes from now on, or none.
    /// Setting what is already set changes nothing.
    pub(crate) fn set_lora(&mut self, lora: Option<&Rc<Lora>>) {
        let same = match (&self.lora, lora) {
            (None, None) => true,
            (Some(a), Some(b)) => Rc::ptr_eq(a, b),
            _ => false,
        };
        if same {
            return;
        }
        let mut scale = [1.0f32];
        let mut ptrs = lora.map(|l| [l.ptr.as_ptr()]);
        let (adapters, scales, n) = match ptrs.as_mut() {
            Some(p) => (p.as_mut_ptr(), scale.as_mut_ptr(), 1),
            None => (std::ptr::null_mut(), std::ptr::null_mut(), 0),
        };
        // SAFETY: a live context; `adapters` and `scales` point to `n`
        // elements (or are null with `n` 0) and outlive the call, which
        // copies them. The adapter stays alive while the context may use
        // it: the context keeps an `Rc` of it until the next call.
        unsafe { sys::llama_set_adapters_lora(self.ptr.as_ptr(), adapters, n, scales) };
        self.lora = lora.cloned();
    }
}
