"""Anthropic's Messages API through the real clients that speak it, against
`tito serve` (real binary, Qwen3 tokenizer, the `think` reasoning parser)
in front of the mock vLLM: the `anthropic` SDK's `messages.create` and
`messages.stream`, and LangChain's `ChatAnthropic`, each running a weather
tool over three calls, with and without thinking (the thinking block comes
back signed and is sent back on the next turn). The mock samples
non-canonical token ids: every export must be one sample carrying them
verbatim, masked 1 exactly on them, with the mock's logprobs; streamed and
non-streamed runs must agree. Then SDK retries answered from the record."""

import functools
import json
import operator

import pytest
from anthropic import Anthropic

import harness

TOKENIZER = harness.QWEN3
MODEL = "test-model"
THINK = 'reasoning_parser = "think"'
SYSTEM = "You are a weather assistant."
QUESTION = "What is the weather in Paris and in London?"
WEATHER = {"Paris": "sunny, 21 C", "London": "rain, 14 C"}
FINAL = "Paris is sunny at 21 C; London has rain at 14 C."
TOOLS = [{
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
# Thinking needs a budget of at least 1024 tokens below `max_tokens`.
THINKING = {"type": "enabled", "budget_tokens": 1024}
MAX_TOKENS = 2048
THOUGHTS = ["I need Paris first.", "Now London.", "I have both."]


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


def chunks(s, n):
    return [s[i : i + n] for i in range(0, len(s), n)]


def call_parts(city):
    body = json.dumps({"name": "get_weather", "arguments": {"city": city}})
    return ["<tool_call>", "\n"] + chunks(body, 5) + ["\n", "</tool_call>"]


def weather_script(tok, thinking):
    """Three replies: text and a call for Paris, a call for London, the
    answer, each after a thought when `thinking`; tokenized in pieces
    (non-canonical)."""
    def thought(i):
        return ["<think>"] + chunks(f"\n{THOUGHTS[i]}\n", 4) + ["</think>", "\n\n"] if thinking else []

    return [
        harness.sampled(tok, thought(0) + chunks("Let me check Paris first.", 3) + ["\n"] + call_parts("Paris")),
        harness.sampled(tok, thought(1) + call_parts("London")),
        harness.sampled(tok, thought(2) + chunks(FINAL, 4)),
    ]


def gateway(tok, script):
    return harness.mock_gateway(TOKENIZER, harness.sampled(tok, ["un", "used"]), script=script,
                                model_extra=THINK)


def summary(m):
    """What a client reads from a Message, without the ids that differ
    between runs: each block's text, thought, or tool name and input, the
    stop reason and the token counts. Every thinking block is signed and
    every tool use has an id."""
    blocks = []
    for b in m.content:
        if b.type == "text":
            blocks.append(("text", b.text))
        elif b.type == "thinking":
            assert b.signature
            blocks.append(("thinking", b.thinking))
        elif b.type == "tool_use":
            assert b.id
            blocks.append(("tool_use", b.name, b.input))
        else:
            blocks.append((b.type,))
    return blocks, m.stop_reason, m.stop_sequence, m.usage.input_tokens, m.usage.output_tokens


def check_weather_turns(turns, thinking):
    got = [summary(m)[:2] for m in turns]
    lead = [[("thinking", t)] if thinking else [] for t in THOUGHTS]
    assert got == [
        (lead[0] + [("text", "Let me check Paris first."), ("tool_use", "get_weather", {"city": "Paris"})],
         "tool_use"),
        (lead[1] + [("tool_use", "get_weather", {"city": "London"})], "tool_use"),
        (lead[2] + [("text", FINAL)], "end_turn"),
    ]


def run_weather(client, stream, thinking, headers=None):
    """Three calls, each sending the whole conversation back: the blocks
    as the SDK returned them (thinking with its signature), then the tool
    results. `headers(turn)`: extra headers of each call."""
    messages = [{"role": "user", "content": QUESTION}]
    turns = []
    for turn in range(3):
        kw = dict(model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS, messages=messages)
        if headers is not None:
            kw["extra_headers"] = headers(turn)
        if thinking:
            kw["thinking"] = THINKING
        if stream:
            # The SDK's stream helper assembles the message from the events.
            with client.messages.stream(**kw) as s:
                texts = "".join(s.text_stream)
                m = s.get_final_message()
            assert texts == "".join(b.text for b in m.content if b.type == "text")
        else:
            m = client.messages.create(**kw)
        turns.append(m)
        messages = messages + [{"role": "assistant", "content": m.content}]
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": WEATHER[b.input["city"]]}
                   for b in m.content if b.type == "tool_use"]
        if results:
            messages.append({"role": "user", "content": results})
    return turns


def same_sample(a, b):
    keys = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "call_offsets")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.mark.parametrize("thinking", [False, True], ids=["tools", "tools+thinking"])
