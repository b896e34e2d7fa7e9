"""What each client operation sends and how it reads the answers, written
once for `Client` and `AsyncClient`: an operation is a generator that
yields `Req`s, receives each `httpx.Response`, and returns its result. The
sync client drives it with blocking calls, the async one with awaits."""

from __future__ import annotations

import os
import secrets
import time
import warnings
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pyarrow as pa

from . import schema
from .batch import Batch, read_parquet, rows
from .errors import NoSampleError, TitoError, raise_for_status

LAYOUTS = ("trajectory", "per_call", "verl")
WEIGHT_MODES = ("wait", "abort", "keep")


class TitoWarning(UserWarning):
    """Something the gateway did may not be what was asked."""


@dataclass
class Req:
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    admin: bool = False
    #: statuses returned to the operation instead of raised
    accept: tuple[int, ...] = ()


T = TypeVar("T")
#: an operation giving a T
Op = Generator[Req, httpx.Response, T]


def new_trajectory_id() -> str:
    """`traj-`, the time in ms as 12 hex digits, 16 random hex digits: the
    gateway's own format, so ids sort in creation order."""
    return f"traj-{int(time.time() * 1000) & (2**48 - 1):012x}{secrets.token_hex(8)}"


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _json(r: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object (an empty body is `{}`)."""
    raise_for_status(r)
    body = r.json() if r.content else {}
    if not isinstance(body, dict):
        raise TitoError(f"{r.request.method} {r.request.url}: expected a JSON object, "
                        f"got {type(body).__name__}")
    return body


# -- trajectories ------------------------------------------------------------

def metadata(tid: str, group: str | None = None, data_source: str | None = None,
             index: int | None = None, extra_info: dict[str, Any] | None = None) -> Op[dict[str, Any]]:
    body = _drop_none({"group": group, "data_source": data_source,
                       "index": None if index is None else int(index), "extra_info": extra_info})
    return _json((yield Req("POST", f"/v1/trajectories/{tid}/metadata", json=body)))


def reward(tid: str, value: float, call: int | None = None,
           extra: dict[str, Any] | None = None) -> Op[dict[str, Any]]:
    body = _drop_none({"reward": float(value), "call": call, "extra": extra})
    return _json((yield Req("POST", f"/v1/trajectories/{tid}/reward", json=body)))


def finish(tid: str) -> Op[dict[str, Any]]:
    return _json((yield Req("POST", f"/v1/trajectories/{tid}/finish")))


def verify(tid: str, threshold: float | None = None, backend: str | None = None) -> Op[dict[str, Any]]:
    body = _drop_none({"threshold": threshold, "backend": backend})
    return _json((yield Req("POST", f"/v1/trajectories/{tid}/verify", json=body)))


def get(path: str, params: dict[str, Any] | None = None, admin: bool = False) -> Op[dict[str, Any]]:
    return _json((yield Req("GET", path, params=params, admin=admin)))


def ready() -> Op[dict[str, Any]]:
    """`/ready`'s body whether it is 200 or 503."""
    r = yield Req("GET", "/ready", accept=(503,))
    return _json(r)


def health() -> Op[bool]:
    r = yield Req("GET", "/health", accept=(500, 502, 503, 504))
    return bool(r.status_code == 200)


def versions() -> Op[dict[int, str]]:
    """Every registered weight version: sequence number -> label."""
    doc = _json((yield Req("GET", "/v1/versions")))
    data = doc.get("data") if isinstance(doc, dict) else None
    return {int(v["seq"]): str(v["version"]) for v in data or []}


def gateway_version() -> Op[str | None]:
    """The gateway's version (`info.version` of `/openapi.json`)."""
    doc = _json((yield Req("GET", "/openapi.json")))
    info = doc.get("info") if isinstance(doc, dict) else None
    version = info.get("version") if isinstance(info, dict) else None
    return version if isinstance(version, str) else None


# -- export ------------------------------------------------------------------

def export_params(layout: str, prompt_length: int | None, response_length: int | None,
                  pad_id: int | None, filters: dict[str, Any]) -> dict[str, Any]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if layout == "verl" and (prompt_length is None or response_length is None):
        raise ValueError("layout='verl' needs prompt_length and response_length")
    params: dict[str, Any] = {"format": "parquet", "layout": layout}
    params.update(_drop_none({"prompt_length": prompt_length,
                              "response_length": response_length, "pad_id": pad_id}))
    for k, v in filters.items():
        if v is None or v is False:
            continue
        params[k] = "true" if v is True else v
    return params


def _checked_table(r: httpx.Response, layout: str, state: dict[str, Any]) -> Op[pa.Table]:
    """The page's table, after the schema check (once per client)."""
    table = read_parquet(r.content)
    header = r.headers.get(schema.SCHEMA_HEADER)
    key = (layout, header)
    if state.get("checked") != key:
        try:
            schema.check(table.schema, layout, header, None)
        except Exception:
            version = yield from gateway_version()
            schema.check(table.schema, layout, header, version)
        state["checked"] = key
    return table


def export(params: dict[str, Any], state: dict[str, Any]) -> Op[pa.Table]:
    r = yield Req("GET", "/v1/export", params=params)
    raise_for_status(r)
    return (yield from _checked_table(r, params["layout"], state))


def lease(consumer: str, params: dict[str, Any], state: dict[str, Any]) -> Op[Batch | None]:
    """The consumer's next page as a `Batch`, or None when nothing is left."""
    r = yield Req("GET", "/v1/export", params={**params, "consumer": consumer})
    raise_for_status(r)
    cursor = r.headers.get("x-export-cursor")
    if cursor is None:
        return None
    table = yield from _checked_table(r, params["layout"], state)
    expires = r.headers.get("x-export-lease-expires")
    n = r.headers.get("x-export-trajectories")
    return Batch(consumer=consumer, layout=params["layout"], cursor=cursor, table=table,
                 trajectories=int(n) if n is not None else len(set(batch_ids(table))),
                 lease_expires_ms=int(expires) if expires is not None else None)


def batch_ids(table: pa.Table) -> list[str]:
    return [str(t) for t in table.column("trajectory_id").to_pylist()]


def ack(consumer: str, cursor: str) -> Op[dict[str, Any]]:
    body = {"consumer": consumer, "cursor": cursor}
    return _json((yield Req("POST", "/v1/export/ack", json=body)))


def lease_running(batch: Batch) -> bool:
    """The batch's lease has not ended (so its cursor may still be acked)."""
    return batch.lease_expires_ms is None or batch.lease_expires_ms > time.time() * 1000


def samples(tid: str, state: dict[str, Any],
            response_length: int | None = None) -> Op[list[dict[str, Any]]]:
    """A trajectory's samples as the export writes them (`layout=trajectory`
    rows of `trajectory=ID`, JSON columns parsed, cut to `response_length`
    by the gateway, which never splits an image's placeholder run), by
    `sample`."""
    params = export_params("trajectory", None, response_length, None, {"trajectory": tid})
    table = yield from export(params, state)
    found: list[dict[str, Any]] = [row for row in rows(table) if row["trajectory_id"] == tid]
    if not found:
        raise NoSampleError(f"trajectory {tid} has no sample in the export (no call recorded)")
    return sorted(found, key=lambda row: row["sample"])


# -- weights and fleet -------------------------------------------------------

def _check_mode(mode: str) -> None:
    if mode not in WEIGHT_MODES:
        raise ValueError(f"mode must be one of {', '.join(WEIGHT_MODES)}, not {mode!r}")


def _confirm_mode(answer: Any, mode: str) -> None:
    """A gateway that knows weight-update modes echoes the mode it ran
    (`keep` runs as `abort`, with its reason in `fallback`); one that does
    not ignores the field and drains (`wait`)."""
    ran = answer.get("mode") if isinstance(answer, dict) else None
    if mode == "wait" or ran == mode:
        return
    if ran is not None:
        why = answer.get("fallback") or "no reason given"
        warnings.warn(f"the gateway ran mode={ran!r} for the weight update asked as "
                      f"mode={mode!r}: {why}", TitoWarning, stacklevel=4)
        return
    warnings.warn(
        f"the gateway did not confirm mode={mode!r} for the weight update; a gateway "
        "without weight-update modes drains in-flight calls instead (mode='wait')",
        TitoWarning, stacklevel=4)


def update_weights(version: str, path: str | None, mode: str, timeout_s: float | None,
                   drain_timeout_s: float | None) -> Op[dict[str, Any]]:
    _check_mode(mode)
    body = _drop_none({"version": version, "path": path, "mode": mode,
                       "timeout_s": timeout_s, "drain_timeout_s": drain_timeout_s})
    answer = _json((yield Req("POST", "/admin/weights", json=body, admin=True)))
    _confirm_mode(answer, mode)
    return answer


def begin_weights(mode: str, timeout_s: float | None, drain_timeout_s: float | None) -> Op[dict[str, Any]]:
    _check_mode(mode)
    body = _drop_none({"mode": mode, "timeout_s": timeout_s, "drain_timeout_s": drain_timeout_s})
    answer = _json((yield Req("POST", "/admin/weights/begin", json=body, admin=True)))
    _confirm_mode(answer, mode)
    return answer


def commit_weights(version: str, timeout_s: float | None) -> Op[dict[str, Any]]:
    body = _drop_none({"version": version, "timeout_s": timeout_s})
    return _json((yield Req("POST", "/admin/weights/commit", json=body, admin=True)))


def cancel_weights(timeout_s: float | None) -> Op[dict[str, Any]]:
    body = _drop_none({"timeout_s": timeout_s})
    return _json((yield Req("POST", "/admin/weights/cancel", json=body, admin=True)))


def add_backend(url: str, kind: str, name: str | None) -> Op[dict[str, Any]]:
    body = _drop_none({"url": url, "kind": kind, "name": name})
    return _json((yield Req("POST", "/admin/backends", json=body, admin=True)))


def remove_backend(backend: str | int) -> Op[dict[str, Any]]:
    return _json((yield Req("DELETE", f"/admin/backends/{backend}", admin=True)))


def admin_post(path: str, params: dict[str, Any] | None = None,
               body: dict[str, Any] | None = None) -> Op[dict[str, Any]]:
    return _json((yield Req("POST", path, params=params, json=body, admin=True)))


def env_url() -> str:
    return os.environ.get("TITO_URL", "http://127.0.0.1:8000")
