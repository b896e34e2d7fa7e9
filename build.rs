//! Compiles the engine's C++ shim, `src/engine/ffi/sched.cpp`, which reaches
//! a llama.cpp context's scheduler (for `[engine] batch_invariant`).
//!
//! The shim includes llama.cpp's internal header `llama-context.h`, so it is
//! compiled against the very sources llama-cpp-sys-2 built the linked
//! library from: llama-cpp-sys-2 reports its CMake install prefix
//! (`DEP_LLAMA_ROOT`), and the CMake cache in its build directory names the
//! source directory it configured. When any of this cannot be found or the
//! shim does not compile, the build goes on without it (with a warning) and
//! the engine refuses `batch_invariant = true` at start-up.
//!
//! Without the `engine` feature this does nothing and needs no C++ compiler.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tito_llama_sched)");
    println!("cargo:rerun-if-changed=build.rs");
    // `cc` is a build dependency of the `engine` feature only.
    #[cfg(feature = "engine")]
    if std::env::var_os("CARGO_FEATURE_ENGINE").is_some() {
        shim::build();
    }
}

#[cfg(feature = "engine")]
mod shim {
    use std::path::{Path, PathBuf};

    const SHIM: &str = "src/engine/ffi/sched.cpp";

    pub fn build() {
        println!("cargo:rerun-if-changed={SHIM}");
        match llama_cpp_source().and_then(|src| compile(&src)) {
            Ok(()) => println!("cargo:rustc-cfg=tito_llama_sched"),
            Err(e) => println!(
                "cargo:warning=engine.batch_invariant = true will be refused at start-up: {e}"
            ),
        }
    }

    /// The llama.cpp source directory the linked library was built from.
    fn llama_cpp_source() -> Result<PathBuf, String> {
        let root = std::env::var_os("DEP_LLAMA_ROOT")
            .ok_or("llama-cpp-sys-2 reported no build directory (DEP_LLAMA_ROOT)")?;
        let cache = Path::new(&root).join("build").join("CMakeCache.txt");
        println!("cargo:rerun-if-changed={}", cache.display());
        let text = std::fs::read_to_string(&cache)
            .map_err(|e| format!("cannot read {}: {e}", cache.display()))?;
        let dir = text
            .lines()
            .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
            .map(|d| PathBuf::from(d.trim()))
            .ok_or_else(|| format!("{} names no source directory", cache.display()))?;
        let header = dir.join("src").join("llama-context.h");
        if !header.is_file() {
            return Err(format!("{} does not exist", header.display()));
        }
        println!("cargo:rerun-if-changed={}", header.display());
        Ok(dir)
    }

    fn compile(src: &Path) -> Result<(), String> {
        cc::Build::new()
            .cpp(true)
            .std("c++17")
            .include(src.join("include"))
            .include(src.join("src"))
            .include(src.join("ggml").join("include"))
            .file(SHIM)
            .try_compile("tito_llama_sched")
            .map_err(|e| format!("cannot compile {SHIM}: {e}"))
    }
}
