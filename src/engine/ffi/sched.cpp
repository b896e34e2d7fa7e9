// The scheduler of a llama.cpp context, for the engine's batch-invariant
// mode (src/engine/kernels.rs). llama.h has no call that reaches a context's
// backends; `llama_context::get_sched` is declared in llama.cpp's internal
// header, so this file is compiled against the sources of the llama.cpp that
// is linked (build.rs) and the compiler, not a hand-written symbol name,
// decides how the member function is called.

#include "llama-context.h"

#include <type_traits>

// The declaration this shim was written for: a const member function that
// takes nothing and returns the scheduler.
static_assert(std::is_same<decltype(&llama_context::get_sched),
                           ggml_backend_sched_t (llama_context::*)() const>::value,
              "llama_context::get_sched changed: review src/engine/ffi/sched.cpp");

extern "C" ggml_backend_sched_t tito_llama_context_sched(const llama_context * ctx) noexcept {
    return ctx == nullptr ? nullptr : ctx->get_sched();
}
