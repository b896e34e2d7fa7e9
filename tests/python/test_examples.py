"""The examples in examples/python run against `tito serve` in front of a
scripted mock backend (real Qwen3 tokenizer), and what they produce is
checked: the OpenAI SDK agent's per-turn ids and rewards, the LangGraph
agent's tool results and reward parts, and the trainer loop's verl batches
(whole groups, verl's shapes and dtypes, GRPO advantages, every finished
trajectory read exactly once)."""

import json
import subprocess
import sys
import urllib.request
from collections import defaultdict

import httpx
import numpy as np
import pytest

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
EXAMPLES = harness.ROOT / "examples" / "python"
sys.path.insert(0, str(EXAMPLES))

import langgraph_tool_agent  # noqa: E402
import openai_sdk_agent  # noqa: E402
import trainer_loop  # noqa: E402

MODEL = "test-model"
P, R = 512, 256


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


class Replies:
    """Token ids the scripted model answers with."""

    def __init__(self, tok):
        self.tok = tok
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def text(self, s):
        return self.tok.encode(s, add_special_tokens=False) + [self.im_end]

    def call(self, name, **args):
        body = json.dumps({"name": name, "arguments": args})
        return self.text(f"<tool_call>\n{body}\n</tool_call>")

    # The OpenAI SDK agent's episodes: (replies, reward).
    def arith_right(self):
        return [self.call("add", a=17, b=25), self.call("multiply", a=42, b=3),
                self.text("(17 + 25) * 3 = 126.")], 1.0

    def arith_wrong(self):
        return [self.call("add", a=17, b=25), self.call("multiply", a=42, b=3),
                self.text("So the answer is 125.")], 0.0

    def arith_short(self):
        return [self.text("It is 126.")], 1.0

    def arith_guess(self):
        return [self.text("Maybe 100?")], 0.0

    # The LangGraph agent's episodes: (replies, reward).
    def capital_right(self):
        return [self.call("capital", country="France"), self.call("letter_count", word="Paris"),
                self.text("The capital of France is Paris; it has 5 letters.")], 1.0

    def capital_wrong(self):
        return [self.call("capital", country="France"), self.call("letter_count", word="Paris"),
                self.text("It is Lyon, with 4 letters.")], 0.0


def get_json(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=30) as r:
        return json.load(r)


def export_rows(addr, query):
    with urllib.request.urlopen(f"http://{addr}/v1/export?format=jsonl&{query}", timeout=30) as r:
        return [json.loads(line) for line in r.read().decode().splitlines()]


def test_openai_sdk_agent(tok):
    rep = Replies(tok)
    episodes = [rep.arith_right(), rep.arith_wrong(), rep.arith_short(), rep.arith_guess()]
    script = [ids for replies, _ in episodes for ids in replies]
    with harness.mock_gateway(TOKENIZER, rep.text("unused"), script=script) as addr:
        results, group = openai_sdk_agent.main(
            f"http://{addr}", MODEL, group="arith-7", samples=4, index=7
        )
        assert [r["reward"] for r in results] == [reward for _, reward in episodes]
        for r, (replies, _) in zip(results, episodes):
            turns = r["turns"]
            # return_token_ids: each turn's sampled ids are what the model emitted.
            assert [t["token_ids"] for t in turns] == replies
            assert [t["finish_reason"] for t in turns] == (
                ["tool_calls"] * (len(replies) - 1) + ["stop"]
            )
            # Each prompt extends the previous prompt and its sampled ids.
            for prev, nxt in zip(turns, turns[1:]):
                head = prev["prompt_token_ids"] + prev["token_ids"]
                assert nxt["prompt_token_ids"][: len(head)] == head
        assert results[0]["tool_calls"] == 2 and "126" in results[0]["final"]

        assert group["size"] == 4 and group["complete"] and group["rewarded"] == 4
        assert group["mean_reward"] == pytest.approx(0.5)
        extras = {t["id"]: t["reward_extra_info"] for t in group["trajectories"]}
        assert extras["arith-7-s0"] == {"acc": 1.0, "tool_calls": 2}
        assert extras["arith-7-s3"] == {"acc": 0.0, "tool_calls": 0}

        rows = {r["trajectory_id"]: r for r in export_rows(addr, "group=arith-7")}
        assert sorted(rows) == [f"arith-7-s{i}" for i in range(4)]
        for r, (replies, _) in zip(results, episodes):
            row = rows[r["trajectory_id"]]
            assert row["group"] == "arith-7" and row["data_source"] == "arithmetic"
            assert row["index"] == 7
            assert row["extra_info"] == {"question": openai_sdk_agent.QUESTION, "answer": 126}
            assert row["num_turns"] == len(replies)
            sampled = [i for i, m in zip(row["response_ids"], row["response_mask"]) if m]
            assert sampled == [i for ids in replies for i in ids]


