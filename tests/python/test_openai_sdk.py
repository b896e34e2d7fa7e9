"""The official OpenAI Python SDK against a running `tito serve` (real
binary, real Qwen3 tokenizer) in front of a deterministic mock vLLM."""

import json
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


def test_logprobs_are_recorded_when_the_sdk_asks_for_none(env):
    """An unmodified SDK call (no logprobs parameter): the export still has
    the backend's logprob of every sampled token (the mock answers
    -0.5 - i/100 for the i-th token), never a fabricated 0.0."""
    _, reply, client, addr = env
    resp = client.chat.completions.create(
        model="test-model", messages=MESSAGES, extra_headers={"X-Trajectory-Id": "sdk-lp-1"}
    )
    assert resp.choices[0].logprobs is None
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/v1/export?format=jsonl&layout=trajectory") as r:
        rows = [json.loads(line) for line in r.read().decode().splitlines()]
    row = next(r for r in rows if r["trajectory_id"] == "sdk-lp-1")
    assert row["response_ids"] == reply
    want = [-0.5 - i / 100 for i in range(len(reply))]
    assert row["response_logprobs"] == pytest.approx(want, abs=1e-6)


def test_sdk_retry_header_with_the_same_body_replays(env):
    """What the SDK sends when it retries: the same body with
    x-stainless-retry-count >= 1 gets the recorded answer, not a new call."""
    _, _, client, addr = env
    headers = {"X-Trajectory-Id": "sdk-retry-1"}
    first = client.chat.completions.create(
        model="test-model", messages=MESSAGES, extra_headers=headers
    )
    again = client.chat.completions.create(
        model="test-model",
        messages=MESSAGES,
        extra_headers={**headers, "x-stainless-retry-count": "1"},
    )
    assert again.id == first.id
    assert again.choices[0].message.content == first.choices[0].message.content
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}/v1/trajectories/sdk-retry-1") as r:
        assert len(json.load(r)["calls"]) == 1


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def test_streaming_with_tools_accumulates_to_the_message():
    """OpenAI SDK streaming with tools: the accumulated deltas equal the
    non-streamed message (the mock emits the same hermes tool call twice)."""
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    call = tok.encode(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>',
        add_special_tokens=False,
    ) + [im_end]
    mock, mock_addr = harness.start_mock(call)
    tito, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}")
    try:
        client = OpenAI(base_url=f"http://{addr}/v1", api_key="unused")
        msgs = [{"role": "user", "content": "What is 6*7?"}]
        plain = client.chat.completions.create(model="test-model", messages=msgs, tools=TOOLS)
        message = plain.choices[0].message
        assert plain.choices[0].finish_reason == "tool_calls"
        stream = client.chat.completions.create(model="test-model", messages=msgs, tools=TOOLS, stream=True)
        content, calls, finish = "", {}, None
        for chunk in stream:
            for c in chunk.choices:
                content += c.delta.content or ""
                for tc in c.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    entry["id"] = tc.id or entry["id"]
                    if tc.function:
                        entry["name"] += tc.function.name or ""
                        entry["arguments"] += tc.function.arguments or ""
                finish = c.finish_reason or finish
        assert finish == "tool_calls"
        assert content == (message.content or "")
        assert len(calls) == len(message.tool_calls) == 1
        got, want = calls[0], message.tool_calls[0]
        assert got["name"] == want.function.name == "calculator"
        assert got["arguments"] == want.function.arguments
        assert got["id"] and got["id"].startswith("call_")
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)


def test_parse_with_a_pydantic_model_gets_a_constrained_answer():
    """`client.chat.completions.parse(response_format=Model)`: the SDK sends a
    strict json_schema; tito passes it to vLLM as `structured_outputs`, and
    the mock, honouring it, answers schema-valid JSON (without the
    constraint it would answer plain text, which the SDK cannot parse)."""
    from pydantic import BaseModel

    class Capital(BaseModel):
        city: str

    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    plain = tok.encode("Paris, of course.", add_special_tokens=False) + [im_end]
    constrained = tok.encode('{"city": "Paris"}', add_special_tokens=False) + [im_end]
    with harness.mock_gateway(TOKENIZER, plain, structured_reply_ids=constrained) as addr:
        client = OpenAI(base_url=f"http://{addr}/v1", api_key="unused")
        resp = client.chat.completions.parse(
            model="test-model",
            messages=[{"role": "user", "content": "Capital of France?"}],
            response_format=Capital,
        )
        assert resp.choices[0].message.parsed == Capital(city="Paris")


def test_tool_choice_required_answers_tool_calls():
    """`tool_choice="required"` through the SDK: the output is constrained to
    a list of calls (the mock answers that list only when constrained) and
    comes back as `tool_calls` with finish_reason `tool_calls`."""
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    plain = tok.encode("I will not call a tool.", add_special_tokens=False) + [im_end]
    calls = tok.encode(
        '[{"name": "calculator", "parameters": {"expression": "6*7"}}]', add_special_tokens=False
    ) + [im_end]
    with harness.mock_gateway(TOKENIZER, plain, structured_reply_ids=calls) as addr:
        client = OpenAI(base_url=f"http://{addr}/v1", api_key="unused")
        resp = client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "What is 6*7?"}],
            tools=TOOLS,
            tool_choice="required",
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.name == "calculator"
        assert json.loads(choice.message.tool_calls[0].function.arguments) == {"expression": "6*7"}
        model = client.models.retrieve("test-model")
        assert model.id == "test-model"


def test_developer_role_and_content_parts_through_the_sdk(env):
    """What the SDK sends for newer models: a `developer` message and a user
    message as a list of text parts. The prompt is the template's render of
    a `system` message and the parts joined with newlines."""
    tok, _, client, _ = env
    resp = client.chat.completions.create(
        model="test-model",
        messages=[
            {"role": "developer", "content": "Always answer in French."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                         {"type": "text", "text": "there"}]},
        ],
        extra_body={"return_token_ids": True},
    )
    want = tok.apply_chat_template(
        [{"role": "system", "content": "Always answer in French."},
         {"role": "user", "content": "Hello\nthere"}],
        tokenize=False, add_generation_prompt=True,
    )
    assert resp.model_extra["prompt_token_ids"] == tok.encode(want, add_special_tokens=False)
