"""AReaL: `TitoWorkflow`, a rollout workflow whose `arun_episode` runs an
agent through tito and returns the tensor dict AReaL trains on.

At AReaL commit 4aef98d8d818af55b43621aaadba047ae10f4e77 a workflow is a
`RolloutWorkflow` with `async def arun_episode(self, engine, data)`
(areal/api/workflow_api.py), and its RLVR workflow returns, with batch
dimension 1 (areal/workflow/rlvr.py, lines 165-178):

- `input_ids` int32 [1, L]: prompt then response;
- `loss_mask` int32 [1, L]: 0 on the prompt, 1 on sampled tokens (here
  also 0 on tool results and template glue);
- `logprobs` float32 [1, L]: 0.0 where nothing was sampled;
- `versions` int32 [1, L]: -1 where nothing was sampled, else the weight
  version that sampled the token;
- `attention_mask` bool [1, L]: all true;
- `rewards` float32 [1].

AReaL numbers weight versions with integers from 0 (the initial weights);
tito's versions are the strings given to `update_weights`. A token's
version is the last run of digits of the label of the weights that sampled
it (`"12"`, `"step-12"` -> 12), read per token from the export's
`response_versions` and the gateway's `GET /v1/versions` (a call that an
`abort` / `keep` update split carries both versions), and 0 for a token
sampled before any update. Tensors are
torch tensors when torch is importable, else numpy arrays of the same
dtypes and shapes.

The agent is either AReaL's own agent shape, an object with `async def
run(self, data, **extra_kwargs)` that reads `base_url`, `api_key` and
`http_client` from `extra_kwargs` (workflow_api.py, `AgentWorkflow`) and
returns a float reward, or a tito agent callable `agent(base_url, task)`."""

from __future__ import annotations

import inspect
import os
import re
from typing import Any

import httpx

from ._episode import Agent, Episode, EpisodeError, load_agent, run_episode
from ._ops import new_trajectory_id
from .client import AsyncClient

try:  # AReaL is optional: imported here, never by `import tito`
    from areal.api.workflow_api import RolloutWorkflow

    HAVE_AREAL = True
except ImportError:
    HAVE_AREAL = False

    class RolloutWorkflow:  # type: ignore[no-redef]
        """Stand-in for AReaL's `RolloutWorkflow` base."""


def version_number(version: str | None) -> int:
    """AReaL's integer version of a tito weight version."""
    if version is None:
        return 0
    m = re.search(r"(\d+)\D*$", version)
    if m is None:
        raise EpisodeError(
            f"weight version {version!r} has no number: with AReaL, name versions by "
            "step (e.g. update_weights('12') or 'step-12')")
    return int(m.group(1))


def token_versions(sample: dict[str, Any], labels: dict[int, str] | None = None) -> list[int]:
    """Per response token: the version of the weights that sampled it, -1
    on tokens nothing sampled. With `labels` (sequence number -> label) and
    the export's `response_versions`, per token; else per call, from
    `weight_versions` (an export without per-token versions)."""
    per_token = sample.get("response_versions")
    if labels is not None and per_token is not None:
        out = []
        for seq, m in zip(per_token, sample["response_mask"]):
            if not m:
                out.append(-1)
            elif seq is None:
                out.append(version_number(None))
            elif int(seq) in labels:
                out.append(version_number(labels[int(seq)]))
            else:
                raise EpisodeError(f"weight version number {seq} is not registered at the "
                                   "gateway (GET /v1/versions)")
        return out
    offsets = list(sample["call_offsets"])
    numbers = [version_number(v) for v in sample["weight_versions"]]
    out = []
    k = 0
    for i, m in enumerate(sample["response_mask"]):
        while k + 1 < len(offsets) and offsets[k + 1] <= i:
            k += 1
        out.append(numbers[k] if m and numbers else -1)
    return out


