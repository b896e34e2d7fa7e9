"""A Qwen3-Coder-style tool call (XML `<function=…><parameter=…>` inside
`<tool_call>`) through the Qwen3 tokenizer with `tool_parser =
"qwen3_coder"`: the unmodified OpenAI SDK receives `tool_calls` whose
arguments are typed from the tool's JSON schema (integer, number, boolean,
array, object, string), streamed and not; the agent's next turn continues
the trajectory exactly (one sample, every sampled id verbatim)."""

import json

from openai import OpenAI

import harness

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "description": "Search a repository.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer"},
                    "min_score": {"type": "number"},
                    "regex": {"type": "boolean"},
                    "paths": {"type": "array", "items": {"type": "string"}},
                    "options": {"type": "object"},
                },
                "required": ["query"],
            },
        },
    }
]

# The call as Qwen3-Coder writes it; the string value keeps its own
# newline-free text, the others are typed from the schema.
CALL_PARTS = [
    "<tool_call>\n<function=search",
    "_code>\n<parameter=query>\nfn ma",
    "in() {\n}\n</parameter>\n<parameter=max_results>\n1",
    "0\n</parameter>\n<parameter=min_score>\n0.",
    "75\n</parameter>\n<parameter=regex>\nfa",
    "lse\n</parameter>\n<parameter=paths>\n[\"src\", \"te",
    "sts\"]\n</parameter>\n<parameter=options>\n{\"case\": tr",
    "ue}\n</parameter>\n</function>\n</tool_call>",
]
TYPED = {
    "query": "fn main() {\n}",
    "max_results": 10,
    "min_score": 0.75,
    "regex": False,
    "paths": ["src", "tests"],
    "options": {"case": True},
}


def run(stream):
    tok = harness.qwen3_tokenizer()
    script = [
        harness.sampled(tok, CALL_PARTS),
        harness.sampled(tok, ["Found it in ", "src/main.rs."]),
    ]
    tid = f"coder-{'stream' if stream else 'plain'}"
    # After the script the mock answers `<|im_end|>` alone (no test asks).
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    with harness.mock_gateway(harness.QWEN3, [im_end], script=script,
                              model_extra='tool_parser = "qwen3_coder"') as addr:
        client = OpenAI(base_url=f"http://{addr}/t/{tid}/v1", api_key="unused")
        msgs = [{"role": "user", "content": "Where is main?"}]
        if stream:
            chunks = client.chat.completions.create(
                model="test-model", messages=msgs, tools=TOOLS, stream=True)
            calls, finish = {}, None
            for c in chunks:
                ch = c.choices[0]
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            assert finish == "tool_calls"
            assert list(calls) == [0]
            call = calls[0]
            assistant = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}]}
            name, arguments, call_id = call["name"], call["arguments"], call["id"]
        else:
            choice = client.chat.completions.create(model="test-model", messages=msgs, tools=TOOLS).choices[0]
            assert choice.finish_reason == "tool_calls"
            tc = choice.message.tool_calls[0]
            assistant = choice.message.model_dump(exclude_none=True)
            name, arguments, call_id = tc.function.name, tc.function.arguments, tc.id
        assert name == "search_code"
        assert json.loads(arguments) == TYPED
        # Typed, not strings: the SDK's JSON carries numbers and booleans.
        assert '"max_results":10' in arguments and '"regex":false' in arguments
        msgs += [assistant, {"role": "tool", "tool_call_id": call_id, "content": "src/main.rs:1"}]
        answer = client.chat.completions.create(model="test-model", messages=msgs, tools=TOOLS)
        assert answer.choices[0].message.content == "Found it in src/main.rs."
        harness.assert_one_exact_sample(addr, tid, script, "chat")


def test_typed_tool_call_and_exact_next_turn():
    run(stream=False)


def test_typed_tool_call_streamed_and_exact_next_turn():
    run(stream=True)
