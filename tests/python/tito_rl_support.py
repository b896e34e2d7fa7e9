"""Shared by the tito-rl tests: scripted replies of the mock backend, the
agents (OpenAI SDK, LangChain, AReaL's agent shape: each a callable taking
an OpenAI-compatible base_url), and export lookups."""

import json
import sys

from openai import AsyncOpenAI, OpenAI

import harness

sys.path.insert(0, str(harness.ROOT / "python" / "src"))

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
MODEL = "test-model"
P, R = 512, 256


class Replies:
    def __init__(self, tok):
        self.tok = tok
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def text(self, s):
        return self.tok.encode(s, add_special_tokens=False) + [self.im_end]

    def call(self, name, **args):
        return self.text(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>")

    def episode(self, answer="17 + 25 = 42."):
        """An agent's two calls: a tool call, then the answer."""
        return [self.call("add", a=17, b=25), self.text(answer)]


# -- agents: callables taking an OpenAI-compatible base_url ------------------

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                      "b": {"type": "integer"}}}}}]
QUESTION = "What is 17 + 25? Use the add tool."


def messages_of(task):
    """The chat messages of a verl / slime / AReaL task."""
    for key in ("raw_prompt", "messages"):
        if key in task:
            return [dict(m) for m in task[key]]
    prompt = task["prompt"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def score(text):
    acc = 1.0 if "42" in (text or "") else 0.0
    return {"reward": acc, "extra": {"acc": acc}}


def openai_agent(base_url, task, api_key="unused"):
    """A tool-use loop on the OpenAI SDK (blocking)."""
    client = OpenAI(base_url=base_url, api_key=api_key)
    messages = messages_of(task)
    while True:
        resp = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        msg = resp.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return score(msg.content)
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": str(args["a"] + args["b"])})


def langchain_agent(base_url, task, api_key="unused"):
    """The same loop on LangChain's ChatOpenAI with a bound tool."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=MODEL).bind_tools([add])
    messages = messages_of(task)
    while True:
        ai = llm.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            return score(ai.content)["reward"]
        for call in ai.tool_calls:
            messages.append(ToolMessage(content=str(add.invoke(call["args"])),
                                        tool_call_id=call["id"]))


class ArealOpenAIAgent:
    """AReaL's own agent shape: `async run(data, **extra_kwargs)` reading
    base_url, api_key and http_client (areal/api/workflow_api.py)."""

    async def run(self, data, **extra_kwargs):
        client = AsyncOpenAI(base_url=extra_kwargs["base_url"], api_key=extra_kwargs["api_key"],
                             http_client=extra_kwargs["http_client"], max_retries=0)
        messages = messages_of(data)
        while True:
            resp = await client.chat.completions.create(model=MODEL, messages=messages,
                                                        tools=TOOLS)
            msg = resp.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                return score(msg.content)["reward"]
            for call in msg.tool_calls:
                args = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": str(args["a"] + args["b"])})


def export_row(client, group, tid=None):
    rows = [r for r in client.export_rows(layout="trajectory", group=group)
            if tid is None or r["trajectory_id"] == tid]
    assert len(rows) == 1, rows
    return rows[0]


def logprobs_zero_padded(row):
    return [lp if m else 0.0 for lp, m in zip(row["response_logprobs"], row["response_mask"])]


def roll(addr, client, n, group_of=lambda i: f"task-{i}"):
    """`n` one-call trajectories, rewarded i / 10 and finished."""
    ids = []
    for i in range(n):
        t = client.new_trajectory(group_of(i), data_source="count", index=i)
        OpenAI(base_url=t.base_url, api_key="unused").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"question {i}"}])
        t.reward(i / 10)
        t.finish()
        ids.append(t.id)
    return ids



def one_call_agent(base_url, task):
    OpenAI(base_url=base_url, api_key="unused").chat.completions.create(
        model=MODEL, messages=messages_of(task))
    return 1.0
