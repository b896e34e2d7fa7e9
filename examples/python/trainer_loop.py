"""A trainer's read loop: exactly-once verl batches from tito, GRPO advantages.

Pulls pages of finished trajectories as Parquet in the verl layout from
`GET /v1/export?consumer=NAME` (each page is leased to this reader; workers
sharing NAME never get the same trajectory), turns them into verl's batch
(the tensors and non-tensors of a `DataProto`), computes GRPO's
group-relative advantages from `uid` and the reward, and acknowledges a page
(`POST /v1/export/ack`) only once every sample of it went through a training
step. A reader that dies before the ack loses nothing: the page is served
again when its lease ends.

GRPO normalises rewards within a group, so a training step must hold whole
groups. With `--group-size N` the loop asks for `complete_groups=true&
group_size=N`: only groups whose N members are finished are served, and a
page holds whole groups (the groups its first `limit` trajectories start),
so workers sharing a consumer name each get whole groups. The loop still
buffers samples by `uid` until a group is whole, which matters only without
`--group-size` (pages then hold `limit` trajectories in arrival order).

Tensors are torch tensors when torch is importable, numpy arrays otherwise;
with verl installed, `to_data_proto` builds verl's `DataProto` itself.

    python examples/python/trainer_loop.py --gateway http://localhost:8000 \
        --consumer grpo-trainer --prompt-length 1024 --response-length 2048 --group-size 4
"""

import argparse
import io
import json
import os
from collections import defaultdict

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

try:
    import torch
except ImportError:  # the loop runs without torch, on numpy arrays
    torch = None

# verl's tensor batch: key -> dtype. Shapes [N, P] (prompts, left-padded),
# [N, R] (responses, response_mask, rollout_log_probs, rm_scores; right-padded)
# and [N, P + R] (input_ids, attention_mask, position_ids).
TENSORS = {"prompts": np.int64, "responses": np.int64, "response_mask": np.int64,
           "input_ids": np.int64, "attention_mask": np.int64, "position_ids": np.int64,
           "rollout_log_probs": np.float32, "rm_scores": np.float32}
NON_TENSORS = ["uid", "data_source", "index", "extra_info", "reward_extra_info", "trajectory_id",
               "weight_version", "min_weight_version", "max_weight_version"]


def to_verl_batch(table):
    """A verl-layout table -> (tensors, non_tensors), the arguments of verl's
    `DataProto.from_dict` (docs/export.md shows the same function)."""
    tensors = {}
    for name, dtype in TENSORS.items():
        # A null logprob (nothing sampled there) becomes 0.0, as verl pads.
        flat = pc.fill_null(table.column(name).combine_chunks().flatten(), 0)
        array = flat.to_numpy(zero_copy_only=False).astype(dtype)
        array = array.reshape(table.num_rows, -1 if table.num_rows else 0)
        tensors[name] = torch.from_numpy(array) if torch is not None else array
    non_tensors = {n: np.array(table.column(n).to_pylist(), dtype=object) for n in NON_TENSORS}
    for name in ["extra_info", "reward_extra_info"]:  # JSON text -> dicts
        non_tensors[name] = np.array([json.loads(v) if v else None for v in non_tensors[name]],
                                     dtype=object)
    non_tensors["__num_turns__"] = table.column("__num_turns__").to_numpy().astype(np.int32)
    return tensors, non_tensors


def to_data_proto(table):
    """verl's `DataProto` (needs verl and torch installed)."""
    from verl import DataProto

    tensors, non_tensors = to_verl_batch(table)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def grpo_advantages(rm_scores, response_mask, uids, eps=1e-6):
    """GRPO outcome advantages as verl computes them: the sample's score
    (sum of rm_scores) minus its group's mean, over the group's standard
    deviation (unbiased); a group of one gets its score unchanged (mean 0,
    std 1). Returns per-sample advantages [N] and token-level ones [N, R]
    (zero off the sampled tokens)."""
    scores = np.asarray(rm_scores, dtype=np.float64).sum(axis=-1)
    adv = np.zeros_like(scores)
    by_uid = defaultdict(list)
    for i, u in enumerate(uids):
        by_uid[u].append(i)
    for rows in by_uid.values():
        s = scores[rows]
        mean, std = (s.mean(), s.std(ddof=1)) if len(rows) > 1 else (0.0, 1.0)
        adv[rows] = (s - mean) / (std + eps)
    token_adv = adv[:, None] * np.asarray(response_mask, dtype=np.float64)
    return adv, token_adv


