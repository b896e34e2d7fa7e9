#!/usr/bin/env python3
"""Reference timing for the `turns/gpt_oss` group of benches/render.rs: the
same conversations (a system prompt and 1 or 50 user turns) mapped to
Harmony messages as tito maps them and rendered by PyPI `openai-harmony`
(`render_conversation_for_completion`).

Run: source scripts/env.sh && .venv/bin/python scripts/bench_render_harmony.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_render_python import timed, turn_text  # noqa: E402
from gen_goldens_harmony import chat_to_harmony_messages  # noqa: E402
from openai_harmony import (  # noqa: E402
    Conversation,
    HarmonyEncodingName,
    Role,
    load_harmony_encoding,
)


def turns(n):
    messages = [{"role": "system", "content": "You are a careful coding agent."}]
    for i in range(n):
        messages.append({"role": "user", "content": turn_text(2 * i)})
        if i + 1 < n:
            messages.append({"role": "assistant", "content": turn_text(2 * i + 1)})
    return messages


def main():
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    kwargs = {"conversation_start_date": "2026-01-15"}
    for n in (1, 50):
        messages = turns(n)

        def render():
            convo = Conversation.from_messages(chat_to_harmony_messages(messages, None, kwargs))
            return enc.render_conversation_for_completion(convo, Role.ASSISTANT)

        tokens = len(render())
        ms = timed(render)
        print(f"gpt_oss turn {n} ({tokens} tokens): map + render {ms:.3f} ms (median)")


if __name__ == "__main__":
    main()
