"""One rollout through tito, shared by the framework integrations: a fresh
trajectory, the user's agent run against its `base_url`, the reward and
`finish` posted, then the sample read back as the export writes it."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .client import AsyncClient, Trajectory
from .errors import TitoError

Agent = Callable[..., Any]


@dataclass
class Episode:
    """What one rollout left: the agent's return value, the reward (None
    when the agent gave none), the trajectory's last sample as exported
    (`layout=trajectory` row), how many samples it has, and its record
    (`GET /v1/trajectories/{id}`: drift, decoded segments)."""

    trajectory: Trajectory
    returned: Any
    reward: float | None
    reward_extra: dict[str, Any] | None
    sample: dict[str, Any]
    num_samples: int
    record: dict[str, Any]
    seconds: float

    @property
    def drift_count(self) -> int:
        return len(self.record.get("drift") or [])

    def response_text(self) -> str | None:
        """The decoded response of the sample (sampled and observation
        segments), None when the gateway could not decode it."""
        for s in self.record.get("samples") or []:
            if s.get("sample") == self.sample["sample"]:
                parts = [seg.get("text") for seg in s.get("segments") or []
                         if seg.get("kind") != "prompt"]
                if any(p is None for p in parts):
                    return None
                return "".join(parts)
        return None

    def stale(self) -> bool:
        """An update of the weights landed while the sample was generated."""
        return self.sample.get("min_weight_version") != self.sample.get("max_weight_version")


def load_agent(agent: Agent | str) -> Agent:
    """A callable, or its import path (`package.module:name` or
    `package.module.name`)."""
    if callable(agent):
        return agent
    if not isinstance(agent, str) or not agent:
        raise TypeError(f"agent must be a callable or an import path, not {agent!r}")
    module, sep, name = agent.partition(":")
    if not sep:
        module, _, name = agent.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{agent} is not callable")
    fn: Agent = obj
    return fn


def _accepts(fn: Agent, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


async def call_agent(agent: Agent, base_url: str, task: dict[str, Any], *,
                     api_key: str | None = None,
                     sampling_params: dict[str, Any] | None = None) -> Any:
    """`agent(base_url, task)`, with `api_key=` and `sampling_params=` when
    it takes them. A coroutine function is awaited; a plain function runs in
    a worker thread, so a blocking agent (the sync OpenAI SDK, LangChain's
    `invoke`) does not stall the event loop."""
    kwargs: dict[str, Any] = {}
    if _accepts(agent, "api_key"):
        kwargs["api_key"] = api_key or "unused"
    if _accepts(agent, "sampling_params"):
        kwargs["sampling_params"] = dict(sampling_params or {})
    if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(
            getattr(agent, "__call__", None)):
        return await agent(base_url, task, **kwargs)
    result = await asyncio.to_thread(agent, base_url, task, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def parse_reward(returned: Any) -> tuple[float | None, dict[str, Any] | None]:
    """The agent's return value as (reward, named parts): a number is the
    reward; a dict gives `reward` and optionally `extra`; None gives none."""
    if returned is None:
        return None, None
    if isinstance(returned, bool):
        raise TypeError("an agent returned a bool; return a float reward")
    if isinstance(returned, (int, float)):
        value = float(returned)
    elif isinstance(returned, dict) and "reward" in returned:
        extra = returned.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise TypeError("an agent's `extra` reward parts must be a dict")
        value = float(returned["reward"])
        if not math.isfinite(value):
            raise ValueError(f"reward {value} is not finite")
        return value, extra
    else:
        raise TypeError("an agent returns a float reward, a dict with `reward` (and "
                        f"optionally `extra`), or None; got {type(returned).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"reward {value} is not finite")
    return value, None


async def run_episode(client: AsyncClient, agent: Agent, *, group: str, task: dict[str, Any],
                      sampling_params: dict[str, Any] | None = None,
                      data_source: str | None = None, index: int | None = None,
                      extra_info: dict[str, Any] | None = None,
                      trajectory_id: str | None = None,
                      response_length: int | None = None) -> Episode:
    """Runs `agent` on a fresh trajectory of `group`, posts its reward (if
    it returned one) and `finish`, and reads the trajectory back (its
    samples cut to `response_length` when given). When the agent raises,
    the trajectory is left active (consumer groups never see it) and the
    exception propagates."""
    traj = await client.new_trajectory(group, trajectory_id=trajectory_id,
                                       data_source=data_source, index=index,
                                       extra_info=extra_info)
    start = time.monotonic()
    returned = await call_agent(agent, traj.base_url, task, api_key=client.api_key,
                                sampling_params=sampling_params)
    seconds = time.monotonic() - start
    reward, extra = parse_reward(returned)
    if reward is not None:
        await client.reward(traj.id, reward, extra=extra)
    await client.finish(traj.id)
    samples = await client.samples(traj.id, response_length=response_length)
    record = await client.trajectory(traj.id)
    return Episode(trajectory=traj, returned=returned, reward=reward, reward_extra=extra,
                   sample=samples[-1], num_samples=len(samples), record=record,
                   seconds=seconds)


def sampled_logprobs(sample: dict[str, Any]) -> list[float] | None:
    """The sample's `response_logprobs` with 0.0 on mask-0 positions (as
    verl and slime pad observations), or None when a sampled token has no
    logprob (the backend reported none): no number is made up for it."""
    out: list[float] = []
    for lp, m in zip(sample["response_logprobs"], sample["response_mask"]):
        if m:
            if lp is None:
                return None
            out.append(float(lp))
        else:
            out.append(0.0)
    return out


# (gateway, what) -> its lock; those this process has registered
_REGISTERING: dict[tuple[str, str], asyncio.Lock] = {}
_REGISTERED: set[tuple[str, str]] = set()


def http_url(host: Any, port: Any) -> str:
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{int(port)}"


async def ensure_backends(client: AsyncClient, what: str,
                          urls: Callable[[], Awaitable[list[str]]], kind: str) -> None:
    """Adds the inference servers `urls()` names (`what` names that set) to
    tito's fleet, once per gateway and process; servers already in the
    fleet are left alone."""
    key = (client.base_url, what)
    if key in _REGISTERED:
        return
    lock = _REGISTERING.setdefault(key, asyncio.Lock())
    async with lock:
        if key in _REGISTERED:
            return
        known = {b["url"].rstrip("/") for b in (await client.fleet())["backends"]}
        for url in await urls():
            if url not in known:
                await client.add_backend(url, kind=kind)
                known.add(url)
        _REGISTERED.add(key)


class EpisodeError(TitoError):
    """A rollout's record cannot be given in the framework's type."""
