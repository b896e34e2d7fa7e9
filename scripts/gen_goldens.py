#!/usr/bin/env python3
"""Writes golden chat-template fixtures from Python transformers.

For every tokenizer fetched by scripts/fetch-tokenizers.sh into
.cache/tokenizers/<name>/, renders a set of conversations with
`AutoTokenizer.from_pretrained(dir).apply_chat_template(..., tokenize=True)`
and writes tests/fixtures/goldens/<name>.json: a list of cases
{name, messages, tools, add_generation_prompt, chat_template_kwargs,
reference, expect_error, text, ids}; for `expect_error` cases transformers
fails (text holds its error, ids are empty) and tito must fail too. tests/render_goldens.rs checks that tito's renderer
gives exactly these ids.

tests/fixtures/goldens/encode/<name>.json holds plain-text encodings
(`encode(text)` with and without the tokenizer's special tokens), as used for
`/v1/completions` string prompts.

`reference` says what produced the golden: "transformers" (apply_chat_template)
or "jinja2" for the few cases transformers cannot express: transformers 5.x
drops message keys whose value is None before rendering, and the DeepSeek V3
template renders tool calls only when content is None. Those cases are rendered
with transformers' own jinja2 environment but without that None-dropping, then
tokenized with `encode(text, add_special_tokens=False)` as transformers does.

Run: scripts/setup-python.sh && scripts/fetch-tokenizers.sh &&
     .venv/bin/python scripts/gen_goldens.py
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "tokenizers"
OUT = ROOT / "tests" / "fixtures" / "goldens"


def sys_(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


def asst(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def tool(text, **extra):
    return {"role": "tool", "content": text, **extra}


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def case(name, messages, tools=None, add_generation_prompt=True, kwargs=None, reference="transformers",
         expect_error=False):
    return {
        "name": name,
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": add_generation_prompt,
        "chat_template_kwargs": kwargs,
        "reference": reference,
        "expect_error": expect_error,
    }


# Texts that stress the tokenizer rather than the template.
UNICODE = "你好，世界！日本語のテキスト。Ελληνικά, café naïve Ångström, emoji 👋🏽🎉🇫🇷 and ZWJ 👩‍💻."
CODE = (
    "Fix this:\n```python\ndef fib(n):\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n```\n"
    "and `x = {'a': 1}`; <div class=\"x\">&amp;</div>"
)
WHITESPACE = "  leading spaces\ttab\t\tdouble tab\n\n\n\nmany newlines     five spaces \r\n CRLF  \n   "
DIGITS = "Numbers: 1 12 123 1234 12345 1234567890, 3.14159, -42, 1e-7, 2026-11-22T17:37:04Z, 0x1F, 1,000,000."
SCRIPTS = (
    "Combining: e\u0301 a\u0308 (NFC changes these); NBSP:\u00a0x; ideographic space:\u3000y; "
    "zero-width:\u200bz; full-width: ＡＢＣ１２３; Arabic: مرحبا بالعالم; Hebrew: שלום; "
    "Devanagari: नमस्ते; Thai: สวัสดี; Korean: 안녕하세요; math: ∑∫√∞ ≤ ≥; form feed:\f; CR only:\rend"
)
SPECIAL_TEXT = "Literal markers typed by a user: <|im_start|> <|im_end|> <|eot_id|> <start_of_turn> </think>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Température en °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns \"snippets\" with a \\score.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number", "default": 2.5},
                "filters": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def qwen3_cases():
    conv = [sys_("You are a helpful assistant."), user("What is 2+2?"), asst("2+2 = 4."), user("And 3+3?")]
    tool_turn = [
        user("Weather in Paris and Tokyo?"),
        asst(
            "",
            tool_calls=[
                call("get_weather", {"city": "Paris", "unit": "celsius"}, "c1"),
                call("get_weather", '{"city": "東京"}', "c2"),
            ],
        ),
        tool('{"temp": 21.5, "sky": "clear"}', tool_call_id="c1"),
        tool('{"temp": 18, "sky": "rain 🌧"}', tool_call_id="c2"),
    ]
    return [
        case("user_only", [user("Hello!")]),
        case("system_user", [sys_("You are terse."), user("Hi.")]),
        case("multi_turn", conv),
        case("no_generation_prompt", conv + [asst("6.")], add_generation_prompt=False),
        case("enable_thinking_false", [user("Quick answer: capital of France?")], kwargs={"enable_thinking": False}),
        case("enable_thinking_true", [user("Think about it: 17*23?")], kwargs={"enable_thinking": True}),
        case(
            "reasoning_content_in_history",
            [
                user("17*23?"),
                asst("391", reasoning_content="17*23 = 17*20 + 17*3 = 340 + 51 = 391."),
                user("And 18*23?"),
            ],
        ),
        case(
            "think_tags_in_history",
            [user("Hi"), asst("<think>\nThe user greets.\n</think>\n\nHello there!"), user("Bye")],
        ),
        case(
            "think_tags_last_assistant",
            [user("Hi"), asst("<think>\nGreeting back.\n</think>\n\nHello!")],
            add_generation_prompt=False,
        ),
        case(
            "reasoning_after_last_query",
            [
                user("Weather in Paris?"),
                asst(
                    "",
                    reasoning_content="I should call the tool.",
                    tool_calls=[call("get_weather", {"city": "Paris"}, "c1")],
                ),
                tool("sunny"),
            ],
            tools=TOOLS,
        ),
        case("tools_no_system", [user("What's the weather in Berlin?")], tools=TOOLS),
        case("tools_with_system", [sys_("Use tools when useful."), user("Search for rust jinja.")], tools=TOOLS),
        case("tool_calls_and_results", tool_turn, tools=TOOLS),
        case(
            "tool_calls_then_answer",
            tool_turn + [asst("Paris: 21.5°C clear; Tokyo: 18°C rain.")],
            tools=TOOLS,
            add_generation_prompt=False,
        ),
        case(
            "tool_call_with_content",
            [
                user("Search please"),
                asst(
                    "Let me search.",
                    tool_calls=[
                        call("search", {"query": "naïve «quotes» \"and\" \\slashes\n", "limit": 3, "w": 0.1,
                                        "tiny": 1e-7, "big": 1e21, "nested": {"a": [1, 2.0, None, True]}}, "s1")
                    ],
                ),
                tool("<tool_response>not really</tool_response>"),
                user("<tool_response>\nfake\n</tool_response>"),
            ],
            tools=[SEARCH_TOOL],
        ),
        case("unicode", [user(UNICODE)]),
        case("code_block", [user(CODE), asst("```python\nprint('ok')\n```"), user("thanks")]),
        case("whitespace_runs", [user(WHITESPACE)]),
        case("scripts_and_normalization", [user(SCRIPTS)]),
        case("digits", [user(DIGITS)]),
        case("special_token_text", [user(SPECIAL_TEXT)]),
        case("empty_user", [user("")]),
        # OpenAI clients send content null with tool calls; transformers drops the
        # key and this template then fails (plain jinja2 fails on None as well).
        case(
            "tool_call_content_null_fails",
            [user("Hi"), asst(None, tool_calls=[call("search", {"query": "x"}, "c1")])],
            tools=TOOLS,
            expect_error=True,
        ),
        case(
            "system_mid_conversation",
            [sys_("First."), user("Hi"), asst("Hello"), sys_("Now answer in German."), user("How are you?")],
        ),
        case(
            "long_agent_loop",
            [sys_("You are an agent.")]
            + [m for i in range(8) for m in (
                user(f"Task {i}: list files in dir_{i}") if i == 0 else tool(f"file_{i}.txt\nfile_{i}b.md"),
                asst("", tool_calls=[call("search", {"query": f"dir_{i}", "limit": i}, f"t{i}")]),
            )]
            + [tool("done"), asst("All listed."), user("Thanks! Summarize.")],
            tools=TOOLS,
            kwargs={"enable_thinking": False},
        ),
    ]


def llama3_1_cases():
    conv = [sys_("You are a pirate."), user("Hello"), asst("Ahoy!"), user("Where is the treasure?")]
    return [
        case("user_only", [user("Hello!")]),
        case("system_user", [sys_("Be brief."), user("Hi.")]),
        case("multi_turn", conv),
        case("no_generation_prompt", conv + [asst("Buried, matey.")], add_generation_prompt=False),
        case("trimmed_content", [user("   padded on both sides \n\n"), asst("\n ok \t")], add_generation_prompt=False),
        case("unicode", [user(UNICODE)]),
        case("code_block", [user(CODE)]),
        case("whitespace_runs", [user(WHITESPACE)]),
        case("scripts_and_normalization", [user(SCRIPTS)]),
        case("digits", [user(DIGITS)]),
        case("special_token_text", [user(SPECIAL_TEXT)]),
    ]


def deepseek_v3_cases():
    conv = [sys_("You are DeepSeek."), user("Hello"), asst("Hi! How can I help?"), user("Tell me a joke.")]
    return [
        case("user_only", [user("Hello!")]),
        case("two_system_prompts", [sys_("First rule."), sys_("Second rule."), user("Go.")]),
        case("multi_turn", conv),
        case("no_generation_prompt", conv + [asst("Why did the GPU cross the road?")], add_generation_prompt=False),
        case("unicode", [user(UNICODE)]),
        case("cjk_long", [user("深度求索是一家人工智能公司。東京タワーは高い。ひらがなとカタカナ。")]),
        case("code_block", [user(CODE)]),
        case("whitespace_runs", [user(WHITESPACE)]),
        case("scripts_and_normalization", [user(SCRIPTS)]),
        case("digits", [user(DIGITS)]),
        case(
            "tool_call_single",
            [
                user("Weather in Paris?"),
                asst(None, tool_calls=[call("get_weather", '{"city": "Paris"}', "c1")]),
                tool('{"temp": 21}'),
                asst("It is 21°C in Paris."),
            ],
            tools=TOOLS,
            add_generation_prompt=False,
            reference="jinja2",
        ),
        case(
            "tool_calls_two_then_results",
            [
                user("Weather in Paris and Tokyo?"),
                asst(
                    None,
                    tool_calls=[
                        call("get_weather", '{"city": "Paris"}', "c1"),
                        call("get_weather", '{"city": "東京"}', "c2"),
                    ],
                ),
                tool('{"temp": 21}'),
                tool('{"temp": 18}'),
            ],
            tools=TOOLS,
            reference="jinja2",
        ),
    ]


def gemma3_cases():
    conv = [sys_("You are Gemma."), user("Hello"), asst("Hi there!"), user("What is 1+1?")]
    return [
        case("user_only", [user("Hello!")]),
        case("system_user", [sys_("Answer in French."), user("Good morning.")]),
        case("multi_turn", conv),
        case("no_generation_prompt", conv + [asst("2")], add_generation_prompt=False),
        case(
            "content_parts",
            [
                {"role": "system", "content": [{"type": "text", "text": "System as parts."}]},
                {"role": "user", "content": [{"type": "text", "text": "  part one "}, {"type": "text", "text": "part two"}]},
            ],
        ),
        case("unicode", [user(UNICODE)]),
        case("code_block", [user(CODE), asst("Here:\n```python\nprint(1)\n```"), user("ok")]),
        case("whitespace_runs", [user(WHITESPACE)]),
        case("scripts_and_normalization", [user(SCRIPTS)]),
        case("digits", [user(DIGITS)]),
        case("special_token_text", [user(SPECIAL_TEXT)]),
        case(
            "reasoning_like_text",
            [user("What is 2+2?"), asst("<think>\nAdd them.\n</think>\n\n2+2 = 4."), user("And 3+3?")],
        ),
        # Gemma 3's template has no tool calling: `tools` must change nothing.
        case("tools_ignored", [sys_("You are Gemma."), user("Weather in Paris?")], tools=TOOLS),
        case("roles_must_alternate", [user("one"), user("two")], expect_error=True),
        case("assistant_first", [asst("Hi"), user("Hello")], expect_error=True),
    ]


CASES = {
    "qwen3": qwen3_cases,
    "llama3_1": llama3_1_cases,
    "deepseek_v3": deepseek_v3_cases,
    "gemma3": gemma3_cases,
}


def compile_like_transformers(template):
    """The template compiled in transformers' own jinja2 environment."""
    return _compile_jinja_template(template)


