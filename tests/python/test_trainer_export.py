"""What a trainer reads from `GET /v1/export`, over HTTP, with pyarrow:
the verl layout (keys, dtypes, shapes, padding with the tokenizer's pad id,
masks of a 3-turn tool trajectory driven through the OpenAI SDK), groups
(uid, reward parts, complete-group filtering), staleness (weight versions per
call), and the exactly-once consumer queue (concurrent workers, leases)."""

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI

import harness

TOKENIZER = harness.ROOT / ".cache" / "tokenizers" / "qwen3"
MODEL = "test-model"
P, R = 512, 256


@pytest.fixture(scope="module")
def tok():
    return harness.qwen3_tokenizer()


def pad_id_from_files():
    """The pad token's id as the tokenizer files define it."""
    config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    pad = config["pad_token"]
    pad = pad["content"] if isinstance(pad, dict) else pad
    added = json.loads((TOKENIZER / "tokenizer.json").read_text())["added_tokens"]
    return pad, next(t["id"] for t in added if t["content"] == pad)


def text_ids(tok, s):
    return tok.encode(s, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def tool_call_ids(tok, name, **args):
    return text_ids(tok, f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>")


def http(addr):
    return httpx.Client(base_url=f"http://{addr}", timeout=60)


def chat(addr, path, content, **kw):
    """One SDK call under `path` (e.g. `/g/G/t/T`)."""
    client = OpenAI(base_url=f"http://{addr}{path}/v1", api_key="unused")
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kw
    )


def parquet(resp):
    resp.raise_for_status()
    return pq.read_table(io.BytesIO(resp.content))


def verl_export(c, **params):
    q = {"format": "parquet", "layout": "verl", "prompt_length": P, "response_length": R, **params}
    return parquet(c.get("/v1/export", params=q))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]

# verl's keys: the Parquet list type each is stored as, and its length.
INT_TENSORS = {"prompts": P, "responses": R, "response_mask": R,
               "input_ids": P + R, "attention_mask": P + R, "position_ids": P + R}
FLOAT_TENSORS = {"rollout_log_probs": R, "rm_scores": R}


def test_verl_layout_three_turn_tool_trajectory(tok):
    pad_token, pad = pad_id_from_files()
    assert pad_token == "<|endoftext|>" and tok.pad_token_id == pad
    assert pad != tok.eos_token_id  # the default is the pad token, not EOS
    script = [
        tool_call_ids(tok, "search", query="tallest mountain"),
        tool_call_ids(tok, "search", query="Everest height"),
        text_ids(tok, "Mount Everest, 8849 m."),
    ]
    with harness.mock_gateway(TOKENIZER, text_ids(tok, "unused"), script=script) as addr:
        client = OpenAI(base_url=f"http://{addr}/g/peaks/t/peaks-0/v1", api_key="unused")
        messages = [{"role": "user", "content": "How high is the tallest mountain?"}]
        turns = []
        for result in ["Mount Everest", "8849 m"] + [None]:
            resp = client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOLS,
                extra_body={"return_token_ids": True, "trajectory_metadata": {
                    "data_source": "peaks", "index": 5, "extra_info": {"split": "test"}}},
            )
            choice = resp.choices[0]
            turns.append((resp.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]))
            messages.append(choice.message.model_dump(exclude_none=True))
            if result is not None:
                call_id = choice.message.tool_calls[0].id
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        assert [ids for _, ids in turns] == script
        with http(addr) as c:
            c.post("/v1/trajectories/peaks-0/reward", json={"reward": 0.75, "extra": {"acc": 1}})
            c.post("/v1/trajectories/peaks-0/finish").raise_for_status()
            table = verl_export(c)
            zero_pad = verl_export(c, pad_id=0)
            too_long = c.get("/v1/export", params={"format": "parquet", "layout": "verl",
                                                   "prompt_length": 131073, "response_length": R})

    # verl's keys and dtypes (int tensors as int32 lists, which verl reads as
    # int64; rollout_log_probs with null elements where nothing was sampled).
    schema = table.schema
    for name, n in {**INT_TENSORS, **FLOAT_TENSORS}.items():
        t = schema.field(name).type
        assert pa.types.is_list(t), name
        assert t.value_type == (pa.float32() if name in FLOAT_TENSORS else pa.int32()), name
    assert schema.field("rollout_log_probs").type.value_field.nullable
    for name in ["uid", "data_source", "extra_info", "reward_extra_info", "trajectory_id"]:
        assert schema.field(name).type == pa.string(), name
    assert schema.field("index").type == pa.int64()
    assert schema.field("__num_turns__").type == pa.int32()  # verl: np.int32
    assert schema.field("weight_versions").type == pa.list_(pa.string())
    assert table.num_rows == 1
    row = table.to_pylist()[0]
    for name, n in {**INT_TENSORS, **FLOAT_TENSORS}.items():
        assert len(row[name]) == n, name

    prompt = turns[0][0]
    lp = len(prompt)
    assert row["prompts"] == [pad] * (P - lp) + prompt  # left-padded with the pad token
    # The response: each turn's sampled ids at its call offset, the new
    # prompt tokens (tool result, template glue) in between.
    offsets = row["call_offsets"]
    assert len(offsets) == 3 and offsets[0] == 0
    for (full_prompt, sampled), off in zip(turns, offsets):
        assert row["responses"][off : off + len(sampled)] == sampled
        assert full_prompt == prompt + row["responses"][:off]  # what the model saw
    lr = offsets[-1] + len(turns[-1][1])
    assert row["responses"][lr:] == [pad] * (R - lr)  # right-padded
    want_mask = [0] * R
    for (_, sampled), off in zip(turns, offsets):
        want_mask[off : off + len(sampled)] = [1] * len(sampled)
    assert row["response_mask"] == want_mask
    assert sum(want_mask) == sum(len(s) for s in script)
    assert 0 in want_mask[:lr], "tool results and glue are observations"

    assert row["input_ids"] == row["prompts"] + row["responses"]
    attention = [0] * (P - lp) + [1] * (lp + lr) + [0] * (R - lr)
    assert row["attention_mask"] == attention
    assert row["position_ids"] == np.clip(np.cumsum(attention) - 1, 0, None).tolist()
    # A logprob exactly on the sampled tokens (the mock's -0.5 - i/100).
    logprobs = row["rollout_log_probs"]
    assert [lp_ is not None for lp_ in logprobs] == [m == 1 for m in want_mask]
    for (_, sampled), off in zip(turns, offsets):
        got = logprobs[off : off + len(sampled)]
        assert got == pytest.approx([-0.5 - i / 100 for i in range(len(sampled))], abs=1e-6)
    assert row["rm_scores"] == [0.0] * (lr - 1) + [0.75] + [0.0] * (R - lr)

    assert row["uid"] == "peaks" and row["trajectory_id"] == "peaks-0"
    assert row["data_source"] == "peaks" and row["index"] == 5
    assert json.loads(row["extra_info"]) == {"split": "test"}
    assert json.loads(row["reward_extra_info"]) == {"acc": 1}
    assert row["__num_turns__"] == 3 and row["reward"] == 0.75

    # pad_id overrides the tokenizer's; lengths above the cap are refused.
    other = zero_pad.to_pylist()[0]
    assert other["prompts"] == [0] * (P - lp) + prompt
    assert other["responses"][lr:] == [0] * (R - lr)
    assert other["attention_mask"] == attention
    assert too_long.status_code == 400
    assert "131072" in too_long.json()["error"]["message"]


