# Sourced by the scripts: build environment shared by serve and test.

# The LLVM library folder holding the libclang that bindgen loads:
# libclang.so* or libclang-<version>.so*. libclang-cpp (the C++ library some
# packages pull in alone) is not it. Prints nothing when there is none.
libclang_dir() {
  local d found=""
  for d in /usr/lib/llvm-*/lib; do
    if compgen -G "$d/libclang.so*" >/dev/null || compgen -G "$d/libclang-[0-9]*.so*" >/dev/null
    then
      found="$d"
    fi
  done
  [ -n "$found" ] && echo "$found"
  return 0
}

if [ -z "${LIBCLANG_PATH:-}" ]; then
  d=$(libclang_dir)
  if [ -n "$d" ]; then export LIBCLANG_PATH="$d"; fi
  unset d
fi

# gpt-oss (Harmony): the Rust crate and the PyPI package `openai-harmony`
# load o200k_base.tiktoken from this folder, else they try to download it.
# scripts/fetch-tokenizers.sh builds it there.
if [ -z "${TIKTOKEN_ENCODINGS_BASE:-}" ]; then
  TIKTOKEN_ENCODINGS_BASE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cache/tokenizers/gptoss"
  export TIKTOKEN_ENCODINGS_BASE
fi
