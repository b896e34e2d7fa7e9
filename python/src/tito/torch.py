"""PyTorch: `ExportDataset`, an `IterableDataset` over a consumer group's
queue. Importing this module needs torch (`pip install torch`); `import
tito` does not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

try:
    import torch
    from torch.utils.data import IterableDataset
except ImportError as e:  # pragma: no cover - the message is what is tested
    raise ImportError("tito.torch needs PyTorch, which is not installed: pip install torch "
                      "(or pip install 'tito-rl[torch]')") from e

from .client import Client


class ExportDataset(IterableDataset):  # type: ignore[misc]
    """Batches of a consumer group's queue, one item per leased page, for
    a `DataLoader(dataset, batch_size=None)`: `layout="verl"` gives verl's
    `(tensors, non_tensors)` with torch tensors, other layouts the page's
    rows as dicts.

    A page is acknowledged when the next item is asked for, i.e. after the
    training step on it returned (as `Client.batches`). Read it in the
    training process (`num_workers=0`, the default): worker processes read
    ahead, and would acknowledge pages before their step ran. The keyword
    arguments are those of `Client.batches`."""

    def __init__(self, consumer: str, gateway: str | None = None, *, token: str | None = None,
                 layout: str = "verl", batch_size: int = 64, **batches: Any) -> None:
        super().__init__()
        self.consumer = consumer
        self.gateway = gateway
        self.token = token
        self.layout = layout
        self.batch_size = batch_size
        self.options = batches

    def __iter__(self) -> Iterator[Any]:
        with Client(self.gateway, token=self.token) as client:
            for batch in client.batches(self.consumer, layout=self.layout,
                                        batch_size=self.batch_size, **self.options):
                yield batch.to_verl(torch) if self.layout == "verl" else batch.rows()
