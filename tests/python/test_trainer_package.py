"""The `tito-rl` package (python/) against a real `tito serve` over the
scripted mock backend (real Qwen3 tokenizer): exactly-once batches across a
client restart, a batch whose step raised delivered again, rewards / finish
/ metadata / verify, weight updates and fleet status, typed errors; the
verl, slime and AReaL integrations driven by an OpenAI SDK agent and a
LangChain agent, their outputs checked against the export's sample and
against the frameworks' types as recorded from their source at pinned
commits; the optional-import guards; and `pip install ./python` into a
fresh venv."""

import asyncio
import dataclasses
import enum
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import warnings
import types

import numpy as np
import pyarrow as pa
import pytest
from openai import AsyncOpenAI, OpenAI

import harness

sys.path.insert(0, str(harness.ROOT / "python" / "src"))

import tito  # noqa: E402
import tito.areal  # noqa: E402
import tito.slime  # noqa: E402
import tito.verl  # noqa: E402

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
MODEL = "test-model"
P, R = 512, 256


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


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


# -- the client ----------------------------------------------------------------

def test_batches_exactly_once_across_restart_and_a_raising_step(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 10)
        opts = dict(layout="verl", batch_size=2, prompt_length=P, response_length=R)
        trained = []  # trajectory ids of steps that returned

        a = tito.Client(gw)
        failed = None
        with pytest.raises(RuntimeError, match="step failed"):
            for k, batch in enumerate(a.batches("ppo", **opts)):
                assert len(batch) == 2 and batch.trajectories == 2
                tensors, non_tensors = batch.to_verl()
                assert tensors["input_ids"].shape == (2, P + R)
                assert tensors["input_ids"].dtype == np.int64
                assert tensors["rm_scores"].sum(axis=1).tolist() == pytest.approx(
                    [everything.index(t) / 10 for t in non_tensors["trajectory_id"]])
                if k == 2:
                    failed = batch
                    raise RuntimeError("step failed")
                trained.extend(batch.trajectory_ids)
        assert failed is not None and not failed.acked
        assert len(trained) == 4

        # The same client delivers the raised batch again, first.
        it = a.batches("ppo", **opts)
        again = next(it)
        assert again.cursor == failed.cursor and again.trajectory_ids == failed.trajectory_ids
        trained.extend(again.trajectory_ids)
        fourth = next(it)  # the loop came back: the redelivered batch is acknowledged
        assert again.acked and again.ack_result["trajectories"] == 2
        assert not set(fourth.trajectory_ids) & set(trained)
        trained.extend(fourth.trajectory_ids)
        fourth.ack()  # a checkpoint, then the trainer stops mid-epoch
        assert fourth.ack_result["object"] == "export.ack"
        assert fourth.ack_result["trajectories"] == 2
        assert fourth.ack_result["already_acknowledged"] is False
        it.close()
        a.close()

        # A restarted trainer (a new client) reads only what is left.
        with tito.Client(gw) as b:
            rest = [t for batch in b.batches("ppo", **opts) for t in batch.trajectory_ids]
            assert list(b.batches("ppo", **opts)) == []
        trained.extend(rest)
        assert len(rest) == 2
        assert sorted(trained) == sorted(everything), "every trajectory trained on exactly once"

        # Another consumer name reads everything independently.
        with tito.Client(gw) as c:
            audit = [t for batch in c.batches("audit", layout="trajectory", batch_size=100)
                     for t in batch.trajectory_ids]
        assert sorted(audit) == sorted(everything)