def test_langgraph_tool_agent(tok):
    rep = Replies(tok)
    episodes = [rep.capital_right(), rep.capital_wrong()]
    script = [ids for replies, _ in episodes for ids in replies]
    with harness.mock_gateway(TOKENIZER, rep.text("unused"), script=script) as addr:
        results, group = langgraph_tool_agent.main(
            f"http://{addr}", MODEL, group="capitals-3", samples=2, index=3
        )
        assert [r["tool_results"] for r in results] == [["Paris", "5"]] * 2
        assert [r["llm_calls"] for r in results] == [3, 3]
        assert results[0]["reward_parts"] == {"acc": 1.0, "count": 1.0}
        assert results[1]["reward_parts"] == {"acc": 0.0, "count": 0.0}
        assert [r["reward"] for r in results] == [1.0, 0.0]
        assert group["size"] == 2 and group["complete"]
        assert group["mean_reward"] == pytest.approx(0.5)

        for r, (replies, _) in zip(results, episodes):
            t = get_json(addr, f"/v1/trajectories/{r['trajectory_id']}")
            assert t["status"] == "finished" and t["group"] == "capitals-3"
            assert t["data_source"] == "capitals" and t["index"] == 3
            assert t["reward_extra"] == r["reward_parts"]
            # The agent's three calls continue each other: one sample.
            assert len(t["samples"]) == 1
            s = t["samples"][0]
            assert s["num_turns"] == 3
            sampled = [i for i, m in zip(s["response_ids"], s["response_mask"]) if m]
            assert sampled == [i for ids in replies for i in ids]


def run_trainer(addr, consumer, steps, **kw):
    def train_step(step, tensors, non_tensors, advantages):
        steps.append((step, tensors, non_tensors, advantages))

    return trainer_loop.main(f"http://{addr}", consumer, P, R, train_step=train_step, **kw)


def check_batch(tensors, non_tensors, advantages, rewards):
    n = len(non_tensors["uid"])
    shapes = {"prompts": (n, P), "responses": (n, R), "response_mask": (n, R),
              "input_ids": (n, P + R), "attention_mask": (n, P + R), "position_ids": (n, P + R),
              "rollout_log_probs": (n, R), "rm_scores": (n, R)}
    for name, shape in shapes.items():
        t = np.asarray(tensors[name])
        assert t.shape == shape, name
        want = np.float32 if name in ("rollout_log_probs", "rm_scores") else np.int64
        assert t.dtype == want, name
    ids = np.asarray(tensors["input_ids"])
    am = np.asarray(tensors["attention_mask"])
    assert (ids == np.concatenate([tensors["prompts"], tensors["responses"]], axis=1)).all()
    assert (np.asarray(tensors["position_ids"]) == np.maximum(np.cumsum(am, axis=1) - 1, 0)).all()
    mask = np.asarray(tensors["response_mask"])
    lp = np.asarray(tensors["rollout_log_probs"])
    assert (lp[mask == 0] == 0).all() and (lp[mask == 1] < 0).all()
    assert non_tensors["__num_turns__"].dtype == np.int32
    # rm_scores carries the recorded reward; GRPO normalises it per uid.
    scores = np.asarray(tensors["rm_scores"]).sum(axis=1)
    tids = list(non_tensors["trajectory_id"])
    assert scores.tolist() == pytest.approx([rewards[t] for t in tids])
    by_uid = defaultdict(list)
    for i, u in enumerate(non_tensors["uid"]):
        by_uid[u].append(i)
    for u, rows in by_uid.items():
        assert len(rows) == 4, f"group {u} is whole in its training step"
        assert {tids[i].rsplit("-s", 1)[0] for i in rows} == {u}
        assert sum(advantages[rows]) == pytest.approx(0, abs=1e-6)
        s = scores[rows]
        want = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
        assert advantages[rows].tolist() == pytest.approx(want.tolist(), abs=1e-5)


