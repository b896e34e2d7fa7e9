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
    int_lists = ["prompt_ids", "response_ids", "response_mask", "input_ids", "attention_mask", "position_ids"]
    for name in int_lists:
        t = schema.field(name).type
        assert pa.types.is_list(t), name
        assert t.value_type == pa.int32(), name
    for name in ["response_logprobs", "rm_scores"]:
        t = schema.field(name).type
        assert pa.types.is_list(t) and t.value_type == pa.float32(), name
    # A missing logprob is a null element; rm_scores has no nulls.
    assert schema.field("response_logprobs").type.value_field.nullable
    assert not schema.field("rm_scores").type.value_field.nullable
    assert schema.field("reward").type == pa.float64()
    assert schema.field("sample").type == pa.int32()
    assert schema.field("num_turns").type == pa.int32()
    assert schema.field("truncated").type == pa.bool_()
    for name in ["trajectory_id", "weight_version", "tokenizer_sha256", "template_sha256", "finish_reason"]:
        assert schema.field(name).type == pa.string(), name


def test_shapes_and_counts(export):
    table, stats, pfile = export
    # 12 trajectories, the one with a 10000-id prompt is skipped.
    assert table.num_rows == stats["rows"] == 11
    assert stats["skipped_long_prompt"] == 1
    assert pfile.metadata.num_row_groups == 3  # row groups of 4 rows
    rows = table.to_pylist()
    for row in rows:
        assert len(row["prompt_ids"]) == P
        for name in ["response_ids", "response_mask", "response_logprobs", "rm_scores"]:
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
        assert row["input_ids"] == row["prompt_ids"] + row["response_ids"]
        expected_pos = [max(c - 1, 0) for c in accumulate(attn)]
        assert row["position_ids"] == expected_pos
        assert all(m == 0 for m in row["response_mask"][n_resp:])
        # Padding and observations (mask 0) have no logprob: null, not 0.0.
        assert all(x is None for x in row["response_logprobs"][n_resp:])
        head = [row[k][:n_resp] for k in ("response_ids", "response_mask", "response_logprobs")]
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
        assert row["truncated"] == (n_resp == R and row["num_turns"] * 17 - 5 > R)
    assert truncated == stats["truncated_responses"] > 0
    assert missing > 0 and present > 0


def test_missing_logprobs_are_nulls_not_zeros(export):
    table, _, _ = export
    column = table.column("response_logprobs").combine_chunks()
    values = column.flatten()
    # Nulls are real Parquet nulls (the validity bitmap), and no stored value
    # is a 0.0 standing in for a missing logprob.
    assert values.null_count > 0
    assert all(x < 0 for x in values.drop_null().to_pylist())
