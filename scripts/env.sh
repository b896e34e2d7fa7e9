# Sourced by the scripts: build environment shared by serve and test.
if [ -z "${LIBCLANG_PATH:-}" ]; then
  for d in /usr/lib/llvm-*/lib; do
    if ls "$d"/libclang*.so* >/dev/null 2>&1; then export LIBCLANG_PATH="$d"; fi
  done
fi