def pages(http, consumer, params):
    """(cursor, table) for each page the consumer leases, until none is left."""
    while True:
        r = http.get("/v1/export", params={**params, "consumer": consumer})
        r.raise_for_status()
        cursor = r.headers.get("x-export-cursor")
        if cursor is None:
            return
        yield cursor, pq.read_table(io.BytesIO(r.content))


def print_step(step, tensors, non_tensors, advantages):
    uids = non_tensors["uid"]
    stale = int(sum(lo != hi for lo, hi in
                    zip(non_tensors["min_weight_version"], non_tensors["max_weight_version"])))
    print(f"step {step}: {len(uids)} samples in {len(set(uids))} groups, "
          f"input_ids {tuple(tensors['input_ids'].shape)}, "
          f"sampled tokens {int(tensors['response_mask'].sum())}, "
          f"mean reward {float(tensors['rm_scores'].sum(-1).mean()):.3f}, "
          f"|advantage| max {float(np.abs(advantages).max(initial=0)):.3f}, "
          f"spanning a weight update {stale}")


def main(gateway, consumer="trainer", prompt_length=1024, response_length=2048, group_size=None,
         limit=64, lease_s=600, train_step=None, token=None):
    """Reads the consumer's queue to its end. `train_step(step, tensors,
    non_tensors, advantages)` gets each batch of whole groups (default:
    print a line). `token`: one of `[auth] trainer_tokens` if set. Returns
    a summary."""
    train_step = train_step or print_step
    params = {"format": "parquet", "layout": "verl", "prompt_length": prompt_length,
              "response_length": response_length, "limit": limit, "lease_s": lease_s}
    if group_size:
        params.update(complete_groups="true", group_size=group_size)
    waiting = defaultdict(list)   # uid -> [(page table, row)] not yet trained on
    members = defaultdict(set)    # uid -> its trajectory ids seen so far
    unacked = {}                  # cursor -> trajectory ids of the page not yet trained on
    summary = {"pages": 0, "steps": 0, "samples": 0, "trajectories": [], "acked": 0}

    def step(http, uids):
        if uids:
            rows = [table.slice(row, 1) for u in uids for table, row in waiting.pop(u)]
            batch = pa.concat_tables(rows)
            tensors, non_tensors = to_verl_batch(batch)
            adv, _ = grpo_advantages(tensors["rm_scores"], tensors["response_mask"],
                                     non_tensors["uid"])
            train_step(summary["steps"], tensors, non_tensors, adv)
            summary["steps"] += 1
            summary["samples"] += len(batch)
            done = set(non_tensors["trajectory_id"])
            for ids in unacked.values():
                ids -= done
        for cursor in [c for c, ids in unacked.items() if not ids]:
            r = http.post("/v1/export/ack", json={"consumer": consumer, "cursor": cursor})
            r.raise_for_status()
            summary["acked"] += r.json()["trajectories"]
            del unacked[cursor]

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=gateway.rstrip("/"), headers=headers, timeout=120) as http:
        for cursor, table in pages(http, consumer, params):
            summary["pages"] += 1
            ids = table.column("trajectory_id").to_pylist()
            uids = table.column("uid").to_pylist()
            summary["trajectories"].extend(sorted(set(ids)))
            unacked[cursor] = set(ids)
            for row, (tid, uid) in enumerate(zip(ids, uids)):
                waiting[uid].append((table, row))
                members[uid].add(tid)
            step(http, [u for u in waiting if not group_size or len(members[u]) >= group_size])
        # The queue is drained: what still waits are groups short of
        # group_size (only possible without complete_groups); train on them.
        step(http, list(waiting))
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8000", help="tito's address")
    ap.add_argument("--consumer", default="trainer", help="consumer group name")
    ap.add_argument("--prompt-length", type=int, default=1024)
    ap.add_argument("--response-length", type=int, default=2048)
    ap.add_argument("--group-size", type=int, default=None,
                    help="GRPO's n: train on a group once this many of its trajectories arrived")
    ap.add_argument("--limit", type=int, default=64, help="trajectories per page")
    ap.add_argument("--lease-s", type=int, default=600, help="seconds before an unacked page returns")
    ap.add_argument("--token", default=os.environ.get("TITO_TRAINER_TOKEN"),
                    help="a trainer token (default $TITO_TRAINER_TOKEN)")
    args = ap.parse_args()
    s = main(args.gateway, args.consumer, args.prompt_length, args.response_length,
             args.group_size, args.limit, args.lease_s, token=args.token)
    print(f"read {s['samples']} samples of {len(s['trajectories'])} trajectories in "
          f"{s['steps']} training steps from {s['pages']} pages; "
          f"acknowledged {s['acked']} trajectories")