# Small templates exercising the Jinja features HF chat templates rely on,
# rendered by jinja2 in transformers' own template environment. Checked by the
# unit tests in src/render/ (no tokenizer needed). "error": true means jinja2
# raised, and tito must fail too.
MSGS = [sys_("S"), user("U1"), asst("A1"), user("U2")]
SNIPPETS = [
    ("loop_controls", "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.role }};"
     "{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}", {"messages": MSGS}),
    ("loop_vars", "{% for m in messages %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex0 }}"
     "{{ '^' if loop.first }}{{ '$' if loop.last }}{% if not loop.first %}<{{ loop.previtem.role }}{% endif %}"
     "{% if not loop.last %}>{{ loop.nextitem.role }}{% endif %} {% endfor %}", {"messages": MSGS}),
    ("namespace", "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% if m.role == 'user' %}"
     "{% set ns.n = ns.n + 1 %}{% set ns.last = m.content %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.last }}",
     {"messages": MSGS}),
    ("is_tests", "{% for x in [s, d, l, n, f, b, none] %}{{ x is string }},{{ x is mapping }},{{ x is sequence }},"
     "{{ x is iterable }},{{ x is number }},{{ x is boolean }},{{ x is none }},{{ x is defined }};{% endfor %}"
     "{{ missing is defined }},{{ missing is none }},{{ d.nokey is defined }}",
     {"s": "str", "d": {"a": 1}, "l": [1, 2], "n": 3, "f": 1.5, "b": True}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('a') }}|{{ d.get('zz', 'dflt') }}"
     "|{{ d.get('zz') }}|{{ d.keys() | list | join(',') }}|{{ d.values() | list | length }}|{{ 'a' in d }}",
     {"d": {"b": "x", "a": 1, "c": [1]}}),
    ("dictsort_and_items_filter", "{% for k, v in d | dictsort %}{{ k }}:{{ v }} {% endfor %}{% for k, v in d | items %}"
     "{{ k }} {% endfor %}", {"d": {"b": 2, "a": 1}}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|{{ s.split() | join('+') }}"
     "|{{ s.split('x', 1) | join('+') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ t.capitalize() }}"
     "|{{ s.replace('x', 'Y') }}|{{ s.startswith('  x') }}|{{ s.endswith('x  ') }}|{{ s.find('b') }}|{{ s.count('x') }}"
     "|{{ ','.join(['p', 'q']) }}|{{ t.splitlines() | length }}",
     {"s": "  xa b cx  ", "t": "hello world\nline two"}),
    ("print_python_values", "{{ none }}|{{ true }}|{{ false }}|{{ l }}|{{ d }}|{{ f }}|{{ g }}|{{ h }}|{{ 3 / 2 }}|{{ 4 / 2 }}"
     "|{{ 7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 2 }}|{{ n | string }}|{{ e }}",
     {"l": ["a", 1, 2.5, None, True, {"k": "v'q"}], "d": {"x": [1]}, "f": 2.0, "g": 1e-7, "h": 123456789012345678.0,
      "n": 5, "e": "it's"}),
    ("tojson_variants", "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(indent=4, sort_keys=true) }}\n"
     "{{ v | tojson(separators=(',', ':')) }}\n{{ 'x<y & \\'z\\' \u00e9 \U0001F600' | tojson }}",
     {"v": {"b": [1, 2.5, None, {}], "a": "é\n\"", "e": [], "f": 1e-7, "g": 1e22, "h": -0.0, "i": 0.1}}),
    ("slicing_and_filters", "{{ messages[1:] | map(attribute='role') | join(',') }}|{{ messages[-1].content }}"
     "|{{ messages[::-1] | map(attribute='content') | join(',') }}|{{ (messages | first).role }}"
     "|{{ (messages | last).role }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
     "|{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}"
     "|{{ messages | length }}|{{ [3, 1, 2] | sort | join }}|{{ 'abc' | reverse }}|{{ [1, 2] + [3] }}",
     {"messages": MSGS}),
    ("whitespace_control", "{% for m in messages %}\n  {%- if m.role == 'user' %}\n    [{{ m.content }}]\n  {% endif %}\n"
     "{% endfor %}\n{{- ' end' }}\n", {"messages": MSGS}),
    ("trim_and_lstrip_blocks", "<ul>\n    {% for m in messages %}\n        <li>{{ m.role }}</li>\n    {% endfor %}\n</ul>\n",
     {"messages": MSGS[:2]}),
    ("macros", "{% macro render(m, prefix='>') %}{{ prefix }}{{ m.role | upper }}{% endmacro %}"
     "{% for m in messages %}{{ render(m) }}{{ render(m, prefix='#') }}{% endfor %}", {"messages": MSGS[:2]}),
    ("in_and_comparisons", "{{ '</think>' in s }}|{{ 'x' not in s }}|{{ 1 < 2 < 3 }}|{{ s == 'a</think>b' }}"
     "|{{ [1, 2] == [1, 2] }}|{{ none == none }}|{{ (1 if s else 2) }}|{{ s.split('</think>')[-1].lstrip('b') }}",
     {"s": "a</think>b"}),
    ("default_and_undefined", "{{ missing | default('d') }}|{{ none | default('d') }}|{{ none | default('d', true) }}"
     "|{{ '' | default('e', true) }}|{{ missing }}|{% if not missing %}falsy{% endif %}|{{ m.content | default('c') }}",
     {"m": {"role": "user"}}),
    ("set_block_and_filters", "{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{{ x | length }}|{{ 'a-b' | replace('-', '_') }}"
     "|{{ ' pad ' | trim }}|{{ 'Hi' | lower }}|{{ 3.7 | int }}|{{ '4' | int + 1 }}|{{ 2 | float }}|{{ -3 | abs }}"
     "|{{ [1, 5, 3] | max }}|{{ [1, 5, 3] | min }}|{{ [1, 2] | sum }}|{{ 'abc' | list | join('.') }}", {}),
    ("raise_exception", "{% if messages | length > 2 %}{{ raise_exception('too many messages') }}{% endif %}ok",
     {"messages": MSGS}),
    ("format_filter", "{{ '%s-%d' | format('a', 3) }}|{{ '%05.2f' | format(3.14159) }}", {}),
    ("mapping_content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
     "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %};{% endfor %}",
     {"messages": [user("plain"), {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "part"}]}]}),
    # None and missing keys: what a template may do with them, and what fails.
    ("none_concat_fails", "{{ 'a' + m.content }}", {"m": {"content": None}}),
    ("none_contains_fails", "{{ 'x' in m.content }}", {"m": {"content": None}}),
    ("undefined_concat_fails", "{{ 'a' + m.content }}", {"m": {}}),
    ("undefined_attribute_of_undefined_fails", "{{ m.content.text }}", {"m": {}}),
    ("undefined_lenient_uses", "{{ 'x' in m.content }}|{% for t in m.tool_calls %}t{% endfor %}|{{ m.content | length }}"
     "|{{ m.content | trim }}|{{ m.content is none }}|{{ m.content is string }}|{% if m.content %}y{% else %}n{% endif %}",
     {"m": {}}),
    ("none_values", "{{ m.content is none }}|{{ m.content is defined }}|{{ m.content }}|{% if m.content %}y{% else %}n{% endif %}"
     "|{{ m.content | default('d') }}", {"m": {"content": None}}),
    ("more_string_methods", "{{ s.rsplit(',', 1) }}|{{ s.rsplit(',') }}|{{ w.rsplit(none, 1) }}|{{ w.rsplit() }}"
     "|{{ w.rsplit(none, 0) }}|{{ s.removeprefix('a,') }}|{{ s.removesuffix(',d') }}|{{ s.removeprefix('zz') }}",
     {"s": "a,b,c,d", "w": "  one two\tthree  four  "}),
    ("generation_tags", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<{{ m.content }}>"
     "{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{%- generation -%}  x  {%- endgeneration %}\n{% endfor %}",
     {"messages": MSGS[1:3]}),
    ("dict_global_and_tuple", "{% set d = dict(a=1, b='x') %}{{ d.a }}{{ d['b'] }}|{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", {}),
]


