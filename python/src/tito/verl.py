"""verl: `TitoAgentLoop`, an agent loop whose `run` drives the user's agent
through tito and returns verl's `AgentLoopOutput` built from tito's record.

Register it in an agent-loop config file (`actor_rollout_ref.rollout.agent.
agent_loop_config_path`); hydra passes the extra keys to `__init__`:

    - name: tito_agent
      _target_: tito.verl.TitoAgentLoop
      gateway: http://127.0.0.1:8000
      agent: my_project.agents:solve

The fields follow verl's `AgentLoopOutput` (verl/experimental/agent_loop/
agent_loop.py at commit b178a3cd56f58b2d502255daba591e92833930a7: the
metrics at lines 125-130, the output at 133-155): unpadded `prompt_ids`,
`response_ids` (cut to the rollout's `response_length` as verl's own loops
cut them), `response_mask` (1 on sampled tokens), `response_logprobs` (0.0
on observation tokens, as verl's tool agent loop pads them: lines 373-375
of tool_agent_loop.py). verl pads them itself afterwards
(`_agent_loop_postprocess`, lines 521-586).

When verl is importable the class subclasses its `AgentLoopBase` and
returns its `AgentLoopOutput`; otherwise stand-ins with the same fields."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from ._episode import (
    Agent,
    Episode,
    EpisodeError,
    ensure_backends,
    http_url,
    load_agent,
    run_episode,
    sampled_logprobs,
)
from .client import AsyncClient

try:  # verl is optional: imported here, never by `import tito`
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
    )

    HAVE_VERL = True
except ImportError:
    HAVE_VERL = False

    @dataclasses.dataclass
    class AgentLoopMetrics:  # type: ignore[no-redef]
        """Stand-in for verl's `AgentLoopMetrics` (same fields, defaults)."""

        generate_sequences: float = 0.0
        tool_calls: float = 0.0
        num_preempted: int = -1

    @dataclasses.dataclass(kw_only=True)
    class AgentLoopOutput:  # type: ignore[no-redef]
        """Stand-in for verl's `AgentLoopOutput` (same fields, defaults)."""

        prompt_ids: list[int]
        response_ids: list[int]
        response_mask: list[int]
        response_logprobs: list[float] | None = None
        routed_experts: Any | None = None
        multi_modal_data: dict[str, Any] | None = None
        reward_score: float | None = None
        num_turns: int = 0
        metrics: AgentLoopMetrics
        extra_fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    class AgentLoopBase:  # type: ignore[no-redef]
        """Stand-in for verl's `AgentLoopBase` constructor: keeps what verl
        passes (`trainer_config` is verl's `DictConfigWrap`)."""

        def __init__(self, trainer_config: Any = None, server_manager: Any = None,
                     tokenizer: Any = None, processor: Any = None, dataset_cls: Any = None,
                     dataset_config: Any = None, **kwargs: Any) -> None:
            self.config = getattr(trainer_config, "config", None)
            self.server_manager = server_manager
            self.tokenizer = tokenizer
            self.processor = processor
            self.dataset_cls = dataset_cls
            self.dataset_config = getattr(dataset_config, "config", None)


def _rollout_length(config: Any, name: str) -> int | None:
    try:
        return int(getattr(config.actor_rollout_ref.rollout, name))
    except (AttributeError, TypeError, ValueError):
        return None


def _multi_modal_data(sample: dict[str, Any]) -> dict[str, Any]:
    """verl's `multi_modal_data` of a sample: `{"images": [PIL images]}` in
    placeholder order, as verl's tool agent loop builds it
    (tool_agent_loop.py lines 190-200), or `{}` for a text sample. verl
    recomputes `multi_modal_inputs` from these with its processor; each is
    turned as its EXIF orientation says, the size tito's placeholder run was
    counted from."""
    images = sample.get("images") or []
    if not images:
        return {}
    if any(b is None for b in images):
        raise EpisodeError("the sample's image bytes are missing (exported with images=ref?)")
    import io

    from PIL import Image, ImageOps  # verl's own dependency, needed only with images

    decoded = []
    for b in images:
        with Image.open(io.BytesIO(b)) as im:
            decoded.append(ImageOps.exif_transpose(im))
    return {"images": decoded}


def agent_loop_output(episode: Episode, response_length: int | None = None) -> Any:
    """verl's `AgentLoopOutput` of a rollout: tito's sample, cut to
    `response_length` as verl's loops cut it, the agent's reward as
    `reward_score` (None lets verl's reward loop score it), and tito's
    provenance in `extra_fields`."""
    s = episode.sample
    cut = slice(None, response_length)
    logprobs = sampled_logprobs(s)
    extra: dict[str, Any] = {
        "tito_trajectory_id": episode.trajectory.id,
        "tito_sample": s["sample"],
        "tito_num_samples": episode.num_samples,
        "tito_weight_versions": s["weight_versions"],
        "tito_min_weight_version": s["min_weight_version"],
        "tito_max_weight_version": s["max_weight_version"],
        "tito_stale": episode.stale(),
        "tito_drift_count": episode.drift_count,
        "tito_finish_reason": s["finish_reason"],
        "tito_truncated": bool(s["truncated"]) or (
            response_length is not None and len(s["response_ids"]) > response_length),
        "tito_agent_seconds": episode.seconds,
    }
    if episode.reward is not None:
        # verl turns reward_extra_info's keys into columns (_postprocess).
        extra["reward_extra_info"] = dict(episode.reward_extra or {})
    return AgentLoopOutput(
        prompt_ids=list(s["prompt_ids"]),
        response_ids=list(s["response_ids"][cut]),
        response_mask=list(s["response_mask"][cut]),
        response_logprobs=logprobs[cut] if logprobs is not None else None,
        multi_modal_data=_multi_modal_data(s),
        reward_score=episode.reward,
        num_turns=int(s["num_turns"]),
        metrics=AgentLoopMetrics(),
        extra_fields=extra,
    )


class TitoAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """An agent loop that runs `agent` (a callable taking an OpenAI
    `base_url` and the sample's dataset fields, or its import path) on a
    fresh tito trajectory per sample, in the group named by the sample's
    `uid` (verl's GRPO group), with `data_source`, `index` and
    `extra_info` as its task metadata.

    `gateway` (default `$TITO_URL`), `token` (a trainer token, default
    `$TITO_TRAINER_TOKEN`) and `api_key` (what the agent sends, default
    `$TITO_API_KEY`) locate tito; `response_length` / `prompt_length`
    default to verl's `actor_rollout_ref.rollout` values.

    With `register_servers=True` the first run in a worker adds verl's own
    rollout servers to tito's fleet (`POST /admin/backends`, needing
    `admin_token`, default `$TITO_ADMIN_TOKEN` or `token`): their
    addresses come from the server actors verl hands the loop
    (`server_manager.server_handles`, each answering
    `get_server_address()`), and `backend_kind` (default verl's
    `actor_rollout_ref.rollout.name`) says how tito speaks to them."""

    def __init__(self, *args: Any, gateway: str | None = None, agent: Agent | str | None = None,
                 token: str | None = None, api_key: str | None = None,
                 admin_token: str | None = None, response_length: int | None = None,
                 prompt_length: int | None = None, register_servers: bool = False,
                 backend_kind: str | None = None, **kwargs: Any) -> None:
        if args or "trainer_config" in kwargs:
            super().__init__(*args, **kwargs)
        else:  # made outside verl's workers (a script, a test): no verl state to keep
            self.config = None
            self.server_manager = kwargs.get("server_manager")
        if agent is None:
            agent = os.environ.get("TITO_AGENT")
        if agent is None:
            raise ValueError("TitoAgentLoop needs `agent` (or $TITO_AGENT)")
        self.agent = load_agent(agent)
        self.gateway = gateway or os.environ.get("TITO_URL", "http://127.0.0.1:8000")
        self.token = token or os.environ.get("TITO_TRAINER_TOKEN")
        self.api_key = api_key or os.environ.get("TITO_API_KEY")
        self.admin_token = admin_token or os.environ.get("TITO_ADMIN_TOKEN")
        config = getattr(self, "config", None)
        self.response_length = response_length or _rollout_length(config, "response_length")
        self.prompt_length = prompt_length or _rollout_length(config, "prompt_length")
        self.register_servers = register_servers
        name = getattr(getattr(getattr(config, "actor_rollout_ref", None), "rollout", None),
                       "name", None)
        self.backend_kind = backend_kind or (name if name in ("vllm", "sglang") else "vllm")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """verl's `AgentLoopBase.run`: `kwargs` are the sample's dataset
        fields (`raw_prompt`, `uid`, `index`, `data_source`, `extra_info`,
        ...); they reach the agent as its `task`."""
        uid = kwargs.get("uid")
        index = kwargs.get("index")
        extra_info = kwargs.get("extra_info")
        async with AsyncClient(self.gateway, token=self.token, api_key=self.api_key,
                               admin_token=self.admin_token) as client:
            if self.register_servers:
                await _register(client, self.server_manager, self.backend_kind)
            episode = await run_episode(
                client, self.agent,
                group=str(uid) if uid is not None else _fresh_group(),
                task=dict(kwargs), sampling_params=sampling_params,
                data_source=_opt_str(kwargs.get("data_source")),
                index=int(index) if index is not None else None,
                extra_info=dict(extra_info) if isinstance(extra_info, dict) else None,
                response_length=self.response_length)
        if self.prompt_length is not None and len(episode.sample["prompt_ids"]) > self.prompt_length:
            raise ValueError(
                f"trajectory {episode.trajectory.id}: prompt of "
                f"{len(episode.sample['prompt_ids'])} tokens is longer than verl's "
                f"prompt_length {self.prompt_length}")
        return agent_loop_output(episode, self.response_length)


async def _register(client: AsyncClient, server_manager: Any, kind: str) -> None:
    """Adds the rollout servers behind `server_manager` to tito's fleet."""
    handles = list(getattr(server_manager, "server_handles", None) or [])
    if not handles:
        raise ValueError("register_servers: verl handed the loop no server handles")

    async def urls() -> list[str]:
        addresses = await asyncio.gather(*(h.get_server_address.remote() for h in handles))
        return [http_url(host, port) for host, port in addresses]

    await ensure_backends(client, "verl-rollout-servers", urls, kind)


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _fresh_group() -> str:
    from ._ops import new_trajectory_id

    return "verl-" + new_trajectory_id()[5:]