def test_anthropic_messages_three_turns_streamed_and_not(tok, thinking):
    script = weather_script(tok, thinking)
    with gateway(tok, script + script) as addr:
        rows, answers = [], []
        for tid, stream in (("msg-plain", False), ("msg-stream", True)):
            client = Anthropic(base_url=f"http://{addr}/t/{tid}", api_key="unused", max_retries=0)
            turns = run_weather(client, stream, thinking)
            check_weather_turns(turns, thinking)
            answers.append([summary(m) for m in turns])
            rows.append(harness.assert_one_exact_sample(addr, tid, script, "messages"))
        assert answers[0] == answers[1], "streamed and non-streamed answers agree"
        same_sample(*rows)


def test_a_changed_thinking_block_is_refused(tok):
    """The signature binds the thinking to the call that sampled it: sent
    back changed, the next turn is a 400 in Anthropic's shape naming the
    block, and nothing is recorded."""
    import anthropic

    script = weather_script(tok, True)
    with gateway(tok, script) as addr:
        client = Anthropic(base_url=f"http://{addr}/t/msg-tamper", api_key="unused", max_retries=0)
        kw = dict(model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, tools=TOOLS, thinking=THINKING)
        first = client.messages.create(messages=[{"role": "user", "content": QUESTION}], **kw)
        blocks = [b.model_dump() for b in first.content]
        assert blocks[0]["type"] == "thinking"
        blocks[0]["thinking"] = "I need London first."
        use = next(b for b in first.content if b.type == "tool_use")
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(messages=[
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": blocks},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "x"}]},
            ], **kw)
        assert e.value.body["type"] == "error"
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert "messages[1].content[0].signature" in e.value.body["error"]["message"]
        assert len(harness.http_json(addr, "/v1/trajectories/msg-tamper")["calls"]) == 1


@pytest.mark.parametrize("thinking", [False, True], ids=["tools", "tools+thinking"])
def test_langchain_chat_anthropic_with_a_bound_tool(tok, thinking):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return WEATHER[city]

    script = weather_script(tok, thinking)
    with gateway(tok, script + script) as addr:
        finals, rows, usages = [], [], []
        for tid, stream in (("lc-msg-plain", False), ("lc-msg-stream", True)):
            extra = {"thinking": THINKING} if thinking else {}
            llm = ChatAnthropic(base_url=f"http://{addr}/t/{tid}", api_key="unused", model=MODEL,
                                max_tokens=MAX_TOKENS, max_retries=0, **extra).bind_tools([get_weather])
            msgs = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
            names, thoughts, usage = [], [], []
            for _ in range(3):
                ai = functools.reduce(operator.add, llm.stream(msgs)) if stream else llm.invoke(msgs)
                msgs.append(ai)
                thoughts += [b["thinking"] for b in ai.content
                             if isinstance(b, dict) and b.get("type") == "thinking"]
                usage.append((ai.usage_metadata["input_tokens"], ai.usage_metadata["output_tokens"]))
                for call in ai.tool_calls:
                    names.append((call["name"], call["args"]))
                    msgs.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
            assert names == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})]
            assert not ai.tool_calls
            assert thoughts == (THOUGHTS if thinking else [])
            finals.append(ai.text)
            usages.append(usage)
            rows.append(harness.assert_one_exact_sample(addr, tid, script, "messages"))
        assert finals == [FINAL, FINAL]
        assert usages[0] == usages[1]
        same_sample(*rows)