def test_async_client_batches_weights_and_errors(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 4)

        async def main():
            trained, failed = [], None
            async with tito.AsyncClient(gw) as client:
                t = await client.new_trajectory("async-g", index=3)
                assert t.base_url == f"{gw}/g/async-g/t/{t.id}/v1"
                with pytest.raises(RuntimeError):
                    async for batch in client.batches("ppo", layout="trajectory", batch_size=3):
                        if failed is None:
                            failed = batch
                            raise RuntimeError("step failed")
                async for batch in client.batches("ppo", layout="trajectory", batch_size=3):
                    trained.append(batch.trajectory_ids)
                assert trained[0] == failed.trajectory_ids, "the raised batch comes first"
                async with client.weight_push("step-9") as begun:
                    assert begun["ok"] is True
                assert (await client.fleet())["weight_version"] == "step-9"
                with pytest.raises(tito.NotFoundError):
                    await client.group("no-such-group")
                assert await client.health() is True
            return [tid for ids in trained for tid in ids]

        trained = asyncio.run(main())
        assert sorted(trained) == sorted(everything)


def test_a_crashed_client_s_batch_comes_back_after_its_lease(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as setup:
            everything = roll(addr, setup, 3)
        opts = dict(layout="trajectory", batch_size=1, lease_s=1)
        crashed = tito.Client(gw)
        first = next(crashed.batches("grpo", **opts))  # its step never returns
        trained = []
        with tito.Client(gw) as restarted:
            trained += [t for b in restarted.batches("grpo", **opts) for t in b.trajectory_ids]
            if first.trajectory_ids[0] not in trained:
                # The lease held it; once the lease has ended it is served again.
                while time.time() * 1000 <= first.lease_expires_ms + 5:
                    time.sleep(0.05)
                trained += [t for b in restarted.batches("grpo", **opts)
                            for t in b.trajectory_ids]
        assert sorted(trained) == sorted(everything)
        with pytest.raises(tito.CursorExpiredError) as e:
            first.ack()
        assert e.value.status == 409 and e.value.code == "cursor_expired"
        crashed.close()


def test_rewards_finish_metadata_verify_and_typed_errors(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("It is 42.")) as addr, \
            tito.Client(f"http://{addr}") as client:
        t = client.new_trajectory("gsm-1", data_source="gsm8k", index=12,
                                  extra_info={"answer": 42})
        assert t.base_url == f"http://{addr}/g/gsm-1/t/{t.id}/v1"
        assert t.id.startswith("traj-") and len(t.id) == 33
        sdk = OpenAI(base_url=t.base_url, api_key="unused")
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "17+25?"}])
        t.reward(0.5, extra={"acc": 1, "format": 0})
        t.finish()

        g = client.group("gsm-1")
        assert (g["size"], g["finished"], g["rewarded"], g["mean_reward"]) == (1, 1, 1, 0.5)
        [row] = t.samples()
        assert row["reward"] == 0.5 and row["reward_extra_info"] == {"acc": 1, "format": 0}
        assert (row["data_source"], row["index"], row["extra_info"]) == ("gsm8k", 12, {"answer": 42})
        assert row["group"] == "gsm-1" and row["num_turns"] == 1
        assert client.trajectory(t.id)["status"] == "finished"

        checked = t.verify(threshold=0.05)
        assert checked["object"] == "trajectory.verify"
        assert checked["samples"][0]["compared"] == sum(row["response_mask"])
        assert checked["samples"][0]["max_abs_diff"] == 0

        # Typed errors carry tito's error body.
        with pytest.raises(tito.ConflictError) as e:
            client.metadata(t.id, group="another-group")
        assert e.value.status == 409 and e.value.body["error"]["message"] == e.value.message
        with pytest.raises(tito.NotFoundError) as e:
            client.trajectory("no-such-trajectory")
        assert e.value.status == 404 and "no-such-trajectory" in e.value.message
        assert e.value.type is not None
        with pytest.raises(tito.BadRequestError) as e:
            client.reward(t.id, 1.0, call=0, extra={"acc": 1})
        assert e.value.status == 400
        with pytest.raises(tito.APIError):
            client.export(layout="verl", prompt_length=131073, response_length=R)
        with pytest.raises(ValueError, match="prompt_length"):
            client.export(layout="verl")
        with pytest.raises(tito.BadRequestError) as e:
            client.export(layout="trajectory", group_sizes=3)
        assert "group_sizes" in e.value.message

        assert client.health() is True
        ready = client.ready()
        assert ready["ready"] is True and ready["backends_ready"] == 1
    with tito.Client(f"http://{addr}") as gone:
        assert gone.health() is False
        with pytest.raises(tito.TitoConnectionError):
            gone.group("gsm-1")