def test_trainer_loop_reads_whole_groups_exactly_once(tok):
    rep = Replies(tok)
    arith = [rep.arith_right(), rep.arith_wrong(), rep.arith_short(), rep.arith_guess()]
    capitals = [rep.capital_right(), rep.capital_wrong(), rep.capital_right(), rep.capital_right()]
    # In the order the rollouts below run.
    episodes = arith[:2] + capitals + arith[2:]
    script = [ids for replies, _ in episodes for ids in replies]
    with harness.mock_gateway(TOKENIZER, rep.text("It is 126."), script=script) as addr:
        gw = f"http://{addr}"
        # Interleave groups in creation order: arith-1 s0..s1, the capitals
        # group, then arith-1 s2..s3 (one rollout at a time).
        rewards = {}
        for i in range(2):
            r = openai_sdk_agent.rollout(gw, "arith-1", f"arith-1-s{i}", MODEL, index=1)
            rewards[r["trajectory_id"]] = r["reward"]
        lg, _ = langgraph_tool_agent.main(gw, MODEL, group="capitals-2", samples=4, index=2)
        rewards.update({r["trajectory_id"]: r["reward"] for r in lg})
        for i in range(2, 4):
            r = openai_sdk_agent.rollout(gw, "arith-1", f"arith-1-s{i}", MODEL, index=1)
            rewards[r["trajectory_id"]] = r["reward"]
        assert [rewards[f"arith-1-s{i}"] for i in range(4)] == [1.0, 0.0, 1.0, 0.0]
        assert [rewards[f"capitals-2-s{i}"] for i in range(4)] == [1.0, 0.0, 1.0, 1.0]
        # A group with an unfinished member is not served yet.
        for i in range(3):
            r = openai_sdk_agent.rollout(gw, "late-3", f"late-3-s{i}", MODEL, index=3)
            rewards[r["trajectory_id"]] = r["reward"]
        from openai import OpenAI

        OpenAI(base_url=f"{gw}/g/late-3/t/late-3-s3/v1", api_key="unused").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "still running"}]
        )

        steps = []
        summary = run_trainer(addr, "grpo", steps, group_size=4, limit=1)
        done = sorted(t for t in rewards if not t.startswith("late-3"))
        assert sorted(summary["trajectories"]) == done, "each finished trajectory exactly once"
        assert summary["samples"] == summary["acked"] == 8
        # With complete groups a page holds the groups its first `limit`
        # trajectories start, whole: [a0 a1 a2 a3] then [c0 c1 c2 c3], although
        # their members were created interleaved.
        assert summary["pages"] == 2
        assert [sorted(set(s[2]["uid"])) for s in steps] == [["arith-1"], ["capitals-2"]]
        for _, tensors, non_tensors, adv in steps:
            check_batch(tensors, non_tensors, adv, rewards)
        assert sorted(t for s in steps for t in s[2]["trajectory_id"]) == done

        # Everything was acknowledged: the consumer's queue is empty...
        again = []
        assert run_trainer(addr, "grpo", again, group_size=4)["pages"] == 0 and not again
        # ...while another consumer name reads everything independently.
        other = []
        assert sorted(run_trainer(addr, "audit", other, group_size=4)["trajectories"]) == done

        # The late group's last member finishes: only that group is new.
        rewards["late-3-s3"] = 0.5
        for path, body in [("reward", {"reward": 0.5}), ("finish", {})]:
            req = urllib.request.Request(
                f"{gw}/v1/trajectories/late-3-s3/{path}", data=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=30).close()
        late = []
        summary = run_trainer(addr, "grpo", late, group_size=4)
        assert sorted(summary["trajectories"]) == [f"late-3-s{i}" for i in range(4)]
        for _, tensors, non_tensors, adv in late:
            check_batch(tensors, non_tensors, adv, rewards)


