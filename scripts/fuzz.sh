#!/usr/bin/env bash
# A longer schemathesis run against tito's own OpenAPI document than the
# bounded one in CI (tests/python/test_conformance.py): a fresh gateway with
# a token for every role in front of the mock backend, positive and negative
# data, the coverage phase too, every operation but the fleet-changing ones.
# Fails on any server error, answer outside its documented status / content
# type / headers / schema, error not in OpenAI's shape, guarded route open
# without its token, or panic / ERROR line in the gateway's log.
#
#   scripts/fuzz.sh [CASES] [SEED]
#
# CASES: cases per operation and data mode in the fuzzing phase (default
# 200; the coverage phase adds its own, about 5,000 in all); SEED: the seed
# to reproduce a run (default random, printed at the end). Measured here:
# CASES=100 is about 7,200 cases in 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

cases="${1:-200}"
args=(--max-examples "$cases")
if [ -n "${2:-}" ]; then args+=(--seed "$2"); fi
[ -x .venv/bin/python ] || scripts/setup-python.sh
[ -f .cache/tokenizers/qwen3/tokenizer.json ] || scripts/fetch-tokenizers.sh
exec .venv/bin/python tests/python/test_conformance.py "${args[@]}"