AUTH = """
[auth]
api_keys = ["agent-key-0001"]
trainer_tokens = ["trainer-token-0001"]
admin_tokens = ["admin-token-0001"]
"""


def test_auth_tokens_per_role(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok"), extra_config=AUTH) as addr:
        gw = f"http://{addr}"
        with tito.Client(gw) as anonymous:
            with pytest.raises(tito.AuthenticationError) as e:
                anonymous.new_trajectory("g")
            assert e.value.status == 401
        with tito.Client(gw, token="trainer-token-0001", api_key="agent-key-0001") as trainer:
            t = trainer.new_trajectory("g")
            assert t.api_key == "agent-key-0001"
            OpenAI(base_url=t.base_url, api_key=t.api_key).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}])
            t.finish()
            assert [b.trajectory_ids for b in trainer.batches("c", layout="trajectory")] == [[t.id]]
            with pytest.raises(tito.AuthenticationError):
                trainer.fleet()
        with tito.Client(gw, token="trainer-token-0001", admin_token="admin-token-0001") as both:
            assert both.fleet()["weight_version"] is None


def test_update_weights_weight_push_and_fleet(tok):
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        def one_call(group):
            t = client.new_trajectory(group)
            OpenAI(base_url=t.base_url, api_key="unused").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}])
            t.finish()
            return export_row(client, group)

        answer = client.update_weights("step-1")  # mode="wait"
        assert answer["ok"] is True and answer["weight_version"] == "step-1"
        assert client.fleet()["weight_version"] == "step-1"
        assert one_call("w1")["weight_versions"] == ["step-1"]

        with client.weight_push("step-2") as begun:
            assert begun["ok"] is True
            fleet = client.fleet()
            assert fleet["paused"] is True and "weight_update" in fleet["paused_for"]
        fleet = client.fleet()
        assert fleet["weight_version"] == "step-2" and fleet["paused"] is False
        assert one_call("w2")["weight_versions"] == ["step-2"]

        # A push that failed is not committed.
        with pytest.raises(RuntimeError, match="push failed"):
            with client.weight_push("step-3"):
                raise RuntimeError("push failed")
        assert client.fleet()["weight_version"] == "step-2"
        client.commit_weights("step-3")  # the trainer pushed again
        assert client.fleet()["weight_version"] == "step-3"
        with pytest.raises(tito.ConflictError):
            client.commit_weights("step-4")  # no begin

        # Other modes are passed to the gateway; one that does not confirm
        # the mode is reported.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answer = client.update_weights("step-5", mode="abort")
        confirmed = answer.get("mode") == "abort"
        assert any(issubclass(w.category, tito.TitoWarning) for w in caught) == (not confirmed)
        assert client.fleet()["weight_version"] == "step-5"
        with pytest.raises(ValueError, match="mode"):
            client.update_weights("step-6", mode="later")


# -- framework integrations ------------------------------------------------------

# verl's `AgentLoopOutput` and `AgentLoopMetrics`, as declared in
# verl/experimental/agent_loop/agent_loop.py at commit
# b178a3cd56f58b2d502255daba591e92833930a7 (lines 125-130 and 133-155):
# field -> annotation, in declaration order.
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
VERL_AGENT_LOOP_OUTPUT = {
    "prompt_ids": "list[int]",
    "response_ids": "list[int]",
    "response_mask": "list[int]",
    "response_logprobs": "Optional[list[float]]",
    "routed_experts": "Optional[Any]",
    "multi_modal_data": "Optional[dict[str, Any]]",
    "reward_score": "Optional[float]",
    "num_turns": "int",
    "metrics": "AgentLoopMetrics",
    "extra_fields": "dict[str, Any]",
}
VERL_AGENT_LOOP_METRICS = {"generate_sequences": ("float", 0.0), "tool_calls": ("float", 0.0),
                           "num_preempted": ("int", -1)}


