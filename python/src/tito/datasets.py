"""Exported Parquet in Hugging Face `datasets` or Ray Data, each imported
only when its function is called."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa

from .batch import read_parquet


def _table(source: Any) -> pa.Table:
    return source if isinstance(source, pa.Table) else read_parquet(source)


def to_hf_dataset(source: Any) -> Any:
    """A `datasets.Dataset` of an export (a Parquet path, its bytes, or a
    pyarrow table)."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError("to_hf_dataset needs Hugging Face datasets: pip install datasets "
                          "(or pip install 'tito-rl[datasets]')") from e
    return datasets.Dataset(_table(source))


def to_ray_dataset(source: Any) -> Any:
    """A Ray Data dataset of an export: `ray.data.read_parquet` for a path
    (a file or a directory of files), else the table in memory."""
    try:
        import ray.data
    except ImportError as e:
        raise ImportError("to_ray_dataset needs Ray Data: pip install 'ray[data]' "
                          "(or pip install 'tito-rl[ray]')") from e
    if isinstance(source, (str, os.PathLike)):
        return ray.data.read_parquet(os.fspath(source))
    return ray.data.from_arrow(_table(source))
