#!/usr/bin/env bash
# tito vs smg vs sglang-router vs LiteLLM proxy on the same mock backend, side by
# side in one run (benches/peers.rs). Installs the peers into .bench-venv,
# fetches the Qwen3 tokenizer fixture, builds the release binary, then runs
# the bench. TITO_PEERS_SECS sets the seconds measured per cell (default 2),
# TITO_PEERS_ROUNDS the interleaved rounds (default 8).
# `--setup-only`: the venv and the tokenizer fixture, nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

scripts/fetch-tokenizers.sh
if [ ! -x .bench-venv/bin/litellm ] || [ ! -x .bench-venv/bin/smg ] || ! .bench-venv/bin/python -c "import sglang_router" 2>/dev/null; then
  echo "== installing smg, sglang-router and LiteLLM into .bench-venv"
  python3 -m venv .bench-venv
  .bench-venv/bin/pip install -q --upgrade pip
  .bench-venv/bin/pip install -q -r scripts/requirements-bench-peers.txt
fi
echo "== peers: $(.bench-venv/bin/pip list 2>/dev/null | grep -E '^(smg|sglang-router|litellm) ' | tr -s ' ' | paste -sd, -)"
if [ "${1:-}" = "--setup-only" ]; then exit 0; fi
cargo build --release --bin tito
cargo bench --bench peers