def conforms(value, annotation):
    """`value` fits one of the recorded annotations."""
    if annotation.startswith("Optional["):
        return value is None or conforms(value, annotation[len("Optional["):-1])
    if annotation == "Any":
        return True
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, float)
    if annotation == "str":
        return isinstance(value, str)
    if annotation.startswith("list["):
        inner = annotation[len("list["):-1]
        return isinstance(value, list) and all(conforms(v, inner) for v in value)
    if annotation.startswith("dict[str, "):
        inner = annotation[len("dict[str, "):-1]
        return isinstance(value, dict) and all(
            isinstance(k, str) and conforms(v, inner) for k, v in value.items())
    if annotation == "AgentLoopMetrics":
        return all(conforms(getattr(value, f), a) for f, (a, _) in VERL_AGENT_LOOP_METRICS.items())
    raise AssertionError(f"no rule for {annotation}")


def field_names(obj):
    cls = type(obj)
    if hasattr(cls, "model_fields"):  # pydantic (verl's real classes)
        return list(cls.model_fields)
    return [f.name for f in dataclasses.fields(cls)]


def check_verl_output(out):
    if tito.verl.HAVE_VERL:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

        assert isinstance(out, AgentLoopOutput)
    assert field_names(out) == list(VERL_AGENT_LOOP_OUTPUT), f"verl at {VERL_COMMIT}"
    for name, annotation in VERL_AGENT_LOOP_OUTPUT.items():
        assert conforms(getattr(out, name), annotation), (name, getattr(out, name))
    assert field_names(out.metrics) == list(VERL_AGENT_LOOP_METRICS)
    for name, (_, default) in VERL_AGENT_LOOP_METRICS.items():
        assert getattr(out.metrics, name) == default  # tito measures none of them


def verl_padded(out, pad):
    """What verl's `_agent_loop_postprocess` (agent_loop.py lines 521-586 at
    VERL_COMMIT) makes of an output: prompt left-padded to P, response
    right-padded to R, logprobs padded with 0.0, position ids from the
    attention mask, the reward on the last valid response token."""
    lp, lr = len(out.prompt_ids), len(out.response_ids)
    attention = [0] * (P - lp) + [1] * (lp + lr) + [0] * (R - lr)
    rm = [0.0] * R
    rm[lr - 1] = out.reward_score
    return {
        "prompts": [pad] * (P - lp) + out.prompt_ids,
        "responses": out.response_ids + [pad] * (R - lr),
        "response_mask": out.response_mask + [0] * (R - lr),
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention) - 1, 0, None).tolist(),
        "rollout_log_probs": out.response_logprobs + [0.0] * (R - lr),
        "rm_scores": rm,
    }


