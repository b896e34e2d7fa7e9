#!/usr/bin/env bash
# System packages the build needs: cmake + clang/libclang for llama.cpp and
# its bindgen bindings; with --test also what the tests need: chromium for
# the browser test of the trajectory viewer (tests/python/test_ui.py), the
# PostgreSQL server for the postgres store tests (scripts/postgres.sh) and
# nginx for the replica tests (docker/nginx.conf), and python3, which
# scripts/fetch-tokenizers.sh runs (scripts/build_tiktoken.py) before the venv exists.
# Idempotent: installs only what is missing.
set -euo pipefail
need=()
if [ "${1:-}" = "--test" ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
fi
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v clang >/dev/null 2>&1 || need+=(clang)
source "$(dirname "$0")/env.sh"
[ -n "$(libclang_dir)" ] || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup-system: installing ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  # The tests start their own servers on free ports: keep the packages'
  # services from starting (policy-rc.d exit 101 = "not allowed").
  added_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
    $sudo_cmd chmod +x /usr/sbin/policy-rc.d
    added_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
  if [ -n "$added_policy" ]; then $sudo_cmd rm -f /usr/sbin/policy-rc.d; fi
fi
