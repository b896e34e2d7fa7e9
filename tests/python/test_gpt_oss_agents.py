"""gpt-oss (the Harmony format) through real agent clients: the `openai`
SDK's chat completions (streamed and not) and LangChain's `ChatOpenAI` with
a `@tool` in the LangGraph ReAct agent, each over three turns (reasoning and
a `get_weather` call ending `<|call|>`, reasoning and the answer after the
tool result, a follow-up answer), against `tito serve` (real binary, the
gpt-oss tokenizer, `chat_template = "harmony"`) in front of the mock vLLM.

The mock samples Harmony text tokenized piece by piece with the gpt-oss
encoding (`openai_harmony`), so the ids are not the canonical encoding of
their text: every export must be one sample carrying them verbatim, masked 1
exactly on them. The clients must see what they expect of an OpenAI
server: `finish_reason == "tool_calls"` and the call in `tool_calls`, the
`analysis` channel as `reasoning_content`, the `final` channel as
`content`."""

import json
import os
import pathlib

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "gptoss"
MODEL = "test-model"
HARMONY = 'chat_template = "harmony"\ntool_parser = "gpt_oss"\nreasoning_parser = "gpt_oss"'
# Harmony's formatting tokens, each one id of the gpt-oss encoding.
SPECIAL = {
    "<|return|>": 200002, "<|constrain|>": 200003, "<|channel|>": 200005,
    "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012,
}
# The ids that end a sampled assistant turn (vLLM's stop ids for gpt-oss).
STOP_IDS = [SPECIAL["<|return|>"], SPECIAL["<|call|>"]]

QUESTION = "Weather in Paris?"
FOLLOW_UP = "Thanks!"
WEATHER = {"Paris": "sunny, 21 °C"}
REASONING = ["Need the weather.", "It is sunny."]
ANSWER = "Sunny in Paris, 21 °C."
THANKS = "You're welcome!"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]

# The three scripted completions, each from right after `<|start|>assistant`
# (as tests/gpt_oss_chat.rs samples them), in the pieces they are encoded in.
PARTS = [
    [
        "<|channel|>analysis<|message|>", "Need the w", "eather.",
        "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        "<|constrain|>json<|message|>",
        '{"ci', 'ty": "Par', 'is"}', "<|call|>",
    ],
    [
        "<|channel|>analysis<|message|>", "It is sunny.",
        "<|end|><|start|>assistant<|channel|>final<|message|>",
        "Sunny in P", "aris, 21 °C.", "<|return|>",
    ],
    ["<|channel|>final<|message|>", "You're wel", "come!", "<|return|>"],
]


@pytest.fixture(scope="module")
def script():
    """The scripted completions' ids: non-canonical, with every Harmony
    formatting token a single id."""
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if not base:
        pytest.fail("TIKTOKEN_ENCODINGS_BASE is unset: run `source scripts/env.sh` first "
                    "(tito and openai_harmony load o200k_base.tiktoken from it)")
    if not (pathlib.Path(base) / "o200k_base.tiktoken").is_file():
        pytest.fail(f"no o200k_base.tiktoken in TIKTOKEN_ENCODINGS_BASE={base}: "
                    "run scripts/fetch-tokenizers.sh")
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/gptoss: run scripts/fetch-tokenizers.sh")
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    for text, want in SPECIAL.items():
        assert enc.encode(text, allowed_special="all") == [want], text
    assert sorted(enc.stop_tokens_for_assistant_actions()) == STOP_IDS
    out = []
    for parts in PARTS:
        ids = [i for p in parts for i in enc.encode(p, allowed_special="all")]
        text = enc.decode(ids)
        assert text == "".join(parts)
        assert enc.encode(text, allowed_special="all") != ids, f"canonical: {parts}"
        assert ids[-1] in STOP_IDS
        out.append(ids)
    harness.build()
    return out


def gateway(script):
    return harness.mock_gateway(TOKENIZER, STOP_IDS, script=script, model_extra=HARMONY)


def get_weather_impl(arguments):
    return WEATHER[json.loads(arguments)["city"]]


def check_export(addr, tid, script):
    row = harness.assert_one_exact_sample(addr, tid, script, "chat")
    sampled = [i for i, m in zip(row["response_ids"], row["response_mask"]) if m == 1]
    assert sampled == script[0] + script[1] + script[2]
    return row


# --- The OpenAI SDK ---


def sdk_client(addr, tid):
    return OpenAI(base_url=f"http://{addr}/t/{tid}/v1", api_key="unused", max_retries=0)