def test_verl_agent_loop_with_openai_sdk_and_langchain_agents(tok):
    rep = Replies(tok)
    script = rep.episode() + rep.episode("So it is 41.")
    with harness.mock_gateway(TOKENIZER, rep.text("unused"), script=script) as addr, \
            tito.Client(f"http://{addr}") as client:
        outputs = []
        for k, agent in enumerate([openai_agent, langchain_agent]):
            loop = tito.verl.TitoAgentLoop(gateway=f"http://{addr}", agent=agent,
                                           response_length=R, prompt_length=P)
            raw_prompt = np.array([{"role": "user", "content": QUESTION}], dtype=object)
            out = asyncio.run(loop.run(
                {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                raw_prompt=list(raw_prompt), uid=f"verl-uid-{k}", index=np.int64(7 + k),
                data_source="arith", extra_info={"split": "train"}, agent_name="tito_agent"))
            outputs.append(out)
            check_verl_output(out)
            tid = out.extra_fields["tito_trajectory_id"]
            row = export_row(client, f"verl-uid-{k}", tid)
            assert out.prompt_ids == row["prompt_ids"]
            assert out.response_ids == row["response_ids"]
            assert out.response_mask == row["response_mask"]
            assert out.response_logprobs == pytest.approx(logprobs_zero_padded(row), abs=0)
            assert 0 in out.response_mask and sum(out.response_mask) == sum(map(len, script[2 * k:2 * k + 2]))
            assert out.num_turns == row["num_turns"] == 2
            assert out.reward_score == row["reward"] == [1.0, 0.0][k]
            assert out.multi_modal_data == {}
            assert out.extra_fields["tito_drift_count"] == len(client.trajectory(tid)["drift"])
            assert out.extra_fields["tito_stale"] is False
            assert (row["data_source"], row["index"], row["extra_info"]) == (
                "arith", 7 + k, {"split": "train"})
        assert outputs[0].extra_fields["reward_extra_info"] == {"acc": 1.0}
        assert outputs[1].extra_fields["reward_extra_info"] == {}  # a float reward: no parts

        # verl pads the output as tito's verl layout does.
        verl = client.export(layout="verl", prompt_length=P, response_length=R).to_pylist()
        by_id = {r["trajectory_id"]: r for r in verl}
        pad = tok.pad_token_id
        for out in outputs:
            got = by_id[out.extra_fields["tito_trajectory_id"]]
            for name, want in verl_padded(out, pad).items():
                values = [0.0 if v is None else v for v in got[name]]
                assert values == pytest.approx(want, abs=0), name
            assert got["uid"] == f"verl-uid-{outputs.index(out)}"


def one_call_agent(base_url, task):
    OpenAI(base_url=base_url, api_key="unused").chat.completions.create(
        model=MODEL, messages=messages_of(task))
    return 1.0


def test_verl_and_slime_register_their_rollout_servers(tok):
    """verl's loop adds the servers of the actors verl hands it
    (`server_manager.server_handles[i].get_server_address`), slime's
    generate function adds slime's router (`args.sglang_router_ip` /
    `_port`), each once."""
    rep = Replies(tok)
    mocks = [harness.start_mock(rep.text("ok")) for _ in range(2)]
    try:
        (vh, vp), (sh, sp) = [addr.rsplit(":", 1) for _, addr in mocks]

        class Method:
            def remote(self):
                async def address():
                    return vh, int(vp)
                return address()

        handle = types.SimpleNamespace(get_server_address=Method())
        server_manager = types.SimpleNamespace(server_handles=[handle])
        with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
                tito.Client(f"http://{addr}") as client:
            before = client.fleet()["backends"]
            assert len(before) == 1
            for uid in ("reg-0", "reg-1"):
                loop = tito.verl.TitoAgentLoop(server_manager=server_manager,
                                               gateway=f"http://{addr}", agent=one_call_agent,
                                               response_length=R, register_servers=True)
                out = asyncio.run(loop.run({}, raw_prompt=[{"role": "user", "content": "hi"}],
                                           uid=uid))
                assert out.reward_score == 1.0
            args = types.SimpleNamespace(tito_url=f"http://{addr}", sglang_router_ip=sh,
                                         sglang_router_port=int(sp))
            generate = tito.slime.make_generate(one_call_agent, register_router=True,
                                                router_kind="vllm")  # the mock speaks vLLM
            for i in range(2):
                sample = asyncio.run(generate(args, SlimeSample(group_index=i, prompt="hi"), {}))
                assert sample.reward == 1.0
            fleet = client.fleet()["backends"]
            assert sorted(b["url"] for b in fleet) == sorted(
                [before[0]["url"]] + [f"http://{a}" for _, a in mocks])
    finally:
        for proc, _ in mocks:
            proc.terminate()
            proc.wait(timeout=30)


# slime's `Sample` (slime/utils/types.py lines 94-142 at commit
# 624b824a898ab0ec1fcb4d373004c7f3852bf515): the fields this package reads
# or writes, with their annotations, and `Sample.Status`.
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"


@dataclasses.dataclass
class SlimeSample:
    group_index: int | None = None
    index: int | None = None
    prompt: str | list = ""
    tokens: list = dataclasses.field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict | None = None
    loss_mask: list | None = None
    weight_versions: list = dataclasses.field(default_factory=list)
    rollout_log_probs: list | None = None

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)