def snippet_goldens():
    out = []
    for name, template, context in SNIPPETS:
        entry = {"name": name, "template": template, "context": context}
        try:
            entry["output"] = compile_like_transformers(template).render(**context)
            entry["error"] = False
        except Exception as e:  # the template raised: tito must raise too
            entry["output"] = f"{type(e).__name__}: {e}"
            entry["error"] = True
        out.append(entry)
    return out


def render_jinja2(tok, c):
    template = compile_like_transformers(tok.chat_template)
    variables = {**tok.special_tokens_map, **(c["chat_template_kwargs"] or {})}
    return template.render(
        messages=c["messages"],
        tools=c["tools"],
        add_generation_prompt=c["add_generation_prompt"],
        **variables,
    )


def golden(tok, c):
    kwargs = c["chat_template_kwargs"] or {}
    if c["expect_error"]:
        try:
            tok.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False,
                                    add_generation_prompt=c["add_generation_prompt"], **kwargs)
        except Exception as e:  # the golden is the failure itself
            return f"error: {type(e).__name__}: {e}", []
        raise SystemExit(f"{c['name']}: expected transformers to fail, it rendered")
    if c["reference"] == "jinja2":
        text = render_jinja2(tok, c)
        ids = tok.encode(text, add_special_tokens=False)
        return text, list(ids)
    common = dict(tools=c["tools"], add_generation_prompt=c["add_generation_prompt"], **kwargs)
    text = tok.apply_chat_template(c["messages"], tokenize=False, **common)
    out = tok.apply_chat_template(c["messages"], tokenize=True, **common)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    ids = [int(i) for i in ids]
    # transformers tokenizes the rendered text with add_special_tokens=False;
    # check that this is still what it does, so the golden text and ids agree.
    plain = list(tok.encode(text, add_special_tokens=False))
    if plain != ids:
        raise SystemExit(f"{c['name']}: apply_chat_template ids differ from encode(text); investigate")
    return text, ids


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path.relative_to(ROOT)}: {len(value)} cases")


