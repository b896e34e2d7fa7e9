"""`Client` (blocking) and `AsyncClient` (asyncio) for a tito gateway's
trainer and admin routes. Both run the same operations (`tito._ops`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa

from . import _ops
from ._ops import Op, Req, T
from .batch import Batch, rows
from .errors import TitoConnectionError, raise_for_status


@dataclass
class Trajectory:
    """A trajectory to run an agent on: point the agent's OpenAI client at
    `base_url` (with `api_key` when `[auth] api_keys` is set) and every
    call it makes is recorded under `id`, in `group`. The methods act on
    this trajectory through the client that made it (coroutines for an
    `AsyncClient`)."""

    id: str
    group: str | None
    base_url: str
    api_key: str | None
    client: Client | AsyncClient

    def reward(self, value: float, *, call: int | None = None,
               extra: dict[str, Any] | None = None) -> Any:
        return self.client.reward(self.id, value, call=call, extra=extra)

    def finish(self) -> Any:
        return self.client.finish(self.id)

    def metadata(self, **fields: Any) -> Any:
        return self.client.metadata(self.id, **fields)

    def verify(self, *, threshold: float | None = None, backend: str | None = None) -> Any:
        return self.client.verify(self.id, threshold=threshold, backend=backend)

    def samples(self) -> Any:
        return self.client.samples(self.id)

    def get(self) -> Any:
        return self.client.trajectory(self.id)


class _Common:
    def __init__(self, base_url: str | None, token: str | None, admin_token: str | None,
                 api_key: str | None) -> None:
        self.base_url = (base_url or _ops.env_url()).rstrip("/")
        self.token = token
        self.admin_token = admin_token or token
        self.api_key = api_key
        # one schema check per (layout, header); the consumer pages this
        # client holds unacknowledged: (consumer, query) -> batches
        self._schema_state: dict[str, Any] = {}
        self._held: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Batch]] = {}

    def _headers(self, req: Req) -> dict[str, str]:
        tok = self.admin_token if req.admin else self.token
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    def _trajectory(self, tid: str, group: str | None) -> Trajectory:
        prefix = f"/g/{group}/t/{tid}" if group is not None else f"/t/{tid}"
        return Trajectory(id=tid, group=group, base_url=f"{self.base_url}{prefix}/v1",
                          api_key=self.api_key, client=self)  # type: ignore[arg-type]

    @staticmethod
    def _query_key(consumer: str, params: dict[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
        return consumer, tuple(sorted(params.items()))

    def _take_held(self, key: tuple[str, tuple[tuple[str, Any], ...]]) -> Batch | None:
        """An unacknowledged batch of this query whose lease still runs (its
        step raised, or the loop was left): delivered again first."""
        held = self._held.get(key, [])
        while held:
            batch = held.pop(0)
            if not batch.acked and _ops.lease_running(batch):
                return batch
        return None

    def _hold(self, key: tuple[str, tuple[tuple[str, Any], ...]], batch: Batch) -> None:
        self._held.setdefault(key, []).append(batch)

    def _release(self, key: tuple[str, tuple[tuple[str, Any], ...]], batch: Batch) -> None:
        held = self._held.get(key, [])
        if batch in held:
            held.remove(batch)


def _batch_query(layout: str, batch_size: int, prompt_length: int | None,
                 response_length: int | None, pad_id: int | None, lease_s: int | None,
                 complete_groups: bool, group_size: int | None,
                 filters: dict[str, Any]) -> dict[str, Any]:
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    params = _ops.export_params(layout, prompt_length, response_length, pad_id,
                                {**filters, "complete_groups": complete_groups,
                                 "group_size": group_size, "status": None})
    params["limit"] = batch_size
    if lease_s is not None:
        params["lease_s"] = lease_s
    return params


class Client(_Common):
    """A blocking client.

    `token`: a trainer token (`[auth] trainer_tokens`) for the trajectory,
    export and verify routes; `admin_token` for `/admin/*` (default
    `token`); `api_key`: what agents send on the OpenAI routes (handed out
    with each `Trajectory`). `base_url` defaults to `$TITO_URL`, else
    `http://127.0.0.1:8000`."""

    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 admin_token: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0, http: httpx.Client | None = None) -> None:
        super().__init__(base_url, token, admin_token, api_key)
        self._http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        try:
            req = next(op)
            while True:
                try:
                    r = self._http.request(req.method, self.base_url + req.path,
                                           params=req.params, json=req.json,
                                           headers=self._headers(req))
                except httpx.TransportError as e:
                    raise TitoConnectionError(f"{req.method} {self.base_url}{req.path}: {e}") from e
                if r.status_code >= 400 and r.status_code not in req.accept:
                    raise_for_status(r)
                req = op.send(r)
        except StopIteration as done:
            value: T = done.value
            return value

    # trajectories

    def new_trajectory(self, group: str | None = None, *, trajectory_id: str | None = None,
                       data_source: str | None = None, index: int | None = None,
                       extra_info: dict[str, Any] | None = None) -> Trajectory:
        """Registers a trajectory (its group and task fields) before its
        agent starts, and returns where the agent points its OpenAI client."""
        tid = trajectory_id or _ops.new_trajectory_id()
        self._run(_ops.metadata(tid, group, data_source, index, extra_info))
        return self._trajectory(tid, group)

    def reward(self, trajectory_id: str, value: float, *, call: int | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trajectory's reward (or one call's, with `call`); `extra`:
        named reward parts (exported as `reward_extra_info`)."""
        return self._run(_ops.reward(trajectory_id, value, call, extra))

    def finish(self, trajectory_id: str) -> dict[str, Any]:
        """No further calls: the trajectory's samples are final (and served
        to consumer groups)."""
        return self._run(_ops.finish(trajectory_id))

    def metadata(self, trajectory_id: str, *, group: str | None = None,
                 data_source: str | None = None, index: int | None = None,
                 extra_info: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._run(_ops.metadata(trajectory_id, group, data_source, index, extra_info))

    def verify(self, trajectory_id: str, *, threshold: float | None = None,
               backend: str | None = None) -> dict[str, Any]:
        """The teacher-forced replay check of every sample (docs/api.md)."""
        return self._run(_ops.verify(trajectory_id, threshold, backend))

    def trajectory(self, trajectory_id: str) -> dict[str, Any]:
        """`GET /v1/trajectories/{id}`: calls, samples with segments, drift."""
        return self._run(_ops.get(f"/v1/trajectories/{trajectory_id}"))

    def group(self, group: str) -> dict[str, Any]:
        return self._run(_ops.get(f"/v1/groups/{group}"))

    def samples(self, trajectory_id: str,
                response_length: int | None = None) -> list[dict[str, Any]]:
        """The trajectory's samples as exported (`layout=trajectory`,
        whatever its status, cut to `response_length` when given);
        `NotFoundError` when there is no such trajectory."""
        return self._run(_ops.samples(trajectory_id, self._schema_state, response_length))

    # export

    def export(self, *, layout: str = "trajectory", prompt_length: int | None = None,
               response_length: int | None = None, pad_id: int | None = None,
               **filters: Any) -> pa.Table:
        """One export (no consumer cursor) as a pyarrow table. `filters`:
        `status`, `since`, `group`, `complete_groups`, `group_size`."""
        params = _ops.export_params(layout, prompt_length, response_length, pad_id, filters)
        return self._run(_ops.export(params, self._schema_state))

    def export_rows(self, **kwargs: Any) -> list[dict[str, Any]]:
        return rows(self.export(**kwargs))

    def batches(self, consumer: str, *, layout: str = "verl", batch_size: int = 64,
                prompt_length: int | None = None, response_length: int | None = None,
                pad_id: int | None = None, lease_s: int | None = None,
                complete_groups: bool = False, group_size: int | None = None,
                **filters: Any) -> Iterator[Batch]:
        """The consumer group's queue as batches, until it is empty.

        Each batch is one leased page of `batch_size` trajectories (with
        `complete_groups`, whole groups: a page may be larger). A batch is
        acknowledged when the loop asks for the next one, i.e. after the
        caller's step for it returned, so every trajectory is trained on
        once across restarts. A batch whose step raised (or whose loop was
        left) is not acknowledged: the next `batches` call of this client
        delivers it again first, and any client gets it after its lease
        (`lease_s`, the gateway's default 600 s) ends. Call `batch.ack()`
        before a `break` that should count the batch as done."""
        params = _batch_query(layout, batch_size, prompt_length, response_length, pad_id,
                              lease_s, complete_groups, group_size, filters)
        key = self._query_key(consumer, params)
        while True:
            batch = self._take_held(key) or self._run(
                _ops.lease(consumer, params, self._schema_state))
            if batch is None:
                return
            batch._ack = lambda b, key=key: self._ack_batch(key, b)
            self._hold(key, batch)
            yield batch
            self._ack_batch(key, batch)

    def _ack_batch(self, key: tuple[str, tuple[tuple[str, Any], ...]], batch: Batch) -> Any:
        if not batch.acked:
            batch.ack_result = self._run(_ops.ack(batch.consumer, batch.cursor))
            batch.acked = True
        self._release(key, batch)
        return batch.ack_result

    def ack(self, consumer: str, cursor: str) -> dict[str, Any]:
        return self._run(_ops.ack(consumer, cursor))

    # weights and fleet

    def update_weights(self, version: str, *, path: str | None = None, mode: str = "wait",
                       timeout_s: float | None = None,
                       drain_timeout_s: float | None = None) -> dict[str, Any]:
        """One-step update: with `path` every backend loads that checkpoint;
        without, the gateway records that the weights are now `version`
        (the trainer changed them itself) and tags later calls with it.
        `mode`: `wait` drains in-flight calls first; `abort` / `keep` are
        passed to the gateway (see docs/trainers.md)."""
        return self._run(_ops.update_weights(version, path, mode, timeout_s, drain_timeout_s))

    @contextlib.contextmanager
    def weight_push(self, version: str, *, mode: str = "wait", timeout_s: float | None = None,
                    drain_timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """Two-step update around the trainer's own push (NCCL / IPC):
        `begin` on entry (admission paused, backends told), `commit
        {version}` when the block returns. When the block raises, nothing
        is committed and the exception propagates: admission stays paused
        until a later commit (push again, then `commit_weights`) or, when
        the failed push changed no weights, `cancel_weights()`."""
        yield self._run(_ops.begin_weights(mode, timeout_s, drain_timeout_s))
        self.commit_weights(version, timeout_s=timeout_s)

    def commit_weights(self, version: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return self._run(_ops.commit_weights(version, timeout_s))

    def cancel_weights(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Calls off a begun update whose push changed no weights: the
        backends go on with the weights they had, under the version before
        the begin, and admission resumes. `ConflictError` when none is begun."""
        return self._run(_ops.cancel_weights(timeout_s))

    def sleep(self, level: int = 1) -> dict[str, Any]:
        return self._run(_ops.admin_post("/admin/sleep", params={"level": level}))

    def wake_up(self) -> dict[str, Any]:
        return self._run(_ops.admin_post("/admin/wake_up"))

    def health(self) -> bool:
        """Liveness: the process answers (False when it cannot be reached)."""
        try:
            return self._run(_ops.health())
        except TitoConnectionError:
            return False

    def ready(self) -> dict[str, Any]:
        """`/ready`'s body (`ready`, `backends`, `backends_ready`, `store`)."""
        return self._run(_ops.ready())

    def fleet(self) -> dict[str, Any]:
        """`GET /admin/backends`: each backend's state, the fleet's weight
        version, whether admission is paused and why."""
        return self._run(_ops.get("/admin/backends", admin=True))

    def add_backend(self, url: str, *, kind: str = "vllm",
                    name: str | None = None) -> dict[str, Any]:
        """Adds an inference server to the fleet (`kind`: vllm | sglang)."""
        return self._run(_ops.add_backend(url, kind, name))

    def remove_backend(self, backend: str | int) -> dict[str, Any]:
        """Removes a backend by id or name."""
        return self._run(_ops.remove_backend(backend))

    def versions(self) -> dict[int, str]:
        """`GET /v1/versions`: each registered weight version's sequence
        number (the numbers in `response_versions`) -> its label."""
        return self._run(_ops.versions())

    def gateway_version(self) -> str | None:
        return self._run(_ops.gateway_version())


class AsyncClient(_Common):
    """The asyncio twin of `Client`: the same methods, as coroutines;
    `batches` is an async iterator and `weight_push` an async context
    manager."""

    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 admin_token: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0, http: httpx.AsyncClient | None = None) -> None:
        super().__init__(base_url, token, admin_token, api_key)
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, op: Op[T]) -> T:
        try:
            req = next(op)
            while True:
                try:
                    r = await self._http.request(req.method, self.base_url + req.path,
                                                 params=req.params, json=req.json,
                                                 headers=self._headers(req))
                except httpx.TransportError as e:
                    raise TitoConnectionError(f"{req.method} {self.base_url}{req.path}: {e}") from e
                if r.status_code >= 400 and r.status_code not in req.accept:
                    raise_for_status(r)
                req = op.send(r)
        except StopIteration as done:
            value: T = done.value
            return value

    async def new_trajectory(self, group: str | None = None, *,
                             trajectory_id: str | None = None, data_source: str | None = None,
                             index: int | None = None,
                             extra_info: dict[str, Any] | None = None) -> Trajectory:
        tid = trajectory_id or _ops.new_trajectory_id()
        await self._run(_ops.metadata(tid, group, data_source, index, extra_info))
        return self._trajectory(tid, group)

    async def reward(self, trajectory_id: str, value: float, *, call: int | None = None,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._run(_ops.reward(trajectory_id, value, call, extra))

    async def finish(self, trajectory_id: str) -> dict[str, Any]:
        return await self._run(_ops.finish(trajectory_id))

    async def metadata(self, trajectory_id: str, *, group: str | None = None,
                       data_source: str | None = None, index: int | None = None,
                       extra_info: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._run(_ops.metadata(trajectory_id, group, data_source, index, extra_info))

    async def verify(self, trajectory_id: str, *, threshold: float | None = None,
                     backend: str | None = None) -> dict[str, Any]:
        return await self._run(_ops.verify(trajectory_id, threshold, backend))

    async def trajectory(self, trajectory_id: str) -> dict[str, Any]:
        return await self._run(_ops.get(f"/v1/trajectories/{trajectory_id}"))

    async def group(self, group: str) -> dict[str, Any]:
        return await self._run(_ops.get(f"/v1/groups/{group}"))

    async def samples(self, trajectory_id: str,
                      response_length: int | None = None) -> list[dict[str, Any]]:
        return await self._run(_ops.samples(trajectory_id, self._schema_state, response_length))

    async def export(self, *, layout: str = "trajectory", prompt_length: int | None = None,
                     response_length: int | None = None, pad_id: int | None = None,
                     **filters: Any) -> pa.Table:
        params = _ops.export_params(layout, prompt_length, response_length, pad_id, filters)
        return await self._run(_ops.export(params, self._schema_state))

    async def batches(self, consumer: str, *, layout: str = "verl", batch_size: int = 64,
                      prompt_length: int | None = None, response_length: int | None = None,
                      pad_id: int | None = None, lease_s: int | None = None,
                      complete_groups: bool = False, group_size: int | None = None,
                      **filters: Any) -> AsyncIterator[Batch]:
        """As `Client.batches`; `await batch.ack()` to acknowledge early."""
        params = _batch_query(layout, batch_size, prompt_length, response_length, pad_id,
                              lease_s, complete_groups, group_size, filters)
        key = self._query_key(consumer, params)
        while True:
            batch = self._take_held(key) or await self._run(
                _ops.lease(consumer, params, self._schema_state))
            if batch is None:
                return
            batch._ack = lambda b, key=key: self._ack_batch(key, b)
            self._hold(key, batch)
            yield batch
            await self._ack_batch(key, batch)

    async def _ack_batch(self, key: tuple[str, tuple[tuple[str, Any], ...]],
                         batch: Batch) -> Any:
        if not batch.acked:
            batch.ack_result = await self._run(_ops.ack(batch.consumer, batch.cursor))
            batch.acked = True
        self._release(key, batch)
        return batch.ack_result

    async def ack(self, consumer: str, cursor: str) -> dict[str, Any]:
        return await self._run(_ops.ack(consumer, cursor))

    async def update_weights(self, version: str, *, path: str | None = None,
                             mode: str = "wait", timeout_s: float | None = None,
                             drain_timeout_s: float | None = None) -> dict[str, Any]:
        return await self._run(
            _ops.update_weights(version, path, mode, timeout_s, drain_timeout_s))

    @contextlib.asynccontextmanager
    async def weight_push(self, version: str, *, mode: str = "wait",
                          timeout_s: float | None = None,
                          drain_timeout_s: float | None = None) -> AsyncIterator[dict[str, Any]]:
        yield await self._run(_ops.begin_weights(mode, timeout_s, drain_timeout_s))
        await self.commit_weights(version, timeout_s=timeout_s)

    async def commit_weights(self, version: str, *,
                             timeout_s: float | None = None) -> dict[str, Any]:
        return await self._run(_ops.commit_weights(version, timeout_s))

    async def cancel_weights(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._run(_ops.cancel_weights(timeout_s))

    async def sleep(self, level: int = 1) -> dict[str, Any]:
        return await self._run(_ops.admin_post("/admin/sleep", params={"level": level}))

    async def wake_up(self) -> dict[str, Any]:
        return await self._run(_ops.admin_post("/admin/wake_up"))

    async def health(self) -> bool:
        try:
            return await self._run(_ops.health())
        except TitoConnectionError:
            return False

    async def ready(self) -> dict[str, Any]:
        return await self._run(_ops.ready())

    async def fleet(self) -> dict[str, Any]:
        return await self._run(_ops.get("/admin/backends", admin=True))

    async def add_backend(self, url: str, *, kind: str = "vllm",
                          name: str | None = None) -> dict[str, Any]:
        return await self._run(_ops.add_backend(url, kind, name))

    async def remove_backend(self, backend: str | int) -> dict[str, Any]:
        return await self._run(_ops.remove_backend(backend))

    async def versions(self) -> dict[int, str]:
        return await self._run(_ops.versions())

    async def gateway_version(self) -> str | None:
        return await self._run(_ops.gateway_version())
