#!/usr/bin/env python3
"""Reference timing for benches/render.rs: the same Qwen3 conversations
rendered and tokenized by Python transformers (apply_chat_template).

The conversation builder mirrors `turn_text` / `conversation` in
benches/render.rs, so both render the same prompts (same token counts).

Run: .venv/bin/python scripts/bench_render_python.py
"""

import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = [1_000, 8_000, 32_000]


def turn_text(i):
    m = i % 7 + 2
    if i % 4 == 0:
        return (
            f"Step {i}: please read the file src/module_{i}.rs and explain what the function "
            "`process_batch` does, in particular how it handles errors and retries when the "
            "upstream service returns HTTP 503. Also list edge cases you would test."
        )
    if i % 4 == 1:
        return (
            "Here is the code:\n```rust\nfn process_batch(items: &[Item]) -> Result<usize, Error> {\n    "
            "let mut done = 0;\n    for (n, item) in items.iter().enumerate() {\n        "
            f"if n % {m} == 0 {{ retry(item, 3)?; }}\n        done += item.weight * {i};\n    }}\n    "
            f"Ok(done)\n}}\n```\nThe loop retries every {m}th item up to 3 times."
        )
    if i % 4 == 2:
        return f"Résumé {i}: 数据处理完成，共 {i * 1237} 条记录；错误率 {i * 0.137:.3f}%. Ünïcödé ✓ 🚀 — next: batch #{i + 1}."
    rows = ", ".join(str(k * i) for k in range(8))
    return f'{{"status": "ok", "rows": [{rows}], "elapsed_ms": {i * 31 % 997}, "note": "see   spaced    output"}}'


def conversation(tok, target):
    messages = [{"role": "system", "content": "You are a careful coding agent."}]
    i = 0
    while True:
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": turn_text(i)})
        i += 1
        if role == "user":
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
            if len(ids) >= target:
                return messages, len(ids)


def timed(f, seconds=3.0):
    f()
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(samples) < 10:
        t = time.perf_counter()
        f()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def main():
    tok = AutoTokenizer.from_pretrained(str(ROOT / ".cache" / "tokenizers" / "qwen3"))
    for target in SIZES:
        messages, n = conversation(tok, target)
        render = timed(lambda: tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        both = timed(lambda: tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        print(f"qwen3 {target // 1000}k ({n} tokens): render {render:.2f} ms, render+tokenize {both:.2f} ms (median)")


if __name__ == "__main__":
    main()
