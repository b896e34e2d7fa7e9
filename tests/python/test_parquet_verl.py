"""Reads a verl-layout Parquet export with pyarrow and checks dtypes, shapes and
null logprobs (missing, observation and padding positions).

The file is produced by the Rust example `verl_fixture` (a throwaway SQLite
store of synthetic multi-turn trajectories exported with layout=verl). Run:

    tests/python/run_parquet_verl.sh

which uses the interpreter in .venv (made by scripts/setup-python.sh).
"""

import json
import os
import subprocess
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
P, R = 64, 96


def fixture_logprob(token_id):
    """The logprob verl_fixture gives a sampled id (ids divisible by 11 get
    none, as from a backend that reported none)."""
    return -(token_id % 7) / 10 - 0.01


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl") / "verl.parquet"
    proc = subprocess.run(
        ["cargo", "run", "--quiet", "--example", "verl_fixture", "--", str(out), str(P), str(R)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return pq.read_table(out), stats, pq.ParquetFile(out)


def test_dtypes(export):
    table, _, _ = export
    schema = table.schema
    int_lists = ["prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
    for name in int_lists:
        t = schema.field(name).type
        assert pa.types.is_list(t), name
        assert t.value_type == pa.int32(), name
    for name in ["rollout_log_probs", "rm_scores"]:
        t = schema.field(name).type
        assert pa.types.is_list(t) and t.value_type == pa.float32(), name
    # A missing logprob is a null element; rm_scores has no nulls.
    assert schema.field("rollout_log_probs").type.value_field.nullable
    assert not schema.field("rm_scores").type.value_field.nullable
    assert schema.field("reward").type == pa.float64()
    assert schema.field("sample").type == pa.int32()
    assert schema.field("__num_turns__").type == pa.int32()
    assert schema.field("truncated").type == pa.bool_()
    assert schema.field("index").type == pa.int64()
    names = ["trajectory_id", "uid", "data_source", "extra_info", "reward_extra_info",
             "weight_version", "min_weight_version", "max_weight_version",
             "tokenizer_sha256", "template_sha256", "finish_reason"]
    for name in names:
        assert schema.field(name).type == pa.string(), name
    assert schema.field("weight_versions").type == pa.list_(pa.string())
    # verl's DataProto keys, none of tito's own names for the same columns.
    for name in ["prompt_ids", "response_ids", "response_logprobs", "num_turns"]:
        assert name not in schema.names, name


def test_shapes_and_counts(export):
    table, stats, pfile = export
    # 12 trajectories, the one with a 10000-id prompt is skipped.
    assert table.num_rows == stats["rows"] == 11
    assert stats["skipped_long_prompt"] == 1
    assert pfile.metadata.num_row_groups == 3  # row groups of 4 rows
    rows = table.to_pylist()
    for row in rows:
        assert len(row["prompts"]) == P
        for name in ["responses", "response_mask", "rollout_log_probs", "rm_scores"]:
            assert len(row[name]) == R, name
        for name in ["input_ids", "attention_mask", "position_ids"]:
            assert len(row[name]) == P + R, name


def test_masks_positions_and_scores(export):
    table, stats, _ = export
    rows = table.to_pylist()
    truncated = missing = present = 0
    for row in rows:
        attn = row["attention_mask"]
        n_prompt = sum(attn[:P])
        n_resp = sum(attn[P:])
        assert attn[:P] == [0] * (P - n_prompt) + [1] * n_prompt, "prompt left-padded"
        assert attn[P:] == [1] * n_resp + [0] * (R - n_resp), "response right-padded"
        assert row["input_ids"] == row["prompts"] + row["responses"]
        expected_pos = [max(c - 1, 0) for c in accumulate(attn)]
        assert row["position_ids"] == expected_pos
        assert all(m == 0 for m in row["response_mask"][n_resp:])
        # Padding and observations (mask 0) have no logprob: null, not 0.0.
        assert all(x is None for x in row["rollout_log_probs"][n_resp:])
        head = [row[k][:n_resp] for k in ("responses", "response_mask", "rollout_log_probs")]
        for i, m, lp in zip(*head):
            if m == 0:
                assert lp is None, (i, lp)
            elif i % 11 == 0:
                assert lp is None, f"fixture: sampled id {i} has no logprob, got {lp}"
                missing += 1
            else:
                assert lp == pytest.approx(fixture_logprob(i), rel=1e-6), i
                present += 1
        scores = row["rm_scores"]
        nonzero = [i for i, x in enumerate(scores) if x != 0.0]
        if row["reward"]:
            assert nonzero == [n_resp - 1]
            assert scores[n_resp - 1] == pytest.approx(row["reward"], rel=1e-6)
        else:
            assert nonzero == []
        truncated += row["truncated"]
        assert row["truncated"] == (n_resp == R and row["__num_turns__"] * 17 - 5 > R)
    assert truncated == stats["truncated_responses"] > 0
    assert missing > 0 and present > 0


def test_missing_logprobs_are_nulls_not_zeros(export):
    table, _, _ = export
    column = table.column("rollout_log_probs").combine_chunks()
    values = column.flatten()
    # Nulls are real Parquet nulls (the validity bitmap), and no stored value
    # is a 0.0 standing in for a missing logprob.
    assert values.null_count > 0
    assert all(x < 0 for x in values.drop_null().to_pylist())


def test_groups_and_task_metadata(export):
    table, _, _ = export
    rows = table.to_pylist()
    for row in rows:
        k = int(row["trajectory_id"].split("-")[1])
        assert row["uid"] == f"task-{k // 4}", "the GRPO group"
        assert row["data_source"] == "fixture"
        assert row["index"] == k
        assert json.loads(row["extra_info"]) == {"k": k}
        assert json.loads(row["reward_extra_info"]) == {"acc": k % 2}
        # Turns 0..k: calls after the third ran under step-2.
        versions = ["step-1" if t < 3 else "step-2" for t in range(k + 1)]
        n = len(row["weight_versions"])
        assert row["weight_versions"] == versions[:n]
        assert row["min_weight_version"] == "step-1"
        assert row["max_weight_version"] == versions[n - 1]