# --- Retries ---


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("keyed", [False, True], ids=["stainless-retry", "idempotency-key"])
def test_anthropic_sdk_retries_after_a_lost_answer_are_answered_from_the_record(tok, stream, keyed):
    """Every first attempt's answer is lost on the way back (the proxy
    resets the connection after tito answered), so the SDK retries each
    call (`x-stainless-retry-count: 1`). Each retry gets the recorded
    answer, thinking signature included: the trajectory still has exactly
    the three scripted calls, one sample. Keyed: an `Idempotency-Key` per
    call and the retry header stripped on the way, so that only the key
    finds the call; else the SDK's retry header and the same body do."""
    script = weather_script(tok, True)
    strip = ["x-stainless-retry-count"] if keyed else []
    with gateway(tok, script) as addr, harness.CuttingProxy(addr, strip=strip) as proxy:
        before = len(harness.export_rows(addr))
        client = Anthropic(base_url=f"http://{proxy.addr}/t/msg-retry", api_key="unused", max_retries=2)
        # One key per call: the SDK sends it on the first attempt and on
        # each retry.
        headers = (lambda turn: {"Idempotency-Key": f"weather-{turn}"}) if keyed else None
        turns = run_weather(client, stream, True, headers=headers)
        check_weather_turns(turns, True)
        assert proxy.cut == 3
        assert [h.get("x-stainless-retry-count") for h in proxy.relayed] == ["1"] * 3
        assert [h.get("idempotency-key") for h in proxy.relayed] == (
            [f"weather-{i}" for i in range(3)] if keyed else [None] * 3)
        harness.assert_one_exact_sample(addr, "msg-retry", script, "messages")
        assert len(harness.export_rows(addr)) == before + 1


# --- tito's own document ---

MESSAGE_OPERATIONS = ["createMessage", "createMessageInTrajectory", "createMessageInGroup",
                      "countMessageTokens", "countMessageTokensInTrajectory", "countMessageTokensInGroup"]


def test_bounded_schemathesis_run_over_the_messages_operations():
    """Anthropic publishes no OpenAPI document to check against offline:
    schemathesis (positive and negative data, fixed seed) over the Messages
    operations of tito's own document as served, with more cases than the
    whole-document run gives each: no server error, every answer in its
    documented status, content type and schema (stream events included),
    every error in Anthropic's shape, no panic or ERROR logged."""
    import os
    import pathlib
    import re
    import subprocess
    import tempfile

    from test_conformance import OWN_CHECKS, OWN_TOKEN, alive, guarded_gateway, panics

    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": str(pathlib.Path(__file__).parent)}
    with guarded_gateway() as g:
        doc = harness.http_json(g.addr, "/openapi.json")
        ops = {op.get("operationId") for path in doc["paths"].values() for op in path.values()
               if isinstance(op, dict)}
        assert set(MESSAGE_OPERATIONS) <= ops, sorted(set(MESSAGE_OPERATIONS) - ops)
        cmd = [str(harness.ROOT / ".venv" / "bin" / "schemathesis"), "run",
               f"http://{g.addr}/openapi.json", "--url", f"http://{g.addr}", "--mode", "all",
               "--max-examples", "50", "--phases", "examples,fuzzing", "--seed", "20261202",
               "--no-color", "--generation-database", "none", "--continue-on-failure",
               "--workers", "1", "--header", f"Authorization: Bearer {OWN_TOKEN}",
               "--checks", ",".join(OWN_CHECKS)]
        for op in MESSAGE_OPERATIONS:
            cmd += ["--include-operation-id", op]
        with tempfile.TemporaryDirectory() as work:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=work)
        out = r.stdout + r.stderr
        m = re.search(r"Test cases:\s*\n\s*(.*)", out)
        line = m.group(1) if m else ""
        generated, passed = (re.search(rf"(\d+) {w}\b", line) for w in ("generated", "passed"))
        print(f"schemathesis on the Messages operations: {line}")
        assert r.returncode == 0 and generated and passed, out[-8000:]
        assert int(generated.group(1)) >= 300 and passed.group(1) == generated.group(1), out[-8000:]
        assert g.process.poll() is None and alive(g.addr), "".join(g.log[-50:])
    assert not panics(g.log), "".join(panics(g.log))[:4000]
