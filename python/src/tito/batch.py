"""Export pages as batches, and the verl layout as verl's batch.

A `Batch` is one page of a consumer group's queue (`GET
/v1/export?consumer=NAME`): a pyarrow table, the page's cursor, and its
lease. `to_verl` turns a verl-layout table into the tensors and non-tensors
of verl's `DataProto` (docs/export.md, "Loading into verl")."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# verl's tensor batch: key -> numpy dtype name. Shapes [N, P] (prompts,
# left-padded), [N, R] (responses, response_mask, rollout_log_probs,
# rm_scores; right-padded) and [N, P + R] (input_ids, attention_mask,
# position_ids).
VERL_TENSORS: dict[str, str] = {
    "prompts": "int64", "responses": "int64", "response_mask": "int64",
    "input_ids": "int64", "attention_mask": "int64", "position_ids": "int64",
    "rollout_log_probs": "float32", "rm_scores": "float32",
}
VERL_NON_TENSORS = ["uid", "data_source", "index", "extra_info", "reward_extra_info",
                    "trajectory_id", "weight_version", "min_weight_version",
                    "max_weight_version"]
_JSON_COLUMNS = ("extra_info", "reward_extra_info")


def read_parquet(source: str | bytes | Any) -> pa.Table:
    """An exported Parquet file (a path, the bytes of an export page, or a
    file object) as a pyarrow table."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    return pq.read_table(source)


def to_verl(table: pa.Table, torch: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A verl-layout table -> (tensors, non_tensors), the arguments of
    verl's `DataProto.from_dict`. Tensors are numpy arrays, or torch
    tensors when the `torch` module is given. A null `rollout_log_probs`
    element (nothing sampled there) becomes 0.0, as verl pads; the JSON text
    columns become dicts."""
    import numpy as np

    tensors: dict[str, Any] = {}
    n = table.num_rows
    for name, dtype in VERL_TENSORS.items():
        flat = pc.fill_null(table.column(name).combine_chunks().flatten(), 0)
        array = flat.to_numpy(zero_copy_only=False).astype(dtype)
        array = array.reshape(n, -1) if n else array.reshape(0, 0)
        tensors[name] = torch.from_numpy(array) if torch is not None else array
    non_tensors: dict[str, Any] = {}
    for name in VERL_NON_TENSORS:
        values = table.column(name).to_pylist()
        if name in _JSON_COLUMNS:
            values = [json.loads(v) if v else None for v in values]
        array = np.empty(n, dtype=object)
        array[:] = values
        non_tensors[name] = array
    non_tensors["__num_turns__"] = table.column("__num_turns__").to_numpy().astype(np.int32)
    return tensors, non_tensors


def to_data_proto(table: pa.Table) -> Any:
    """verl's `DataProto` of a verl-layout table (needs verl and torch)."""
    import torch
    from verl import DataProto

    tensors, non_tensors = to_verl(table, torch)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """The table's rows as dicts, the JSON text columns parsed."""
    out: list[dict[str, Any]] = table.to_pylist()
    for row in out:
        for name in _JSON_COLUMNS:
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
    return out


@dataclass
class Batch:
    """One leased page of a consumer group's queue.

    `table` holds the page's samples (pyarrow, in the requested layout);
    `cursor` acknowledges it; `trajectories` counts its trajectories (a
    trajectory may give several samples); `lease_expires_ms` is when the
    gateway serves it again if it is not acknowledged (unix ms)."""

    consumer: str
    layout: str
    cursor: str
    table: pa.Table
    trajectories: int
    lease_expires_ms: int | None
    acked: bool = False
    ack_result: dict[str, Any] | None = None
    _ack: Callable[[Batch], Any] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def trajectory_ids(self) -> list[str]:
        """The page's trajectory ids, one per sample (row)."""
        return [str(t) for t in self.table.column("trajectory_id").to_pylist()]

    @property
    def num_tokens(self) -> int:
        """Prompt and response tokens of its samples, padding not counted."""
        if self.layout == "verl":
            col = self.table.column("attention_mask").combine_chunks().flatten()
            return int(pc.sum(col).as_py() or 0)
        total = 0
        for name in ("prompt_ids", "response_ids"):
            total += int(pc.sum(pc.list_value_length(self.table.column(name))).as_py() or 0)
        return total

    def rows(self) -> list[dict[str, Any]]:
        """The samples as dicts (JSON text columns parsed)."""
        return rows(self.table)

    def to_verl(self, torch: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """`(tensors, non_tensors)` for verl's `DataProto.from_dict`; see
        `tito.batch.to_verl`. Only for `layout="verl"`."""
        self._need_verl()
        return to_verl(self.table, torch)

    def to_data_proto(self) -> Any:
        """verl's `DataProto` (verl and torch installed)."""
        self._need_verl()
        return to_data_proto(self.table)

    def ack(self) -> Any:
        """Acknowledges the page now (the iterator does it when the loop
        comes back for the next batch). With an `AsyncClient` this returns
        an awaitable. Acknowledging twice is harmless."""
        if self._ack is None:
            raise RuntimeError("this batch was not leased by a client")
        return self._ack(self)

    def _need_verl(self) -> None:
        if self.layout != "verl":
            raise ValueError(f"to_verl needs layout='verl', this batch is {self.layout!r}")
