# Sourced by the scripts: build environment shared by serve and test.
# bindgen loads libclang.so* or libclang-<version>.so*; libclang-cpp (the C++
# library some packages pull in alone) is not it.
if [ -z "${LIBCLANG_PATH:-}" ]; then
  for d in /usr/lib/llvm-*/lib; do
    if ls "$d"/libclang.so* "$d"/libclang-[0-9]*.so* >/dev/null 2>&1; then
      export LIBCLANG_PATH="$d"
    fi
  done
fi
