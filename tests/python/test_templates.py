"""The chat templates tito ships (templates/), checked against the reference
implementation: transformers' `apply_chat_template` given the same template
string must produce the prompt token ids a running `tito serve` (selecting
the template by name) reports for the same conversation."""

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

import harness

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}

CASES = {
    "qwen3-keep-think": ("qwen3", [
        ([{"role": "system", "content": "You are terse."},
          {"role": "user", "content": "What is 2+2?"}], None),
        ([{"role": "user", "content": "What is 2+2?"},
          {"role": "assistant", "content": "4", "reasoning_content": "Two plus two."},
          {"role": "user", "content": "And 3+3? 你好"}], None),
        ([{"role": "system", "content": "Use tools."},
          {"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [CALL]},
          {"role": "tool", "tool_call_id": "c1", "content": "22 C"},
          {"role": "tool", "tool_call_id": "c1", "content": "(cached)"}], [WEATHER]),
        ([{"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "<think>\ninline\n</think>\n\nHello"},
          {"role": "user", "content": "Bye"}], None),
    ]),
    "llama3.1-tools": ("llama3_1", [
        ([{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hello there"}], None),
        ([{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": None, "tool_calls": [CALL]},
          {"role": "tool", "tool_call_id": "c1", "content": "22 C"}], [WEATHER]),
        ([{"role": "system", "content": "Use tools when they help."},
          {"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": "Which city?"},
          {"role": "user", "content": "Paris"}], [WEATHER]),
    ]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shipped_template_matches_transformers(name):
    tokenizer, cases = CASES[name]
    tok_dir = harness.ROOT / ".cache" / "tokenizers" / tokenizer
    if not (tok_dir / "tokenizer.json").exists():
        pytest.fail(f"missing {tok_dir}: run scripts/fetch-tokenizers.sh")
    harness.build()
    template = (harness.ROOT / "templates" / f"{name}.jinja").read_text()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    mock, mock_addr = harness.start_mock([1, 2])
    tito, addr = harness.start_tito(tok_dir, f"http://{mock_addr}",
                                    model_extra=f'chat_template = "{name}"')
    client = OpenAI(base_url=f"http://{addr}/v1", api_key="unused")
    try:
        for messages, tools in cases:
            want = tok.apply_chat_template(messages, tools=tools, chat_template=template,
                                           tokenize=False, add_generation_prompt=True)
            want_ids = tok.encode(want, add_special_tokens=False)
            kwargs = {"tools": tools} if tools else {}
            resp = client.chat.completions.create(
                model="test-model", messages=messages, max_tokens=2,
                extra_body={"return_token_ids": True}, **kwargs)
            got = resp.model_extra["prompt_token_ids"]
            assert got == want_ids, (name, messages, tok.decode(got), want)
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)
