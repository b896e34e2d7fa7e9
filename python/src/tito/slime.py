"""slime: a custom generate function (`--custom-generate-function-path
tito.slime.generate`) that runs an agent through tito and fills slime's
`Sample` from tito's record.

The signature is slime's `async def custom_generate(args, sample: Sample,
sampling_params: dict) -> Sample` (slime's docs,
en/get_started/customization.md, section 2; called at slime/rollout/sglang_rollout.py lines 251-260), and
the fields are those of `slime.utils.types.Sample` (lines 94-142), both at
commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:

- `tokens`: prompt ids, then response ids (slime keeps the whole sequence);
- `response_length`: the response's length; `loss_mask`: 1 on sampled
  tokens, 0 on tool results and template glue, one per response token;
- `rollout_log_probs`: one per response token, 0.0 on mask-0 tokens, as
  `Sample.append_response_tokens` pads non-trainable tokens (line 281);
- `weight_versions`: one per call, root first (tito's `weight_versions`;
  None for a call served before any weight update, which slime's type
  writes as `list[str]`);
- `response`: the decoded response; `status`: `TRUNCATED` when the
  response budget ended it, else `COMPLETED`; `reward`: the agent's reward,
  or left None for slime's reward model (`--custom-rm-path`).

The sample is only read and written through its attributes (its own class
gives `Status`), so nothing of slime is imported here.

Configuration of the module-level `generate`: `$TITO_URL`, `$TITO_AGENT`
(an import path of the agent), `$TITO_TRAINER_TOKEN`, `$TITO_API_KEY`,
`$TITO_ADMIN_TOKEN`, `$TITO_REGISTER_ROUTER=1` (add slime's SGLang router
to tito's fleet), `$TITO_RUN_ID` (a prefix for group names; default random
per process), or the same as attributes of slime's `args`
(`args.tito_url`, `args.tito_agent`, ...). `make_generate(agent, ...)`
builds one in code."""

from __future__ import annotations

import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from ._episode import (
    Agent,
    EpisodeError,
    ensure_backends,
    http_url,
    load_agent,
    run_episode,
    sampled_logprobs,
)
from ._ops import new_trajectory_id
from .client import AsyncClient

_RUN = os.environ.get("TITO_RUN_ID") or secrets.token_hex(4)


def _setting(args: Any, name: str) -> str | None:
    value = getattr(args, f"tito_{name}", None)
    return value if value is not None else os.environ.get(f"TITO_{name.upper()}")


def group_of(sample: Any, run: str = _RUN) -> str:
    """The tito group of a slime sample: its `group_index` (the n samples
    of one prompt) within this run."""
    gi = getattr(sample, "group_index", None)
    return f"slime-{run}-g{gi}" if gi is not None else f"slime-{run}-{new_trajectory_id()[5:]}"


def fill_sample(sample: Any, episode: Any) -> Any:
    """Writes a rollout's record into slime's `Sample` and returns it."""
    s = episode.sample
    logprobs = sampled_logprobs(s)
    if logprobs is None:
        raise EpisodeError(
            f"trajectory {episode.trajectory.id}: a sampled token has no logprob (the backend "
            "reported none); slime needs rollout log probabilities for trainable tokens")
    response = list(s["response_ids"])
    sample.tokens = list(s["prompt_ids"]) + response
    sample.response_length = len(response)
    sample.loss_mask = list(s["response_mask"])
    sample.rollout_log_probs = logprobs
    sample.weight_versions = list(s["weight_versions"])
    text = episode.response_text()
    sample.response = text if text is not None else ""
    status = type(sample).Status
    truncated = bool(s["truncated"]) or s["finish_reason"] == "length"
    sample.status = status.TRUNCATED if truncated else status.COMPLETED
    if episode.reward is not None:
        sample.reward = episode.reward
    metadata = getattr(sample, "metadata", None)
    if isinstance(metadata, dict):
        metadata.update({
            "tito_trajectory_id": episode.trajectory.id,
            "tito_group": episode.trajectory.group,
            "tito_num_samples": episode.num_samples,
            "tito_drift_count": episode.drift_count,
            "tito_stale": episode.stale(),
            "tito_finish_reason": s["finish_reason"],
        })
        if episode.reward_extra is not None:
            metadata["tito_reward_extra"] = dict(episode.reward_extra)
    return sample


def task_of(sample: Any) -> dict[str, Any]:
    """What the agent gets as its task: the sample's prompt (a string or
    chat messages), label, metadata, index and group index."""
    return {"prompt": sample.prompt, "label": getattr(sample, "label", None),
            "metadata": getattr(sample, "metadata", None),
            "index": getattr(sample, "index", None),
            "group_index": getattr(sample, "group_index", None)}


def make_generate(agent: Agent | str, *, gateway: str | None = None, token: str | None = None,
                  api_key: str | None = None, admin_token: str | None = None,
                  run: str | None = None, register_router: bool = False,
                  router_kind: str = "sglang"
                  ) -> Callable[[Any, Any, dict[str, Any]], Awaitable[Any]]:
    """A slime custom generate function running `agent` (a callable taking
    an OpenAI `base_url` and the task, or its import path) through tito.

    With `register_router` the first call in a process adds slime's SGLang
    router (`args.sglang_router_ip`, `args.sglang_router_port`) to tito's
    fleet as a `router_kind` backend (needs an admin token)."""
    fn = load_agent(agent)

    async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
        url = gateway or _setting(args, "url") or "http://127.0.0.1:8000"
        async with AsyncClient(url, token=token or _setting(args, "trainer_token"),
                               api_key=api_key or _setting(args, "api_key"),
                               admin_token=admin_token or _setting(args, "admin_token")
                               ) as client:
            if register_router:
                router = http_url(args.sglang_router_ip, args.sglang_router_port)

                async def urls() -> list[str]:
                    return [router]

                await ensure_backends(client, router, urls, router_kind)
            index = getattr(sample, "index", None)
            episode = await run_episode(
                client, fn, group=group_of(sample, run or _RUN), task=task_of(sample),
                sampling_params=sampling_params,
                index=int(index) if index is not None else None)
        return fill_sample(sample, episode)

    return generate


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """`--custom-generate-function-path tito.slime.generate`: the agent is
    `args.tito_agent` or `$TITO_AGENT`."""
    agent = _setting(args, "agent")
    if agent is None:
        raise ValueError("tito.slime.generate needs the agent's import path in $TITO_AGENT "
                         "(or args.tito_agent)")
    register = (_setting(args, "register_router") or "") not in ("", "0", "false", "False")
    return await make_generate(agent, register_router=bool(register))(
        args, sample, sampling_params)
