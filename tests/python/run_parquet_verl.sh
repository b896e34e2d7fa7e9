#!/usr/bin/env bash
# Runs tests/python/test_parquet_verl.py with the project's Python (.venv,
# made by scripts/setup-python.sh; needs pyarrow and pytest). The test builds
# and runs the Rust example `verl_fixture` itself (cargo, honours
# CARGO_TARGET_DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ]; then
    echo "no Python at $PY: run scripts/setup-python.sh first (or set PYTHON)" >&2
    exit 1
fi
if ! "$PY" -c "import pyarrow, pytest" 2>/dev/null; then
    echo "$PY lacks pyarrow/pytest: run scripts/setup-python.sh first" >&2
    exit 1
fi
exec "$PY" -m pytest -q tests/python/test_parquet_verl.py "$@"