def test_groups_reward_parts_and_complete_groups(tok):
    with harness.mock_gateway(TOKENIZER, text_ids(tok, "42")) as addr, http(addr) as c:
        rewards = [1.0, 0.0, 0.5, 1.0]
        for i, r in enumerate(rewards):
            chat(addr, f"/g/G/t/T{i}", f"task G, sample {i}")
            body = {"reward": r, "extra": {"acc": i % 2, "format": 0.5}}
            c.post(f"/v1/trajectories/T{i}/reward", json=body).raise_for_status()
        # A second, complete group next to it.
        for i in range(2):
            chat(addr, f"/g/H/t/H{i}", f"task H, sample {i}")
            c.post(f"/v1/trajectories/H{i}/finish").raise_for_status()
        for i in range(3):
            c.post(f"/v1/trajectories/T{i}/finish").raise_for_status()

        g = c.get("/v1/groups/G").raise_for_status().json()
        assert (g["size"], g["finished"], g["complete"], g["rewarded"]) == (4, 3, False, 4)
        assert g["mean_reward"] == pytest.approx(0.625)
        assert sorted(t["id"] for t in g["trajectories"]) == ["T0", "T1", "T2", "T3"]

        every = verl_export(c)
        assert sorted(every.column("uid").to_pylist()) == ["G"] * 4 + ["H"] * 2
        complete = verl_export(c, complete_groups="true")
        assert complete.column("uid").to_pylist() == ["H", "H"]
        assert verl_export(c, complete_groups="true", group_size=3).num_rows == 0

        c.post("/v1/trajectories/T3/finish").raise_for_status()
        g = c.get("/v1/groups/G").raise_for_status().json()
        assert (g["size"], g["finished"], g["complete"]) == (4, 4, True)
        assert g["mean_reward"] == pytest.approx(0.625)
        table = verl_export(c, complete_groups="true", group="G")
        rows = sorted(table.to_pylist(), key=lambda r: r["trajectory_id"])
        assert [r["trajectory_id"] for r in rows] == ["T0", "T1", "T2", "T3"]
        assert {r["uid"] for r in rows} == {"G"}
        assert [r["reward"] for r in rows] == rewards
        assert [json.loads(r["reward_extra_info"]) for r in rows] == [
            {"acc": i % 2, "format": 0.5} for i in range(4)
        ]
        both = verl_export(c, complete_groups="true", group_size=4)
        assert sorted(both.column("uid").to_pylist()) == ["G"] * 4