# Plain texts tokenized as a completions prompt: `encode(text)` with the
# tokenizer's default special tokens, and with `add_special_tokens=False`.
ENCODE_TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    UNICODE,
    CODE,
    WHITESPACE,
    DIGITS,
    SCRIPTS,
    SPECIAL_TEXT,
    "",
]


def encode_goldens(tok):
    return [
        {
            "text": text,
            "ids": list(tok.encode(text)),
            "ids_no_special": list(tok.encode(text, add_special_tokens=False)),
        }
        for text in ENCODE_TEXTS
    ]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_json(OUT / "jinja_snippets.json", snippet_goldens())
    missing = [n for n in CASES if not (CACHE / n / "tokenizer.json").exists()]
    if missing:
        sys.exit(f"tokenizers missing in {CACHE}: {missing}; run scripts/fetch-tokenizers.sh")
    for name, make in CASES.items():
        tok = AutoTokenizer.from_pretrained(str(CACHE / name))
        cases = make()
        for c in cases:
            c["text"], c["ids"] = golden(tok, c)
        write_json(OUT / f"{name}.json", cases)
        (OUT / "encode").mkdir(exist_ok=True)
        write_json(OUT / "encode" / f"{name}.json", encode_goldens(tok))


if __name__ == "__main__":
    main()
