//! llama.cpp's grammar sampler, used only to mask a row of logits: which
//! tokens an output constraint (GBNF, from a JSON schema) allows next.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use super::Model;

/// A grammar's state over the tokens drawn so far (`llama_sampler`).
pub(crate) struct Grammar {
    ptr: NonNull<sys::llama_sampler>,
    n_vocab: usize,
    /// The sampler reads the model's vocabulary until it is freed.
    _model: Arc<Model>,
}

impl Grammar {
    /// Parses `gbnf` with start rule `root` against `model`'s vocabulary.
    pub(crate) fn new(model: &Arc<Model>, gbnf: &str, root: &str) -> Result<Grammar, String> {
        let text = CString::new(gbnf).map_err(|_| "the grammar has a NUL byte".to_string())?;
        let root = CString::new(root).map_err(|_| "the root rule has a NUL byte".to_string())?;
        // SAFETY: the vocabulary of a live model, kept alive by the `Arc`
        // stored next to the sampler; both strings are NUL-terminated and
        // outlive the call, which copies them. This wrapper of
        // `llama-cpp-sys-2` catches llama.cpp's parse exceptions (null).
        let raw = unsafe {
            sys::llama_rs_sampler_init_grammar(model.vocab(), text.as_ptr(), root.as_ptr())
        };
        let ptr = NonNull::new(raw).ok_or("llama.cpp did not accept the grammar")?;
        Ok(Grammar {
            ptr,
            n_vocab: model.n_vocab() as usize,
            _model: model.clone(),
        })
    }

    /// Which tokens may come next, given a row of logits: the grammar
    /// sampler sets the logit of every other candidate to -inf, in place and
    /// in order. A token whose logit already was -inf counts as not allowed;
    /// one past the vocabulary is not allowed.
    pub(crate) fn allowed(&mut self, logits: &[f32]) -> Vec<bool> {
        let n = logits.len().min(self.n_vocab);
        let mut data: Vec<sys::llama_token_data> = logits[..n]
            .iter()
            .enumerate()
            .map(|(id, &logit)| sys::llama_token_data {
                id: id as i32,
                logit,
                p: 0.0,
            })
            .collect();
        let mut array = sys::llama_token_data_array {
            data: data.as_mut_ptr(),
            size: data.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: a live sampler; `array` points at `data`, `size` entries
        // whose ids are tokens of the vocabulary (`n <= n_vocab`), alive and
        // not otherwise borrowed during the call. The grammar sampler only
        // lowers logits in place.
        unsafe { sys::llama_sampler_apply(self.ptr.as_ptr(), &mut array) };
        let mut allowed: Vec<bool> = data.iter().map(|d| d.logit != f32::NEG_INFINITY).collect();
        allowed.resize(logits.len(), false);
        allowed
    }

    /// Advances the grammar over the drawn `token`.
    pub(crate) fn accept(&mut self, token: u32) {
        let Ok(id) = i32::try_from(token) else {
            return;
        };
        // SAFETY: a live sampler. The wrapper catches llama.cpp's exception
        // for a token the grammar does not allow; the engine draws only
        // allowed tokens, so its status is not needed.
        let _ = unsafe { sys::llama_rs_sampler_accept(self.ptr.as_ptr(), id) };
    }
}

impl Drop for Grammar {
    fn drop(&mut self) {
        // SAFETY: made by `Grammar::new`, freed only here, before the `Arc`
        // of its model (fields drop after `drop`).
        unsafe { sys::llama_sampler_free(self.ptr.as_ptr()) }
    }
}
