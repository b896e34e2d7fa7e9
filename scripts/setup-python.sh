#!/usr/bin/env bash
# Creates the gitignored virtualenv .venv with scripts/requirements-test.txt
# (transformers + jinja2 for golden fixtures, openai and pyarrow for tests).
# Idempotent: when .venv already holds exactly these requirements it returns
# at once.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

REQS="scripts/requirements-test.txt"
STAMP=".venv/.requirements.sha256"
want="$(sha256sum "$REQS" | cut -d' ' -f1)"

if [[ -x .venv/bin/python && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    echo ".venv: up to date"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r "$REQS"
echo "$want" > "$STAMP"
echo ".venv: installed $(.venv/bin/python -c 'import transformers; print("transformers", transformers.__version__)')"
