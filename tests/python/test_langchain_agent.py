"""An unmodified LangGraph ReAct agent (langchain-openai ChatOpenAI with two
tools) runs against `tito serve` backed by a scripted mock that emits hermes
tool calls with non-canonical tokenization and odd JSON spacing. The agent
completes; the exported trajectory has one sample whose mask is 1 exactly on
the scripted sampled ids and 0 on everything else (tool results, glue)."""

import json
import urllib.request

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from transformers import AutoTokenizer

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 2+2."""
    a, b = expression.split("+")
    return str(int(a) + int(b))


@tool
def lookup(key: str) -> str:
    """Look up a fact by key."""
    return {"capital_of_france": "Paris"}.get(key, "unknown")


def make_agent(llm, tools):
    try:
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(llm, tools)
    except ImportError:  # newer LangChain moved the prebuilt agent
        from langchain.agents import create_agent

        return create_agent(llm, tools)


def pieces(tok, parts):
    """Token ids of `parts` tokenized one by one (valid, not canonical)."""
    return [i for p in parts for i in tok.encode(p, add_special_tokens=False)]


def test_react_agent_runs_and_export_masks_sampled_ids():
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail("missing .cache/tokenizers/qwen3: run scripts/fetch-tokenizers.sh")
    harness.build()
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    script = [
        pieces(tok, ["<tool_call>", '\n{"name":  "', "c", "alc", "ulator", '", "arguments": {"expression":"2+2"}}\n', "</tool_call>"]) + [im_end],
        pieces(tok, ["<tool_call>", '\n{"name": "lookup",  "arguments": {"key": "capital_', "of_france", '"}}\n', "</tool_call>"]) + [im_end],
        pieces(tok, ["2+2 is 4 and the capital of France is Paris."]) + [im_end],
    ]
    mock, mock_addr = harness.start_mock([im_end], script=script)
    tito, addr = harness.start_tito(TOKENIZER, f"http://{mock_addr}")
    try:
        llm = ChatOpenAI(
            base_url=f"http://{addr}/t/agent-1/v1", api_key="unused", model="test-model", temperature=0
        )
        agent = make_agent(llm, [calculator, lookup])
        result = agent.invoke({"messages": [("user", "What is 2+2, and what is the capital of France?")]})
        final = result["messages"][-1]
        assert "Paris" in final.content
        tool_results = [m.content for m in result["messages"] if m.type == "tool"]
        assert tool_results == ["4", "Paris"]

        with urllib.request.urlopen(f"http://{addr}/v1/export?format=jsonl&layout=trajectory") as r:
            rows = [json.loads(line) for line in r.read().decode().splitlines()]
        rows = [r for r in rows if r["trajectory_id"] == "agent-1"]
        assert len(rows) == 1, "one sample: every call continued the previous one"
        row = rows[0]
        resp, mask = row["response_ids"], row["response_mask"]
        sampled = [i for i, m in zip(resp, mask) if m == 1]
        assert sampled == script[0] + script[1] + script[2]
        # The sampled runs sit exactly where the model produced them.
        pos = 0
        for reply in script:
            start = resp.index(reply[0], pos)
            assert resp[start : start + len(reply)] == reply
            assert mask[start : start + len(reply)] == [1] * len(reply)
            pos = start + len(reply)
        assert row["num_turns"] == 3
        with urllib.request.urlopen(f"http://{addr}/v1/trajectories/agent-1") as r:
            t = json.load(r)
        assert t["drift"], "the re-rendered tool calls differ from the sampled ids"
        assert {d["cause"] for d in t["drift"]} <= {"tool_call_rerender", "bpe_retokenization"}
    finally:
        for p in (tito, mock):
            p.terminate()
            p.wait(timeout=30)
