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
//! llama.cpp has no public call to reach a context's backends. The engine
//! creates its contexts itself ([`super::ffi`]) and a small C++ shim,
//! compiled against the internal headers of the linked llama.cpp, returns
//! the context's scheduler; its backends are then set through ggml's public
//! C API. Where that cannot be done (a build without the shim, a context
//! without a CPU backend) `batch_invariant = true` is refused at start-up:
//! the engine never serves in a mode it could not verify.

use super::ffi::backends::{self, Backend};
use super::ffi::Context;

/// A backend as the mode switch sees it.
trait KernelSwitch {
    fn is_cpu(&self) -> bool;
    /// Sets the reference kernels of a CPU backend.
    fn use_reference(&mut self, on: bool);
}

impl KernelSwitch for Backend<'_> {
    fn is_cpu(&self) -> bool {
        Backend::is_cpu(self)
    }

    fn use_reference(&mut self, on: bool) {
        self.use_reference_kernels(on);
    }
}

/// Whether this build can run ggml's reference kernels; why not otherwise.
pub(crate) fn available() -> Result<(), String> {
    backends::available()
}

/// Turns ggml's reference CPU kernels on or off for `ctx`. Returns how many
/// CPU backends were set; an error when the context's backends cannot be
/// reached or none is a CPU backend (then nothing changed).
pub(crate) fn set_reference_kernels(ctx: &Context<'_>, on: bool) -> Result<usize, String> {
    let mut backends = ctx.backends()?;
    switch(&mut backends, on)
}

/// Sets every CPU backend of `backends`, once it is known there is one.
fn switch<B: KernelSwitch>(backends: &mut [B], on: bool) -> Result<usize, String> {
    if backends.is_empty() {
        return Err("the llama.cpp context lists no backend".into());
    }
    let cpu = backends.iter().filter(|b| b.is_cpu()).count();
    if cpu == 0 {
        return Err("the llama.cpp context has no CPU backend".into());
    }
    for b in backends.iter_mut().filter(|b| b.is_cpu()) {
        b.use_reference(on);
    }
    Ok(cpu)
}

/// The start-up error when the reference kernels cannot be turned on.
pub(crate) fn refusal(reason: &str) -> String {
    format!(
        "engine.batch_invariant = true, but ggml's reference kernels cannot be turned on: \
         {reason}; set engine.batch_invariant = false to run with the kernels ggml picks by \
         batch shape"
    )
}

/// llama.cpp's own line naming the CPU features its kernels were built for
/// (`CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | …`).
pub fn system_info() -> String {
    backends::system_info()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that records what it was set to.
    struct StandIn {
        cpu: bool,
        reference: Option<bool>,
    }

    impl KernelSwitch for StandIn {
        fn is_cpu(&self) -> bool {
            self.cpu
        }

        fn use_reference(&mut self, on: bool) {
            self.reference = Some(on);
        }
    }

    fn stand_ins(cpu: &[bool]) -> Vec<StandIn> {
        cpu.iter()
            .map(|&cpu| StandIn {
                cpu,
                reference: None,
            })
            .collect()
    }

    #[test]
    fn a_context_without_a_cpu_backend_is_refused_and_left_as_it_was() {
        let mut none: Vec<StandIn> = Vec::new();
        let e = switch(&mut none, true).expect_err("no backend at all");
        assert!(e.contains("no backend"), "{e}");

        let mut gpus = stand_ins(&[false, false]);
        let e = switch(&mut gpus, true).expect_err("no CPU backend");
        assert!(e.contains("no CPU backend"), "{e}");
        assert!(gpus.iter().all(|b| b.reference.is_none()));
    }

    #[test]
    fn only_the_cpu_backends_are_switched() {
        let mut mixed = stand_ins(&[false, true]);
        assert_eq!(switch(&mut mixed, true), Ok(1));
        assert_eq!(mixed[0].reference, None);
        assert_eq!(mixed[1].reference, Some(true));
        assert_eq!(switch(&mut mixed, false), Ok(1));
        assert_eq!(mixed[1].reference, Some(false));
    }

    #[test]
    fn the_refusal_names_the_key_and_the_way_out() {
        let e = refusal("the llama.cpp context has no CPU backend");
        assert!(e.starts_with("engine.batch_invariant = true"), "{e}");
        assert!(e.contains("no CPU backend"), "{e}");
        assert!(e.contains("set engine.batch_invariant = false"), "{e}");
    }

    /// The default build reaches a real context's scheduler: one CPU
    /// backend, switched both ways.
    #[test]
    fn a_real_context_has_one_cpu_backend_to_switch() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let backend = crate::engine::llama_backend().expect("llama.cpp backend");
        let model = super::super::ffi::Model::load(backend, &path, 0)
            .expect("the test model loads (scripts/fetch-model.sh)");
        let params = super::super::ffi::ContextParams {
            n_ctx: 256,
            n_batch: 8,
            n_seq_max: 1,
            threads: 1,
            flash_attention: true,
        };
        let ctx = Context::new(&model, &params).expect("context");
        available().expect("this build has the scheduler shim");
        let backends = ctx.backends().expect("the context's backends");
        assert_eq!(backends.iter().filter(|b| b.is_cpu()).count(), 1);
        drop(backends);
        assert_eq!(set_reference_kernels(&ctx, true), Ok(1));
        assert_eq!(set_reference_kernels(&ctx, false), Ok(1));
    }
}
