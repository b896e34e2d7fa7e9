"""The official OpenAI Python SDK against a running `tito serve` (real
binary, real Qwen3 tokenizer) in front of a deterministic mock vLLM."""

import pathlib

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hello in two languages. 你好?"},
]


@pytest.fixture(scope="module")
def env():
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    reply = tok.encode("Hello! 你好 🎉", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    mock, mock_addr = harness.start_mock(reply)
    tito, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}")
    client = OpenAI(base_url=f"http://{addr}/v1", api_key="unused")
    try:
        yield tok, reply, client, addr
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)


def golden_prompt(tok):
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_non_streaming_chat_returns_exact_ids(env):
    tok, reply, client, _ = env
    resp = client.chat.completions.create(
        model="test-model", messages=MESSAGES, extra_body={"return_token_ids": True}
    )
    extra = resp.model_extra
    assert extra["prompt_token_ids"] == golden_prompt(tok)
    choice = resp.choices[0]
    assert choice.model_extra["token_ids"] == reply
    assert choice.message.content == "Hello! 你好 🎉"
    assert choice.finish_reason == "stop"
    assert resp.usage.completion_tokens == len(reply)


def test_streaming_concatenates_to_non_streamed(env):
    tok, reply, client, _ = env
    plain = client.chat.completions.create(
        model="test-model", messages=MESSAGES, extra_body={"return_token_ids": True}
    )
    stream = client.chat.completions.create(
        model="test-model",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    ids, text, prompt_ids, finish, usage = [], "", None, None, None
    for chunk in stream:
        extra = chunk.model_extra or {}
        if prompt_ids is None and "prompt_token_ids" in extra:
            prompt_ids = extra["prompt_token_ids"]
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            ids.extend((c.model_extra or {}).get("token_ids") or [])
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert prompt_ids == golden_prompt(tok)
    assert ids == plain.choices[0].model_extra["token_ids"] == reply
    assert text == plain.choices[0].message.content
    assert finish == "stop"
    assert usage.completion_tokens == len(reply)


def test_unknown_model_is_a_clean_sdk_error(env):
    _, _, client, _ = env
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert e.value.body["code"] == "model_not_found"


def test_trajectory_is_recorded(env):
    _, reply, client, addr = env
    client.chat.completions.create(
        model="test-model", messages=MESSAGES, extra_headers={"X-Trajectory-Id": "sdk-traj-1"}
    )
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/v1/trajectories/sdk-traj-1") as r:
        t = json.load(r)
    assert len(t["calls"]) == 1
    assert t["calls"][0]["sampled_ids"] == reply