def test_weight_update_between_turns_is_visible_per_call(tok):
    with harness.mock_gateway(TOKENIZER, text_ids(tok, "ok")) as addr, http(addr) as c:
        client = OpenAI(base_url=f"http://{addr}/t/stale-1/v1", api_key="unused")
        messages = [{"role": "user", "content": "turn 1"}]
        c.post("/admin/weights", json={"version": "step-1"}).raise_for_status()
        first = client.chat.completions.create(model=MODEL, messages=messages)
        c.post("/admin/weights", json={"version": "step-2"}).raise_for_status()
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "turn 2"}]
        client.chat.completions.create(model=MODEL, messages=messages)
        # A fresh trajectory under one version, for contrast.
        chat(addr, "/t/fresh-1", "turn 1")
        for t in ["stale-1", "fresh-1"]:
            c.post(f"/v1/trajectories/{t}/finish").raise_for_status()
        rows = {r["trajectory_id"]: r for r in verl_export(c).to_pylist()}

    stale, fresh = rows["stale-1"], rows["fresh-1"]
    assert stale["__num_turns__"] == 2
    assert stale["weight_versions"] == ["step-1", "step-2"]
    assert len(stale["call_offsets"]) == 2
    assert (stale["min_weight_version"], stale["max_weight_version"]) == ("step-1", "step-2")
    assert stale["min_weight_version"] != stale["max_weight_version"]
    assert stale["weight_version"] == "step-2"
    assert fresh["weight_versions"] == ["step-2"]
    assert fresh["min_weight_version"] == fresh["max_weight_version"] == "step-2"


def lease_page(c, consumer, **params):
    """One consumer page: (cursor or None, trajectory ids, headers)."""
    q = {"format": "parquet", "layout": "verl", "prompt_length": P, "response_length": R,
         "consumer": consumer, **params}
    resp = c.get("/v1/export", params=q)
    table = parquet(resp)
    ids = table.column("trajectory_id").to_pylist()
    assert int(resp.headers["x-export-trajectories"]) == len(set(ids))
    return resp.headers.get("x-export-cursor"), ids, resp.headers


def ack(c, consumer, cursor):
    return c.post("/v1/export/ack", json={"consumer": consumer, "cursor": cursor})


def test_exactly_once_for_concurrent_workers_and_leases(tok):
    n = 1000
    with harness.mock_gateway(TOKENIZER, text_ids(tok, "done")) as addr, http(addr) as c:
        def rollout(i):
            chat(addr, f"/t/q{i:04d}", f"question {i}")
            with http(addr) as own:
                own.post(f"/v1/trajectories/q{i:04d}/finish").raise_for_status()

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(rollout, range(n)))
        chat(addr, "/t/unfinished", "not done yet")  # never served to a consumer
        everything = {f"q{i:04d}" for i in range(n)}

        # Two workers of one consumer, pulling small pages at the same time.
        start = threading.Barrier(2)
        seen = [[], []]

        def worker(k):
            with http(addr) as own:
                start.wait()
                while True:
                    cursor, ids, _ = lease_page(own, "trainers", limit=37)
                    if cursor is None:
                        assert ids == []
                        return
                    seen[k].extend(ids)
                    body = ack(own, "trainers", cursor).raise_for_status().json()
                    assert body["trajectories"] == len(ids)
                    assert body["already_acknowledged"] is False

        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(worker, k) for k in range(2)]:
                f.result()
        a, b = seen
        assert len(a) == len(set(a)) and len(b) == len(set(b)), "no trajectory twice to a worker"
        assert not set(a) & set(b), "the workers' sets are disjoint"
        assert set(a) | set(b) == everything, "together they read every finished trajectory"
        assert lease_page(c, "trainers")[0] is None

        # Another consumer name has its own queue.
        cursor, ids, _ = lease_page(c, "auditor", limit=n)
        assert set(ids) == everything
        assert ack(c, "auditor", cursor).json()["trajectories"] == n
        again = ack(c, "auditor", cursor).raise_for_status().json()
        assert again["already_acknowledged"] is True and again["trajectories"] == 0

        # A reader that never acks: its page is held while the lease runs,
        # then served again.
        c1, first, h1 = lease_page(c, "crashy", limit=10, lease_s=1)
        c2, second, h2 = lease_page(c, "crashy", limit=10, lease_s=600)
        expires1 = int(h1["x-export-lease-expires"])
        leased2 = int(h2["x-export-lease-expires"]) - 600_000  # when the second page was taken
        assert len(first) == len(second) == 10
        if leased2 < expires1:
            assert not set(first) & set(second), "a leased page is held"
            while time.time() * 1000 <= expires1 + 5:  # the lease's real end
                time.sleep(0.05)
            c3, third, _ = lease_page(c, "crashy", limit=10, lease_s=600)
        else:  # this machine took longer than the lease between two requests
            c3, third = c2, second
        assert third == first, "the expired page comes back"
        assert c3 != c1
        # The stale cursor no longer owns it; the new one does.
        stale = ack(c, "crashy", c1)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "cursor_expired"
        assert ack(c, "crashy", c3).raise_for_status().json()["trajectories"] == 10
        c4, fourth, _ = lease_page(c, "crashy", limit=10)
        assert not set(fourth) & (set(first) | set(second))
