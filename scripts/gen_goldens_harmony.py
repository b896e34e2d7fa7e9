#!/usr/bin/env python3
"""Writes the gpt-oss (Harmony format) golden fixtures from OpenAI's own
renderer / parser, the PyPI package `openai-harmony`.

tests/fixtures/goldens/gpt_oss.json: a list of prompt cases
{name, messages, tools, chat_template_kwargs, add_generation_prompt, text, ids}.
`messages` and `tools` are OpenAI Chat Completions requests; they are mapped to
Harmony messages by `chat_to_harmony_messages` (vLLM's mapping, with tito's
fixed conversation start date from `chat_template_kwargs`) and rendered with
`render_conversation_for_completion(conv, Role.ASSISTANT)` when
add_generation_prompt, else `render_conversation(conv)`, both with harmony's
default config (auto_drop_analysis=True, a no-op after the mapping's own
drop). `text` is `decode_utf8(ids)`, for reading only; `ids` is the golden.

tests/fixtures/goldens/gpt_oss_parse.json: a list of completion cases
{name, how, ids, text, messages}: the token ids a model samples after the
prompt's `<|start|>assistant`, and what
`parse_messages_from_completion_tokens(ids, Role.ASSISTANT)` makes of them, as
messages [{channel, recipient, content_type, text}]. The ids are
`encoding.render(Message)` of assistant messages, concatenated, with two
changes recorded in each case's `how`: the leading `<|start|>` and `assistant`
tokens of the first message are dropped (the prompt already holds them, so a
sampled completion starts at `<|channel|>`), and a completion ending on the
final channel ends in `<|return|>` (the stop token the model samples) where
render() writes `<|end|>`. One case is instead `encode(text,
allowed_special="all")` of the form gpt-oss itself samples for tool calls,
with the recipient after the channel (render() puts it in the role header).

Both packages read o200k_base.tiktoken from $TIKTOKEN_ENCODINGS_BASE
(scripts/env.sh; built by scripts/fetch-tokenizers.sh), with no network.

Run: scripts/setup-python.sh && scripts/fetch-tokenizers.sh &&
     source scripts/env.sh && .venv/bin/python scripts/gen_goldens_harmony.py
"""

import json
import os
import sys
from pathlib import Path

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "goldens"

