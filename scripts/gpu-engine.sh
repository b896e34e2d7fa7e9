#!/usr/bin/env bash
# The bundled engine on an NVIDIA GPU, measured on a machine that has the
# CUDA toolkit but no Rust toolchain (how docs/benchmarks-engine.md's GPU
# section was measured). Where one machine has both, the plain way is
#   TITO_BENCH_DEVICE=cuda cargo bench --features cuda --bench engine
#
# The Rust side is built here against llama.cpp's shared libraries; the GPU
# machine builds the same llama.cpp source (the one vendored by the
# llama-cpp-sys-2 crate in Cargo.lock) as shared libraries with CUDA, and the
# binaries load those. The engine's own code is the same either way; what
# differs from `--features cuda` is only how llama.cpp is linked.
#
#   scripts/gpu-engine.sh pack DIR    (here) DIR/llama-src.tgz, DIR/tito.xz, DIR/engine-bench.xz
#   scripts/gpu-engine.sh build DIR   (GPU machine) llama.cpp with CUDA into $GPU_BUILD
#   scripts/gpu-engine.sh run DIR     (GPU machine) the engine bench on cuda, then
#                                     one chat call through `tito serve` on cuda
# A/B on the GPU: `BASE_BENCH=<an engine bench binary built the same way from
# another commit with the same llama-cpp-sys-2> scripts/gpu-engine.sh pack DIR`
# adds DIR/engine-bench-base.xz, and `run` then runs that bench before this
# one, on the same CUDA build (a failing base bench stops the run).
# Env: GPU_BUILD (default /tmp/llama-cuda), CUDA_ARCH (default 90: H100/H200),
# TITO_BENCH_* as in benches/engine.rs (the bench threads default to 2).
set -euo pipefail
base_bench=${BASE_BENCH:+$(realpath "$BASE_BENCH")}
cd "$(dirname "$0")/.."
cmd=${1:?pack, build or run}
dir=${2:?a folder}
build=${GPU_BUILD:-/tmp/llama-cuda}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf

case "$cmd" in
pack)
    mkdir -p "$dir"
    version=$(awk '/^name = "llama-cpp-sys-2"/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
    src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-2-"$version" | head -1)
    tar czf "$dir/llama-src.tgz" -C "$src" llama.cpp/CMakeLists.txt llama.cpp/LICENSE llama.cpp/cmake \
        llama.cpp/include llama.cpp/src llama.cpp/common llama.cpp/vendor llama.cpp/ggml
    target=${CARGO_TARGET_DIR:-target/shared}
    export CARGO_TARGET_DIR=$target LLAMA_BUILD_SHARED_LIBS=1
    cargo build --release --bin tito
    bench=$(cargo bench --bench engine --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "engine" and m.get("executable"):
        print(m["executable"])')
    strip -o "$dir/tito" "$target/release/tito"
    strip -o "$dir/engine-bench" "$bench"
    xz -f -T0 "$dir/tito" "$dir/engine-bench"
    rm -f "$dir/engine-bench-base.xz"
    if [ -n "$base_bench" ]; then
        strip -o "$dir/engine-bench-base" "$base_bench"
        xz -f -T0 "$dir/engine-bench-base"
    fi
    ls -la "$dir"
    ;;
build)
    mkdir -p "$build/src"
    tar xzf "$dir/llama-src.tgz" -C "$build/src"
    # The options llama-cpp-sys-2's build script gives CMake, with CUDA on
    # as its `cuda` feature turns it.
    cmake -S "$build/src/llama.cpp" -B "$build/out" -G Ninja \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=ON \
        -DCMAKE_C_FLAGS="-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64" \
        -DCMAKE_CXX_FLAGS="-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64" \
        -DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DGGML_CCACHE=OFF \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$build/cmake.log" ||
        { tail -30 "$build/cmake.log"; exit 1; }
    time cmake --build "$build/out" --target llama-common -j "$(nproc)"
    ls "$build/out/bin"
    ;;
run)
    rm -f "$build/engine-bench-base"
    for f in tito engine-bench engine-bench-base; do
        # The base bench is optional; the other two must be there.
        [ "$f" = engine-bench-base ] && [ ! -f "$dir/$f.xz" ] && continue
        xz -dc "$dir/$f.xz" >"$build/$f.new"
        chmod +x "$build/$f.new"
        mv "$build/$f.new" "$build/$f"
    done
    export LD_LIBRARY_PATH=$build/out/bin
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    if [ -x "$build/engine-bench-base" ]; then
        echo "== base engine bench"
        TITO_BENCH_DEVICE=cuda TITO_BENCH_MODEL=$PWD/$model "$build/engine-bench-base" --bench
        echo "== this engine bench"
    fi
    TITO_BENCH_DEVICE=cuda TITO_BENCH_MODEL=$PWD/$model "$build/engine-bench" --bench
    echo "engine bench exited with status 0"
    port=18000
    cat >"$build/gpu.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
[model]
name = "smollm2-135m-instruct"
tokenizer = "$model"
[[backends]]
url = "engine"
kind = "engine"
[engine]
model = "$model"
device = "cuda"
batch_invariant = false
[store]
url = "sqlite://$build/spans.db"
EOF
    RUST_LOG=info "$build/tito" serve --config "$build/gpu.toml" >"$build/serve.log" 2>&1 &
    pid=$!
    # Wait for the listener: a start-up, not a test's synchronisation.
    for _ in $(seq 1 300); do curl -sf "127.0.0.1:$port/ready" >/dev/null && break; sleep 0.1; done
    curl -sf "127.0.0.1:$port/t/gpu-1/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"model":"smollm2-135m-instruct","messages":[{"role":"user","content":"Name three colours."}],"max_tokens":24,"temperature":0}'
    echo
    curl -sf "127.0.0.1:$port/v1/trajectories/gpu-1" | python3 -c '
import json, sys
for c in json.load(sys.stdin)["calls"]:
    lps = c["logprobs"]
    print("recorded call", c["call_index"], "on", c["backend"], "sampled", c["sampled_ids"])
    print("logprobs:", lps[:4], "...;", sum(x is None for x in lps), "null of", len(lps))'
    kill "$pid"
    status=0
    wait "$pid" || status=$?
    echo "tito serve exited with status $status"
    grep -iE 'offload|CUDA0|llama.cpp kernels|error' "$build/serve.log" | head -20
    ;;
*)
    echo "unknown command $cmd: pack, build or run" >&2
    exit 2
    ;;
esac