def slime_sample_class():
    try:
        from slime.utils.types import Sample
    except ImportError:
        return SlimeSample
    return Sample


def check_slime_sample(s):
    """The types slime declares, and its own length rule
    (`Sample._validate_response_metadata_lengths`)."""
    assert all(isinstance(t, int) for t in s.tokens)
    assert isinstance(s.response, str) and isinstance(s.response_length, int)
    assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs)
    assert all(m in (0, 1) for m in s.loss_mask)
    assert all(isinstance(lp, float) for lp in s.rollout_log_probs)
    assert all(isinstance(v, str) for v in s.weight_versions)
    assert isinstance(s.status, type(s).Status)


def test_slime_generate_with_openai_sdk_and_langchain_agents(tok, monkeypatch):
    rep = Replies(tok)
    script = rep.episode() + rep.episode() + rep.episode("No idea.")
    with harness.mock_gateway(TOKENIZER, rep.text("unused"), script=script) as addr, \
            tito.Client(f"http://{addr}") as client:
        client.update_weights("step-3")
        Sample = slime_sample_class()
        args = types.SimpleNamespace(tito_url=f"http://{addr}")
        generated = []
        for k, agent in enumerate([openai_agent, langchain_agent]):
            sample = Sample(group_index=k, index=10 + k, prompt=QUESTION, label="42")
            out = asyncio.run(tito.slime.make_generate(agent, run="t1")(
                args, sample, {"temperature": 1.0, "max_new_tokens": R}))
            assert out is sample
            generated.append(out)
        # The module-level function, configured by import path.
        monkeypatch.setenv("TITO_AGENT", f"{__name__}:openai_agent")
        sample = Sample(group_index=2, index=12, prompt=[{"role": "user", "content": QUESTION}])
        generated.append(asyncio.run(tito.slime.generate(args, sample, {"temperature": 1.0})))

        for k, s in enumerate(generated):
            check_slime_sample(s)
            tid = s.metadata["tito_trajectory_id"]
            assert s.metadata["tito_group"] == tito.slime.group_of(s, "t1" if k < 2 else tito.slime._RUN)
            row = export_row(client, s.metadata["tito_group"], tid)
            assert s.tokens == row["prompt_ids"] + row["response_ids"]
            assert s.response_length == len(row["response_ids"])
            assert s.loss_mask == row["response_mask"]
            assert s.rollout_log_probs == pytest.approx(logprobs_zero_padded(row), abs=0)
            assert s.weight_versions == row["weight_versions"] == ["step-3", "step-3"]
            assert s.status == type(s).Status.COMPLETED
            assert s.reward == row["reward"] == [1.0, 1.0, 0.0][k]
            assert ["17 + 25 = 42.", "17 + 25 = 42.", "No idea."][k] in s.response
            assert "<tool_call>" in s.response and "42" in s.response  # call, result, answer
            assert row["index"] == 10 + k


# AReaL's episode tensors (areal/workflow/rlvr.py lines 165-178 at commit
# 4aef98d8d818af55b43621aaadba047ae10f4e77): key -> dtype; each [1, L]
# except `rewards` [1].
AREAL_COMMIT = "4aef98d8d818af55b43621aaadba047ae10f4e77"
AREAL_TENSORS = {"input_ids": "int32", "loss_mask": "int32", "logprobs": "float32",
                 "versions": "int32", "attention_mask": "bool", "rewards": "float32"}


