//! A context's ggml backends, for ggml's reference CPU kernels
//! ([`super::super::kernels`]).
//!
//! llama.h has no call that reaches a context's backends. The C++ shim
//! `sched.cpp` calls `llama_context::get_sched`; build.rs compiles it against
//! the internal headers of the llama.cpp that is linked, and sets the
//! `tito_llama_sched` cfg only when that worked. Everything after the
//! scheduler is ggml's public C API.

use std::marker::PhantomData;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::Context;

#[cfg(tito_llama_sched)]
unsafe extern "C" {
    /// `ctx->get_sched()`, or null for a null `ctx` (sched.cpp).
    fn tito_llama_context_sched(ctx: *const sys::llama_context) -> sys::ggml_backend_sched_t;
}

/// Whether this build can reach a context's scheduler; why not otherwise.
pub(crate) fn available() -> Result<(), String> {
    if cfg!(tito_llama_sched) {
        Ok(())
    } else {
        Err(
            "this build has no access to llama.cpp's scheduler (build.rs could not compile \
             src/engine/ffi/sched.cpp against the sources of the linked llama.cpp; its warning \
             says why)"
                .into(),
        )
    }
}

/// One of a context's ggml backends (`ggml_backend_t`), borrowed from it.
pub(crate) struct Backend<'c> {
    ptr: NonNull<sys::ggml_backend>,
    _ctx: PhantomData<&'c Context<'c>>,
}

impl Context<'_> {
    /// The backends of this context's scheduler, in its order.
    pub(crate) fn backends(&self) -> Result<Vec<Backend<'_>>, String> {
        available()?;
        let sched = self.sched();
        if sched.is_null() {
            return Err("the llama.cpp context has no scheduler".into());
        }
        // SAFETY: the scheduler of a live context, which owns it and its
        // backends for its whole life; these calls only read it.
        let n = unsafe { sys::ggml_backend_sched_get_n_backends(sched) };
        let mut out = Vec::new();
        for i in 0..n {
            // SAFETY: as above; `i` is below the scheduler's backend count.
            let b = unsafe { sys::ggml_backend_sched_get_backend(sched, i) };
            let ptr = NonNull::new(b).ok_or("the llama.cpp scheduler lists a null backend")?;
            out.push(Backend {
                ptr,
                _ctx: PhantomData,
            });
        }
        Ok(out)
    }

    #[cfg(tito_llama_sched)]
    fn sched(&self) -> sys::ggml_backend_sched_t {
        // SAFETY: a live context that this module created (`Context::new`);
        // the shim is compiled against the declaration of the linked
        // llama.cpp, and `get_sched` only returns a member.
        unsafe { tito_llama_context_sched(self.ptr.as_ptr()) }
    }

    #[cfg(not(tito_llama_sched))]
    fn sched(&self) -> sys::ggml_backend_sched_t {
        std::ptr::null_mut()
    }
}

impl Backend<'_> {
    /// Whether this is ggml's CPU backend (ggml compares its GUID).
    pub(crate) fn is_cpu(&self) -> bool {
        // SAFETY: a backend of a live context (the borrow); this only reads
        // its GUID.
        unsafe { sys::ggml_backend_is_cpu(self.ptr.as_ptr()) }
    }

    /// Turns ggml's reference kernels on or off; false (and nothing done)
    /// when this is not the CPU backend.
    pub(crate) fn use_reference_kernels(&mut self, on: bool) -> bool {
        if !self.is_cpu() {
            return false;
        }
        // SAFETY: a CPU backend (checked above, which ggml asserts too) of a
        // live context; no decode runs, since that needs the context
        // mutably while this borrows it.
        unsafe { sys::ggml_backend_cpu_set_use_ref(self.ptr.as_ptr(), on) };
        true
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