def episode_tensors(episode: Episode, reward: float,
                    labels: dict[int, str] | None = None) -> dict[str, Any]:
    """AReaL's tensor dict of a rollout (batch dimension 1)."""
    s = episode.sample
    prompt, response = list(s["prompt_ids"]), list(s["response_ids"])
    mask = list(s["response_mask"])
    logprobs = []
    for lp, m in zip(s["response_logprobs"], mask):
        if m and lp is None:
            raise EpisodeError(f"trajectory {episode.trajectory.id}: a sampled token has no "
                               "logprob (the backend reported none)")
        logprobs.append(float(lp) if m else 0.0)
    columns = {
        "input_ids": (prompt + response, "int32"),
        "loss_mask": ([0] * len(prompt) + mask, "int32"),
        "logprobs": ([0.0] * len(prompt) + logprobs, "float32"),
        "versions": ([-1] * len(prompt) + token_versions(s, labels), "int32"),
        "attention_mask": ([True] * (len(prompt) + len(response)), "bool"),
    }
    try:
        import torch
    except ImportError:
        import numpy as np

        out = {k: np.asarray(v, dtype=d)[None] for k, (v, d) in columns.items()}
        out["rewards"] = np.asarray(reward, dtype="float32")[None]
        return out
    dtypes = {"int32": torch.int32, "float32": torch.float32, "bool": torch.bool}
    res = {k: torch.tensor(v, dtype=dtypes[d]).unsqueeze(0) for k, (v, d) in columns.items()}
    res["rewards"] = torch.tensor(reward, dtype=torch.float32).unsqueeze(0)
    return res


def _as_agent(agent: Any) -> Agent:
    """A tito agent callable of `agent`: an import path, a class (made with
    no arguments), an object with AReaL's `async run(data, **extra_kwargs)`,
    or a tito agent callable."""
    if isinstance(agent, str):
        agent = load_agent(agent)
    if isinstance(agent, type):
        agent = agent()
    run = getattr(agent, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        return load_agent(agent)

    async def call(base_url: str, task: dict[str, Any], api_key: str | None = None) -> Any:
        async with httpx.AsyncClient(timeout=None) as http:
            returned = await run(task, base_url=base_url, api_key=api_key, http_client=http)
        if isinstance(returned, dict):
            raise TypeError("rewards keyed by response id are not supported through tito; "
                            "return the trajectory's float reward")
        return returned

    return call


class TitoWorkflow(RolloutWorkflow):  # type: ignore[misc]
    """A rollout workflow that runs `agent` on a fresh tito trajectory per
    episode. `group_fn(data)` names the trajectory's group (default: a
    fresh group per episode); `gateway` (default `$TITO_URL`), `token`
    (`$TITO_TRAINER_TOKEN`), `api_key` (`$TITO_API_KEY`) locate tito."""

    def __init__(self, agent: Any, *, gateway: str | None = None, token: str | None = None,
                 api_key: str | None = None, group_fn: Any = None) -> None:
        self.agent = _as_agent(agent)
        self.gateway = gateway or os.environ.get("TITO_URL", "http://127.0.0.1:8000")
        self.token = token or os.environ.get("TITO_TRAINER_TOKEN")
        self.api_key = api_key or os.environ.get("TITO_API_KEY")
        self.group_fn = group_fn

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any]:
        """AReaL's `RolloutWorkflow.arun_episode`; `engine` is not used:
        tito routes the agent's calls to its own backends."""
        group = self.group_fn(data) if self.group_fn else "areal-" + new_trajectory_id()[5:]
        async with AsyncClient(self.gateway, token=self.token, api_key=self.api_key) as client:
            episode = await run_episode(client, self.agent, group=group, task=dict(data))
            labels = (await client.versions()
                      if episode.sample.get("response_versions") is not None else None)
        reward = episode.reward if episode.reward is not None else episode.sample["reward"]
        if reward is None:
            raise EpisodeError(f"trajectory {episode.trajectory.id}: the agent returned no "
                               "reward and none was posted; AReaL needs one per episode")
        return episode_tensors(episode, float(reward), labels)