def test_areal_workflow_with_openai_sdk_and_langchain_agents(tok):
    rep = Replies(tok)
    script = rep.episode() + rep.episode("It is 43.")
    with harness.mock_gateway(TOKENIZER, rep.text("unused"), script=script) as addr, \
            tito.Client(f"http://{addr}") as client:
        client.update_weights("step-7")
        for k, agent in enumerate([ArealOpenAIAgent(), langchain_agent]):
            wf = tito.areal.TitoWorkflow(agent, gateway=f"http://{addr}",
                                         group_fn=lambda data: data["qid"])
            assert isinstance(wf, tito.areal.RolloutWorkflow)
            data = {"qid": f"areal-q{k}", "messages": [{"role": "user", "content": QUESTION}]}
            res = asyncio.run(wf.arun_episode(None, data))
            assert list(res) == list(AREAL_TENSORS), f"AReaL at {AREAL_COMMIT}"
            row = export_row(client, f"areal-q{k}")
            n = len(row["prompt_ids"]) + len(row["response_ids"])
            for key, dtype in AREAL_TENSORS.items():
                t = np.asarray(res[key])
                assert str(t.dtype).removeprefix("torch.") == dtype, key
                assert t.shape == ((1,) if key == "rewards" else (1, n)), key
            lp = len(row["prompt_ids"])
            assert np.asarray(res["input_ids"])[0].tolist() == row["prompt_ids"] + row["response_ids"]
            assert np.asarray(res["loss_mask"])[0].tolist() == [0] * lp + row["response_mask"]
            assert np.asarray(res["logprobs"])[0].tolist() == pytest.approx(
                [0.0] * lp + logprobs_zero_padded(row), abs=1e-7)
            want_versions = [-1] * lp + [7 if m else -1 for m in row["response_mask"]]
            assert np.asarray(res["versions"])[0].tolist() == want_versions
            assert np.asarray(res["attention_mask"]).all()
            assert np.asarray(res["rewards"]).tolist() == [row["reward"]] == [[1.0, 0.0][k]]

    assert tito.areal.version_number(None) == 0
    assert tito.areal.version_number("12") == tito.areal.version_number("step-12") == 12
    with pytest.raises(tito.TitoError):
        tito.areal.version_number("final")


# -- schema, imports, install ------------------------------------------------------

def test_export_schema_check_names_both_versions(tok):
    from tito import schema

    good = pa.schema([(n, t) for n, t in schema.COLUMNS["verl"].items()])
    schema.check(good, "verl", None, "0.1.0")
    schema.check(good, "verl", "1", "0.1.0")
    with pytest.raises(tito.IncompatibleGatewayError) as e:
        schema.check(good, "verl", "2", "0.9.0")
    msg = str(e.value)
    assert "0.9.0" in msg and "schema 2" in msg and tito.__version__ in msg and "schema 1" in msg
    missing = pa.schema([f for f in good if f.name != "rollout_log_probs"])
    with pytest.raises(tito.IncompatibleGatewayError, match="rollout_log_probs"):
        schema.check(missing, "verl", None, "0.0.9")
    # The package is versioned with the gateway, and reads its export.
    cargo = (harness.ROOT / "Cargo.toml").read_text()
    assert f'version = "{tito.__version__}"' in cargo
    pyproject = (harness.ROOT / "python" / "pyproject.toml").read_text()
    assert f'version = "{tito.__version__}"' in pyproject
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        assert client.gateway_version() == tito.__version__
        roll(addr, client, 1)
        for layout in ("trajectory", "per_call", "verl"):
            table = client.export(layout=layout, prompt_length=P, response_length=R)
            assert table.num_rows == 1, layout


