"""Times transformers' apply_chat_template(tokenize=True) on a conversation:
prints `median_ms token_count`. Used by `cargo bench --bench trajectory`."""

import json
import statistics
import sys
import time

from transformers import AutoTokenizer

tok_dir, conv_path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(tok_dir)
messages = json.load(open(conv_path))
times = []
for _ in range(reps):
    t = time.perf_counter()
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    times.append(time.perf_counter() - t)
if hasattr(ids, "keys"):
    ids = ids["input_ids"]
print(f"{statistics.median(times) * 1000:.3f} {len(ids)}")