REASONING_EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def flatten_text(content):
    """A Chat Completions content as one string: a string as is, the
    concatenated `text` of the `type: "text"` parts of a list, "" for None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def reasoning_of(msg):
    """The first present of `reasoning_content`, `reasoning`, `thinking`."""
    for key in ("reasoning_content", "reasoning", "thinking"):
        if msg.get(key) is not None:
            return msg[key]
    return None


def chat_to_harmony_messages(messages, tools, kwargs):
    """Maps an OpenAI Chat Completions request (messages, tools,
    chat_template_kwargs) to the list of Harmony messages gpt-oss is prompted with.

    It follows vLLM's vllm/entrypoints/openai/parser/harmony_utils.py
    (`build_harmony_preamble` / `get_system_message` / `get_developer_message`,
    `parse_chat_input_to_harmony_message`, `auto_drop_analysis_messages`), with
    tito's fixed date instead of today's:

    - a system message `SystemContent.new()` with only the reasoning effort
      (`reasoning_effort`: low | medium | high, default medium) and
      `conversation_start_date` set;
    - when the first message is system or developer, its text is the developer
      instructions and it leaves the list; a developer message
      (`DeveloperContent.new()`, `.with_instructions(text)` when the text is
      non-empty, `.with_function_tools([...])` for the `type: "function"` tools
      when there are any) follows only if there are instructions or tools;
    - assistant with tool calls: its content (non-empty) on channel
      `commentary`, then its reasoning (non-empty) on `analysis`, then one
      message per call: the `arguments` string to `functions.NAME` on
      `commentary`, content type `json`;
    - tool: author tool named `functions.NAME` (NAME of the earlier call whose
      id is `tool_call_id`, else the message's `name`, else ""), channel
      `commentary`, recipient `assistant`;
    - assistant without tool calls: reasoning (non-empty) on `analysis`,
      content (non-empty) on `final`;
    - a later system or developer message: a plain text message of its role
      (as vLLM's chat_completion harmony conversion keeps it); user: a user
      message;
    - finally every `analysis` message before the last assistant `final` one
      is dropped.

    Where tito reads more than vLLM: reasoning under `reasoning_content` and
    `thinking` too (tito serves `reasoning_content`), and a tool result's
    `name` when its `tool_call_id` names no call.
    """
    kwargs = kwargs or {}
    effort = REASONING_EFFORT[kwargs.get("reasoning_effort", "medium")]
    date = kwargs["conversation_start_date"]
    out = [
        Message.from_role_and_content(
            Role.SYSTEM, SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(date)
        )
    ]

    rest = list(messages)
    instructions = None
    if rest and rest[0]["role"] in ("system", "developer"):
        instructions = flatten_text(rest[0].get("content"))
        rest = rest[1:]
    function_tools = [
        ToolDescription.new(
            t["function"]["name"], t["function"].get("description") or "", t["function"].get("parameters")
        )
        for t in (tools or [])
        if t.get("type") == "function"
    ]
    if instructions or function_tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if function_tools:
            dev = dev.with_function_tools(function_tools)
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))

    call_names = {}
    for msg in rest:
        role = msg["role"]
        text = flatten_text(msg.get("content"))
        if role == "assistant" and msg.get("tool_calls"):
            if text:
                out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
            reasoning = reasoning_of(msg)
            if reasoning:
                out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
            for call in msg["tool_calls"]:
                name = call["function"]["name"]
                call_names[call.get("id")] = name
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, call["function"].get("arguments") or "")
                    .with_channel("commentary")
                    .with_recipient(f"functions.{name}")
                    .with_content_type("json")
                )
        elif role == "assistant":
            reasoning = reasoning_of(msg)
            if reasoning:
                out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
            if text:
                out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
        elif role == "tool":
            name = call_names.get(msg.get("tool_call_id")) or msg.get("name") or ""
            out.append(
                Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), text)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        elif role in ("system", "developer"):
            out.append(Message.from_role_and_content(Role(role), text or ""))
        elif role == "user":
            out.append(Message.from_role_and_content(Role.USER, text))
        else:
            raise SystemExit(f"unknown role {role!r}")

    last_final = max(
        (i for i, m in enumerate(out) if m.author.role == Role.ASSISTANT and m.channel == "final"), default=-1
    )
    return [m for i, m in enumerate(out) if not (i < last_final and m.channel == "analysis")]


# OpenAI Chat Completions helpers ------------------------------------------


def sys_(text):
    return {"role": "system", "content": text}


def dev(text):
    return {"role": "developer", "content": text}


def user(text):
    return {"role": "user", "content": text}


def asst(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def tool(text, call_id, **extra):
    return {"role": "tool", "tool_call_id": call_id, "content": text, **extra}


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


DATE = "2026-01-15"


def case(name, messages, tools=None, add_generation_prompt=True, effort=None, date=DATE):
    kwargs = {"conversation_start_date": date}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    return {
        "name": name,
        "messages": messages,
        "tools": tools,
        "chat_template_kwargs": kwargs,
        "add_generation_prompt": add_generation_prompt,
    }


UNICODE = (
    "你好，世界！日本語のテキスト。한국어. Ελληνικά, café naïve Ångström, e\u0301 combining, "
    "emoji 👋🏽🎉🇫🇷 ZWJ 👩‍💻; RTL: مرحبا بالعالم, שלום עולם."
)
SPECIAL_TEXT = (
    "Literal markers typed by a user: <|start|>assistant<|channel|>final<|message|>hi<|end|> "
    "<|return|> <|call|> <|constrain|>json <|endoftext|> to=functions.x"
)
CODE_WS = (
    "Fix this:\n```python\ndef fib(n):\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n```\n\n\n\ntabs\t\tand  two   three    spaces"
    "     \n   trailing   \r\n CRLF\n\n"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns snippets.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "filters": {
                    "type": "object",
                    "description": "Optional filters",
                    "properties": {
                        "site": {"type": "string"},
                        "lang": {"type": "string", "enum": ["en", "fr", "ja"]},
                        "after": {"type": "string", "description": "ISO date"},
                    },
                },
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to match"},
                "exact": {"type": "boolean"},
                "boost": {"type": ["number", "null"]},
            },
            "required": ["query"],
        },
    },
}
NOW_TOOL = {"type": "function", "function": {"name": "now", "description": "The current time."}}
EMPTY_PARAMS_TOOL = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL, NOW_TOOL, EMPTY_PARAMS_TOOL]


def prompt_cases():
    tool_turn = [
        user("Weather in Paris and Tokyo?"),
        asst(
            None,
            tool_calls=[
                call("get_weather", '{"city": "Paris", "unit": "celsius"}', "c1"),
                call("get_weather", '{"city": "東京"}', "c2"),
            ],
        ),
        tool('{"temp": 21.5, "sky": "clear"}', "c1"),
        tool('{"temp": 18, "sky": "rain 🌧"}', "c2"),
    ]
    return [
        case("user_only", [user("Hello!")]),
        case("system_user", [sys_("You are terse."), user("Hi.")]),
        case("developer_instructions", [dev("Answer in French.\nBe brief."), user("Good morning.")]),
        case("tools_schema", [sys_("Use tools when useful."), user("Search for rust jinja.")], tools=TOOLS),
        case("tools_without_instructions", [user("What time is it?")], tools=[NOW_TOOL, WEATHER_TOOL]),
        case(
            "tool_call_and_result",
            [
                user("Weather in Berlin?"),
                asst("", tool_calls=[call("get_weather", '{"city":"Berlin"}', "call_1")]),
                tool('{"temp": 12}', "call_1"),
            ],
            tools=[WEATHER_TOOL],
        ),
        case(
            "parallel_tool_calls_then_answer",
            tool_turn + [asst("Paris: 21.5°C, clear. Tokyo: 18°C, rain."), user("Thanks! And tomorrow?")],
            tools=[WEATHER_TOOL],
        ),
        case(
            "tool_call_with_preamble_and_reasoning",
            [
                user("Find the rust jinja crate."),
                asst(
                    "Let me search.",
                    reasoning_content="The user wants a crate; call search.",
                    tool_calls=[call("search", '{"query": "rust jinja", "tags": ["crate"], "exact": false}', "s1")],
                ),
                tool("minijinja: a Jinja2 engine for Rust", "s1"),
            ],
            tools=TOOLS,
        ),
        case(
            "tool_result_name_fallback",
            [
                user("Ping it."),
                asst("", tool_calls=[call("ping", "{}", "p1")]),
                {"role": "tool", "name": "ping", "content": "pong"},
                {"role": "tool", "content": [{"type": "text", "text": "no id, no name"}]},
            ],
            tools=TOOLS,
        ),
        case(
            "reasoning_before_final_dropped_after_kept",
            [
                user("17*23?"),
                asst("391", reasoning_content="17*23 = 340 + 51 = 391."),
                user("Weather in Oslo?"),
                asst(
                    None,
                    reasoning="Need the weather tool.",
                    tool_calls=[call("get_weather", '{"city":"Oslo"}', "o1")],
                ),
                tool('{"temp": -3}', "o1"),
            ],
            tools=[WEATHER_TOOL],
        ),
        case(
            "several_final_turns",
            [
                sys_("You are a calculator."),
                user("1+1?"),
                asst("2", thinking="Trivial."),
                user("2+2?"),
                asst("4", reasoning_content="Also trivial."),
                user("3+3?"),
                asst("6"),
                user("4+4?"),
            ],
        ),
        case("reasoning_effort_low", [user("Quick: capital of France?")], effort="low"),
        case("reasoning_effort_high", [sys_("Think carefully."), user("Prove √2 is irrational.")], effort="high",
             date="2025-08-05"),
        case("unicode", [user(UNICODE), asst("¡Hola! 😊 — «ok»"), user("Merci, à bientôt ✨")]),
        case("special_token_text", [user(SPECIAL_TEXT)]),
        case("whitespace_and_code", [user(CODE_WS), asst("```python\nprint('ok')\n```\n"), user("  thanks  ")]),
        case(
            "no_generation_prompt",
            [sys_("You are terse."), user("Hi."), asst("Hello.", reasoning_content="Greet back.")],
            add_generation_prompt=False,
        ),
        case(
            "no_generation_prompt_ends_in_tool_call",
            [user("Weather in Rome?"), asst("", tool_calls=[call("get_weather", '{"city":"Rome"}', "r1")])],
            tools=[WEATHER_TOOL],
            add_generation_prompt=False,
        ),
        case(
            "content_parts",
            [
                {"role": "system", "content": [{"type": "text", "text": "System "}, {"type": "text", "text": "as parts."}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "  part one "}, {"type": "text", "text": "part two"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Parts "}, {"type": "text", "text": "back."}]},
                {"role": "user", "content": [{"type": "text", "text": "ok"}]},
            ],
        ),
        case(
            "system_mid_conversation",
            [user("Hi"), asst("Hello"), sys_("Now answer in German."), dev("And be formal."), user("How are you?")],
        ),
    ]


def render_prompt(enc, c):
    msgs = chat_to_harmony_messages(c["messages"], c["tools"], c["chat_template_kwargs"])
    conv = Conversation.from_messages(msgs)
    if c["add_generation_prompt"]:
        ids = enc.render_conversation_for_completion(conv, Role.ASSISTANT)
    else:
        ids = enc.render_conversation(conv)
    return [int(i) for i in ids]


# Completions --------------------------------------------------------------


def a(text, channel, recipient=None, content_type=None):
    m = Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)
    if recipient is not None:
        m = m.with_recipient(recipient)
    if content_type is not None:
        m = m.with_content_type(content_type)
    return m


def completion_from_messages(enc, name, messages):
    start, assistant, end, ret = (enc.encode(t, allowed_special="all") for t in
                                  ("<|start|>", "assistant", "<|end|>", "<|return|>"))
    ids = [i for m in messages for i in enc.render(m)]
    assert ids[:2] == start + assistant, ids[:4]
    ids = ids[2:]
    how = "render(messages), leading <|start|> assistant dropped"
    if messages[-1].channel == "final":
        assert ids[-1:] == end
        ids = ids[:-1] + ret
        how += ", final <|end|> replaced by <|return|>"
    return {"name": name, "how": how, "ids": ids}


def completion_cases(enc):
    cases = [
        completion_from_messages(enc, "analysis_then_final", [
            a("The user asks 2+2. Simple.", "analysis"),
            a("2 + 2 = 4.", "final"),
        ]),
        completion_from_messages(enc, "analysis_then_tool_call_constrain_json", [
            a("Need the weather tool.", "analysis"),
            a('{"city":"Paris","unit":"celsius"}', "commentary", "functions.get_weather", "<|constrain|>json"),
        ]),
        completion_from_messages(enc, "analysis_then_tool_call_json", [
            a("Need the weather tool.", "analysis"),
            a('{"city":"東京"}', "commentary", "functions.get_weather", "json"),
        ]),
        completion_from_messages(enc, "preamble_then_tool_call", [
            a("Let me check the weather.", "commentary"),
            a('{"city":"Oslo"}', "commentary", "functions.get_weather", "<|constrain|>json"),
        ]),
        completion_from_messages(enc, "final_only", [a("Bonjour ! 👋 <|end|> is just text here.", "final")]),
    ]
    text = ('<|channel|>analysis<|message|>Call the tool.<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}<|call|>')
    cases.append({
        "name": "tool_call_recipient_in_channel",
        "how": "encode(text, allowed_special='all') of the form gpt-oss samples: recipient after the channel",
        "ids": enc.encode(text, allowed_special="all"),
    })
    for c in cases:
        c["ids"] = [int(i) for i in c["ids"]]
        c["text"] = enc.decode_utf8(c["ids"])
        parsed = enc.parse_messages_from_completion_tokens(c["ids"], Role.ASSISTANT)
        c["messages"] = [
            {
                "channel": m.channel,
                "recipient": m.recipient,
                "content_type": m.content_type,
                "text": "".join(p.text for p in m.content),
            }
            for m in parsed
        ]
    return cases


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path.relative_to(ROOT)}: {len(value)} cases")


def main():
    base = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if not base or not (Path(base) / "o200k_base.tiktoken").is_file():
        sys.exit("TIKTOKEN_ENCODINGS_BASE must hold o200k_base.tiktoken: run scripts/fetch-tokenizers.sh "
                 "and source scripts/env.sh")
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    cases = prompt_cases()
    for c in cases:
        c["ids"] = render_prompt(enc, c)
        c["text"] = enc.decode_utf8(c["ids"])
        # Field order: the request, then the golden.
        c["ids"] = c.pop("ids")
    OUT.mkdir(parents=True, exist_ok=True)
    write_json(OUT / "gpt_oss.json", cases)
    write_json(OUT / "gpt_oss_parse.json", completion_cases(enc))


if __name__ == "__main__":
    main()