def test_imports_are_lazy_and_guarded(tok, monkeypatch):
    code = ("import json, sys, tito; print(json.dumps([m for m in ('torch', 'verl', 'slime', "
            "'areal', 'datasets', 'ray', 'langchain_core', 'openai') if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(harness.ROOT / "python" / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert json.loads(out.stdout) == [], "import tito loads no framework"
    code = "import tito.verl, tito.slime, tito.areal, tito.datasets"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)

    import importlib
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        with pytest.raises(ImportError, match="pip install torch"):
            importlib.import_module("tito.torch")
    if importlib.util.find_spec("datasets") is None:
        from tito.datasets import to_hf_dataset

        with pytest.raises(ImportError, match="pip install datasets"):
            to_hf_dataset(pa.table({"a": [1]}))
    if importlib.util.find_spec("ray") is None:
        from tito.datasets import to_ray_dataset

        with pytest.raises(ImportError, match="ray"):
            to_ray_dataset(pa.table({"a": [1]}))

    # ExportDataset's iteration, on a stand-in torch (numpy arrays for tensors).
    fake = types.ModuleType("torch")
    fake.from_numpy = lambda a: a
    fake.utils = types.ModuleType("torch.utils")
    fake.utils.data = types.ModuleType("torch.utils.data")
    fake.utils.data.IterableDataset = type("IterableDataset", (), {})
    for name, mod in [("torch", fake), ("torch.utils", fake.utils),
                      ("torch.utils.data", fake.utils.data)]:
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "tito.torch", raising=False)
    try:
        ExportDataset = importlib.import_module("tito.torch").ExportDataset
    finally:
        sys.modules.pop("tito.torch", None)  # bound to the stand-in

    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("ok")) as addr, \
            tito.Client(f"http://{addr}") as client:
        everything = roll(addr, client, 3)
        ds = ExportDataset("loader", f"http://{addr}", batch_size=2, prompt_length=P,
                           response_length=R)
        seen = []
        it = iter(ds)
        tensors, non_tensors = next(it)
        assert tensors["input_ids"].shape == (2, P + R)
        seen += list(non_tensors["trajectory_id"])
        # Not acknowledged before the step returned: a second reader gets
        # only the page not leased.
        other = [t for b in client.batches("loader", layout="verl", prompt_length=P,
                                           response_length=R) for t in b.trajectory_ids]
        assert len(other) == 1 and not set(other) & set(seen)
        seen += other
        assert list(it) == []  # acknowledges the first page
        assert sorted(seen) == sorted(everything)
        assert list(client.batches("loader", layout="verl", prompt_length=P,
                                   response_length=R)) == []
        data = client.export(layout="trajectory")
        buf = pa.BufferOutputStream()
        import pyarrow.parquet as pq

        pq.write_table(data, buf)
        assert tito.read_parquet(buf.getvalue().to_pybytes()).equals(data)


def test_pip_install_in_a_fresh_venv(tmp_path):
    """`pip install ./python` into a new venv, offline: pip, the build
    backend (flit_core, scripts/requirements-test.txt) and the dependencies
    (httpx, pyarrow, numpy) come from the test venv's site-packages, seen
    through a .pth file; then `import tito` there."""
    import importlib.util

    import importlib.metadata

    if importlib.util.find_spec("flit_core") is None:
        pytest.fail("flit_core is missing from the test venv: run scripts/setup-python.sh")
    try:
        importlib.metadata.distribution("tito-rl")
        pytest.fail("tito-rl is installed in the test venv: pip would find it satisfied")
    except importlib.metadata.PackageNotFoundError:
        pass
    src = tmp_path / "python"
    shutil.copytree(harness.ROOT / "python", src,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (pathlib.Path(site) / "test-venv.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-build-isolation", str(src)], check=True, cwd=tmp_path)
    code = "import tito; print(tito.__version__, tito.__file__)"
    out = subprocess.run([str(py), "-c", code],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    version, path = out.stdout.split()
    assert version == tito.__version__
    assert path.startswith(site), "imported from the fresh venv, not the source tree"
    shown = subprocess.run([str(py), "-m", "pip", "show", "tito-rl"], capture_output=True,
                           text=True, check=True).stdout
    assert "Requires: httpx, numpy, pyarrow" in shown