def test_openai_sdk_three_turns(script):
    tid = "oss-sdk"
    with gateway(script) as addr:
        client = sdk_client(addr, tid)
        messages = [{"role": "user", "content": QUESTION}]

        r1 = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        c1 = r1.choices[0]
        assert c1.finish_reason == "tool_calls", r1.model_dump()
        m1 = c1.message
        assert m1.role == "assistant"
        assert m1.content is None, r1.model_dump()
        assert m1.model_extra.get("reasoning_content") == REASONING[0], r1.model_dump()
        assert m1.model_dump()["reasoning_content"] == REASONING[0]
        assert len(m1.tool_calls) == 1, r1.model_dump()
        call = m1.tool_calls[0]
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        # The cookbook loop: the SDK's message as it came, then the result.
        messages.append(m1)
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": get_weather_impl(call.function.arguments)})

        r2 = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        c2 = r2.choices[0]
        assert c2.finish_reason == "stop", r2.model_dump()
        assert c2.message.content == ANSWER
        assert c2.message.model_extra.get("reasoning_content") == REASONING[1], r2.model_dump()
        assert not c2.message.tool_calls
        messages.append(c2.message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": FOLLOW_UP})

        r3 = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        c3 = r3.choices[0]
        assert c3.finish_reason == "stop", r3.model_dump()
        assert c3.message.content == THANKS
        assert not c3.message.model_extra.get("reasoning_content")
        assert not c3.message.tool_calls
        assert r3.usage.completion_tokens == len(script[2])

        check_export(addr, tid, script)


def stream_turn(client, messages):
    """One streamed call, assembled as a client does: the message (content,
    reasoning_content, tool_calls by index) and the finish reason."""
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, stream=True,
        stream_options={"include_usage": True},
    )
    content, reasoning, calls, finish, usage, roles = "", "", {}, None, None, set()
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            assert c.index == 0
            d = c.delta
            if d.role:
                roles.add(d.role)
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                if tc.id:
                    assert slot["id"] in (None, tc.id), "one id per call"
                    slot["id"] = tc.id
                if tc.type:
                    assert tc.type == "function"
                if tc.function:
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert roles == {"assistant"}
    message = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        assert sorted(calls) == list(range(len(calls)))
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish, usage


def test_openai_sdk_three_turns_streamed(script):
    tid = "oss-sdk-stream"
    with gateway(script) as addr:
        client = sdk_client(addr, tid)
        messages = [{"role": "user", "content": QUESTION}]

        m1, finish, usage = stream_turn(client, messages)
        assert finish == "tool_calls", m1
        assert m1["content"] is None, m1
        assert m1.get("reasoning_content") == REASONING[0], m1
        assert len(m1.get("tool_calls", [])) == 1, m1
        call = m1["tool_calls"][0]
        assert call["id"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert usage.completion_tokens == len(script[0])
        messages.append(m1)
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": get_weather_impl(call["function"]["arguments"])})

        m2, finish, usage = stream_turn(client, messages)
        assert finish == "stop", m2
        assert m2 == {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING[1]}
        assert usage.completion_tokens == len(script[1])
        messages.append(m2)
        messages.append({"role": "user", "content": FOLLOW_UP})

        m3, finish, usage = stream_turn(client, messages)
        assert finish == "stop", m3
        assert m3 == {"role": "assistant", "content": THANKS}
        assert usage.completion_tokens == len(script[2])

        check_export(addr, tid, script)


# --- LangChain ---


def make_agent(llm, tools):
    """LangGraph's prebuilt ReAct agent (as test_langchain_agent.py makes it)."""
    try:
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(llm, tools)
    except ImportError:  # newer LangChain moved the prebuilt agent
        from langchain.agents import create_agent

        return create_agent(llm, tools)


@tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    return WEATHER[city]


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
def test_langchain_react_agent_three_turns(script, streaming):
    tid = f"oss-langchain-{'stream' if streaming else 'plain'}"
    with gateway(script) as addr:
        llm = ChatOpenAI(base_url=f"http://{addr}/t/{tid}/v1", api_key="unused", model=MODEL,
                         temperature=0, max_retries=0, streaming=streaming)
        agent = make_agent(llm, [get_weather])

        # One run: the tool call, the tool, the answer (two LLM calls).
        result = agent.invoke({"messages": [("user", QUESTION)]})
        msgs = result["messages"]
        assert [m.type for m in msgs] == ["human", "ai", "tool", "ai"], msgs
        call_msg = msgs[1]
        assert [(c["name"], c["args"]) for c in call_msg.tool_calls] == [
            ("get_weather", {"city": "Paris"})], call_msg
        assert msgs[2].content == WEATHER["Paris"]
        assert msgs[2].tool_call_id == call_msg.tool_calls[0]["id"]
        assert msgs[3].content == ANSWER
        assert not msgs[3].tool_calls

        # A follow-up on the same history: the third LLM call.
        result = agent.invoke({"messages": msgs + [("user", FOLLOW_UP)]})
        msgs = result["messages"]
        assert [m.type for m in msgs] == ["human", "ai", "tool", "ai", "human", "ai"], msgs
        assert msgs[-1].content == THANKS
        assert not msgs[-1].tool_calls

        check_export(addr, tid, script)