def test_command_lines(tok):
    """Each example's `__main__` runs and prints its summary."""
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("It is 126.")) as addr:
        gw = f"http://{addr}"

        def run(name, *args):
            proc = subprocess.run(
                [sys.executable, str(EXAMPLES / name), "--gateway", gw, *args],
                capture_output=True, text=True, timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        out = run("openai_sdk_agent.py", "--model", MODEL, "--group", "cli-a", "--samples", "2")
        assert "group cli-a: size 2, complete True, mean reward 1.0" in out
        out = run("langgraph_tool_agent.py", "--model", MODEL, "--group", "cli-b")
        assert "group cli-b: size 1, complete True, mean reward 0.0" in out
        out = run("trainer_loop.py", "--consumer", "cli", "--prompt-length", str(P),
                  "--response-length", str(R), "--group-size", "1")
        lines = out.splitlines()
        assert lines[0].startswith("step 0: 3 samples in 2 groups, input_ids (3, 768)"), out
        assert lines[-1] == (
            "read 3 samples of 3 trajectories in 1 training steps from 1 pages; "
            "acknowledged 3 trajectories"
        ), out


AUTH = """
[auth]
api_keys = ["agent-key-0001"]
trainer_tokens = ["trainer-token-0001"]
"""


def test_examples_with_auth(tok):
    """With `[auth]` set, the agents chat with an API key and reward with a
    trainer token; the trainer loop reads with its token and is refused
    without."""
    rep = Replies(tok)
    with harness.mock_gateway(TOKENIZER, rep.text("It is 126."), extra_config=AUTH) as addr:
        gw = f"http://{addr}"
        keys = {"api_key": "agent-key-0001", "trainer_token": "trainer-token-0001"}
        results, group = openai_sdk_agent.main(gw, MODEL, group="auth-a", samples=2, **keys)
        assert [r["reward"] for r in results] == [1.0, 1.0] and group["complete"]
        results, group = langgraph_tool_agent.main(gw, MODEL, group="auth-b", **keys)
        assert group["size"] == 1 and group["complete"]
        with pytest.raises(httpx.HTTPStatusError) as e:
            trainer_loop.main(gw, "auth", P, R)
        assert e.value.response.status_code == 401
        with pytest.raises(httpx.HTTPStatusError):
            trainer_loop.main(gw, "auth", P, R, token="agent-key-0001")
        steps = []
        summary = run_trainer(addr, "auth", steps, token="trainer-token-0001")
        assert sorted(summary["trajectories"]) == ["auth-a-s0", "auth-a-s1", "auth-b-s0"]


def test_docs_verl_loader_matches_the_trainer_loop(tok, monkeypatch, tmp_path):
    """The "Loading into verl" code in docs/export.md runs on a real export
    page (torch and verl stood in for by numpy and a recorder) and gives what
    trainer_loop.to_verl_batch gives."""
    import types

    doc = (harness.ROOT / "docs" / "export.md").read_text()
    section = doc.split("## Loading into verl", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    made = {}
    fake_torch = types.ModuleType("torch")
    fake_torch.from_numpy = lambda a: a
    fake_verl = types.ModuleType("verl")
    fake_verl.DataProto = types.SimpleNamespace(from_dict=lambda **kw: made.update(kw) or "proto")
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "verl", fake_verl)

    rep = Replies(tok)
    replies, _ = rep.arith_right()
    with harness.mock_gateway(TOKENIZER, rep.text("It is 126."), script=replies) as addr:
        openai_sdk_agent.main(f"http://{addr}", MODEL, group="doc", samples=2)
        url = f"http://{addr}/v1/export?format=parquet&layout=verl&prompt_length={P}&response_length={R}"
        with urllib.request.urlopen(url, timeout=30) as r:
            (tmp_path / "batch.parquet").write_bytes(r.read())
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "docs/export.md", "exec"), scope)
    assert scope["batch"] == "proto"

    import pyarrow.parquet as pq

    tensors, non_tensors = trainer_loop.to_verl_batch(pq.read_table(tmp_path / "batch.parquet"))
    assert made["tensors"].keys() == tensors.keys()
    for name, t in tensors.items():
        got = made["tensors"][name]
        assert got.dtype == np.asarray(t).dtype and (got == np.asarray(t)).all(), name
    assert made["tensors"]["input_ids"].shape == (2, P + R)
    for name, v in made["non_tensors"].items():
        assert v.tolist() == non_tensors[name].tolist(), name
    assert list(made["non_tensors"]["uid"]) == ["doc", "doc"]
    assert made["non_tensors"]["extra_info"][0]["answer"] == 126
