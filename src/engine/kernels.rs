//! Which CPU kernels llama.cpp runs, and the batch-invariant mode.
//!
//! Why a sequence's logprobs depend on its batch (measured in
//! docs/benchmarks-engine.md): ggml picks kernels by the shape of each step. A
//! matrix product with two or more rows goes through the llamafile `sgemm`
//! tiles, one row through the per-element dot product; flash attention over
//! many query rows uses a tiled kernel, one query row over 512 or more cells
//! splits the cells between threads and merges the partial sums. Each of
//! these adds the same terms in another order, so a row's result depends on
//! how many other rows share its step, and how many cells the cache uses.
//!
//! ggml's CPU backend has a reference mode (`ggml_backend_cpu_set_use_ref`)
//! in which every product is the per-element dot product and flash attention
//! is the sequential per-row loop, which skips the masked cells of other
//! sequences and visits a sequence's own cells in order. Every row is then
//! computed by the same operations whatever else is in the step, so a
//! sequence's output is bitwise the same alone or batched, and a KV cell is
//! the same whether it was written by a prefill or by a decode step.
//!
//! llama.cpp has no public call to reach a context's backends, and
//! `llama-cpp-2` keeps the context pointer private. This module reads the
//! pointer from the context's `Debug` form (checked against `llama_n_ctx`
//! before use) and calls `llama_context::get_sched` through its C++ symbol
//! (Itanium ABI: the `this` pointer is the first argument), then uses ggml's
//! public C API on the scheduler's backends.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_sys_2 as sys;

#[cfg(not(target_env = "msvc"))]
unsafe extern "C" {
    /// `ggml_backend_sched_t llama_context::get_sched() const`.
    #[link_name = "_ZNK13llama_context9get_schedEv"]
    fn llama_context_get_sched(ctx: *const sys::llama_context) -> sys::ggml_backend_sched_t;
}

/// The context's raw pointer, read from its `Debug` form
/// (`LlamaContext { context: 0x… }`) and checked to be that context.
fn raw_context(ctx: &LlamaContext<'_>) -> Option<*const sys::llama_context> {
    let text = format!("{ctx:?}");
    let hex: String = text
        .split_once("context: 0x")?
        .1
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    let raw = usize::from_str_radix(&hex, 16).ok()? as *const sys::llama_context;
    // SAFETY: `raw` is the pointer `ctx` wraps (its Debug form prints it);
    // llama_n_ctx only reads the context.
    let n_ctx = unsafe { sys::llama_n_ctx(raw) };
    (n_ctx == ctx.n_ctx()).then_some(raw)
}

/// Turns ggml's reference CPU kernels on or off for `ctx`. Returns how many
/// CPU backends were set; an error when the context's backends cannot be
/// reached (then nothing changed).
pub(crate) fn set_reference_kernels(ctx: &LlamaContext<'_>, on: bool) -> Result<usize, String> {
    #[cfg(target_env = "msvc")]
    {
        let _ = (ctx, on);
        return Err("batch-invariant kernels are not available in MSVC builds".into());
    }
    #[cfg(not(target_env = "msvc"))]
    {
        let raw = raw_context(ctx).ok_or("cannot reach the llama.cpp context's backends")?;
        let mut set = 0;
        // SAFETY: `raw` is a live context (checked above); the scheduler and
        // its backends live as long as the context, which `ctx` borrows.
        unsafe {
            let sched = llama_context_get_sched(raw);
            if sched.is_null() {
                return Err("the llama.cpp context has no scheduler".into());
            }
            for i in 0..sys::ggml_backend_sched_get_n_backends(sched) {
                let backend = sys::ggml_backend_sched_get_backend(sched, i);
                if !backend.is_null() && sys::ggml_backend_is_cpu(backend) {
                    sys::ggml_backend_cpu_set_use_ref(backend, on);
                    set += 1;
                }
            }
        }
        if set == 0 {
            return Err("the llama.cpp context has no CPU backend".into());
        }
        Ok(set)
    }
}

/// llama.cpp's own line naming the CPU features its kernels were built for
/// (`CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | …`).
pub fn system_info() -> String {
    // SAFETY: returns a pointer to a static, NUL-terminated string.
    let p = unsafe { sys::llama_print_system_info() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string()
}
