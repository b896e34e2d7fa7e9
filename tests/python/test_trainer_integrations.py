"""The framework integrations of `tito-rl` against a real `tito serve`
over the scripted mock backend: `tito.verl.TitoAgentLoop`, slime's custom
generate function and AReaL's `TitoWorkflow`, each driven by an OpenAI SDK
agent and a LangChain agent; their outputs equal the export's sample for
the trajectory (ids, mask, logprobs) and have the frameworks' field names,
types and padding, as recorded below from the frameworks' source at pinned
commits (the real classes are used where the framework can be imported)."""

import asyncio
import dataclasses
import enum
import types

import numpy as np
import pytest

import harness
from tito_rl_support import (
    P,
    QUESTION,
    R,
    TOKENIZER,
    ArealOpenAIAgent,
    Replies,
    export_row,
    langchain_agent,
    logprobs_zero_padded,
    one_call_agent,
    openai_agent,
)

import tito  # noqa: E402
import tito.areal  # noqa: E402
import tito.slime  # noqa: E402
import tito.verl  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


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
        monkeypatch.setenv("TITO_AGENT", "tito_rl_support:openai_agent")
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
    # A call split by an abort / keep update: each token gets the version
    # that sampled it, read per token; per call where the export has none.
    split = {"response_mask": [1, 1, 0, 1, 1], "response_versions": [1, 1, None, 2, 2],
             "call_offsets": [0], "weight_versions": ["step-3"]}
    labels = {1: "step-3", 2: "step-4"}
    assert tito.areal.token_versions(split, labels) == [3, 3, -1, 4, 4]
    assert tito.areal.token_versions(split) == [3, 3, -1, 3, 3]
    with pytest.raises(tito.TitoError, match="not registered"):
        tito.areal.token_versions(split, {1: "step-3"})


